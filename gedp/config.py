"""Typed loading of YAML release configs: every key checked, unknown keys refused.

``psi`` names a shipped neighbor function with its parameters (``{name: sqrt, a: 0}``; default
sqrt) or combines two: ``{name: combined, parts: [{name: sqrt, gamma: 0.5}, {name: linear, d: 1}],
rule: min}``, each part with its distance ``gamma`` (default 1), ``rule`` min (protect both) or max
(two publishers composed). A release takes the combinations with a closed form (min of sqrt without
offset and linear: sqrt-linear); the others are numeric and refused by the plan.

Budgets: a config always has a cap on its total mu, its ``mu_cap`` or, when absent,
``mu_limits.DEFAULT_MU_CAP`` (2.5); a query's mu above ``mu_limits.MAX_QUERY_MU`` (2.0; the shipped
plans spend at most 0.9 per query and 2.31 in total) is refused unless ``allow_large_mu``, with a
message saying what it would release. Group-by keys are public columns of the schema other than
``estab_id`` (the year and quarter a file may carry are not grouping keys).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import gedp.configs as configs
from gedp.accounting.mu_limits import DEFAULT_MU_CAP, MAX_STATED_MU, check_query_mus
from gedp.errors import ConfigError
from gedp.measure.combined import combined_psi
from gedp.measure.jobframe import EMPLOYMENT, JobPlan
from gedp.measure.neighbors import NeighborFunction, make_psi
from gedp.measure.queries import IDENTITY
from gedp.measure.workflows import MeasurementPlan, QueryPlan
from gedp.postprocess.wages import WAGE_METHODS
from gedp.postprocess.wls import RELEASE_VARIANCE_MODES, SOLVERS, VARIANCE_MODES
from gedp.synth.schema import CONFIDENTIAL, PUBLIC, shown

TOP_KEYS = {"workflow", "psi", "zeta", "mu_cap", "variance", "solver", "wages", "integer", "attributes", "queries",
            "jobs"}
REQUIRED_KEYS = {"attributes", "queries"}
ATTRIBUTE_KEYS = {"gamma"}
QUERY_KEYS = {"by", "mu"}
JOBS_KEYS = {"gamma", "families"}
COMBINED = "combined"
PSI_COMBINED_KEYS = {"name", "parts", "rule"}
#: Columns a query may group by (the identity query groups by estab_id; year and qtr are not keys).
GROUPABLE = set(PUBLIC) - {"estab_id"}

#: Limits of a config file: configs are a few dozen lines, so anything far larger is refused
#: before it is parsed.
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 20


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML without aliases (an alias bomb expands exponentially), nesting deeper than
    MAX_DEPTH (deep nesting exhausts the recursion), duplicate keys (PyYAML would silently keep the
    last) or keys other than text."""

    depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"YAML aliases (*{event.anchor[:40]} at line {line}) are not allowed in configs")
        if self.depth >= MAX_DEPTH:
            raise ConfigError(f"line {line} is nested more than {MAX_DEPTH} levels deep")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise ConfigError(_key_not_text(key, key_node, node))
        if key in seen:
            raise ConfigError(f"duplicate key {shown(key)} at line {line}")
        seen.add(key)
        if _yaml11_number(value_node) or _yaml11_bool(value_node):
            rule = _YAML11_BOOL_RULE if _yaml11_bool(value_node) else _YAML11_RULE
            raise ConfigError(f"key {shown(key)} at line {line}: {rule.format(value=shown(value_node.value))}")
    return loader.construct_mapping(node, deep=deep)


#: Number forms of YAML 1.1 that read as another number than they show (050 is octal 40, 1:30 is
#: base 60, 90; 2_307 drops its underscore; 0b11 is binary): refused, naming the key, not read.
_YAML11_NUMBER = re.compile(r"[-+]?0(?:[0-9_]|b)|.*[_:]")
_YAML11_RULE = ("{value} is a YAML 1.1 number (a leading zero reads as octal, a colon as base 60, an underscore is "
                "dropped); write it as a plain decimal number, such as 50 or 0.5")


