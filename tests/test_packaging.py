"""The wheel installs one import name, gedp, and works where a user's own modules shadow generic names."""

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: A user's module that the type check writes into the checkout for a moment (the wheel's copy leaves it out).
TYPED_USE = "_typed_use_of_gedp.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout so that no build/ folder is left in it (a stale
    build/lib would hold a second copy of the package)."""
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "gedp"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "site", "docs", "tests", "benchmarks",
                                                                 "*.egg-info", "__pycache__", TYPED_USE))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, capture_output=True, cwd=out)
    [built] = out.glob("gedp-*.whl")
    return built


def test_the_wheel_installs_only_the_gedp_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"gedp"}, top
    for sub in ("synth", "measure", "postprocess", "evaluation", "configs"):
        assert f"gedp/{sub}/__init__.py" in names
    assert "gedp/configs/baseline.yaml" in names and "gedp/synth/profiles/small.json" in names
    assert "gedp/py.typed" in names


def nested_venv(env_dir: Path) -> Path:
    """A venv whose own site-packages come first and which sees the dependencies installed for this
    interpreter, wherever they are (system-wide or inside the venv running the tests): a venv with
    ``system_site_packages`` sees only its base interpreter's packages, not an outer venv's. The outer
    directories are listed in a .pth file, so their own .pth files (an editable gedp) are not run."""
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (Path(own) / "outer_environment.pth").write_text("\n".join(outer) + "\n")
    return python


def test_installed_gedp_ignores_a_users_own_evaluation_module(wheel, tmp_path):
    """Before: `python3 -m gedp interval 36` in a folder holding evaluation.py failed (ModuleNotFoundError)."""
    env_dir = tmp_path / "venv"
    python = nested_venv(env_dir)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    work = tmp_path / "project"
    work.mkdir()
    for name in ("evaluation", "measure", "synth", "configs", "postprocess"):
        (work / f"{name}.py").write_text("raise ImportError('the user module was imported')\n")
    done = subprocess.run([str(python), "-m", "gedp", "interval", "36"], cwd=work, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    located = subprocess.run([str(python), "-c", "import gedp.measure; print(gedp.measure.__file__)"], cwd=work,
                             capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in located


def test_only_the_stage_folders_join_the_namespace():
    """The stage folders are gedp.synth, gedp.measure, ... by setuptools' package mapping alone: no
    other folder of the checkout (benchmarks/, tests/, docs/) is importable as gedp.<name>."""
    code = ("import importlib.util, gedp\n"
            "print([n for n in ('benchmarks', 'tests', 'docs') if importlib.util.find_spec('gedp.' + n)])\n"
            "print(hasattr(gedp, '__path__') and len(gedp.__path__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.split("\n")[:2] == ["[]", "1"], done.stdout


def test_the_public_api_is_typed_for_its_users(tmp_path):
    """A user's type checker sees gedp's signatures through the lazy top level (py.typed): a wrong
    argument and a missing attribute are reported, and correct use is clean."""
    user = ROOT / TYPED_USE  # inside the checkout, where mypy finds gedp
    user.write_text('import gedp\n\nrelease = gedp.read_release("r")\ntable = release.tabulate(by="total")\n'
                    'release.no_such_attribute\ngedp.protect("in.csv", config=3)\n')
    try:
        done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", str(user)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    finally:
        user.unlink()
    assert '"Release" has no attribute "no_such_attribute"' in done.stdout, done.stdout
    assert 'Argument "config" to "protect" has incompatible type "int"' in done.stdout, done.stdout
    assert "Found 2 errors in 1 file" in done.stdout, done.stdout


def test_stages_import_only_earlier_stages():
    """Data flows one way (synth -> measure -> postprocess -> evaluation): importing every module of a
    stage, the release writer or the API loads no later stage (writing QCEW tables needs no evaluation/)."""
    stages = ("synth", "measure", "postprocess", "evaluation")
    checks = {f"gedp.{stage}": ([f"gedp.{stage}.{p.stem}" for p in sorted((ROOT / stage).glob("*.py"))],
                                tuple(f"gedp.{later}" for later in stages[i + 1:]))
              for i, stage in enumerate(stages[:-1])}
    release_path = ("gedp.running.state_pipeline", "gedp.running.engine", "gedp.api", "gedp.running.recorded_release",
                    "gedp.release.writer", "gedp.release.reader")
    checks |= {name: ([name], ("gedp.evaluation",)) for name in release_path}
    for label, (modules, forbidden) in checks.items():
        code = (f"import importlib, sys\nfor name in {modules!r}: importlib.import_module(name)\n"
                f"print(sorted(m for m in sys.modules if m.startswith({forbidden!r})))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]", (label, done.stdout)
