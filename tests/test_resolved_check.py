"""Every reader re-solves a release's protected microdata from its answers once, and remembers the verdict by
the digest of the files it read (gedp/release/resolved.py; red team rt28 J1: a copy with whole queries deleted
from its answers and plan stated a lower mu with the same tables, and every reader but the audit read it)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_psi_totals import refused_by_every_reader

import gedp
from gedp.errors import InputError
from gedp.release import resolved
from gedp.synth.panel import quarter_range, synthesize_panel
from gedp.synth.profiles import generate_profile, load_profile

REFUSED = "its protected microdata are not the postprocessing of its answers"


def dropped(folder: Path, copy: Path, queries: set[str]) -> Path:
    """rt28's forge_drop.py: the answers of ``queries`` deleted, with their lines of the manifest's plan (config
    queries, mu, grid, each state's ledger); every mu restated from the charges left with gedp's own functions.
    The protected microdata and tables stay byte for byte."""
    from gedp.measure.conversions import privacy_statement
    from gedp.release.manifest import attribute_mu
    from gedp.release.spending import _composed

    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for part in sorted((copy / "measurements.parquet").glob("*.parquet")):
        frame = pd.read_parquet(part)
        frame[~frame["query"].isin(queries)].reset_index(drop=True).to_parquet(part, index=False)
    name = lambda by: "identity" if by == "identity" else ",".join(by)  # noqa: E731
    manifest["config"]["queries"] = [q for q in manifest["config"]["queries"] if name(q["by"]) not in queries]
    for query in queries:
        manifest["mu"].pop(query, None)
        manifest["grid"].pop(query, None)
    totals = []
    for state, section in manifest["per_state"].items():
        for key in ("mu", "grid"):
            section[key] = {q: v for q, v in section[key].items() if q not in queries}
        kept, spent = [event for event in section["ledger"] if event["query"] not in queries], []
        for event in kept:
            spent.append(event["mu"])
            event["spent_total"] = _composed(spent)
        section["ledger"] = manifest["ledger"][state] = kept
        section["mu_total"] = _composed(spent)
        totals.append(section["mu_total"])
    manifest["mu_total"] = max(totals)
    manifest["privacy"] = privacy_statement(manifest["mu_total"], attribute_mu(manifest["mu"]))
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return copy


@pytest.fixture(scope="module")
def release(seeded_small_release) -> Path:
    """A release of 800 establishments (read, never changed)."""
    return seeded_small_release("resolved", 800)


@pytest.fixture
def refits(monkeypatch) -> list[str]:
    """The labels of the states ``resolved.refit`` solved again."""
    seen: list[str] = []
    counted = resolved.refit

    def spy(manifest, protected, measurements, label):
        seen.append(label)
        return counted(manifest, protected, measurements, label)

    monkeypatch.setattr(resolved, "refit", spy)
    return seen


def group_queries(folder: Path) -> set[str]:
    queries = set(pd.read_parquet(folder / "measurements.parquet", columns=["query"])["query"])
    return queries - {"identity"}


def test_a_copy_with_queries_dropped_is_refused_by_every_reader(release, tmp_path, monkeypatch):
    """J1: every group query dropped, the copy states a lower mu with the same tables. Power: with the re-solve
    check off, it is read and states less than the mu spent; with it, every reader refuses it in one line
    and writes nothing."""
    spent = gedp.read_release(release).privacy["mu"]
    copy = dropped(release, tmp_path / "dropped", group_queries(release))
    with monkeypatch.context() as unchecked:
        unchecked.setattr(resolved, "check_resolved", lambda *args: None)
        unchecked.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache-unchecked"))
        assert gedp.read_release(copy).privacy["mu"] < 0.9 * spent
    refused_by_every_reader(copy, tmp_path, REFUSED)


def test_one_query_dropped_is_refused(release, tmp_path):
    """The smallest such copy: the finest group query alone dropped."""
    finest = max(group_queries(release), key=lambda query: query.count(","))
    copy = dropped(release, tmp_path / "one", {finest})
    with pytest.raises(InputError, match=REFUSED) as refused:
        _ = gedp.read_release(copy).privacy
    assert "gedp audit --release" in str(refused.value) and "\n" not in str(refused.value)


def test_microdata_moved_up_are_refused(release, tmp_path):
    """J2's limit: the largest county's values moved up by 30% (the group check is one-sided, the microdata
    above their answers are read by it); the re-solve refuses them."""
    copy = tmp_path / "up"
    shutil.copytree(release, copy)
    for part in (copy / "protected.parquet").glob("*.parquet"):
        protected = pd.read_parquet(part)
        county = protected["county"].astype(str)
        here = county == county.value_counts().index[0]
        protected.loc[here, "m1emp"] = protected.loc[here, "m1emp"] * 1.3
        protected.to_parquet(part, index=False)
    with pytest.raises(InputError, match=REFUSED):
        _ = gedp.read_release(copy).privacy


def test_a_change_below_the_tolerance_passes_and_above_it_fails(release, tmp_path, refits):
    """The tolerance is what ``RTOL`` states, of the attribute's largest value: one protected value moved by
    half of it is read; by twice it, refused."""
    largest = float(pd.read_parquet(release / "protected.parquet")["m1emp"].abs().max())
    for factor, held in ((0.5, True), (2.0, False)):
        copy = tmp_path / f"moved{factor}"
        shutil.copytree(release, copy)
        part = next((copy / "protected.parquet").glob("*.parquet"))
        protected = pd.read_parquet(part)
        protected.loc[0, "m1emp"] += factor * resolved.RTOL * largest
        protected.to_parquet(part, index=False)
        if held:
            assert gedp.read_release(copy).privacy["mu"] > 0
        else:
            with pytest.raises(InputError, match=REFUSED):
                _ = gedp.read_release(copy).privacy


def panel_release(folder: Path) -> Path:
    first = generate_profile(load_profile("small"), n_establishments=500, rng=np.random.default_rng(22))
    quarters = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(22))
    return gedp.protect(quarters, seed=5, not_for_publication=True, allow_over_cap=True).write(folder)


@pytest.mark.parametrize("kind", ["psi", "pnc", "integer", "panel"])
def test_a_genuine_release_is_read_and_solved_once(kind, tmp_path, refits):
    """Genuine releases of four kinds are read; the first read solves each state again, the second (same
    bytes, verdict kept) solves nothing; a copy of the same bytes in another folder is not solved again."""
    from gedp.config import resolve_config

    state = generate_profile(load_profile("small"), n_establishments=500, rng=np.random.default_rng(7))
    if kind == "panel":
        folder = panel_release(tmp_path / kind)
    else:
        config = gedp.load(integer=True) if kind == "integer" else resolve_config("recommended", kind, False, None)
        folder = gedp.protect(state, config, seed=3, not_for_publication=True).write(tmp_path / kind)
    assert gedp.read_release(folder).privacy["mu"] > 0
    assert len(refits) == (2 if kind == "panel" else 1)
    refits.clear()
    assert gedp.read_release(folder).privacy["mu"] > 0
    assert refits == []
    shutil.copytree(folder, tmp_path / "copy")
    assert gedp.read_release(tmp_path / "copy").privacy["mu"] > 0
    assert refits == []


def verdict_files(cache: Path) -> list[Path]:
    return sorted((cache / "margins" / resolved.VERDICTS_FOLDER).iterdir())


def test_a_verdict_for_other_files_is_not_used(release, tmp_path, margins_cache, refits):
    """The verdict kept for a genuine release, put where the forged copy's verdict would be read, is not used:
    it names another digest. The copy is solved again and refused."""
    assert gedp.read_release(release).privacy["mu"] > 0
    (kept,) = verdict_files(margins_cache)
    copy = dropped(release, tmp_path / "dropped", group_queries(release))
    name, _ = resolved._verdict(copy, None)
    shutil.copy(kept, name)
    refits.clear()
    with pytest.raises(InputError, match=REFUSED):
        _ = gedp.read_release(copy).privacy
    assert refits


def tampered(kind: str, path: Path, content: dict) -> None:
    """A verdict file at ``path`` claiming ``content`` but written as no gedp process writes one."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "garbage":
        path.write_bytes(b"\x00not json{")
        return
    if kind == "symlink":
        target = path.with_name("elsewhere")
        target.write_text(json.dumps(content, sort_keys=True))
        path.symlink_to(target)
        return
    path.write_text(json.dumps(content, sort_keys=True))
    if kind == "writable":
        path.chmod(0o666)
    elif kind == "owner":
        os.chown(path, 12345, -1)
    elif kind == "folder":
        path.parent.chmod(0o777)


@pytest.mark.parametrize("kind", ["garbage", "symlink", "writable", "owner", "folder"])
def test_a_tampered_verdict_is_never_trusted(kind, release, tmp_path, refits):
    """A verdict claiming that a forged copy held, written as gedp never writes one (garbage, a link, writable
    by others, of another owner, in a folder writable by others): the copy is solved again and refused.
    Power: the same claim written as gedp writes it is trusted (the copy read unsolved)."""
    if kind == "owner" and os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    copy = dropped(release, tmp_path / "dropped", group_queries(release))
    path, content = resolved._verdict(copy, None)
    tampered(kind, path, content)
    if kind == "folder":
        with pytest.raises(InputError, match="not private|" + REFUSED):
            _ = gedp.read_release(copy).privacy
        path.parent.chmod(0o700)
    else:
        with pytest.raises(InputError, match=REFUSED):
            _ = gedp.read_release(copy).privacy
        assert refits
    path.unlink()
    resolved._keep(path, content)
    refits.clear()
    assert gedp.read_release(copy).privacy["mu"] > 0 and refits == []


def test_a_re_solve_that_does_not_finish_is_one_solver_error_line(release, monkeypatch):
    """The re-solve's block principal pivoting not finishing (its cap set to 0) is gedp's solver error: one
    line, exit 1, nothing written, no verdict kept."""
    from typer.testing import CliRunner

    from gedp.cli import app
    from gedp.postprocess import structured

    monkeypatch.setattr(structured, "MAX_ITERATIONS", 0)
    result = CliRunner().invoke(app, ["tabulate", str(release), "--by", "county", "--moe"])
    assert result.exit_code == 1 and result.output.startswith("solver error:"), result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    path, _ = resolved._verdict(release, None)
    assert not path.exists()


def test_the_most_recent_verdicts_are_kept(tmp_path, monkeypatch, margins_cache):
    """At most ``KEPT_VERDICTS`` verdicts are kept, the least recently written removed first."""
    monkeypatch.setattr(resolved, "KEPT_VERDICTS", 2)
    folder = margins_cache / "margins" / resolved.VERDICTS_FOLDER
    folder.mkdir(parents=True, mode=0o700)
    for number in range(4):
        resolved._keep(folder / f"{number:064x}", {"n": number})
        os.utime(folder / f"{number:064x}", ns=(number * 10**9, number * 10**9))
    assert sorted(path.name[-1] for path in folder.iterdir()) == ["2", "3"]