def _yaml11_number(node: yaml.Node) -> bool:
    """Whether a node is a plain number written in a YAML 1.1 form (``_YAML11_NUMBER``)."""
    return (isinstance(node, yaml.ScalarNode) and node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
            and _YAML11_NUMBER.match(node.value) is not None)


def _number_node(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float:
    """A number outside a mapping (an item of a list), refused in a YAML 1.1 form as a mapping's value is."""
    if _yaml11_number(node):
        raise ConfigError(f"line {node.start_mark.line + 1}: {_YAML11_RULE.format(value=shown(node.value))}")
    return loader.construct_yaml_int(node) if node.tag.endswith(":int") else loader.construct_yaml_float(node)


#: The booleans of YAML 1.1 that YAML 1.2 reads as text (yes, no, on, off: PyYAML reads them as true
#: or false): refused, naming the key, so that no config means one thing to gedp and another elsewhere.
_YAML11_BOOL_RULE = "{value} is a YAML 1.1 boolean (YAML 1.2 reads it as text); write true or false"


def _yaml11_bool(node: yaml.Node) -> bool:
    """Whether a node is a plain boolean written other than true or false (``_YAML11_BOOL_RULE``)."""
    return (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:bool"
            and node.value.lower() not in ("true", "false"))


def _bool_node(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    """A boolean outside a mapping's value (an item of a list, a key), refused in a YAML 1.1 form."""
    if _yaml11_bool(node):
        raise ConfigError(f"line {node.start_mark.line + 1}: {_YAML11_BOOL_RULE.format(value=shown(node.value))}")
    return loader.construct_yaml_bool(node)


def _key_not_text(key: object, key_node: yaml.Node, node: yaml.MappingNode) -> str:
    """The message for a key that is not text: where it is, what it is, and (a number in a flow
    mapping: ``{m1emp: 0,7}`` reads 7 as a key) the decimal comma it likely is."""
    mark = key_node.start_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(key, (int, float)) and not isinstance(key, bool):
        hint = ("; a decimal comma? In {m1emp: 0,7} the comma ends the value 0 and 7 becomes a key: write 0.7"
                if node.flow_style else "")
        return f"a key at {where} is the number {shown(key)}; keys must be plain text{hint}"
    kind = {bool: "true or false", type(None): "empty (null)"}.get(type(key), f"a {type(key).__name__}")
    return f"a key at {where} is {kind}; keys must be plain text"


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _number_node)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _number_node)
_StrictLoader.add_constructor("tag:yaml.org,2002:bool", _bool_node)


@dataclass(frozen=True)
class Config:
    """A checked release configuration."""

    plan: MeasurementPlan
    variance_mode: str
    solver: str
    source: str
    raw: dict[str, Any]
    wages: str = "employment"
    integer: bool = False
    jobs: JobPlan | None = None

    @property
    def name(self) -> str:
        """The shipped config's name, or "custom": never a path (a manifest holds no paths)."""
        source = Path(self.source)
        shipped = configs.DIRECTORY / f"{source.stem}.yaml"
        return (
            source.stem
            if source.suffix == ".yaml" and shipped.is_file() and source.resolve() == shipped.resolve()
            else "custom"
        )

    @property
    def attributes(self) -> tuple[str, ...]:
        """The establishment attributes the plan measures (its job families are not columns of the input)."""
        families = self.jobs.families if self.jobs is not None else {}
        return tuple(a for a in self.plan.attributes if a not in families)

    def with_workflow(self, workflow: str) -> Config:
        """The same config measured with another workflow (pnc or psi)."""
        try:
            plan = dataclasses.replace(self.plan, workflow=workflow)
        except ValueError as err:
            raise ConfigError(f"workflow: {err}") from None
        return dataclasses.replace(self, plan=plan)

    def with_integer(self, integer: bool) -> Config:
        """The same config with its release rounded to whole numbers (True) or not."""
        return dataclasses.replace(self, integer=integer, raw={**self.raw, "integer": integer})


