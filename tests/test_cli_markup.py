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
