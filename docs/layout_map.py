"""The map of gedp's layout on the contributing page, held against the code.

Rooms are the stage folders (``synth/``, ``measure/``, ``postprocess/``, ``evaluation/``, ``configs/``)
and, inside ``gedp/``, each subpackage and root module. An arrow A -> B: a module of A imports one of
B, as installed (``gedp.synth`` is ``synth/``), lazy imports inside functions included. The page
lists each room's arrows in a table; ``tests/test_layout_map.py`` checks that the table and the code
have the same arrows and that they form no circle. ``python docs/layout_map.py`` redraws the
picture from the table (docs/images/layout.svg).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

STAGES = ("synth", "measure", "postprocess", "evaluation", "configs")
PAGE = Path(__file__).parent / "contributing.md"
PICTURE = Path(__file__).parent / "images" / "layout.svg"


def room_of_file(relative: Path) -> str:
    """The room of a source file (a path relative to the repository)."""
    parts = relative.parts
    if parts[0] in STAGES:
        return f"{parts[0]}/"
    return f"gedp/{parts[1]}/" if len(parts) > 2 else f"gedp/{relative.name}"


def room_of_module(module: str, root: Path) -> str | None:
    """The room an imported module (or name) lives in; None outside gedp."""
    parts = module.split(".")
    if parts[0] != "gedp":
        return None
    if len(parts) == 1:
        return "gedp/__init__.py"
    if parts[1] in STAGES:
        return f"{parts[1]}/"
    if (root / "gedp" / parts[1]).is_dir():
        return f"gedp/{parts[1]}/"
    return f"gedp/{parts[1]}.py" if (root / "gedp" / f"{parts[1]}.py").is_file() else "gedp/__init__.py"


def imported_modules(tree: ast.AST) -> list[str]:
    """Every module (or module.name) an absolute import of the tree names."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def code_arrows(root: Path) -> set[tuple[str, str]]:
    """The arrows between rooms that the code's imports draw."""
    arrows = set()
    for top in ("gedp", *STAGES):
        for path in sorted((root / top).rglob("*.py")):
            source = room_of_file(path.relative_to(root))
            for module in imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
                target = room_of_module(module, root)
                if target is not None and target != source:
                    arrows.add((source, target))
    return arrows


def page_arrows(page: Path = PAGE) -> set[tuple[str, str]]:
    """The arrows the contributing page's map table states: rows ``| `room` | ... | `a`, `b` |``."""
    arrows = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[^`]+`", cells[0]):
            arrows |= {(cells[0].strip("`"), target) for target in re.findall(r"`([^`]+)`", cells[2])}
    return arrows


def floors(arrows: set[tuple[str, str]]) -> dict[str, int]:
    """Each room's floor: 1 for a room that imports no other, else one above the highest it imports."""
    rooms = {room for arrow in arrows for room in arrow}
    floor: dict[str, int] = {}

    def height(room: str, seen: tuple[str, ...] = ()) -> int:
        if room in seen:
            raise ValueError(f"the rooms {' -> '.join((*seen, room))} import each other in a circle")
        if room not in floor:
            below = [target for source, target in arrows if source == room]
            floor[room] = 1 + max((height(target, (*seen, room)) for target in below), default=0)
        return floor[room]

    for room in sorted(rooms):
        height(room)
    return floor


def draw(arrows: set[tuple[str, str]], out: Path = PICTURE) -> Path:
    """The rooms on their floors (top: the command line; ground: errors) with the arrows between them
    that no path through other rooms implies (the transitive reduction; the page's table lists all)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "gedp-layout"  # the same file for the same map
    import matplotlib.pyplot as plt
    import networkx as nx

    floor = floors(arrows)
    drawn = set(nx.transitive_reduction(nx.DiGraph(sorted(arrows))).edges)
    levels: dict[int, list[str]] = {}
    for room in sorted(floor, key=lambda r: (r.startswith("gedp/"), r)):
        levels.setdefault(floor[room], []).append(room)
    place = {room: ((i + 1) / (len(rooms) + 1), level) for level, rooms in levels.items()
             for i, room in enumerate(rooms)}
    figure, axes = plt.subplots(figsize=(11, 0.75 * max(levels) + 1))
    for source, target in sorted(drawn):
        axes.annotate("", xy=place[target], xytext=place[source], zorder=1,
                      arrowprops={"arrowstyle": "-|>", "color": "#9aa5b1", "lw": 0.7, "shrinkA": 11, "shrinkB": 11})
    for room, (x, y) in place.items():
        stage = not room.startswith("gedp/")
        axes.text(x, y, room, ha="center", va="center", fontsize=8.5, zorder=2,
                  bbox={"boxstyle": "round,pad=0.35", "fc": "#e8f0fb" if stage else "#fdf6e3", "ec": "#52606d"})
    axes.set_xlim(0, 1)
    axes.set_ylim(0.4, max(levels) + 0.6)
    axes.set_yticks(range(1, max(levels) + 1), [f"floor {level}" for level in range(1, max(levels) + 1)],
                    fontsize=8)
    axes.set_xticks([])
    for side in ("top", "right", "bottom"):
        axes.spines[side].set_visible(False)
    axes.set_title("gedp's rooms, each above what it imports (blue: the stage folders; yellow: gedp/);\n"
                   "an arrow is drawn where no path through other rooms already leads (the table lists them all)",
                   fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    return out


if __name__ == "__main__":
    stated, found = page_arrows(), code_arrows(Path(__file__).resolve().parents[1])
    if stated != found:
        print("the page's map and the code differ:", file=sys.stderr)
        for source, target in sorted(found - stated):
            print(f"  in the code, not on the page: {source} -> {target}", file=sys.stderr)
        for source, target in sorted(stated - found):
            print(f"  on the page, not in the code: {source} -> {target}", file=sys.stderr)
        sys.exit(1)
    print(draw(stated))