def _keys(mapping: Any, allowed: set[str], where: str, required: set[str] = frozenset()) -> dict:
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(mapping).__name__}")
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {shown(unknown[0])} (allowed: {', '.join(sorted(allowed))})")
    missing = sorted(required - set(mapping))
    if missing:
        raise ConfigError(f"{where}: missing key '{missing[0]}'")
    return mapping


def _number(value: Any, where: str) -> float:
    """A finite number (its range is checked where it is used: the plan, psi, the budget)."""
    try:
        number = math.nan if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
    except OverflowError:  # a 400-digit int
        number = math.inf
    if not math.isfinite(number):
        hint = ("; a decimal comma? write a decimal point" if isinstance(value, str)
                and re.fullmatch(r"\s*[+-]?[0-9]+,[0-9]+\s*", value) else "")
        raise ConfigError(f"{where} must be a finite number, got {shown(value)}{hint}")
    return number


def _query_by(value: Any, where: str) -> tuple[str, ...]:
    if value == "identity":
        return IDENTITY
    if value == "total" or value == []:
        return ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ConfigError(f"{where} must be 'identity', 'total' or a list of public columns, got {shown(value)}")
    unknown = [c for c in value if c not in GROUPABLE]
    if unknown:
        raise ConfigError(f"{where}: {shown(unknown[0])} is not a public column to group by")
    return tuple(value)


def parse_config(raw: Any, source: str = "<config>", allow_large_mu: bool = False) -> Config:
    """Check a config mapping and build the measurement plan from it (ranges are checked by the
    plan, psi and budget objects; their errors are reported with the config's name). A query's mu
    above ``MAX_QUERY_MU`` is refused unless ``allow_large_mu``."""
    where = f"config {source}"
    raw = _keys(raw, TOP_KEYS, where, REQUIRED_KEYS)
    attributes = _keys(raw["attributes"], set(CONFIDENTIAL), f"{where}: attributes")
    if not attributes:
        raise ConfigError(f"{where}: attributes is empty")
    gammas = {}
    for name, spec in attributes.items():
        spec = _keys(spec, ATTRIBUTE_KEYS, f"{where}: attributes.{name}", ATTRIBUTE_KEYS)
        gammas[name] = _number(spec["gamma"], f"{where}: attributes.{name}.gamma")
    jobs = None
    if "jobs" in raw:
        jobs = _job_plan(raw["jobs"], f"{where}: jobs")
        if EMPLOYMENT not in gammas:
            raise ConfigError(f"{where}: jobs: job families add up to {EMPLOYMENT}; measure it among the attributes")
        gammas.update({family: _number(raw["jobs"]["gamma"], f"{where}: jobs.gamma") for family in jobs.families})
    if not isinstance(raw["queries"], list) or not raw["queries"]:
        raise ConfigError(f"{where}: queries must be a non-empty list")
    queries = []
    for index, entry in enumerate(raw["queries"], start=1):
        at = f"{where}: queries[{index}]"
        entry = _keys(entry, QUERY_KEYS, at, QUERY_KEYS)
        mus = _keys(entry["mu"], set(gammas), f"{at}.mu")
        by = _query_by(entry["by"], f"{at}.by")
        mu = {a: _number(mu, f"{at}.mu.{a}") for a, mu in mus.items()}
        try:
            queries.append(QueryPlan(by=by, mu=mu))
        except ValueError as err:
            raise ConfigError(f"{at}.by: {err}") from None
    psi_spec = raw.get("psi", {"name": "sqrt"})
    if not isinstance(psi_spec, dict) or "name" not in psi_spec:
        raise ConfigError(f"{where}: psi must be a mapping with a 'name', got {shown(psi_spec)}")
    variance_mode = raw.get("variance", "smoothed")
    solver = raw.get("solver", "auto")
    if variance_mode not in RELEASE_VARIANCE_MODES:
        raise ConfigError(
            f"{where}: variance {shown(variance_mode)} is not one a release can use (choose smoothed, pooled or"
            " estimated;"
            f" modes {', '.join(VARIANCE_MODES)} exist for ablation studies, exact and hybrid need confidential"
            " true variances)"
        )
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ConfigError(f"{where}: solver {shown(solver)} is unknown (choose one of {', '.join(SOLVERS)})")
    wages = raw.get("wages", "employment")
    if not isinstance(wages, str) or wages not in WAGE_METHODS:
        raise ConfigError(f"{where}: wages {shown(wages)} is unknown (choose one of {', '.join(WAGE_METHODS)})")
    integer = raw.get("integer", False)
    if not isinstance(integer, bool):
        raise ConfigError(f"{where}: integer must be true or false, got {shown(integer)}")
    psi = _psi(psi_spec, where)
    zeta = _number(raw.get("zeta", 0.01), f"{where}: zeta")
    plan = _capped_plan(raw, where, allow_large_mu, psi=psi, gammas=gammas, queries=tuple(queries),
                        workflow=raw.get("workflow", "pnc"), zeta=zeta)
    if jobs is not None and (plan.identity_plan is None or not set(jobs.families) <= set(plan.identity_plan.mu)):
        raise ConfigError(f"{where}: every job family needs the identity query (its answers weigh the categories)")
    return Config(plan=plan, variance_mode=variance_mode, solver=solver, source=source, raw=raw, wages=wages,
                  integer=integer, jobs=jobs)


