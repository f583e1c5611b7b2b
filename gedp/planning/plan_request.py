"""``gedp plan``: a plan from its command-line options (levels and weights as text), its output
path refused before the search, written as a config with its summary and frontier plot."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from gedp.errors import InputError
from gedp.planning.output import write_plan
from gedp.planning.search import PlanResult, make_plan, search_steps
from gedp.tabulation.output_files import check_output_file

#: A progress display of a number of steps: yields the callback that advances it by one named step.
Steps = Callable[[int], AbstractContextManager[Callable[[str], None]]]


def plan_from_text(from_qcew: Path, out: Path, *, mu_total: float | None = None, quarters: int = 1,
                   targets: str = "", base: str = "baseline", weights: str = "",
                   progress: Steps = lambda total: nullcontext(lambda step: None)) -> PlanResult:
    """Plan from the published QCEW file ``from_qcew`` (``make_plan``) and write the plan to ``out``
    (``write_plan``). ``targets``: QCEW levels, comma-separated (empty: every level published);
    ``weights``: NAME=NUMBER,... (empty: the default weights)."""
    check_output_file(out)
    levels = _numbers(targets, "--targets", int)
    weight_map: dict[str, float] = {}
    for key, value in (_pair(item, "--weights") for item in weights.split(",") if item.strip()):
        if key.strip() in weight_map:
            raise InputError(f"--weights names '{key.strip()}' twice; give each weight once")
        weight_map[key.strip()] = _weight(value)
    with progress(search_steps()) as advance:
        result = make_plan(from_qcew, mu_total=mu_total, targets=levels or None, base=base,
                           weights=weight_map or None, on_step=advance, quarters=quarters)
    write_plan(result, out)
    return result


def _numbers(text: str, option: str, kind: type) -> list:
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"{option} ({text}) must be comma-separated numbers") from None


def _weight(text: str) -> float:
    """One weight of --weights: a finite number (``search._check`` refuses those below 0)."""
    numbers = _numbers(text, "--weights", float)
    if len(numbers) != 1 or not math.isfinite(numbers[0]):
        raise InputError(f"--weights value '{text.strip()}' must be a finite number")
    return numbers[0]


def _pair(item: str, option: str) -> tuple[str, str]:
    if "=" not in item:
        raise InputError(f"{option} item '{item}' must be NAME=NUMBER")
    key, value = item.split("=", 1)
    return key, value
