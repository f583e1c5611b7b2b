"""Paths and names in the command line's messages are text, never rich markup (red team rt24 F3): a
folder named with '[/x]' had raised MarkupError (a traceback, exit 1) after `gedp protect` had written
its release and committed its ledger charge (a script retrying on the exit status charged again), and
'[red]...[/red]' had been swallowed, so the path said was not the one written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gedp.cli import app

runner = CliRunner()

#: Folder names that are markup to rich: a closing tag no tag opened (MarkupError), a style, a link.
MARKUP_NAMES = ["m[/x]", "n[red]r[/red]", "k[link=http://example.com]x"]


@pytest.fixture(scope="module")
def release(seeded_small_release) -> Path:
    return seeded_small_release("markup", 300)


@pytest.mark.parametrize("name", MARKUP_NAMES)
def test_protect_and_ledger_show_say_a_marked_up_path_as_it_is(tmp_path, small_state, name):
    source = tmp_path / "in.parquet"
    small_state.iloc[:300].to_parquet(source)
    folder = tmp_path / name
    folder.mkdir(parents=True)
    out, ledger = folder / "release", folder / "ledger.json"
    result = runner.invoke(app, ["protect", str(source), "--out", str(out), "--ledger", str(ledger),
                                 "--lifetime-cap", "20"])
    assert result.exit_code == 0, result.output
    assert f"Release written to {out}" in result.output
    assert json.loads((out / "manifest.json").read_text())["lifetime"]["release_id"]
    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)])
    assert shown.exit_code == 0, shown.output
    assert f"ledger {ledger}" in shown.output


@pytest.mark.parametrize("name", MARKUP_NAMES)
def test_readers_say_a_marked_up_output_as_it_is(release, tmp_path, monkeypatch, name):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / name
    folder.mkdir(parents=True)
    table = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--out", str(folder / "t.csv")])
    assert table.exit_code == 0 and f"written to {folder / 't.csv'}" in table.output, table.output
    report = runner.invoke(app, ["report", str(release), "--out", str(folder / "r.html")])
    assert report.exit_code == 0 and f"written to {folder / 'r.html'}" in report.output, report.output
    assert (folder / "t.csv").is_file() and (folder / "r.html").is_file()


def test_readers_say_an_output_path_with_escapes_escaped(release, tmp_path, monkeypatch):
    """The review of int28 (finding D): an --out path holding a terminal's escape sequence reached the
    terminal as it was in 'written to ...' (rich drops BEL, not ESC); it is shown escaped as every other
    text is (``command_line.printable``)."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "e\x1b[2Jx"
    folder.mkdir(parents=True)
    commands = ((["tabulate", str(release), "--by", "county"], "t.csv"), (["report", str(release)], "r.html"))
    for command, name in commands:
        result = runner.invoke(app, [*command, "--out", str(folder / name)])
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output, result.output
        assert f"written to {str(folder / name).replace(chr(27), chr(92) + 'x1b')}" in result.output, result.output
        assert (folder / name).is_file()


def rewritten_ledger(ledger: Path, out: Path, edit) -> Path:
    """A copy of ``ledger`` (and its key files) whose reserve events ``edit`` changed, the chain's hashes
    and head recomputed as anyone who can write the file can (gedp.accounting.ledger_file's rules)."""
    import hashlib
    import shutil

    book = json.loads(ledger.read_text())
    previous = hashlib.sha256(f"gedp ledger {book['version']} {book['key']}".encode()).hexdigest()
    for event in book["events"]:
        if event["event"] == "reserve":
            edit(event["release"])
        event["previous"] = previous
        content = {k: v for k, v in event.items() if k != "hash"}
        text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
        event["hash"] = previous = hashlib.sha256(text.encode()).hexdigest()
    book["head"] = previous
    out.write_text(json.dumps(book))
    shutil.copytree(ledger.with_name(ledger.name + ".keys"), out.with_name(out.name + ".keys"))
    return out


#: Texts of a ledger no gedp writes (red team rt27 H4): markup (a closing tag no tag opened had ended
#: `ledger show` in a 141-line MarkupError traceback; a link hid its target), a terminal's escape
#: sequences and a line break (had reached the terminal as they were).
LEDGER_TEXTS = {"[/x]": "[/x]", "r[link=http://evil.example]x[/link]": "r[link=http://evil.example]x[/link]",
                "r\x1b]0;pwned\x07\x1b[2J": "r\\x1b]0;pwned\\x07\\x1b[2J", "r\nfake line": "r\\nfake line"}


@pytest.fixture(scope="module")
def ledger(tmp_path_factory, small_state) -> Path:
    folder = tmp_path_factory.mktemp("ledger")
    source = folder / "in.parquet"
    small_state.iloc[:300].to_parquet(source)
    result = runner.invoke(app, ["protect", str(source), "--out", str(folder / "release"), "--ledger",
                                 str(folder / "ledger.json"), "--lifetime-cap", "20"])
    assert result.exit_code == 0, result.output
    return folder / "ledger.json"


@pytest.mark.parametrize("field", ["config", "psi", "gammas"])
@pytest.mark.parametrize("text", list(LEDGER_TEXTS))
def test_ledger_show_says_a_ledgers_texts_as_they_are(ledger, tmp_path, field, text):
    def edit(release: dict) -> None:
        if field == "config":
            release["config"] = text
        elif field == "psi":
            release["psi"]["name"] = text
        else:
            release["gammas"] = {text: 0.5, **release["gammas"]}
            release["charges"] = {text: 0.1, **release["charges"]}

    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(rewritten_ledger(ledger, tmp_path / "l.json", edit))])
    assert shown.exit_code == 0, shown.output
    assert LEDGER_TEXTS[text] in shown.output.replace("\n│", "").replace("│\n", "") or (
        field != "config" and repr(text)[1:-1] in shown.output), shown.output
    assert "\x1b" not in shown.output and "\nfake line" not in shown.output