def _capped_plan(raw: dict, where: str, allow_large_mu: bool, **fields: Any) -> MeasurementPlan:
    """The measurement plan of ``fields``, refused unless every mu is valid, within MAX_QUERY_MU
    (or ``allow_large_mu``) and the total within the config's cap (its mu_cap, or DEFAULT_MU_CAP)."""
    explicit = raw.get("mu_cap") is not None
    cap = _number(raw["mu_cap"], f"{where}: mu_cap") if explicit else DEFAULT_MU_CAP
    try:
        plan = MeasurementPlan(**fields)
        total = plan.budget().total  # every mu valid
        check_query_mus(plan, where, allow_large_mu)
        if max(total, cap) > MAX_STATED_MU:
            raise ConfigError(f"{where}: total mu and mu_cap must be <= {MAX_STATED_MU:g}, the most a release "
                              "may state")
        if not explicit and total > cap:
            raise ConfigError(f"{where}: planned total mu ({total:.4f}) exceeds {cap:g}, the cap of a config without "
                              "mu_cap; set mu_cap to spend more")
        plan = dataclasses.replace(plan, cap=cap)
        plan.budget()  # a plan over its cap is refused here, before any data is read
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    return plan


def _psi(spec: dict, where: str) -> NeighborFunction:
    """The ``psi`` section: a shipped psi, ``{name: sqrt, a: 0}`` (sqrt, log: a; linear: d; sqrt-linear:
    gamma_sqrt, d), or a combination of two, ``{name: combined, parts: [{name: sqrt, gamma: 0.5},
    {name: linear, d: 1}], rule: min}``: each part a shipped psi with its distance ``gamma`` (default
    1), ``rule`` min (protect both; the default) or max (two publishers composed). Min of sqrt
    without offset and linear is the closed form sqrt-linear, which releases use; other combinations
    are numeric and serve intervals only, so a release plan refuses them."""
    if spec["name"] != COMBINED:
        return _built(make_psi, where, spec["name"], **_psi_params(spec, f"{where}: psi", {"name"}))
    spec = _keys(spec, PSI_COMBINED_KEYS, f"{where}: psi", {"name", "parts"})
    parts = spec["parts"]
    if not isinstance(parts, list) or len(parts) != 2:
        raise ConfigError(f"{where}: psi.parts must be a list of two psi mappings, got {shown(parts)}")
    built = []
    for index, part in enumerate(parts, start=1):
        at = f"{where}: psi.parts[{index}]"
        if not isinstance(part, dict) or part.get("name") in (None, COMBINED):
            raise ConfigError(f"{at} must be a mapping with the 'name' of a shipped psi, got {shown(part)}")
        params = _psi_params(part, at, {"name", "gamma"})
        psi = _built(make_psi, at, part["name"], **params)
        built.append((psi, _number(part.get("gamma", 1.0), f"{at}.gamma")))
    return _built(combined_psi, f"{where}: psi", built, spec.get("rule", "min"))


