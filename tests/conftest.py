"""Shared fixtures: small synthetic states and the path of the shared public QCEW data."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gedp.synth.profiles import generate_profile, load_profile

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _receive_ctrl_c() -> None:
    """Let the suite's processes and their children receive Ctrl-C when the suite was started with it
    ignored (a background job of a shell without job control): gedp keeps an inherited ignored SIGINT,
    so the stop tests' child processes would never see the Ctrl-C they are sent."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_receive_ctrl_c()


def restate_pnc_noise(folder: Path) -> None:
    """After a test's edit of a one-state release's identity answers (``folder``'s measurements part):
    each pnc group's noise sd restated as the pnc mechanism would have drawn it under the edited answers'
    upper bounds: rounded_noise_sd(Delta(u*_g) / mu), u*_g the largest psi^-1(released + sd tau + grid)
    of the group's members (their public columns those of the protected rows), variances sd^2 (readers
    tie every group's sd to one bound's noise, each answer's largest to the state's largest bound), and
    each group's value drawn again at that sd around its protected rows' sum (readers hold nested
    answers' spread to their stated noise: ``release.nesting_checks``). The tests that edit answers test
    the postprocessing, not the budget's check."""
    import json

    import pandas as pd

    from gedp.measure.grid import VALUE_GRID, rounded_noise_sd
    from gedp.measure.mechanisms import pnc_released_sensitivity
    from gedp.measure.neighbors import make_psi

    manifest = json.loads((folder / "manifest.json").read_text())
    (state,) = manifest["states"]
    (part,) = (folder / "measurements.parquet").glob("*.parquet")
    frame = pd.read_parquet(part)
    public = pd.read_parquet(folder / "protected.parquet").set_index("estab_id")
    psi, tau = make_psi(**manifest["psi"]), float(manifest["tau"][state])
    identity = (frame["query"] == "identity").to_numpy()
    noise = np.random.default_rng(0)
    with np.errstate(all="ignore"):
        bounds = psi.inverse(frame["released"].to_numpy() + frame["sd"].to_numpy() * tau + frame["grid"].to_numpy())
    for (query, attribute), rows in frame[~identity].groupby(["query", "attribute"]).groups.items():
        keys = [] if query == "total" else str(query).split(",")
        mine = identity & (frame["attribute"] == attribute).to_numpy()
        members = public.loc[frame.loc[mine, "estab_id"], keys].assign(bound=bounds[mine])
        clip = members.groupby(keys)["bound"].max() if keys else pd.Series([members["bound"].max()])
        answers = frame.loc[rows, keys]
        levels = (clip.reindex(pd.MultiIndex.from_frame(answers)) if len(keys) > 1 else
                  clip.reindex(answers[keys[0]]) if keys else clip.reindex([0] * len(rows)))
        gamma = float(manifest["gammas"][str(attribute).split("[", 1)[0]])
        mu = float(frame.loc[rows[0], "mu"])
        sensitivity = pnc_released_sensitivity(levels.to_numpy(dtype=float), psi, gamma)
        restated = np.where(sensitivity == 0, 0.0, rounded_noise_sd(sensitivity / mu, VALUE_GRID))
        frame.loc[rows, "sd"] = restated
        frame.loc[rows, "variance"] = restated * restated
        totals = public.groupby(keys)[attribute].sum() if keys else pd.Series([public[attribute].sum()])
        sums = (totals.reindex(pd.MultiIndex.from_frame(answers)) if len(keys) > 1 else
                totals.reindex(answers[keys[0]]) if keys else totals.reindex([0] * len(rows)))
        drawn = np.where(restated == 0, 0.0, sums.to_numpy(dtype=float) + restated * noise.standard_normal(len(rows)))
        frame.loc[rows, ["released", "estimate"]] = np.column_stack([np.round(drawn / VALUE_GRID) * VALUE_GRID] * 2)
    frame.to_parquet(part, index=False)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Workers for ``-n auto`` (pyproject's addopts): none when one test file is named, which would go
    to a single worker anyway (``python3 -m pytest tests/test_x.py`` starts no worker processes);
    otherwise pytest-xdist's count of cores."""
    named = [arg.split("::")[0] for arg in config.args]
    return 0 if len(named) == 1 and Path(named[0]).is_file() else None


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """A loader of a script of benchmarks/ as a module (its folder importable while it loads, for the
    scripts that import one another), for tests of the scripts' functions."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(folder))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(folder))
        return module

    return load


@pytest.fixture(scope="session")
def small_state():
    """The small profile rescaled to 1,500 establishments (fixed seed): fast end-to-end solves."""
    return generate_profile(load_profile("small"), n_establishments=1_500, rng=np.random.default_rng(7))


@pytest.fixture(scope="session")
def synthesized(shared_data) -> Callable[[str], pd.DataFrame]:
    """A function ``state code -> microdata``: the state synthesized from its 2016 Q1 QCEW file
    (realistic sizes, seed 1), made once for the session's process (Rhode Island's costs about 2.5 s of
    processor time, New Jersey's 5.7 s; test_accuracy, test_months, test_qcew, test_suppression and
    test_wages use them); each call returns a copy."""
    from functools import cache

    from gedp.synth.establishments import synthesize_state
    from gedp.synth.qcew import read_qcew

    @cache
    def synthesized_once(code: str) -> pd.DataFrame:
        return synthesize_state(read_qcew(shared_data / f"qcew_2016q1_{code}.csv"), rng=np.random.default_rng(1))

    return lambda code: synthesized_once(code).copy()


@pytest.fixture(scope="session")
def baseline_release(small_state):
    """A baseline release of the small state (seed 5, not for publication), made once for the session's
    process (test_wages, test_cell_margins, test_rate_tails and the fixtures below read it; none changes
    it)."""
    import gedp

    return gedp.protect(small_state, "baseline", seed=5, not_for_publication=True)


@pytest.fixture(scope="session")
def recommended_release(small_state):
    """The small state under the default plan (seed 1, not for publication), made once for the session's
    process: tests write copies of it (``Release.write``) and tabulate it; none changes it."""
    import gedp

    return gedp.protect(small_state, seed=1, not_for_publication=True)


@pytest.fixture(scope="session")
def small_panel_release(tmp_path_factory) -> Path:
    """A release of two quarters (2016Q1 and 2016Q2) of a 300-establishment small state, made with the
    command line once a session (seed 1, not for publication): tests read it and write beside it."""
    from typer.testing import CliRunner

    from gedp.cli import app

    folder = tmp_path_factory.mktemp("small-panel")
    panel, release = folder / "panel.parquet", folder / "panel-release"
    runner = CliRunner()
    assert runner.invoke(app, ["synth", "--profile", "small", "--establishments", "300", "--quarters",
                               "2016Q1:2016Q2", "--out", str(panel)]).exit_code == 0
    assert runner.invoke(app, ["protect", str(panel), "--out", str(release), "--seed", "1",
                               "--not-for-publication", "--allow-over-cap"]).exit_code == 0
    return release


@pytest.fixture(scope="session")
def fitted_state(baseline_release):
    """``baseline_release``'s answers, protected microdata and psi, read from its files, for tests that
    refit its wages with a knob switched."""
    import gedp
    from gedp.release.reader import read_release

    protected, answers = read_release(baseline_release.folder)
    return answers, protected, gedp.load("baseline").plan.psi


@pytest.fixture(scope="session")
def baseline_wage_fit(fitted_state):
    """The wage fit made again from ``fitted_state``'s answers and protected microdata, every knob at its
    default (read only: a test that switches a knob fits again)."""
    from gedp.postprocess import wages

    return wages.fit_wages(*fitted_state)


def spreads_by_pass(fitted_state, monkeypatch, priors: str) -> list:
    """Refits ``fitted_state``'s wages and returns the squared spread that the wage fit's ``priors``
    (``"_cell_priors"`` or ``"_rate_priors"``: their fifth output) gave in each pass."""
    from gedp.postprocess import wages

    found, original = [], getattr(wages, priors)

    def recorded(*args):
        out = original(*args)
        found.append(out[4].copy())
        return out

    monkeypatch.setattr(wages, priors, recorded)
    wages.fit_wages(*fitted_state)
    return found


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or a skip with the reason when it is absent (a user's machine)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared QCEW data not found at {SHARED_DATA} (present in CI only)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def small_release(tmp_path_factory):
    """`gedp run` on 2,000 establishments (seed 1): the release directory and what the command printed.
    Tests read it and copy it; none may change it."""
    from typer.testing import CliRunner

    from gedp.cli import app

    out = tmp_path_factory.mktemp("run") / "release"
    result = CliRunner().invoke(app, ["run", "--establishments", "2000", "--seed", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


@pytest.fixture(scope="module")
def lone_release(small_release, tmp_path_factory):
    """The small release copied alone into an empty folder (nothing else around it)."""
    import shutil

    folder = tmp_path_factory.mktemp("lone") / "release"
    shutil.copytree(small_release[0], folder)
    return folder


@pytest.fixture(scope="session")
def seeded_small_release(tmp_path_factory):
    """A function ``(name, establishments) -> folder``: a release of the small profile, state seed 5 and
    noise seed 6, not for publication, written to a fresh folder (for a test module to read or copy).
    Each size is protected once for the session's process (ten modules ask for three sizes) and written
    anew for each call (``Release.write``)."""
    from functools import cache

    import gedp

    @cache
    def released(establishments: int) -> gedp.Release:
        state = gedp.synthesize("small", establishments=establishments, seed=5)
        return gedp.protect(state, seed=6, not_for_publication=True)

    def write(name: str, establishments: int) -> Path:
        folder = tmp_path_factory.mktemp(name) / "release"
        released(establishments).write(folder)
        return folder

    return write


class DrawnOnce:
    """``gedp.release.implicates.tabulation_implicates`` (the 20 implicates a size-class table is combined
    over, about 4 s of processor time on the 2,000-establishment release) drawn once per release and
    quarter for the session: a later call for a folder holding the same files (every byte of every file)
    and the same quarter, under the same settings, gets a copy of the frame drawn first. The draw is a
    function of those alone (its seed is the release's, ``tabulation_seed``): ``TABULATION_IMPLICATES``
    and the upper-case settings of every ``gedp.postprocess`` module loaded (``settings``: switches such
    as ``implicates.LEVEL_BY_SECTOR`` or ``CELL_CHANGES`` change the draws, not the release's bytes) are
    in the key too.

    The draws are held per side (``side``: the main thread, where ``gedp tabulate`` and the library run,
    or any other thread, where a server draws), so a server's table is still compared with a command's
    table drawn independently. ``again()``: calls in it draw anew and hold nothing (a test of the draw's
    own repeatability). A test that changes how implicates are drawn (a patched prior, constant or
    generator) must not use it (a patched function is not in the key)."""

    def __init__(self) -> None:
        from gedp.release import implicates

        self.draw = implicates.tabulation_implicates
        self.held: dict[tuple, Any] = {}
        self.lock = threading.Lock()
        self.fresh = False

    #: The ``gedp.postprocess`` modules a draw loads, loaded before the key is read (so that a first draw's
    #: key is the next call's).
    DRAW_MODULES = ("cell_changes", "deconvolve", "implicates", "joint_changes", "months", "penalty_choice",
                    "prior_components", "wage_coupling", "wage_priors", "whole_changes", "wls")

    @classmethod
    def settings(cls) -> tuple:
        """The upper-case module settings of every ``gedp.postprocess`` module loaded (``DRAW_MODULES`` at
        least), as (module, name, value) with arrays as their dtype, shape and bytes' digest."""
        import hashlib

        for name in cls.DRAW_MODULES:
            importlib.import_module(f"gedp.postprocess.{name}")
        found = []
        for module_name, module in sorted(sys.modules.items()):
            if not module_name.startswith("gedp.postprocess.") or module is None:
                continue
            for name, value in sorted(vars(module).items()):
                if name.isupper() and not callable(value):
                    if isinstance(value, np.ndarray):
                        value = (str(value.dtype), value.shape, hashlib.sha256(value.tobytes()).hexdigest())
                    found.append((module_name, name, repr(value)))
        return tuple(found)

    @staticmethod
    def side() -> str:
        return "command" if threading.current_thread() is threading.main_thread() else "server"

    def __call__(self, release: str | Path, quarter: str | None = None):
        import hashlib

        from gedp.release.implicates import TABULATION_IMPLICATES

        if self.fresh:
            return self.draw(release, quarter)
        digest = hashlib.sha256()
        for file in sorted(p for p in Path(release).rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(release).as_posix()}\n".encode())
            digest.update(hashlib.sha256(file.read_bytes()).digest())
        key = (self.side(), digest.hexdigest(), quarter, TABULATION_IMPLICATES, self.settings())
        with self.lock:  # one draw at a time: two threads asking for the same one wait for it
            if key not in self.held:
                self.held[key] = self.draw(release, quarter)
            return self.held[key].copy()

    def again(self):
        """A context in which every call draws anew (nothing held is read or kept)."""
        import contextlib

        @contextlib.contextmanager
        def fresh():
            self.fresh = True
            try:
                yield
            finally:
                self.fresh = False

        return fresh()


@pytest.fixture(scope="session")
def drawn_once_held() -> DrawnOnce:
    """The session's ``DrawnOnce`` (its held draws shared by the modules that use it)."""
    return DrawnOnce()


@pytest.fixture
def drawn_once(drawn_once_held: DrawnOnce, monkeypatch) -> DrawnOnce:
    """``tabulation_implicates`` drawing once per release for this test (``DrawnOnce``)."""
    from gedp.release import implicates

    monkeypatch.setattr(implicates, "tabulation_implicates", drawn_once_held)
    return drawn_once_held


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory) -> Iterator[Path]:
    """Fixtures wider than a test (a module's server, the session's release) are set up before a test's
    own ``margins_cache``: they keep their margin structures in a folder of the session's, never in the
    user's cache (where another tree's structures of the same format could be read back)."""
    folder = tmp_path_factory.mktemp("gedp-session-cache")
    before = os.environ.get("GEDP_CACHE_DIR")
    os.environ["GEDP_CACHE_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("GEDP_CACHE_DIR", None)
    else:
        os.environ["GEDP_CACHE_DIR"] = before


@pytest.fixture
def unresolved(monkeypatch) -> None:
    """Readers without the re-solve check (``gedp.release.resolved``): for tests of what the other checks, the
    margins or the draws do with answers edited on purpose (such a copy is not the fit of its answers: the
    re-solve would refuse it before them)."""
    from gedp.release import resolved

    monkeypatch.setattr(resolved, "check_resolved", lambda *args: None)


@pytest.fixture(autouse=True)
def margins_cache(tmp_path_factory, monkeypatch) -> Path:
    """Margin structures are kept in a folder of each test's own (``GEDP_CACHE_DIR``), never in the
    user's cache."""
    folder = tmp_path_factory.mktemp("gedp-cache")
    monkeypatch.setenv("GEDP_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def ctrl_c_among_workers(tmp_path):
    """A function that runs a gedp command (its arguments) in a session of its own, sends SIGINT to
    the whole group (what Ctrl-C in a terminal does) as soon as ``workers`` child processes run, and
    checks the stop: exit 130, one last line ``stopped (Ctrl-C)``, no traceback, no child left."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    def stopped(arguments: list[str], workers: int, repeated: bool = False) -> str:
        """``repeated``: Ctrl-C again every few milliseconds until the run ends (a user who presses
        it again while the command stops)."""
        # faulthandler: a run that does not end is made to print every thread's stack (below)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONFAULTHANDLER": "1"}
        run = subprocess.Popen([sys.executable, "-m", "gedp", *arguments], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        children: list[psutil.Process] = []
        while len(children) < workers:
            assert run.poll() is None, f"the run ended before it started its workers: {run.communicate()[0]}"
            children = psutil.Process(run.pid).children(recursive=True)
            time.sleep(0.005)
        os.killpg(run.pid, signal.SIGINT)
        again = time.monotonic() + 20
        while repeated and run.poll() is None and time.monotonic() < again:
            time.sleep(0.002)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGINT)
        try:
            output = run.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            pytest.fail(f"not ended 120 s after Ctrl-C; its processes and their threads' stacks:\n{_stacks(run)}")
        if run.returncode == 0:
            pytest.skip("the run finished before Ctrl-C arrived")
        _, alive = psutil.wait_procs(children, timeout=10)
        assert run.returncode == 130 and "Traceback" not in output and "KeyboardInterrupt" not in output, output
        assert not alive, f"left running: {[child.cmdline() for child in alive]}"
        assert output.strip().splitlines()[-1] == "stopped (Ctrl-C)", output
        return output

    def _stacks(run: subprocess.Popen) -> str:
        """The processes of a run that did not end (status, command line), then what each Python process
        printed on SIGABRT (faulthandler: every thread's stack)."""
        listed = []
        for process in psutil.process_iter(["pid", "status", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if os.getpgid(process.pid) == run.pid:
                    listed.append(f"{process.pid} {process.info['status']} {' '.join(process.info['cmdline'])[-120:]}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGABRT)
        try:
            printed = run.communicate(timeout=30)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
        return "\n".join([*listed, printed])

    return stopped
