"""No module of the library over MAX_LINES lines (issue 48): a longer one is split by what its parts do.

The library is the four stage folders and the front, as in the repository (gedp/, synth/, measure/,
postprocess/); tests and evaluation are not held to it. The command line is the package
``gedp/cli/``, its modules held to the rule like any other.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gedp", "synth", "measure", "postprocess")
MAX_LINES = 600


def oversized(root: Path, folders=FOLDERS, max_lines: int = MAX_LINES) -> dict[str, int]:
    """Each module under ``folders`` of ``root`` over ``max_lines`` lines (its path from ``root``, as
    text with '/'), with its line count."""
    out = {}
    for folder in folders:
        for module in sorted((root / folder).rglob("*.py")):
            lines = len(module.read_text(encoding="utf-8").splitlines())
            if lines > max_lines:
                out[module.relative_to(root).as_posix()] = lines
    return out


def test_no_module_is_over_600_lines():
    offenders = oversized(ROOT)
    assert not offenders, f"modules over {MAX_LINES} lines (split them by what their parts do): {offenders}"


def test_the_count_flags_a_module_one_line_over(tmp_path):
    """Power: 601 lines are flagged, 600 are not, in a subfolder too; other folders are not looked at."""
    for folder, name, lines in [("gedp", "long.py", 601), ("gedp/sub", "deep.py", 700), ("gedp", "edge.py", 600),
                                ("tests", "test_long.py", 900)]:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / name).write_text("x = 1\n" * lines, encoding="utf-8")
    (tmp_path / "synth").mkdir()
    assert oversized(tmp_path, ("gedp", "synth")) == {"gedp/long.py": 601, "gedp/sub/deep.py": 700}
