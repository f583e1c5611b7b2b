"""What a release claims, checked by every reader before it is stated or used, and what a reader writes
(red team of session 21 on main 17c076e): the budget a manifest states against its ledgers (F3), its
solver section (F4), no output inside the release read (F5), no public code gedp does not write (F9); and
(red team of session 22 on main a2026b5) the budget a release states against the noise its answers drew
(F1, F7), a publishable panel's audit (F3) and its quarters published as it is (F9)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import gedp
from gedp.cli import app
from gedp.errors import InputError
from gedp.release.reader import read_manifest
from gedp.serve.releases import load_releases

runner = CliRunner()


@pytest.fixture(scope="module")
def release(seeded_small_release) -> Path:
    return seeded_small_release("claims", 400)


def edited(release: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``release`` whose manifest ``edit`` changed."""
    copy = tmp_path / "copy"
    shutil.copytree(release, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def refused_by_every_reader(copy: Path, tmp_path: Path, message: str, plain: bool = True,
                            manifest: bool = True) -> None:
    """tabulate (with and without margins; without: only when ``plain``, a refusal of the manifest: a plain
    tabulation reads no answers), report, implicates, the server's loader and (an edited ``manifest``) the
    API's privacy statement each refuse ``copy`` in one line naming ``message``, exit 2, nothing written."""
    requests = [["tabulate", str(copy), "--by", "county", "--out", str(tmp_path / "t.csv")]] if plain else []
    for request in (*requests,
                    ["tabulate", str(copy), "--by", "county", "--moe", "--out", str(tmp_path / "t.csv")],
                    ["report", str(copy), "--out", str(tmp_path / "report.html")],
                    ["implicates", str(copy), "--out", str(tmp_path / "imp"), "--n", "2"]):
        result = runner.invoke(app, request)
        assert result.exit_code == 2 and message in result.output, (request, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
    assert not any((tmp_path / name).exists() for name in ("t.csv", "report.html", "imp"))
    with pytest.raises(InputError, match=re.escape(message)):
        load_releases([copy])
    if manifest:
        with pytest.raises(InputError, match=re.escape(message)):
            _ = gedp.read_release(copy).privacy


def test_a_genuine_manifest_states_its_ledgers_composed(release):
    """The rule the readers check, on a release as gedp writes it, computed here from the ledger alone:
    mu_total = sqrt(sum of the ledger's mu^2), privacy's mu that and rho mu^2 / 2, and each
    attribute's mu its charges composed."""
    manifest = json.loads((release / "manifest.json").read_text())
    (ledger,) = [section["ledger"] for section in manifest["per_state"].values()]
    total = math.sqrt(sum(entry["mu"] ** 2 for entry in ledger))
    assert manifest["mu_total"] == pytest.approx(total, rel=1e-12)
    assert manifest["privacy"]["mu"] == pytest.approx(total, rel=1e-12)
    assert manifest["privacy"]["rho"] == pytest.approx(total**2 / 2, rel=1e-12)
    for attribute, block in manifest["privacy"]["attributes"].items():
        mine = math.sqrt(sum(entry["mu"] ** 2 for entry in ledger if entry["attribute"] == attribute))
        assert block["mu"] == pytest.approx(mine, rel=1e-12)
    assert read_manifest(release)["mu_total"] == manifest["mu_total"]


def _spent_ten_times_less(manifest: dict) -> None:
    """The red team's edit: mu_total and what the privacy block states of it, 0.1."""
    manifest["mu_total"] = manifest["privacy"]["mu"] = 0.1
    manifest["privacy"]["rho"] = 0.005


#: Manifests stating another budget than their ledgers charged, and what the refusal names.
STATED = {
    "mu_total 0.1 with its privacy block": (_spent_ten_times_less, "'mu_total' is not the largest of its states'"),
    "mu_total only": (lambda m: m.update(mu_total=m["mu_total"] * 0.99), "'mu_total' is not the largest"),
    "a state's mu_total": (lambda m: m["per_state"]["44"].update(mu_total=0.1), "'per_state.44.mu_total' is not"),
    "mu_planned_total below it": (lambda m: m.update(mu_planned_total=0.1), "'mu_planned_total' is less than"),
    "privacy's mu": (lambda m: m["privacy"].update(mu=0.1), "'privacy' does not state mu"),
    "privacy's rho": (lambda m: m["privacy"].update(rho=0.1), "'privacy' does not state mu"),
    "an attribute's mu": (lambda m: m["privacy"]["attributes"]["wage"].update(mu=0.1),
                          "'privacy.attributes.wage' does not state"),
    "an attribute dropped": (lambda m: m["privacy"]["attributes"].pop("wage"), "'privacy.attributes' names other"),
    "no privacy block": (lambda m: m.pop("privacy"), "'privacy' must hold"),
}


@pytest.mark.parametrize("case", list(STATED))
def test_a_budget_other_than_the_ledgers_composed_is_refused_by_every_reader(release, tmp_path, monkeypatch, case):
    """Red team F3: with mu_total set to 0.1 the report said "mu = 0.1000, epsilon 0.40" (the ledgers
    composed: 2.3, epsilon 13), as did serve and tabulate --moe; only gedp audit --release noticed."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = STATED[case]
    refused_by_every_reader(edited(release, tmp_path, edit), tmp_path, message)


#: Privacy blocks stating another epsilon than their mu gives (only the API hands the block out; the
#: commands state epsilon computed from mu_total).
EPSILON = {
    "the total's": (lambda m: m["privacy"]["epsilon"].update({"1e-06": 0.4}), "'privacy.epsilon'"),
    "an attribute's": (lambda m: m["privacy"]["attributes"]["wage"]["epsilon"].update({"1e-06": 0.4}),
                       "'privacy.attributes.wage.epsilon'"),
    "a delta dropped": (lambda m: m["privacy"]["epsilon"].pop("1e-06"), "'privacy.epsilon'"),
}


@pytest.mark.parametrize("case", list(EPSILON))
def test_the_privacy_block_the_api_gives_states_the_epsilon_of_its_mu(release, tmp_path, case):
    edit, message = EPSILON[case]
    copy = edited(release, tmp_path, edit)
    with pytest.raises(InputError, match=re.escape(message)):
        _ = gedp.read_release(copy).privacy
    assert gedp.read_release(release).privacy["epsilon"]["1e-06"] > 0


@pytest.fixture(scope="module")
def panel(tmp_path_factory) -> Path:
    """A seeded panel release of 300 establishments over 2016Q1 and 2016Q2."""
    import numpy as np

    from gedp.synth.panel import quarter_range, synthesize_panel
    from gedp.synth.profiles import generate_profile, load_profile

    first = generate_profile(load_profile("small"), n_establishments=300, rng=np.random.default_rng(3))
    quarters = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(3))
    folder = tmp_path_factory.mktemp("panel") / "release"
    gedp.protect(quarters, seed=4, not_for_publication=True, allow_over_cap=True).write(folder)
    return folder


def _quarter_spent_less(manifest: dict) -> None:
    """A quarter's totals edited alike (its mu_total, privacy and per_state), its ledger as charged."""
    section = manifest["per_quarter"]["2016Q2"]
    for where in (section, *section["per_state"].values()):
        where["mu_total"] = 0.1
    section["privacy"].update(mu=0.1, rho=0.005)


#: Panel manifests stating another budget than their quarters' ledgers compose to.
PANEL = {
    "mu_total 0.1": (lambda m: m.update(mu_total=0.1), "'mu_total' is not what 2 quarters of mu"),
    "mu_quarter": (lambda m: m.update(mu_quarter=0.1), "'mu_quarter' is not the most a quarter spent"),
    "privacy's mu": (lambda m: m["privacy"].update(mu=0.1), "'privacy' does not state mu"),
    "a quarter's totals": (_quarter_spent_less, "'per_quarter.2016Q2.per_state.44.mu_total' is not"),
    "an unknown design": (lambda m: m["design"].update(name="bogus"), "'design' must name a design"),
}


def test_a_genuine_panel_states_its_quarters_composed(panel):
    """sqrt(2) times the larger quarter's mu_total, each quarter's its ledger composed (computed here)."""
    manifest = json.loads((panel / "manifest.json").read_text())
    quarters = []
    for section in manifest["per_quarter"].values():
        (ledger,) = [state["ledger"] for state in section["per_state"].values()]
        quarters.append(math.sqrt(sum(entry["mu"] ** 2 for entry in ledger)))
        assert section["mu_total"] == pytest.approx(quarters[-1], rel=1e-12)
    assert manifest["mu_total"] == pytest.approx(math.sqrt(2) * max(quarters), rel=1e-12)
    assert read_manifest(panel)["mu_total"] == manifest["mu_total"]


@pytest.mark.parametrize("case", list(PANEL))
def test_a_panel_stating_another_budget_is_refused(panel, tmp_path, monkeypatch, case):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy, message = refused_as_a_panel(panel, tmp_path, *PANEL[case])
    with pytest.raises(InputError, match=re.escape(message)):
        load_releases([copy])


def refused_as_a_panel(panel: Path, tmp_path: Path, edit, message: str) -> tuple[Path, str]:
    """A copy of ``panel`` that ``edit`` changed, refused with ``message`` by the manifest reader and, in one
    line with exit status 2, by a tabulation of a quarter with margins."""
    copy = edited(panel, tmp_path, edit)
    with pytest.raises(InputError, match=re.escape(message)):
        read_manifest(copy)
    result = runner.invoke(app, ["tabulate", str(copy), "--by", "county", "--quarter", "2016Q1", "--moe"])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1
    return copy, message


def test_audit_states_the_readers_check(release, tmp_path):
    """gedp audit --release fails the copy on its manifest, with the readers' words."""
    from gedp.audit.release import audit_release

    checks = audit_release(edited(release, tmp_path, _spent_ten_times_less))
    failed = [check for check in checks if not check.passed]
    assert failed and "'mu_total' is not the largest of its states'" in str(failed[0])


#: Solver sections the red team wrote (F4: TypeError tracebacks in tabulate --moe, report and serve, or
#: a model "bogus" that silently changed the wage margins), and what the refusal names.
SOLVERS = {
    "a solve that is text": (lambda m: m["solver"].update(wage="model"), "'solver' of 'wage' ('model') must state"),
    "no solver": (lambda m: m.update(solver=None), "'solver' must map each attribute to its solve"),
    "a solve that is null": (lambda m: m.update(solver={**m["solver"], "wage": None}), "'solver' of 'wage' (None)"),
    "a solve that is a number": (lambda m: m.update(solver={**m["solver"], "wage": 5}), "'solver' of 'wage' (5)"),
    "an unknown model": (lambda m: m["solver"]["wage"].update(model="bogus"), "model 'bogus' is not one of"),
    "a model that is a number": (lambda m: m["solver"]["m1emp"].update(model=1), "model 1 is not one of"),
    "a measured attribute without its solve": (lambda m: m["solver"].pop("wage"), "'solver' lacks wage"),
    "iterations as text": (lambda m: m["solver"]["wage"].update(iterations="2"), "iterations '2' must be a number"),
    "a status that is a list": (lambda m: m["solver"]["wage"].update(status=[]), "status [] must be text"),
}


@pytest.mark.parametrize("case", list(SOLVERS))
def test_a_solver_section_other_than_gedps_is_refused_by_every_reader(release, tmp_path, monkeypatch, case):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = SOLVERS[case]
    refused_by_every_reader(edited(release, tmp_path, edit), tmp_path, message)


def test_the_readers_models_are_the_postprocessings_own():
    from gedp.postprocess.models import MonthModel, PlainModel, WageModel
    from gedp.release.validation import MODELS

    assert set(MODELS) == {PlainModel.name, MonthModel.name, WageModel.name}


def test_a_release_of_mixed_models_across_states_is_read(release, tmp_path):
    """Several states' models are joined by commas (``combined_report``): each a known model is read."""
    copy = edited(release, tmp_path, lambda m: m["solver"]["wage"].update(model="plain,wage prior"))
    assert read_manifest(copy)["solver"]["wage"]["model"] == "plain,wage prior"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("request_", [
    ["tabulate", "{r}", "--by", "county", "--out", "{r}/protected.parquet/part-44.parquet"],
    ["tabulate", "{r}", "--by", "county", "--moe", "--out", "{r}/measurements.parquet/part-44.parquet"],
    ["tabulate", "{r}", "--agglvl", "75", "--format", "xlsx", "--out", "{r}/qcew_tables.csv"],
    ["tabulate", "{r}", "--by", "county", "--out", "{r}/new.csv"],
    ["tabulate", "{link}", "--by", "county", "--out", "{r}/new.csv"],
    ["tabulate", "{r}", "--by", "county", "--out", "{link}/new.csv"],
    ["report", "{r}", "--out", "{r}/manifest.json"],
    ["implicates", "{r}", "--out", "{r}/implicates", "--n", "2"],
    ["audit", "--release", "{r}", "--out", "{r}/audit.json"],
    ["suppress", "--data", "{r}", "--out", "{r}/cells", "--no-audit"],
    ["suppress", "--data", "{link}/protected.parquet", "--out", "{r}/measurements.parquet/cells", "--no-audit"],
    ["evaluate", "risk", "--data", "{r}", "--release", "{link}", "--out", "{r}/risk"],
    ["evaluate", "e1", "--data", "{r}", "--out", "{link}/e1"],
    ["evaluate", "e3", "--trials", "100", "--out", "{r}/e3"],  # reads no release: none is written into
])
def test_an_output_inside_the_release_read_is_refused(release, tmp_path, monkeypatch, request_):
    """Red team F5: `tabulate --out r/protected.parquet/part-44.parquet`, `report --out r/manifest.json`
    exited 0 and destroyed the release (and wrote .json files into it)."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    (tmp_path / "link").symlink_to(copy)
    before = _files(copy)
    request = [part.format(r=copy, link=tmp_path / "link") for part in request_]
    result = runner.invoke(app, request)
    assert result.exit_code == 2 and "is inside the release" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert _files(copy) == before  # no file changed, none added


@pytest.mark.parametrize("request_", [
    ["tabulate", "{r}", "--by", "county", "--out", "{other}/qcew_tables.csv"],
    ["tabulate", "{r}", "--by", "county", "--moe", "--out", "{link}/t.csv"],
    ["tabulate", "{r}", "--agglvl", "75", "--format", "xlsx", "--out", "{other}/b.xlsx"],
    ["report", "{r}", "--out", "{other}/r.html"],
    ["implicates", "{r}", "--out", "{other}/implicates", "--n", "2"],
    ["audit", "--release", "{r}", "--out", "{other}/audit.json"],
])
def test_an_output_inside_another_release_is_refused(release, tmp_path, monkeypatch, request_):
    """Red team rt23 F2: a reader refused only the release it reads, so `tabulate r --out other/qcew_tables.csv`
    replaced another release's published tables (exit 0; its readers did not notice) and implicates and
    report wrote folders and files into it."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy, other = tmp_path / "r", tmp_path / "other"
    shutil.copytree(release, copy)
    shutil.copytree(release, other)
    (tmp_path / "link").symlink_to(other)
    before = _files(other)
    result = runner.invoke(app, [part.format(r=copy, other=other, link=tmp_path / "link") for part in request_])
    assert result.exit_code == 2 and "is inside the release" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert _files(other) == before  # no file changed, none added


def test_the_apis_outputs_inside_another_release_are_refused(release, tmp_path):
    """rt23 F2 through the API: the workbook and the report of one release inside another."""
    copy, other = tmp_path / "r", tmp_path / "other"
    shutil.copytree(release, copy)
    shutil.copytree(release, other)
    before = _files(other)
    with pytest.raises(InputError, match="is inside the release"):
        gedp.read_release(copy).tabulate(agglvl=75, format="xlsx", out=other / "b.xlsx")
    with pytest.raises(InputError, match="is inside the release"):
        gedp.report(copy, out=other / "r.html")
    assert _files(other) == before


def _truncated(release: Path, tmp_path: Path) -> Path:
    """A copy of ``release`` whose protected part lost its last row (its manifest unchanged)."""
    import pandas as pd

    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    part = copy / "protected.parquet" / "part-44.parquet"
    pd.read_parquet(part).iloc[:-1].to_parquet(part, index=False)
    return copy


@pytest.mark.parametrize("command", [["suppress", "--no-audit"], ["evaluate", "e1"]])
def test_suppress_and_evaluate_read_a_release_through_its_reader(release, tmp_path, command):
    """--data naming a release's protected microdata is read with the readers' checks (a copy
    whose rows are not the establishments its manifest states is refused), a part alone is refused,
    and a genuine release is read (the report written beside it)."""
    copy = _truncated(release, tmp_path)
    for data, message in ((copy / "protected.parquet", "manifest states"),
                          (copy, "manifest states"),
                          (release / "protected.parquet" / "part-44.parquet", "is not its protected microdata")):
        result = runner.invoke(app, [*command, "--data", str(data), "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and message in result.output, (data, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert not (tmp_path / "out").exists()
    result = runner.invoke(app, [*command, "--data", str(release), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0 and (tmp_path / "out" / "summary.json").exists(), result.output


def test_a_job_table_in_a_release_is_refused(release, tmp_path):
    """e6's --jobs is a job table of --data, never a file of a release (its job frame has other columns)."""
    result = runner.invoke(app, ["evaluate", "e6", "--data", str(release), "--jobs", str(release / "protected.parquet"),
                                 "--out", str(tmp_path / "e6")])
    assert result.exit_code == 2 and "is in a release" in result.output, result.output
    assert not (tmp_path / "e6").exists()


def test_an_output_beside_the_release_is_written(release, tmp_path, monkeypatch):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    result = runner.invoke(app, ["tabulate", str(release), "--by", "county", "--out", str(tmp_path / "r.csv")])
    assert result.exit_code == 0 and (tmp_path / "r.csv").exists() and (tmp_path / "r.csv.json").exists()


#: Public codes of a part edited as the red team did (F9: plain tabulate wrote them into its CSV).
CODES = {
    "a county formula": ("county", "=1+1", "column 'county': codes must be 3 ASCII digits"),
    "a naics3 link": ("naics3", '=HYPERLINK("http://example.com")', "column 'naics3' holds a code gedp does not write"),
    "a sector not of its naics": ("sector", "99", "column 'sector' holds a code gedp does not write"),
}


@pytest.mark.parametrize("case", list(CODES))
def test_codes_gedp_does_not_write_are_refused_by_a_plain_tabulation(release, tmp_path, monkeypatch, case):
    import pandas as pd

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    column, value, message = CODES[case]
    copy = edited(release, tmp_path, lambda m: None)
    part = copy / "protected.parquet" / "part-44.parquet"
    frame = pd.read_parquet(part)
    frame.loc[3, column] = value
    frame.to_parquet(part, index=False)
    for by in (column, "county,naics3"):
        result = runner.invoke(app, ["tabulate", str(copy), "--by", by, "--out", str(tmp_path / "t.csv")])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "=" not in result.output, result.output
    assert not (tmp_path / "t.csv").exists()
    with pytest.raises(InputError, match=re.escape(message)):
        load_releases([copy])


def _pattern_edits() -> dict[str, tuple]:
    """Hostile edits of the public columns a smoothed release's months share patterns in (``PATTERN_GROUP``,
    ``PATTERN_CELL``), each with the words its refusal names: a column dropped, a null, a number, an extra row."""
    from gedp.postprocess.months import PATTERN_CELL, PATTERN_GROUP

    columns = list(dict.fromkeys((*PATTERN_GROUP, *PATTERN_CELL)))
    edits: dict[str, tuple] = {f"no {c}": (lambda f, c=c: f.drop(columns=c), f"lack the column '{c}'") for c in columns}
    edits["a null sector"] = (lambda f: f.assign(sector=f["sector"].astype(object).where(f.index != 3, None)),
                              "column 'sector'")
    edits["a numeric county"] = (lambda f: f.assign(county=f["county"].astype(int)), "column 'county' as int64")
    edits["an extra row"] = (lambda f: f.iloc[[*range(len(f)), 0]], "hold 401 rows")
    return edits


PATTERN_EDITS = _pattern_edits()


@pytest.mark.parametrize("case", list(PATTERN_EDITS))
def test_the_smoothed_months_pattern_columns_are_checked_by_every_reader(release, tmp_path, monkeypatch, case):
    """The months of a smoothed release share patterns within its sectors and county x NAICS cells: a copy
    without its sector column was read (the common pattern then served all, other margins silently) by
    tabulate --moe, report, implicates and the server; every reader now refuses it, as it refuses a null,
    a number or an extra row in those columns; audit --release fails it (exit 2)."""
    import pandas as pd

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    assert read_manifest(release)["variance_mode"] == "smoothed"
    edit, message = PATTERN_EDITS[case]
    copy = edited(release, tmp_path, lambda m: None)
    part = copy / "protected.parquet" / "part-44.parquet"
    edit(pd.read_parquet(part)).to_parquet(part, index=False)
    refused_by_every_reader(copy, tmp_path, message, manifest=False)
    assert runner.invoke(app, ["audit", "--release", str(copy)]).exit_code == 2


@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_manifest_holding_a_key_twice_is_refused(release, tmp_path, monkeypatch, where):
    """Python's JSON reader keeps the last of a repeated key: another reader may keep the first (the
    ledger already refused it; the manifest now does too, with the same rule)."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = edited(release, tmp_path, lambda m: None)
    text = (copy / "manifest.json").read_text()
    key = '"gedp_version"' if where == "top" else '"kind"'
    assert text.count(key) == 1
    (copy / "manifest.json").write_text(text.replace(key, f"{key}: null, {key}", 1))
    message = "manifest.json holds a key twice in one object"
    with pytest.raises(InputError, match=message):
        read_manifest(copy)
    result = runner.invoke(app, ["report", str(copy), "--out", str(tmp_path / "report.html")])
    assert result.exit_code == 2 and message in result.output and not (tmp_path / "report.html").exists()


#: The fields the readers did not check (red team of session 21 on int21: each read as any value), each
#: edited as the red team did, and what the refusal names.
RUN_FIELDS = {
    "a created_date that is no date": (lambda m: m.update(created_date="yesterday"), "'created_date' ('yesterday')"),
    "a created_date of month 13": (lambda m: m.update(created_date="2026-13-01"), "'created_date' ('2026-13-01')"),
    "a created_date as a number": (lambda m: m.update(created_date=20261129), "'created_date' (20261129)"),
    "a negative tau": (lambda m: m["tau"].update({"44": -1}), "'tau.44' (-1) must be a number >= 0"),
    "a tau as text": (lambda m: m["tau"].update({"44": "4.6"}), "'tau.44' ('4.6')"),
    "a tau that is a list": (lambda m: m["tau"].update({"44": [4.6]}), "'tau.44' ([4.6])"),
    "tau as a list": (lambda m: m.update(tau=[4.6]), "'tau' must map exactly the states 44"),
    "tau of another state": (lambda m: m.update(tau={"45": 4.6}), "'tau' must map exactly the states 44"),
    "a state's tau as text": (lambda m: m["per_state"]["44"].update(tau="x"), "'per_state.44.tau' ('x')"),
    "integer as text": (lambda m: m.update(integer="yes"), "'integer' ('yes') must be true or false"),
    "integer null": (lambda m: m.update(integer=None), "'integer' (None) must be true or false"),
    "an unknown variance_mode": (lambda m: m.update(variance_mode="bogus"), "'variance_mode' ('bogus') must be one"),
    "a variance_mode that is a number": (lambda m: m.update(variance_mode=5), "'variance_mode' (5) must be one"),
    "a seed as text": (lambda m: m["rng"].update(seed="abc"), "'rng.seed' ('abc') must be a whole number >= 0"),
    "a negative seed": (lambda m: m["rng"].update(seed=-1), "'rng.seed' (-1) must be a whole number >= 0"),
    "a seed that is true": (lambda m: m["rng"].update(seed=True), "'rng.seed' (True) must be a whole number"),
    "an unknown generator": (lambda m: m["rng"].update(kind="bogus"), "'rng' must name a generator"),
    "rng as text": (lambda m: m.update(rng="secure"), "'rng' must name a generator"),
    "an infinite gamma": (lambda m: m["gammas"].update(wage=float("inf")), "'gammas.wage' (inf)"),
    # red team of session 27 (H2): the version is the one manifest text a sheet and a page show
    "a gedp_version with a formula and control characters": (
        lambda m: m.update(gedp_version="=1+1\x1b]0;pwn\x07\x01" + "x" * 40_000), "'gedp_version' ('=1+1\\x1b]0;pwn"),
    "a gedp_version holding markup": (lambda m: m.update(gedp_version="0.1.0<script>"),
                                      "'gedp_version' ('0.1.0<script>')"),
    "a gedp_version as a number": (lambda m: m.update(gedp_version=0.1), "'gedp_version' (0.1) must be a version"),
    "a gamma named with control characters": (lambda m: m["gammas"].update({"x\x1b]0;pwn\x07": 0.5}),
                                              "'gammas' names 'x\\x1b]0;pwn\\x07', which is not an attribute"),
}


@pytest.mark.parametrize("case", list(RUN_FIELDS))
def test_every_field_of_how_a_release_was_computed_is_checked_by_every_reader(release, tmp_path, monkeypatch, case):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = RUN_FIELDS[case]
    refused_by_every_reader(edited(release, tmp_path, edit), tmp_path, message)


def test_the_fields_of_a_genuine_release_are_read(release, panel):
    """What gedp writes passes (power of the rules above): a seeded pnc release (tau > 0, a seed) and a
    panel, each quarter's own fields checked; a psi release's tau is null (tests/test_cli.py)."""
    manifest = read_manifest(release)
    assert manifest["tau"]["44"] > 0 and manifest["rng"]["seed"] >= 0 and manifest["integer"] is False
    assert read_manifest(panel)["per_quarter"]["2016Q2"]["variance_mode"] == manifest["variance_mode"]


def test_a_gedp_version_with_control_characters_is_no_traceback_of_a_workbook(release, tmp_path):
    """Red team of session 27 (H2): the workbook's notes sheet shows the release's gedp_version, and the
    spreadsheet writer raised a 548-line IllegalCharacterError (exit 1) for one holding ESC; refused in one line."""
    copy = edited(release, tmp_path, RUN_FIELDS["a gedp_version with a formula and control characters"][0])
    out = tmp_path / "t.xlsx"
    result = runner.invoke(app, ["tabulate", str(copy), "--agglvl", "51", "--format", "xlsx", "--out", str(out)])
    assert result.exit_code == 2 and "'gedp_version'" in result.output and not out.exists(), result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_the_versions_gedp_writes_are_read():
    """Power of the version rule: versions as Python packages write them pass (a release, a development
    build, a local build), the shown forms of a hostile one do not."""
    from gedp.release.validation import VERSION_PATTERN
    from gedp.release.versions import versions

    for version in (versions()["gedp"], "0.1.0", "1.2.dev3+g1a2b3c4.d20261130", "2!1.0rc1", "0.1.0.post2"):
        assert VERSION_PATTERN.fullmatch(version), version
    for version in ("", "0.1 ", "0.1\n", "=1+1", "0.1<b>", "0.1\x1b", "1" * 65):
        assert not VERSION_PATTERN.fullmatch(version), version


def test_the_readers_variance_modes_and_generators_are_gedps_own():
    from gedp.measure.rng import make_rng
    from gedp.postprocess.wls import RELEASE_VARIANCE_MODES
    from gedp.release.validation import RNG_KINDS, VARIANCE_MODES

    assert set(VARIANCE_MODES) == set(RELEASE_VARIANCE_MODES)
    kinds = {make_rng(seed, kind)[1]["kind"] for seed, kind in ((None, None), (None, "pcg64"), (5, None))}
    assert kinds == set(RNG_KINDS)


#: A panel's own fields and each quarter's, edited, and what the refusal names.
PANEL_RUN_FIELDS = {
    "the panel's created_date": (lambda m: m.update(created_date="2026-02-30"), "'created_date' ('2026-02-30')"),
    "the panel's integer": (lambda m: m.update(integer="no"), "'integer' ('no')"),
    "a quarter's gedp_version": (lambda m: m["per_quarter"]["2016Q2"].update(gedp_version="0.1\x1b[2J"),
                                 "'per_quarter.2016Q2.gedp_version' ('0.1\\x1b[2J')"),
    "a quarter's variance_mode": (lambda m: m["per_quarter"]["2016Q2"].update(variance_mode="bogus"),
                                  "'per_quarter.2016Q2.variance_mode' ('bogus')"),
    "a quarter's seed": (lambda m: m["per_quarter"]["2016Q2"]["rng"].update(seed="abc"),
                         "'per_quarter.2016Q2.rng.seed' ('abc')"),
    "a quarter's tau": (lambda m: m["per_quarter"]["2016Q1"]["tau"].update({"44": -1}),
                        "'per_quarter.2016Q1.tau.44' (-1)"),
}


@pytest.mark.parametrize("case", list(PANEL_RUN_FIELDS))
def test_a_panel_and_each_quarter_state_how_they_were_computed(panel, tmp_path, monkeypatch, case):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    refused_as_a_panel(panel, tmp_path, *PANEL_RUN_FIELDS[case])


@pytest.mark.parametrize("case", ["a seed as text", "a negative tau", "an unknown variance_mode"])
def test_audit_fails_a_release_whose_fields_the_readers_refuse(release, tmp_path, case):
    """gedp audit --release passed some of these (red team): it fails them now, with the readers' words."""
    from gedp.audit.release import audit_release

    edit, message = RUN_FIELDS[case]
    failed = [check for check in audit_release(edited(release, tmp_path, edit)) if not check.passed]
    assert failed and message in str(failed[0])


def forged(folder: Path, tmp_path: Path, factor: float | dict[str, float], name: str = "forged") -> Path:
    """The red team's forgery (session 22, F1): every pnc (non-identity) query's mu times ``factor`` (or its
    attribute's, a mapping) wherever the manifest states it (config, mu, ledgers, totals, privacy; each
    quarter of a panel) and in the measurements' mu column, their sd and answers untouched: a copy whose
    manifest and mu column agree on a budget its noise did not spend."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from gedp.measure.conversions import privacy_statement

    copy = tmp_path / name
    shutil.copytree(folder, copy)

    def scale(attribute: str) -> float:
        return factor[attribute] if isinstance(factor, dict) else factor

    def cut(by_query: dict) -> None:
        for query, by in by_query.items():
            for attribute in by if query != "identity" else ():
                by[attribute] *= scale(attribute)

    def cut_config(m: dict) -> None:
        for query in m["config"]["queries"]:
            if query["by"] != "identity":
                query["mu"].update({attribute: mu * scale(attribute) for attribute, mu in query["mu"].items()})

    def forge(m: dict) -> dict[str, float]:
        cut_config(m)
        cut(m["mu"])
        for entries in [*(section["ledger"] for section in m["per_state"].values()), *m["ledger"].values()]:
            for entry in entries:
                if entry["query"] != "identity":
                    entry["mu"] *= scale(entry["attribute"])
                    entry["mu_planned"] *= scale(entry["attribute"])
        for section in m["per_state"].values():
            cut(section["mu"])
            section["mu_total"] = math.sqrt(math.fsum(entry["mu"] ** 2 for entry in section["ledger"]))
        m["mu_total"] = m["mu_planned_total"] = max(section["mu_total"] for section in m["per_state"].values())
        attributes = {a: math.sqrt(math.fsum(by[a] ** 2 for by in m["mu"].values() if a in by))
                      for a in m["privacy"]["attributes"]}
        m["privacy"] = privacy_statement(m["mu_total"], attributes)
        return attributes

    manifest = json.loads((copy / "manifest.json").read_text())
    if "per_quarter" in manifest:
        spent = [forge(section) for section in manifest["per_quarter"].values()]
        cut_config(manifest)
        count = len(spent)
        manifest["mu_quarter"] = max(section["mu_total"] for section in manifest["per_quarter"].values())
        manifest["mu_total"] = math.sqrt(count) * manifest["mu_quarter"]
        manifest["privacy"] = privacy_statement(manifest["mu_total"], {
            a: math.sqrt(count) * max(attributes[a] for attributes in spent) for a in spent[0]})
    else:
        forge(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    for part in (copy / "measurements.parquet").iterdir():
        table = pq.read_table(part)
        mu = table.column("mu")
        scales = pa.array([scale(attribute) for attribute in table.column("attribute").to_pylist()], pa.float64())
        cut_mu = pc.if_else(pc.equal(table.column("query"), "identity"), mu, pc.multiply(mu, scales))
        pq.write_table(table.set_column(table.schema.get_field_index("mu"), "mu", cut_mu), part)
    return copy


#: How the readers refuse an answer whose sd is not what its stated mu and tau give.
PNC_SD = "pnc sd is not the noise its stated mu and tau give"


def test_a_budget_forged_with_its_noise_kept_is_refused_by_every_reader_of_answers(release, tmp_path, monkeypatch):
    """Red team rt22 F1: with every pnc query's mu halved in the manifest and the mu column (sd and answers
    kept), report, tabulate --moe, serve and read_release().privacy stated mu 1.87 (epsilon 10.15) for a
    release that spent 2.31 (13.08): the manifest alone is consistent, the noise drawn is not its mu's."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = forged(release, tmp_path, 0.5)
    assert read_manifest(copy)["mu_total"] < 0.9 * read_manifest(release)["mu_total"]  # the manifest's rules hold
    refused_by_every_reader(copy, tmp_path, PNC_SD, plain=False)


def test_a_budget_stated_larger_than_spent_is_refused_too(release, tmp_path):
    """The rule is an equality (the noise is exactly its mu's), so an overstated mu is refused as well."""
    from gedp.release.reader import read_measurements

    with pytest.raises(InputError, match=re.escape(PNC_SD)):
        read_measurements(forged(release, tmp_path, 1.01))


def test_a_panel_forged_alike_is_refused(panel, tmp_path, monkeypatch):
    """rt22 F1 on a panel: each quarter forged, claimed mu_total 2.65 for 3.26; tabulate --change --moe exit 0."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = forged(panel, tmp_path, 0.5)
    result = runner.invoke(app, ["tabulate", str(copy), "--change", "2016Q1:2016Q2", "--by", "county", "--moe"])
    assert result.exit_code == 2 and PNC_SD in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(InputError, match=re.escape(PNC_SD)):
        _ = gedp.read_release(copy).privacy
    with pytest.raises(InputError, match=re.escape(PNC_SD)):
        load_releases([copy])


def test_each_pnc_answers_largest_sd_is_that_of_its_states_largest_upper_bound(release, panel):
    """The rule the readers check (from the identity answers alone), on releases as gedp writes them, against
    the mechanism's noise recomputed here group by group from the protected rows' public columns: each
    group's clip level u*_g the largest upper bound psi^-1(omega_j + s_j tau + g_j) of its members, its sd
    the rounded Delta(u*_g) / mu; the largest over the groups is that of the state's largest bound."""
    from gedp.measure.grid import VALUE_GRID, rounded_noise_sd
    from gedp.measure.mechanisms import pnc_released_sensitivity
    from gedp.measure.neighbors import make_psi
    from gedp.measure.queries import Groupings
    from gedp.release.reader import read_measurements, read_quarter

    checked = 0
    for folder, quarter in ((release, None), (panel, "2016Q1"), (panel, "2016Q2")):
        manifest = read_manifest(folder) if quarter is None else read_manifest(folder)["per_quarter"][quarter]
        psi, tau = make_psi(**manifest["psi"]), manifest["tau"]["44"]
        measured, groupings = read_measurements(folder, quarter), Groupings(read_quarter(folder, quarter))
        identity = measured[measured["query"] == "identity"]
        bounds = {attribute: psi.inverse(rows["released"].to_numpy() + rows["sd"].to_numpy() * tau
                                         + rows["grid"].to_numpy())
                  for attribute, rows in identity.groupby("attribute")}
        for (query, attribute), rows in measured[measured["mechanism"] == "pnc"].groupby(["query", "attribute"]):
            clip = groupings(tuple(query.split(","))).max(bounds[attribute])
            mu = float(rows["mu"].iloc[0])
            sd = rounded_noise_sd(pnc_released_sensitivity(clip, psi, manifest["gammas"][attribute]) / mu, VALUE_GRID)
            assert np.allclose(rows["sd"].to_numpy(), sd, rtol=1e-12, atol=0), (query, attribute)
            assert clip.max() == bounds[attribute].max()
            largest = rounded_noise_sd(pnc_released_sensitivity(
                np.array([bounds[attribute].max()]), psi, manifest["gammas"][attribute]) / mu, VALUE_GRID)
            assert rows["sd"].max() == pytest.approx(float(largest[0]), rel=1e-12)
            checked += 1
    assert checked >= 3 * 8


#: How the readers refuse a pnc group's sd that no upper bound's noise over its mu gives (red team rt23 F1).
PNC_GROUP_SD = "pnc sd is not the noise of any upper bound of its attribute over its stated mu"


def _restated(release: Path, tmp_path: Path, how: str) -> Path:
    """Red team rt23 F1: a budget restated so that each pnc answer's LARGEST sd is still what its stated mu
    gives, every sd kept: "zeta" raises zeta to 0.5 (the most a config takes; tau restated as zeta gives
    it), "identity" caps every identity answer at 10 on psi's scale (estimates and variances as the psi
    mechanism gives them); either lowers the state's largest upper bound U to U', and each pnc query's mu
    is cut by Delta(U') / Delta(U) of its attribute (``forged``)."""
    import pandas as pd

    from gedp.measure.mechanisms import pnc_released_sensitivity, pnc_tau
    from gedp.measure.neighbors import make_psi

    manifest = json.loads((release / "manifest.json").read_text())
    (part,) = (release / "measurements.parquet").glob("*.parquet")
    frame = pd.read_parquet(part)
    identity = (frame["query"] == "identity").to_numpy()
    psi, tau = make_psi(**manifest["psi"]), manifest["tau"]["44"]
    released, sd = frame["released"].to_numpy().copy(), frame["sd"].to_numpy()
    if how == "zeta":
        zeta = 0.5
        restated_tau = pnc_tau(zeta, int(identity.sum()))
    else:
        restated_tau = tau
        cap = np.floor(10 / frame["grid"].to_numpy()) * frame["grid"].to_numpy()
        released = np.where(identity, np.minimum(released, cap), released)
    factors = {}
    for attribute in frame.loc[identity, "attribute"].unique():
        rows = identity & (frame["attribute"] == attribute).to_numpy()
        largest = [psi.inverse(values[rows] + sd[rows] * t + frame["grid"].to_numpy()[rows]).max()
                   for values, t in ((frame["released"].to_numpy(), tau), (released, restated_tau))]
        before, after = pnc_released_sensitivity(np.array(largest), psi, manifest["gammas"][attribute])
        factors[attribute] = float(after / before)
    assert max(factors.values()) < 1  # a lower budget is claimed
    copy = forged(release, tmp_path, factors, name=how)
    claimed = json.loads((copy / "manifest.json").read_text())
    if how == "zeta":
        claimed.update(zeta=zeta, zeta_per_state=zeta)
        claimed["config"]["zeta"] = claimed["per_state"]["44"]["zeta"] = zeta
        claimed["tau"]["44"] = claimed["per_state"]["44"]["tau"] = restated_tau
        (copy / "manifest.json").write_text(json.dumps(claimed))
    else:
        (copied,) = (copy / "measurements.parquet").glob("*.parquet")
        edited_frame = pd.read_parquet(copied)
        edited_frame["released"] = released
        estimate = psi.unbiased_estimate(released[identity], sd[identity])
        edited_frame.loc[identity, "estimate"] = estimate
        edited_frame.loc[identity, "variance"] = psi.releasable_variance(estimate, sd[identity])
        edited_frame.to_parquet(copied, index=False)
    return copy


@pytest.mark.parametrize("how", ["zeta", "identity"])
def test_a_budget_restated_through_tau_or_the_identity_answers_is_refused(release, tmp_path, monkeypatch, how):
    """Red team rt23 F1: each answer's largest sd fits the restated mu (the check of rt22 F1 passes: the
    refusal is the group rule's), but the answers' other groups drew the noise of bounds the restated
    tau or answers no longer give; the red team's copies claimed mu 2.2800 (zeta) and 1.9171 (identity
    answers) for a release that spent 2.3063, every reader exit 0."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = _restated(release, tmp_path, how)
    assert read_manifest(copy)["mu_total"] < read_manifest(release)["mu_total"]  # the manifest's rules hold
    refused_by_every_reader(copy, tmp_path, PNC_GROUP_SD, plain=False)



def _bounds_moved(release: Path, tmp_path: Path, factor: float, below: bool) -> Path:
    """Red team rt24 F1: every pnc query's mu times ``factor`` (``forged``), every pnc sd and answer kept, and
    each identity answer's upper bound u = psi^-1(omega + sd tau + grid) moved to u' with Delta(u') = factor
    Delta(u): omega moved on its grid, the remainder taken up by the row's own sd (``below``: the sd at most
    the mechanism's, else at least), estimates and variances as the psi mechanism gives them. Each pnc group's
    sd is then the noise of the same bound's Delta(u') over the restated mu."""
    import pandas as pd

    from gedp.measure.mechanisms import pnc_released_sensitivity
    from gedp.measure.neighbors import make_psi

    copy = forged(release, tmp_path, factor, name="bounds")
    manifest = json.loads((copy / "manifest.json").read_text())
    psi, tau = make_psi(**manifest["psi"]), manifest["tau"]["44"]
    (part,) = (copy / "measurements.parquet").glob("*.parquet")
    frame = pd.read_parquet(part)
    for attribute in frame.loc[frame["query"] == "identity", "attribute"].unique():
        rows = ((frame["query"] == "identity") & (frame["attribute"] == attribute)).to_numpy()
        released, sd, grid = (frame.loc[rows, name].to_numpy() for name in ("released", "sd", "grid"))
        gamma = manifest["gammas"][attribute]
        bound = psi.inverse(released + sd * tau + grid)
        wanted = factor * pnc_released_sensitivity(bound, psi, gamma)
        low, high = np.zeros_like(bound), bound.copy()
        for _ in range(200):  # bisection: Delta(u') = wanted (Delta increases with u)
            middle = (low + high) / 2
            above = pnc_released_sensitivity(middle, psi, gamma) > wanted
            high, low = np.where(above, middle, high), np.where(above, low, middle)
        level = psi(np.where(bound > 0, high, bound)) - grid
        moved = (np.ceil if below else np.floor)((level - sd * tau) / grid) * grid
        moved_sd = (level - moved) / tau
        estimate = psi.unbiased_estimate(moved, moved_sd)
        frame.loc[rows, "released"], frame.loc[rows, "sd"] = moved, moved_sd
        frame.loc[rows, "estimate"], frame.loc[rows, "variance"] = estimate, psi.releasable_variance(estimate, moved_sd)
    frame.to_parquet(part, index=False)
    return copy


@pytest.mark.parametrize("below", [True, False], ids=["sds below the mechanism's", "sds above"])
def test_a_budget_restated_through_the_identity_bounds_is_refused(release, tmp_path, monkeypatch, below):
    """Red team rt24 F1: every pnc group's sd matches the restated mu (rt23 F1's group rule holds: each group's
    bound moved alike), every pnc query's mu claimed at a twentieth of what it spent; the identity answers'
    sds, nudged row by row, are what no psi mechanism draws (one sd per answer, between the noise of
    (gamma + grid) / mu and the float error's). The red team's copy (2,000 establishments) claimed mu 1.7035
    (epsilon 9.07) for a release that spent 2.3063 (13.08), every reader exit 0."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = _bounds_moved(release, tmp_path, 0.05, below)
    assert read_manifest(copy)["mu_total"] < 0.9 * read_manifest(release)["mu_total"]  # the manifest's rules hold
    refused_by_every_reader(copy, tmp_path, "sd is below the psi mechanism's (gamma + grid) / mu" if below else
                            "sd is above the psi mechanism's (gamma + grid + float error) / mu", plain=False)


def test_the_identity_bounds_moved_with_the_pnc_checks_alone_are_read(release, tmp_path, monkeypatch, unresolved):
    """Power of the test above: the same copy passes the pnc checks (largest sd and groups) as they stand, so
    its refusal is the psi sd rule's, not theirs."""
    from gedp.release import measurement_checks
    from gedp.release.reader import read_answers

    monkeypatch.setattr(measurement_checks, "_check_psi_sd", lambda *arguments: None)
    monkeypatch.setattr(measurement_checks, "_check_noise", lambda *arguments: None)
    copy = _bounds_moved(release, tmp_path, 0.05, below=True)
    assert read_answers(copy)

def _tau_times(factor: float):
    def edit(manifest: dict) -> None:  # the release's and the state's, consistently
        manifest["tau"]["44"] = manifest["per_state"]["44"]["tau"] = manifest["tau"]["44"] * factor
    return edit


def _zeta(value: float, tau: bool = False):
    def edit(manifest: dict) -> None:  # zeta, its share per state and the state's, consistently (``tau``: and tau)
        from gedp.measure.mechanisms import pnc_tau

        manifest.update(zeta=value, zeta_per_state=value)
        manifest["per_state"]["44"]["zeta"] = value
        if tau:  # one bound per identity answer: each attribute's, one per establishment
            bounds = len(manifest["mu"]["identity"]) * manifest["establishments"]
            manifest["tau"]["44"] = manifest["per_state"]["44"]["tau"] = pnc_tau(value, bounds)
    return edit


#: tau and zeta edited (red team rt22 F7: the top-level ones were read by tabulate --moe, report and
#: implicates), and what the refusal names.
TAU_ZETA = {
    "tau 1% larger": (_tau_times(1.01), "tau of state 44 is not the one its zeta_per_state gives"),
    "tau 1e300": (_tau_times(1e300 / 5), "tau of state 44 is not the one its zeta_per_state gives"),
    "zeta 0.4": (_zeta(0.4), "tau of state 44 is not the one its zeta_per_state gives"),
    "zeta alone": (lambda m: m.update(zeta=0.4), "zeta_per_state is not 1 - (1 - zeta)^(1/1) of its zeta"),
    # red team rt23 F4: zeta 0.6 (tau restated alike) was read; a config takes zeta in [1e-12, 0.5] only
    "zeta 0.6": (_zeta(0.6, tau=True), "zeta is not in [1e-12, 0.5], where a config's zeta lies"),
}


@pytest.mark.parametrize("case", list(TAU_ZETA))
def test_tau_and_zeta_other_than_the_noises_are_refused(release, tmp_path, monkeypatch, case):
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    edit, message = TAU_ZETA[case]
    refused_by_every_reader(edited(release, tmp_path, edit), tmp_path, message, plain=False)


#: A state's section stating a tau or zeta other than the release's (rt22 F7; harden23 item 2: null or
#: missing), each read with exit 0 by the readers before (only the audit failed it).
STATE_TAU_ZETA = {
    "tau 1e300": lambda m: m["per_state"]["44"].update(tau=1e300),
    "zeta 0.4": lambda m: m["per_state"]["44"].update(zeta=0.4),
    "tau null": lambda m: m["per_state"]["44"].update(tau=None),
    "tau missing": lambda m: m["per_state"]["44"].pop("tau"),
    "zeta missing": lambda m: m["per_state"]["44"].pop("zeta"),
}
#: How the readers refuse it.
STATE_TAU_ZETA_RULE = "'per_state.44' must state the release's tau.44 and zeta_per_state as its tau and zeta"


@pytest.mark.parametrize("case", list(STATE_TAU_ZETA))
def test_a_states_tau_or_zeta_other_than_the_releases_is_refused_and_fails_the_audit(release, tmp_path,
                                                                                     monkeypatch, case):
    """rt22 F7: per_state.44.tau 1e300 or zeta 0.4 passed all 12 checks (no reader uses them: each reads the
    release's tau and zeta_per_state); harden23 item 2: a null or missing one was read by every reader with
    exit 0. Every reader refuses it now (tabulate, --moe, report, implicates, serve, the API), and the audit
    fails it with the readers' words."""
    from gedp.audit.release import audit_release

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = edited(release, tmp_path, STATE_TAU_ZETA[case])
    refused_by_every_reader(copy, tmp_path, STATE_TAU_ZETA_RULE)
    with pytest.raises(InputError, match=re.escape(STATE_TAU_ZETA_RULE)):
        gedp.read_release(copy).tabulate("county")
    failed = {check.name: check.detail for check in audit_release(copy) if not check.passed}
    assert list(failed) == ["manifest"] and STATE_TAU_ZETA_RULE in failed["manifest"]


def test_a_panel_quarters_state_tau_is_checked_alike(panel, tmp_path, monkeypatch):
    """harden23 item 2 on a panel: a quarter's state section with a null tau is refused by its readers."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    refused_as_a_panel(panel, tmp_path, lambda m: m["per_quarter"]["2016Q2"]["per_state"]["44"].update(tau=None),
                       "'per_quarter.2016Q2.per_state.44' must state the release's tau.44")


@pytest.fixture(scope="module")
def publishable_panel(tmp_path_factory) -> Path:
    """A publishable panel release (the secure generator) of 200 establishments over 2016Q1 and 2016Q2."""
    from gedp.synth.panel import quarter_range, synthesize_panel
    from gedp.synth.profiles import generate_profile, load_profile

    first = generate_profile(load_profile("small"), n_establishments=200, rng=np.random.default_rng(7))
    quarters = synthesize_panel(first, quarter_range("2016Q1:2016Q2"), rng=np.random.default_rng(7))
    folder = tmp_path_factory.mktemp("publishable-panel") / "release"
    gedp.protect(quarters, allow_over_cap=True).write(folder)
    return folder


def test_audit_of_a_publishable_panel_gives_its_verdicts(publishable_panel, tmp_path):
    """Red team rt22 F3: gedp audit --release crashed on every publishable panel (KeyError 'rng': a panel's
    manifest states no generator, each quarter its own). Its verdicts now: every check passed, exit 0; the
    F1 forgery of it fails its pnc variances, exit 2."""
    from gedp.audit.release import audit_release

    assert read_manifest(publishable_panel)["publishable"] is True
    checks = audit_release(publishable_panel)
    assert {check.name for check in checks} >= {"no seed", "pnc variances", "tau and zeta"}
    assert all(check.passed for check in checks), [check for check in checks if not check.passed]
    assert runner.invoke(app, ["audit", "--release", str(publishable_panel)]).exit_code == 0
    copy = forged(publishable_panel, tmp_path, 0.5)
    result = runner.invoke(app, ["audit", "--release", str(copy)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert [check.name for check in audit_release(copy) if not check.passed] == ["pnc variances"]


def test_a_seed_in_a_quarter_of_a_publishable_panel_fails_its_audit(publishable_panel, tmp_path):
    from gedp.audit.release import check_no_seed

    manifest = json.loads((publishable_panel / "manifest.json").read_text())
    assert check_no_seed(manifest, []) == []
    manifest["per_quarter"]["2016Q2"]["rng"]["seed"] = 5
    assert check_no_seed(manifest, []) and check_no_seed(manifest["per_quarter"]["2016Q2"], [])


def test_a_quarter_published_otherwise_than_its_panel_is_refused(publishable_panel, tmp_path, monkeypatch):
    """Red team rt22 F9: a quarter stating publishable false inside a publishable panel was read."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    refused_as_a_panel(publishable_panel, tmp_path, lambda m: m["per_quarter"]["2016Q2"].update(publishable=False),
                       "'per_quarter.2016Q2.publishable' is not the panel's")


# --- the API's tabulate and write (red team of session 22, F5) ----------------------------------------
def test_the_apis_workbook_inside_the_release_read_is_refused(release, tmp_path):
    """`Release.tabulate(format="xlsx", out=<inside the release>)` wrote the workbook into the release
    (the CLI and gedp.report refused): now refused as they refuse it, nothing written; beside it, written."""
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    before = _files(copy)
    for out in (copy / "protected.parquet" / "part-44.xlsx", copy / "b.xlsx"):
        with pytest.raises(InputError, match="is inside the release"):
            gedp.read_release(copy).tabulate(agglvl=75, format="xlsx", out=out)
    assert _files(copy) == before
    gedp.read_release(copy).tabulate(agglvl=75, format="xlsx", out=tmp_path / "b.xlsx")
    assert (tmp_path / "b.xlsx").stat().st_size > 0


@pytest.mark.parametrize("format_", ["table", "qcew"])
def test_an_out_the_format_does_not_write_is_refused(release, tmp_path, format_):
    """out was silently ignored for format "table" (no file, no error)."""
    level = {"agglvl": 75} if format_ == "qcew" else {}
    with pytest.raises(InputError, match="out is the workbook of format 'xlsx'"):
        gedp.read_release(release).tabulate(by="county", format=format_, out=tmp_path / "x.csv", **level)
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("by", [None, 5, b"county", ["county", 3], {"county": 1}.keys()])
def test_a_by_that_is_not_column_names_is_an_input_error(release, by):
    """by=None, 5, b'county' raised TypeError; now the API's documented error in one line."""
    with pytest.raises(InputError, match="by must be column names") as refused:
        gedp.read_release(release).tabulate(by=by)
    assert "\n" not in str(refused.value)


def test_by_as_a_string_or_a_list_is_read(release):
    """Power: the forms the API documents tabulate alike."""
    tables = [gedp.read_release(release).tabulate(by=by) for by in ("county", ["county"], ("county",))]
    assert all(table.equals(tables[0]) for table in tables) and len(tables[0]) > 1


def test_a_release_written_inside_another_is_refused(release, tmp_path, small_state):
    """`gedp protect --out <release>/sub` and `Release.write(<release>/sub)` put one release inside
    another (published with it, and refused by its audit's files check); refused now, nothing written.
    Writing beside the release, or replacing it, still works."""
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    before = _files(copy)
    source = tmp_path / "in.csv"
    small_state.head(300).to_csv(source, index=False)
    for out in (copy / "sub", copy / "protected.parquet" / "sub", copy / "sub" / "deeper"):
        result = runner.invoke(app, ["protect", str(source), "--config", "employment", "--out", str(out),
                                     "--not-for-publication", "--seed", "1"])
        assert result.exit_code == 2 and "is inside the gedp release" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        with pytest.raises(InputError, match="is inside the gedp release"):
            gedp.read_release(release).write(out)
    assert _files(copy) == before
    assert gedp.read_release(release).write(tmp_path / "beside") == (tmp_path / "beside").resolve()
    gedp.read_release(release).write(copy)  # an earlier release at out is replaced, as before
    assert _files(copy) == before


@pytest.mark.parametrize("moe", ["no", 1, None])
def test_the_apis_moe_other_than_a_boolean_is_refused(release, moe):
    """Red team rt23 F5: `Release.tabulate(moe="no")` gave margins of error (any true value was taken)."""
    with pytest.raises(InputError, match="moe must be True or False"):
        gedp.read_release(release).tabulate(by="county", moe=moe)
    assert "m1emp_moe" in gedp.read_release(release).tabulate(by="county", moe=np.bool_(True)).columns


@pytest.mark.parametrize("option", [["--change", "2016Q1:2016Q2"], ["--gains-losses", "2016Q1:2016Q2"]])
def test_a_size_class_table_of_a_change_says_it_is_of_one_quarter(panel, option):
    """Red team rt23 F6: `tabulate PANEL --change Q1:Q2 --by size_class` said "give a quarter (or a change)"
    though a change was given (the server says a size-class table is of one quarter)."""
    result = runner.invoke(app, ["tabulate", str(panel), *option, "--by", "size_class"])
    assert result.exit_code == 2 and "a size-class table is of one quarter" in result.output, result.output


@pytest.mark.parametrize("format_", ["qcew", "xlsx"])
def test_a_table_ready_to_publish_states_no_forged_budget(release, tmp_path, monkeypatch, format_):
    """harden23 item 1: gedp tabulate --format qcew / xlsx (and the API's xlsx workbook) wrote the manifest's
    mu and epsilon into their notes without reading the answers, so the rt22 F1 forgery (mu 1.87 stated for
    2.31 spent) was restated with exit 0. They state only what the answers confirmed: refused, nothing written."""
    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = forged(release, tmp_path, 0.5)
    out = tmp_path / f"t.{'csv' if format_ == 'qcew' else 'xlsx'}"
    result = runner.invoke(app, ["tabulate", str(copy), "--agglvl", "71", "--format", format_, "--out", str(out)])
    assert result.exit_code == 2 and PNC_SD in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists() and not out.with_name(out.name + ".json").exists()
    if format_ == "xlsx":
        with pytest.raises(InputError, match=re.escape(PNC_SD)):
            gedp.read_release(copy).tabulate(agglvl=71, format="xlsx", out=tmp_path / "api.xlsx")
        assert not (tmp_path / "api.xlsx").exists()
    genuine = tmp_path / f"genuine.{out.suffix[1:]}"  # the release itself: written, its stated mu in the notes
    result = runner.invoke(app, ["tabulate", str(release), "--agglvl", "71", "--format", format_, "--out",
                                 str(genuine)])
    assert result.exit_code == 0, result.output
    notes = json.loads(genuine.with_name(genuine.name + ".json").read_text())["notes"]
    assert f"mu {read_manifest(release)['mu_total']:.4f} (" in notes["Privacy guarantee"]


def _panel_with_jobs(panel: Path, tmp_path: Path, where: str) -> Path:
    """A copy of ``panel`` holding a job frame gedp never writes for a panel: each quarter's part one
    job per month-1 employee of family worker (sex 1), the family stated in the manifest (``where``:
    the panel's ``jobs``, or a quarter's)."""
    import pandas as pd

    copy = tmp_path / "panel-jobs"
    shutil.copytree(panel, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    section = {"file": "protected_jobs.parquet", "adds_up_to": "m1emp",
               "families": {"worker": {"columns": ["sex"], "categories": 2}}}
    if where == "panel":
        manifest["jobs"] = section
        manifest["files"]["jobs"] = "protected_jobs.parquet"
    else:
        manifest["per_quarter"]["2016Q2"]["jobs"] = section
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "protected_jobs.parquet").mkdir()
    for part in sorted((copy / "protected.parquet").iterdir()):
        rows = pd.read_parquet(part).query("m1emp > 0")
        pd.DataFrame({"estab_id": rows["estab_id"].astype(str), "family": "worker", "sex": "1",
                      "jobs": rows["m1emp"].astype(float)}).to_parquet(copy / "protected_jobs.parquet" / part.name)
    return copy


@pytest.mark.parametrize("where", ["panel", "a quarter"])
def test_a_panel_stating_a_job_frame_is_refused_by_every_reader(panel, tmp_path, monkeypatch, where):
    """harden23 item 7: gedp protect refuses a job table with a panel, so no genuine panel holds a job frame;
    one that states it was read: Release.jobs and gedp audit --release crashed with a traceback
    (InvalidIndexError: the panel's ids repeat over its quarters), tabulate by a quarter exit 0. Every
    reader refuses it now in one line, exit 2; the audit fails its manifest with the readers' words."""
    from gedp.audit.release import audit_release

    monkeypatch.setenv("GEDP_CACHE_DIR", str(tmp_path / "cache"))
    copy = _panel_with_jobs(panel, tmp_path, where)
    field = "'jobs'" if where == "panel" else "'per_quarter.2016Q2.jobs'"
    message = f"{field} states a job frame, which no panel release holds"
    for request in (["tabulate", str(copy), "--by", "county", "--quarter", "2016Q1"],
                    ["tabulate", str(copy), "--by", "county,sex", "--quarter", "2016Q2", "--moe"],
                    ["implicates", str(copy), "--quarter", "2016Q1", "--out", str(tmp_path / "imp"), "--n", "2"]):
        result = runner.invoke(app, request)
        assert result.exit_code == 2 and message in result.output, (request, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
    with pytest.raises(InputError, match=re.escape(message)):
        _ = gedp.read_release(copy).jobs
    with pytest.raises(InputError, match=re.escape(message)):
        load_releases([copy])
    failed = {check.name: check.detail for check in audit_release(copy) if not check.passed}
    assert list(failed) == ["manifest"] and message in failed["manifest"]
    result = runner.invoke(app, ["audit", "--release", str(copy)])
    assert result.exit_code == 2 and "Traceback" not in result.output