def test_ledger_show_of_the_ledger_gedp_writes_says_its_config_and_accounts(ledger):
    """Power of the escaping above: a ledger as gedp writes it is listed as it was (its config's name, its
    accounts' psi as its name and parameters, its gammas as name and value:
    'psi sqrt (a = 0.0), gammas m1emp 0.5, ...')."""
    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)])
    book = json.loads(ledger.read_text())
    (release,) = [event["release"] for event in book["events"] if event["event"] == "reserve"]
    assert shown.exit_code == 0 and f"│ {release['config']} " in shown.output, shown.output
    psi, gammas = release["psi"], ", ".join(f"{name} {value}" for name, value in release["gammas"].items())
    assert f"accounts: psi {psi['name']} (a = {psi['a']}), gammas {gammas};" in shown.output, shown.output


def test_audit_says_a_releases_texts_as_they_are(release, tmp_path):
    """Red team rt27: `gedp audit --release`, the command that checks a release someone passed on, shows
    what failed with the release's own text (a path in its config); '[/y]' in it had ended the audit in a
    150-line MarkupError traceback (exit 1), an ESC sequence reached the terminal as it was."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(release, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["config"]["note"] = "/etc/passwd\x1b[2J[/y]"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["audit", "--release", str(copy)])
    assert result.exit_code == 2, result.output
    assert "'note' holds a path (/etc/passwd\\x1b[2J[/y])" in result.output, result.output
    assert "\x1b" not in result.output and "Traceback" not in result.output


#: Text from a release, a published file or a ledger that a console line may carry, and how it is shown:
#: markup rich refuses (MarkupError) as typed, a terminal escape (set the window's title, clear the
#: screen) with its control characters escaped.
HOSTILE_TEXTS = {"state [/x] done": "state [/x] done",
                 "state 44\x1b]0;pwned\x07\x1b[2J done": "state 44\\x1b]0;pwned\\x07\\x1b[2J done"}


@pytest.mark.parametrize("text, said", HOSTILE_TEXTS.items())
def test_progress_lines_say_their_text_as_it_is(monkeypatch, text, said):
    """A progress bar's step (`protect`, `plan`) and a line said above it (`implicates`) are text: the
    markup shown as typed, an escape sequence shown escaped (h3fix27, the sweep after rt27)."""
    from io import StringIO

    from rich.console import Console

    from gedp.cli import command_line

    terminal = StringIO()
    monkeypatch.setattr(command_line, "errors", Console(file=terminal, force_terminal=True, color_system=None,
                                                          width=200))
    with command_line.progress_steps(2) as advance:
        advance(text)
    with command_line.progress_counts("drawing implicates") as (_, say):
        say(text)
    shown = terminal.getvalue()
    assert "\x1b]0;pwned" not in shown and "\x1b[2J" not in shown, repr(shown)
    assert shown.count(said) >= 2, repr(shown)  # the step and the line above the bar


def test_tabulate_says_a_warnings_text_as_it_is(release, tmp_path, monkeypatch):
    """A warning raised while tabulating (it may quote a release's or a file's text) is printed with its
    escape sequences shown escaped (h3fix27); gedp's own warnings are printable and print as they are."""
    import warnings

    from gedp.tabulation import request

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    tabulated = request._tabulated

    def warning_too(*args, **kwargs):
        warnings.warn("title [/x]\x1b]0;pwned\x07\x1b[2J", UserWarning, stacklevel=1)
        return tabulated(*args, **kwargs)

    monkeypatch.setattr(request, "_tabulated", warning_too)
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--out", str(tmp_path / "t.csv")])
    assert result.exit_code == 0, result.output
    assert "warning: title [/x]\\x1b]0;pwned\\x07\\x1b[2J\n" in result.output, repr(result.output)
    assert "\x1b" not in result.output
