"""Search spaces: the YAML schema, its validation, and the Optuna define-by-run function it becomes.

A space file looks like::

    parameters:
      max_num_seqs: {type: int, low: 2, high: 64, log: true}
      max_num_batched_tokens: {type: int, low: 64, high: 2048, step: 64}
      gpu_memory_utilization: {type: float, low: 0.3, high: 0.9}
      num_replicas: {type: categorical, choices: [1, 2]}
      enable_prefix_caching: true            # a fixed value
    constraints:
      - max_num_batched_tokens >= max_num_seqs
    baseline: vllm-defaults                  # or a dict of values: the first trial

Every parameter is sampled from its declared distribution; then, in the order written, each constraint
moves its left-hand parameter to the nearest value that meets it, so every point that runs satisfies it.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.errors import ConfigError, validation_line

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
# Parameters the pool consumes; every other name must be a vLLM engine argument.
POOL_PARAMS = ("num_replicas", "heartbeat_period_s", "heartbeat_timeout_s", "failure_threshold")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntParam(_Strict):
    type: Literal["int"]
    low: int
    high: int
    step: int = 1
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> IntParam:
        if self.low > self.high:
            raise ValueError(f"`low <= high` must hold, but got low={self.low} and high={self.high}")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("a log-scaled int needs low >= 1 and step 1")
        return self


class FloatParam(_Strict):
    type: Literal["float"]
    low: float
    high: float
    step: float | None = None
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> FloatParam:
        if self.low > self.high:
            raise ValueError(f"`low <= high` must hold, but got low={self.low} and high={self.high}")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("a log-scaled float needs low > 0 and no step")
        return self


class CategoricalParam(_Strict):
    type: Literal["categorical"]
    choices: list[Any] = Field(min_length=1)


Param = Annotated[IntParam | FloatParam | CategoricalParam, Field(discriminator="type")]
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_]\w*)\s*(>=|<=)\s*([A-Za-z_]\w*|-?\d+(?:\.\d+)?)\s*$")
_OPS = {">=": operator.ge, "<=": operator.le}


class SearchSpace(_Strict):
    """A validated search space: tunable parameters, fixed values, constraints, baseline."""

    parameters: dict[str, Param | bool | int | float | str]
    constraints: list[str] = []
    baseline: Literal["vllm-defaults"] | dict[str, Any] = "vllm-defaults"
    description: str = ""

    @property
    def tunable(self) -> dict[str, Param]:
        return {k: v for k, v in self.parameters.items() if isinstance(v, BaseModel)}  # type: ignore

    @property
    def fixed(self) -> dict[str, Any]:
        return {k: v for k, v in self.parameters.items() if not isinstance(v, BaseModel)}

    def parsed_constraints(self) -> list[tuple[str, str, str | float]]:
        out = []
        for text in self.constraints:
            match = _CONSTRAINT.match(text)
            if not match:
                raise ConfigError(f"constraint {text!r}: expected 'PARAM >= PARAM|NUMBER' or '<='")
            left, op, right = match.groups()
            value: str | float = right if re.match(r"[A-Za-z_]", right) else float(right)
            for name in (left, value):
                if isinstance(name, str) and name not in self.parameters:
                    raise ConfigError(f"constraint {text!r}: {name!r} is not a parameter of the space")
            out.append((left, op, value))
        return out

    def define_by_run(self) -> DefineByRun:
        """The Optuna define-by-run function (picklable, so Tune can checkpoint the searcher)."""
        return DefineByRun(self)

    def bounds(self) -> dict[str, tuple[float, float]]:
        """Each numeric parameter's lowest and highest value (a categorical's numeric choices, a fixed number)."""
        bounds: dict[str, tuple[float, float]] = {}
        for name, spec in self.parameters.items():
            if isinstance(spec, (IntParam, FloatParam)):
                bounds[name] = (spec.low, spec.high)
            elif isinstance(spec, CategoricalParam):
                numeric = [c for c in spec.choices if isinstance(c, (int, float))]
                if numeric:
                    bounds[name] = (min(numeric), max(numeric))
            elif isinstance(spec, (int, float)) and not isinstance(spec, bool):
                bounds[name] = (spec, spec)
        return bounds

    def check_feasible(self) -> None:
        """Raise ConfigError if the constraints leave no point (checked on the ranges' extremes)."""
        bounds = self.bounds()
        for (left, op, right), text in zip(self.parsed_constraints(), self.constraints, strict=True):
            l_low, l_high = bounds.get(left, (float("-inf"), float("inf")))
            r_low, r_high = (
                bounds.get(right, (float("-inf"), float("inf"))) if isinstance(right, str) else (right, right)
            )
            if (op == ">=" and l_high < r_low) or (op == "<=" and l_low > r_high):
                raise ConfigError(
                    f"constraint {text!r} can never hold: {left} is in [{l_low:g}, {l_high:g}]"
                    f" and the other side in [{r_low:g}, {r_high:g}]"
                )

    def check_baseline(self, baseline: dict[str, Any], origin: str) -> None:
        """Raise ConfigError unless the baseline can be sampled: categorical values among the choices,
        constraints met (Optuna cannot replay a point outside its distributions). `origin` says where
        the values came from."""
        for name, value in baseline.items():
            spec = self.tunable.get(name)
            if isinstance(spec, CategoricalParam) and value not in spec.choices:
                raise ConfigError(
                    f"baseline: {origin} has {name}={value!r}, not among the choices "
                    f"{spec.choices}; add it, or give 'baseline:' as a dict of values"
                )
        values = {**self.fixed, **baseline}
        for (left, op, right), text in zip(self.parsed_constraints(), self.constraints, strict=True):
            a, b = values.get(left), values.get(right) if isinstance(right, str) else right
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not (a >= b if op == ">=" else a <= b):
                raise ConfigError(
                    f"baseline: {origin} has {left}={a!r} and breaks the constraint {text!r}; "
                    "give 'baseline:' as a dict of values that meets it"
                )


class DefineByRun:
    """Samples every tunable parameter from its declared distribution, then repairs the point to meet
    the constraints (each value moved to the nearest allowed one, in the order written). Returns the
    fixed and repaired values, which Ray merges over the sampled ones into the trial's config.

    The distributions never change from trial to trial, so Optuna's model-based samplers (GP,
    multivariate TPE) model every parameter jointly; narrowing a range by a constraint would make it
    a different distribution in each trial, which they can only sample independently.
    """

    def __init__(self, space: SearchSpace) -> None:
        self.tunable = space.tunable
        self.fixed = space.fixed
        self.constraints = space.parsed_constraints()

    def __call__(self, trial: Any) -> dict[str, Any]:
        chosen: dict[str, Any] = dict(self.fixed)
        for name, spec in self.tunable.items():
            if isinstance(spec, IntParam):
                chosen[name] = trial.suggest_int(name, spec.low, spec.high, step=spec.step, log=spec.log)
            elif isinstance(spec, FloatParam):
                chosen[name] = trial.suggest_float(name, spec.low, spec.high, step=spec.step, log=spec.log)
            else:
                chosen[name] = trial.suggest_categorical(name, spec.choices)
        # Repair once every value is known, so a constraint may refer to a parameter written after it.
        for name, spec in self.tunable.items():
            value = chosen[name]
            low, high = getattr(spec, "low", None), getattr(spec, "high", None)
            if low is not None and not low <= value <= high:
                continue  # an enqueued point outside the range (the baseline): run it as given
            chosen[name] = repair(value, *_narrow(name, spec, self.constraints, chosen))
        return chosen


def repair(value: Any, low: Any, high: Any, choices: list[Any]) -> Any:
    """The allowed value nearest to `value`: clamped into [low, high], or the nearest allowed choice."""
    if choices:
        if value in choices:
            return value
        numeric = [c for c in choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if numeric and isinstance(value, (int, float)):
            return min(numeric, key=lambda c: abs(c - value))
        return choices[0]
    if low is not None and value < low:
        return type(value)(low)
    if high is not None and value > high:
        return type(value)(high)
    return value


def _narrow(name: str, spec: Any, constraints, chosen: dict[str, Any]):
    low = getattr(spec, "low", None)
    high = getattr(spec, "high", None)
    choices = list(getattr(spec, "choices", []) or [])
    for left, op, right in constraints:
        if left != name:
            continue
        bound = chosen.get(right) if isinstance(right, str) else right
        if bound is None:
            continue
        if choices:
            kept = [c for c in choices if _OPS[op](c, bound)]
            choices = kept or choices
        elif op == ">=":
            low = min(max(low, bound), high)
        else:
            high = max(min(high, bound), low)
    step = getattr(spec, "step", None)
    if step and low is not None and not choices:
        # Stay on the declared grid (low + k * step), or Optuna shifts the grid and warns.
        low = spec.low + math.ceil((low - spec.low) / step - 1e-9) * step
        high = spec.low + math.floor((high - spec.low) / step + 1e-9) * step
        low = min(low, high)
    return low, high, choices


def load_space(ref: str | Path, *, known_engine_args: set[str] | None = None) -> SearchSpace:
    """Load a space from a file path or a bundled name (`cpu-smoke`, `default`, ...).

    Raises ConfigError naming the file and field: unknown parameter (with a suggestion), low > high,
    empty categorical, malformed or impossible constraints.
    """
    path = Path(ref)
    if not path.exists() and not path.suffix:
        path = SPACES_DIR / f"{ref}.yaml"
    if not path.exists():
        bundled = ", ".join(sorted(p.stem for p in SPACES_DIR.glob("*.yaml")))
        raise ConfigError(f"search space {ref}: no such file or bundled space (bundled: {bundled})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    try:
        space = SearchSpace.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(f"{path}: {validation_line(error)}") from None
    if known_engine_args is not None:
        for name in list(space.parameters) + (list(space.baseline) if isinstance(space.baseline, dict) else []):
            if name not in known_engine_args and name not in POOL_PARAMS:
                close = difflib.get_close_matches(name, sorted(known_engine_args | set(POOL_PARAMS)), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"{path}: parameters.{name}: unknown parameter{hint}; it is neither a "
                    "pool setting nor a vLLM engine argument"
                )
    try:
        space.check_feasible()
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return space


def matches_baseline(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> bool:
    """Whether a trial ran the baseline: every baseline param equal (numbers as numbers, so a float read back
    from MLflow matches the one logged; anything else also by its text, as MLflow logs params)."""
    return bool(baseline) and all(_same(params.get(key), value) for key, value in baseline.items())


def _same(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b or str(a) == str(b)
