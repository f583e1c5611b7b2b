"""What a release claims, checked by every reader before it is stated or used, and what a reader writes
(red team of session 21 on main 17c076e): the budget a manifest states against its ledgers (F3), its
solver section (F4), no output inside the release read (F5), no public code gedp does not write (F9)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

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


def refused_by_every_reader(copy: Path, tmp_path: Path, message: str, manifest: bool = True) -> None:
    """tabulate (with and without margins), report, implicates, the server's loader and (an edited
    ``manifest``) the API's privacy statement each refuse ``copy`` in one line naming ``message``, exit 2,
    nothing written."""
    for request in (["tabulate", str(copy), "--by", "county", "--out", str(tmp_path / "t.csv")],
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
