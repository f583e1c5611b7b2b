"""The contributing page's map of the layout is the code's: the same arrows between rooms, no circle.

docs/layout_map.py reads the code's imports (as installed: gedp.synth is synth/) and the page's
table; a new import between rooms that the page does not state, or a stated one the code no longer
has, fails here with both named.
"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def layout_map():
    spec = importlib.util.spec_from_file_location("layout_map", ROOT / "docs" / "layout_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_states_every_arrow_of_the_code_and_no_other():
    mapping = layout_map()
    stated, found = mapping.page_arrows(), mapping.code_arrows(ROOT)
    assert sorted(found - stated) == [], "imports between rooms that the contributing page's map does not state"
    assert sorted(stated - found) == [], "arrows on the contributing page's map that the code no longer has"


def test_the_rooms_stand_on_floors_with_no_circle():
    mapping = layout_map()
    floor = mapping.floors(mapping.code_arrows(ROOT))
    assert floor["gedp/errors.py"] == 1 and max(floor.values()) == floor["gedp/__main__.py"]
    assert floor["synth/"] < floor["measure/"] < floor["postprocess/"] < floor["evaluation/"]
    assert all(floor[room] < floor["evaluation/"] for room in ("gedp/running/", "gedp/release/", "gedp/config.py"))


def test_the_map_reader_sees_a_circle_and_a_stray_import(tmp_path):
    """The checks can fail: a circle is named, and an import the page does not state is found."""
    mapping = layout_map()
    with pytest.raises(ValueError, match="circle"):
        mapping.floors({("a/", "b/"), ("b/", "c/"), ("c/", "a/")})
    (tmp_path / "gedp" / "running").mkdir(parents=True)
    (tmp_path / "synth").mkdir()
    (tmp_path / "gedp" / "errors.py").write_text("")
    (tmp_path / "synth" / "io.py").write_text("def f():\n    from gedp.running.engine import x\n")
    assert mapping.code_arrows(tmp_path) == {("synth/", "gedp/running/")}
    page = tmp_path / "page.md"
    page.write_text("| room | holds | imports |\n|---|---|---|\n| `synth/` | inputs | `gedp/errors.py` |\n")
    assert mapping.page_arrows(page) == {("synth/", "gedp/errors.py")}
