"""The typer app of the gedp command line, its consoles, one-line error reports, progress bars and
the entry points (``main``, ``command``); the commands register on ``app`` from the modules of
``gedp.cli``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text
from typer.core import TyperGroup, TyperOption

import gedp
from gedp.errors import AuditError, GedpError, InputProblems, SolverError, Terminated, run_started
from gedp.running.process import end_process, exit_status, set_up_command_memory, stop_on_sigterm

try:  # typer >= 0.20 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors  # type: ignore[no-redef]


class _Commands(TyperGroup):
    """The app's commands: a stop (Ctrl-C, or SIGTERM's ``Terminated``) anywhere in a command, its
    imports before ``reported_errors`` and its printout after included, ends it with the one line
    ``stop_line`` on stderr; typer then exits 130 (143 after SIGTERM: ``main``)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as stop:
            _said_stop.append(True)
            typer.echo(stop_line(stop), err=True)
            raise


#: Whether a command of this ``main`` said its stop (``_Commands``): ``main`` says one outside a command.
_said_stop: list[bool] = []

app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    no_args_is_help=True,
    help="Gaussian Establishment DP: protected, consistent establishment microdata with stated error.",
)
#: Width of output that is not on a terminal: wide enough that no table is cut to fit.
UNWRAPPED_WIDTH = 10_000


def _console(*, stderr: bool = False) -> Console:
    """A terminal wraps to its width; a pipe, file or log gets every line whole (rich would wrap it
    at 80 columns and split log lines): soft wrapping, and tables as wide as their content."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=UNWRAPPED_WIDTH)


console = _console()
errors = _console(stderr=True)


def plain(value: object) -> str:
    """A path or name as text in a rich message: its brackets escaped, so that '[/x]' in a folder's name
    neither raises MarkupError after the command has done its work nor styles, hides or links the rest
    (red team rt24 F3)."""
    return escape(str(value))


def readable(value: object) -> str:
    """Text for a plain (not rich) line: each character that is not printable (ESC, a line break, a
    right-to-left override) shown escaped, so no escape sequence or line break of it reaches the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(value))


def printable(value: object) -> str:
    """Text read from a file someone else may have written (a ledger's config name) as ``plain`` text,
    each character that is not printable shown escaped (``readable``): no markup, escape sequence or
    line break of it reaches the terminal (red team rt27 H4)."""
    return plain(readable(value))


def _flag_type(option: TyperOption, ctx: Any) -> Optional[str]:
    """No type column for flags: typer 0.29 labels every flag (--help, --moe, ...) ``<bool>``,
    though a flag takes no value; options that take one keep their type."""
    return None if option.is_flag else _option_type(option, ctx)


_option_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign, assignment]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gedp {gedp.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    context: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print gedp's version and exit.")] = False,
) -> None:
    context.with_resource(run_started())  # a SIGTERM from here on stops the command's run (gedp.errors)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn every gedp error into one line on stderr: exit status 1 when the computation failed
    (solver, audit LP), 2 when an input, config, budget or path was refused (gedp.errors). A stop
    (Ctrl-C, or SIGTERM's ``Terminated``) passes: the app says it for the whole command (``_Commands``)."""
    try:
        yield
    except (SolverError, AuditError) as err:
        kind = "solver" if isinstance(err, SolverError) else "audit"
        typer.echo(f"{kind} error: {readable(err)}", err=True)
        raise typer.Exit(1) from None
    except InputProblems as err:  # every problem of an input, one per line
        typer.echo("\n".join([f"error: {readable(err.subject)} has:", *(f"  - {readable(p)}" for p in err.problems)]),
                   err=True)
        raise typer.Exit(2) from None
    except GedpError as err:
        typer.echo(f"error: {readable(err)}", err=True)
        raise typer.Exit(2) from None


def stop_line(stop: KeyboardInterrupt) -> str:
    """The line a stopped command ends with: the notes the run added to the stop (what it left: a
    release pending in the ledger, published or not, ``gedp.running.recorded_release.reported_stop``),
    else which stop it was. A stop received while the command was stopping (raised during the first's
    handling: its ``__context__``) ends it with the first's line."""
    stops = [stop]
    while isinstance(stops[-1].__context__, KeyboardInterrupt):
        stops.append(stops[-1].__context__)
    notes = next((s.__notes__ for s in stops if getattr(s, "__notes__", None)), None)
    if notes:
        return readable(" ".join(notes))
    return f"stopped ({'SIGTERM' if isinstance(stops[-1], Terminated) else 'Ctrl-C'})"


class StepsColumn(ProgressColumn):
    """The steps done, out of the total when it is known ("3/12"), else alone ("3"; the bar then
    moves to and fro: rich's indeterminate bar)."""

    def render(self, task: Task) -> Text:
        done = f"{task.completed:,.0f}"
        return Text(done if task.total is None else f"{done}/{task.total:,.0f}")


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"), BarColumn(), StepsColumn(),
        TimeElapsedColumn(), console=errors, transient=True, disable=not errors.is_terminal,
    )


@contextmanager
def progress_steps(total: int | None) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (of ``total`` steps, or counting without an end); yields the callback
    that advances it by one named step."""
    with _progress_bar() as progress:
        task = progress.add_task("measuring", total=total)

        def advance(description: str) -> None:
            progress.update(task, advance=1, description=printable(description))

        yield advance


@contextmanager
def progress_counts(description: str) -> Iterator[tuple[Callable[[int, int], None], Callable[[str], None]]]:
    """A progress bar on stderr; yields callbacks ``(done, total)`` for the bar and ``(message)``,
    which prints a line above it and names the next phase."""
    with _progress_bar() as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        def say(message: str) -> None:
            progress.console.print(f"  {printable(message)}")
            progress.update(task, completed=0, total=None, description=description)

        yield update, say


def main() -> None:
    """Console entry point: usage errors (a bad option value, an unknown command), too, end in one
    line ``error: ...`` and exit status 2."""
    _said_stop.clear()
    try:
        stop_on_sigterm()  # SIGTERM stops a command as Ctrl-C does (exit 143, nothing left)
        set_up_command_memory()
        code = app(standalone_mode=False)
    except KeyboardInterrupt as stop:  # outside a command (typer converts a stop within one to exit 130)
        _said_stop.append(True)
        typer.echo(stop_line(stop), err=True)
        code = 130
    except click_errors.NoArgsIsHelpError:
        app(["--help"])
    except click_errors.ClickException as err:
        typer.echo(f"error: {readable(err.format_message())}", err=True)
        sys.exit(err.exit_code)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        sys.exit(1)
    if code == 130 and not _said_stop:  # stopped while typer read the command line
        typer.echo(stop_line(Terminated() if exit_status(code) != code else KeyboardInterrupt()), err=True)
    sys.exit(exit_status(code if isinstance(code, int) else 0))


def command() -> None:
    """The ``gedp`` executable and ``python -m gedp``: ``main``, then the process ends without the
    interpreter's teardown (``gedp.running.process.end_process``)."""
    try:
        main()
    except SystemExit as done:
        if done.code is not None and not isinstance(done.code, int):
            raise  # a message: Python prints it
        end_process(done.code or 0)