def _psi_params(spec: dict, where: str, skip: set[str]) -> dict[str, float]:
    return {k: _number(v, f"{where}.{k}") for k, v in spec.items() if k not in skip}


def _built(build: Callable[..., NeighborFunction], where: str, *args: Any, **params: float) -> NeighborFunction:
    """``build(*args, **params)``, its ValueError reported as a ConfigError at ``where``."""
    try:
        return build(*args, **params)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def _job_plan(spec: Any, where: str) -> JobPlan:
    """The ``jobs`` section: gamma and families (name -> list of worker columns)."""
    spec = _keys(spec, JOBS_KEYS, where, JOBS_KEYS)
    families = spec["families"]
    if not isinstance(families, dict) or not families:
        raise ConfigError(f"{where}.families must be a mapping of family names to lists of worker columns")
    for name, columns in families.items():
        if name in CONFIDENTIAL or not name.isidentifier():
            raise ConfigError(f"{where}.families: {shown(name)} must be a plain name, not an attribute's")
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise ConfigError(f"{where}.families.{name} must be a list of worker columns, got {shown(columns)}")
    try:
        return JobPlan({name: tuple(columns) for name, columns in families.items()})
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def _yaml_problem(err: Exception) -> str:
    """Where and what a YAML error is: "at line 7, column 9: expected ',' or ']', but got ':' (while
    parsing a flow sequence started at line 6, column 9)"; PyYAML counts lines and columns from 0."""
    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    problem_mark = getattr(err, "problem_mark", None)
    context_mark = getattr(err, "context_mark", None)
    problem, context = getattr(err, "problem", None), getattr(err, "context", None)
    if problem_mark is None or not problem:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"({first})"
    started = f" started at {at(context_mark)}" if context_mark is not None else ""
    return f"at {at(problem_mark)}: {problem}" + (f" ({context}{started})" if context else "")


def load_config(name_or_path: str | Path, allow_large_mu: bool = False) -> Config:
    """Load a config from a YAML file, or a shipped one by name ('recommended', 'baseline', 'uniform', ...);
    ``allow_large_mu`` as for ``parse_config``. A name given as text that is both a shipped config's and
    a file's or folder's in the working folder is refused as ambiguous (either reading could spend
    another budget than meant): ``./recommended`` (or a Path) names the file."""
    path = Path(name_or_path)
    if str(name_or_path) in configs.available():
        if isinstance(name_or_path, str) and path.exists():
            raise ConfigError(f"config '{name_or_path}' is both a shipped config and a file in the working folder; "
                              f"write ./{name_or_path} for the file, or rename it")
        if not path.is_file():
            path = configs.path(str(name_or_path))
    if not path.is_file():
        raise ConfigError(
            f"config '{name_or_path}' is neither a file nor a shipped config ({', '.join(configs.available())})"
        )
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config {path} is larger than {MAX_CONFIG_BYTES >> 20} MB; a config is a few dozen lines")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except ConfigError as err:
        raise ConfigError(f"config {path}: {err}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"config {path}: not valid YAML {_yaml_problem(err)}") from None
    return parse_config(raw, str(path), allow_large_mu)


def resolve_config(config: str | Path | Mapping[str, Any] | Config = configs.DEFAULT_CONFIG,
                   workflow: str | None = None, allow_large_mu: bool = False, integer: bool | None = None) -> Config:
    """A config from a shipped name, a YAML path, a mapping with the YAML's keys, or a Config, with its
    workflow and rounding overridden when given (``gedp.load``)."""
    if isinstance(config, Config):
        loaded = config
    elif isinstance(config, Mapping):
        loaded = parse_config(dict(config), source="<dict>", allow_large_mu=allow_large_mu)
    else:
        loaded = load_config(config, allow_large_mu=allow_large_mu)
    loaded = loaded if workflow is None else loaded.with_workflow(workflow)
    return loaded if integer is None else loaded.with_integer(integer)
