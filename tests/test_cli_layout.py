"""The command line only translates: gedp/cli/ holds one module per group of commands, no command
function is longer than 40 lines (its whole ``def``, the typer-annotated parameters included), and
the library never imports the command line."""

import ast
from pathlib import Path

import typer.main

from gedp.cli import app

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "gedp" / "cli"
#: Most lines of a command function: flags mapped to one library call and a printout.
MOST_LINES = 40
#: Folders of the library (installed as gedp.*), which must not import gedp.cli.
LIBRARY = ("gedp", "synth", "measure", "postprocess", "evaluation")


def _is_command(decorator: ast.expr) -> bool:
    """``@app.command``, ``@app.command(...)``, ``@ledger_app.command(name=...)``, ..."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "command"


def command_functions() -> dict[str, int]:
    """Every command function of gedp/cli/, as module:function -> its lines, from ``def`` to its end."""
    found = {}
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef) and any(_is_command(d) for d in node.decorator_list):
                found[f"{path.stem}:{node.name}"] = node.end_lineno - node.lineno + 1
    return found


def test_no_command_function_is_over_40_lines():
    lengths = command_functions()
    assert {name: n for name, n in lengths.items() if n > MOST_LINES} == {}


def test_the_count_sees_every_command_of_the_app():
    """The functions counted are the commands typer runs (none registered another way escapes)."""
    group = typer.main.get_command(app)
    callbacks = {c.callback.__name__ for c in (*group.commands.values(), *group.commands["ledger"].commands.values())
                 if c.callback is not None and not isinstance(c, typer.core.TyperGroup)}
    counted = {name.split(":")[1] for name in command_functions()}
    assert counted == callbacks and len(counted) >= 14


def test_the_count_measures_a_long_command():
    """A decorated function of 41 lines is found and measured as 41: the test above can fail."""
    body = "\n".join(f"    x{i} = {i}" for i in range(40))
    tree = ast.parse(f"@app.command(name='long')\ndef long():\n{body}\n")
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert any(_is_command(d) for d in node.decorator_list)
    assert node.end_lineno - node.lineno + 1 == 41


#: The modules that start the command line: ``python -m gedp`` and the ``gedp`` script's entry point.
ENTRY_POINTS = ("__main__.py", "entry.py")


def _imports_cli(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if isinstance(node, ast.ImportFrom) and node.module == "gedp":
            names += [f"gedp.{alias.name}" for alias in node.names]
        if any(name == "gedp.cli" or name.startswith("gedp.cli.") for name in names):
            return True
    return False


def test_the_library_never_imports_the_command_line():
    importers = [str(path.relative_to(ROOT)) for folder in LIBRARY for path in sorted((ROOT / folder).rglob("*.py"))
                 if CLI not in path.parents and path.name not in ENTRY_POINTS and _imports_cli(path)]
    assert importers == []
    assert _imports_cli(ROOT / "gedp" / "entry.py")  # the check sees an import of gedp.cli
