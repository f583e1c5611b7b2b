"""The documentation: the site builds in strict mode, and every code block of README.md and docs/ runs.

A fenced block is run when its language is python, bash or console (``$ `` lines of a console block
are its commands). Blocks of one page run in order, in one temporary folder that already holds a
small synthetic state (``state.parquet``, 2,000 establishments), a release of it (``gedp-release``)
and that release's QCEW tables as a stand-in for a BLS file (``qcew.csv``). A block that must not
run (a download, an install, a cluster address) is preceded by the line ``<!-- not run: REASON -->``.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "reports" not in p.parts)]
RUN_LANGUAGES = {"python", "bash", "console"}
NOT_RUN = re.compile(r"<!-- not run: \S.* -->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
#: Blocks marked not to run, over every page: they must stay few.
MAX_NOT_RUN = 8


def code_blocks(page: Path) -> list[tuple[str, str, bool]]:
    """(language, code, marked not to run) of every fenced block of a page, in page order."""
    text = page.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1]
        code = textwrap.dedent(match.group("body"))
        blocks.append((match.group("lang"), code, bool(NOT_RUN.fullmatch(before.strip()))))
    return blocks


def runnable(page: Path) -> list[tuple[str, str]]:
    return [(lang, code) for lang, code, skip in code_blocks(page) if lang in RUN_LANGUAGES and not skip]


def command_env() -> dict[str, str]:
    """This interpreter's scripts (gedp, mkdocs) first on PATH; no terminal-width wrapping."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NO_MKDOCS_2_WARNING"] = "1"
    env["COLUMNS"] = "200"
    return env


def run_block(lang: str, code: str, folder: Path) -> None:
    if lang == "python":
        argv = [sys.executable, "-c", code]
    elif lang == "console":
        commands = [line[2:] for line in code.splitlines() if line.startswith("$ ")]
        argv = ["bash", "-euo", "pipefail", "-c", "\n".join(commands)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    done = subprocess.run(argv, cwd=folder, env=command_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"block failed ({done.returncode}):\n{code}\n--- stderr:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic state, a release of it, and its QCEW tables as a BLS-layout file."""
    import gedp

    folder = tmp_path_factory.mktemp("docs-workspace")
    gedp.synthesize(profile="small", establishments=2000, seed=1).to_parquet(folder / "state.parquet")
    release = gedp.protect(folder / "state.parquet", seed=1, not_for_publication=True)
    release.write(folder / "gedp-release")
    shutil.copy(folder / "gedp-release" / "qcew_tables.csv", folder / "qcew.csv")
    return folder


def test_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path)],
                          cwd=ROOT, env=command_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cli_page = (tmp_path / "reference" / "cli" / "index.html").read_text()
    for command in ("run", "synth", "protect", "tabulate", "evaluate", "interval", "ledger"):
        assert f"gedp {command}" in cli_page, f"the generated CLI reference lacks 'gedp {command}'"
    assert "def protect" not in cli_page
    assert "read_release" in (tmp_path / "reference" / "api" / "index.html").read_text()


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page: Path, workspace: Path, tmp_path: Path) -> None:
    folder = tmp_path / "page"
    shutil.copytree(workspace, folder)
    for lang, code in runnable(page):
        run_block(lang, code, folder)


def test_blocks_not_run_are_few_and_say_why() -> None:
    marked = [(page, code) for page in PAGES for _, code, skip in code_blocks(page) if skip]
    assert len(marked) <= MAX_NOT_RUN, f"{len(marked)} blocks are marked not to run (at most {MAX_NOT_RUN})"
    for page in PAGES:
        for line in page.read_text().splitlines():
            if line.strip().startswith("<!-- not run"):
                assert NOT_RUN.fullmatch(line.strip()), f"{page.name}: a not-run marker needs a reason: {line}"


def test_readme_starts_with_the_two_commands_and_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150)"
    first_block = code_blocks(ROOT / "README.md")[0]
    assert first_block[1].splitlines() == ['python3 -m pip install . && gedp run',
                                           'python3 -m pip install -e ".[test]" && python3 -m pytest']


def test_no_page_refers_to_the_specification_or_issues() -> None:
    pattern = re.compile(r"\bSPEC\b|\b[Ii]ssues?(\s+#?\d+|'s)|\b[Ss]essions?\b")
    for page in [*PAGES, *DOCS.glob("reports/*/report.md")]:
        found = pattern.search(page.read_text())
        assert found is None, f"{page.relative_to(ROOT)} refers to {found.group(0)!r}"


def gdp_delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP (Dong, Roth and Su 2022, Corollary 2.13)."""
    return float(norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def test_stated_budget_is_the_recommended_plans_and_its_epsilon_at_the_one_stated_delta() -> None:
    """The recommended plan's total (from its YAML: sqrt of the sum of every mu^2) and its epsilon at
    delta 1e-6 (root finding) as the pages state them, and every epsilon the pages state at 1e-6."""
    import yaml

    from gedp.measure.conversions import STATED_DELTA

    raw = yaml.safe_load((ROOT / "configs" / "recommended.yaml").read_text())
    mu = float(np.sqrt(sum(value**2 for query in raw["queries"] for value in query["mu"].values())))
    eps = brentq(lambda e: gdp_delta(e, mu) - 1e-6, 0.0, 100.0)
    assert STATED_DELTA == 1e-6
    for page in (ROOT / "README.md", DOCS / "method" / "privacy-model.md", DOCS / "how-to" / "plan-budget.md"):
        text = " ".join(page.read_text().split())
        assert f"mu {mu:.4f}" in text, f"{page.name} should state the recommended plan's mu {mu:.4f}"
        assert re.search(rf"epsilon {eps:.2f} at delta 1e-6", text), f"{page.name} should state epsilon {eps:.2f}"
    statement = re.compile(r"(?:epsilon|eps)[ =]+[0-9.]+ at delta[ =]+([0-9e.-]+)|\([0-9.]+, (1e-[0-9]+)\)-DP")
    for page in PAGES:
        for match in statement.finditer(" ".join(page.read_text().split())):
            assert (match.group(1) or match.group(2)) == "1e-6", f"{page.name}: {match.group(0)}"


def test_the_api_page_documents_every_public_name() -> None:
    import gedp

    page = (DOCS / "reference" / "api.md").read_text()
    for name in set(gedp.__all__) - {"__version__"}:
        assert f"::: gedp.api.{name}\n" in page and f"`gedp.{name}`" in page, f"api.md omits gedp.{name}"


def test_release_format_lists_every_manifest_key(workspace: Path) -> None:
    manifest = json.loads((workspace / "gedp-release" / "manifest.json").read_text())
    page = (DOCS / "reference" / "release-format.md").read_text()
    missing = [key for key in manifest if f"`{key}`" not in page]
    assert not missing, f"reference/release-format.md does not describe manifest keys {missing}"
