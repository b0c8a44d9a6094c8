"""The one config loader: YAML via safe_load, CLI overrides merged, then strict pydantic validation.

Every key of a search config is a field below; an unknown or mistyped key fails at load time with its
field path. See the README's "Search config" section for the documented file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.capacity import CapacityPlan
from tuner.errors import ConfigError, validation_line
from tuner.sampling import required_requests
from tuner.slo import Slo, parse_slo
from tuner.workload.transforms import TransformSpec

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "examples" / "default.yaml"
BUNDLED_WORKLOAD = Path(__file__).resolve().parent / "workload" / "data" / "chat-sample.jsonl"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Strict):
    path: str | None = Field(None, description="local directory or Hugging Face id; null = tiny model")
    max_model_len: int = Field(2048, ge=16)
    engine_args: dict[str, Any] = Field(default_factory=dict, description="fixed vLLM engine args")


class HardwareSection(_Strict):
    device: Literal["auto", "cpu", "gpu"] = "auto"
    cpu_cores_per_replica: int = Field(1, ge=1)
    kv_budget_mib: float = Field(64, gt=0, description="on CPU: gpu_memory_utilization=1.0 means this")


class WorkloadSection(_Strict):
    path: str | None = Field(None, description="trace file; null = the bundled chat sample")
    format: str = "auto"
    time_unit: Literal["ms", "s"] | None = None
    transforms: TransformSpec = TransformSpec()
    reference_rps: float | None = Field(None, gt=0, description="1.0x load per accelerator")


class CapacitySection(_Strict):
    """How each trial searches its capacity: loads are multiples of the reference load per accelerator."""

    start_factor: float = Field(1.0, gt=0, description="first climb load: 1 or growth^-k (below the reference)")
    growth: float = Field(2.0, gt=1, description="each climb step multiplies the load by this")
    max_factor: float = Field(16.0, gt=0, description="the climb stops here: a config passing it is censored")
    min_factor: float = Field(0.25, gt=0, description="if the first step fails, descend at most to here")
    resolution: float = Field(0.10, gt=0, description="refine until the bracket is this narrow (relative)")
    noise: float = Field(0.0, ge=0, description="measured step-to-step noise; refine no finer than this")
    measured_requests: int | None = Field(
        None, ge=1, description="per step; null = enough for tail_requests above the SLO's highest percentile"
    )
    tail_requests: int = Field(10, ge=1, description="requests above the SLO's percentile in every step")
    min_window_s: float = Field(
        20, ge=0, description="a step's measured window lasts at least this long (more requests at high rates)"
    )
    warmup_requests: int = Field(20, ge=0, description="sent evenly before the measured ones, not counted")
    windows: int = Field(4, ge=1, description="runs of consecutive requests, at random offsets, per step")
    deadline_s: float = Field(15, gt=0, description="after the last send; unfinished requests then fail")
    sustain_horizon_s: float | None = Field(
        60, gt=0, description="a step whose TTFT trend breaks the bound within this long fails; null = off"
    )
    max_steps: int = Field(12, ge=1, description="steps per trial at most")
    failure_rule: Literal["once", "majority"] = Field(
        "once",
        description="once: a failing step fails its load; majority: the ending failure is measured until 2 of 3 agree",
    )
    max_step_s: float = Field(600, gt=0, description="longest step allowed (checked before the search)")

    @model_validator(mode="after")
    def _check(self) -> CapacitySection:
        if not self.min_factor <= self.start_factor <= self.max_factor:
            raise ValueError(
                f"`min_factor <= start_factor <= max_factor` must hold, but got {self.min_factor}, "
                f"{self.start_factor}, {self.max_factor}"
            )
        power = math.log(1 / self.start_factor, self.growth)
        if abs(power - round(power)) > 1e-6 or round(power) < 0:
            raise ValueError(
                f"start_factor must be 1 or growth^-k so that the climb measures the reference "
                f"load (1x), but got {self.start_factor} with growth {self.growth} "
                f"(try {self.growth ** -max(0, math.ceil(power - 1e-6)):g})"
            )
        return self

    def plan(self) -> CapacityPlan:
        return CapacityPlan(
            start_factor=self.start_factor,
            growth=self.growth,
            max_factor=self.max_factor,
            min_factor=self.min_factor,
            resolution=self.resolution,
            noise=self.noise,
            max_steps=self.max_steps,
            failure_rule=self.failure_rule,
        )


class Objective(_Strict):
    metric: str
    mode: Literal["max", "min"]


class AshaSection(_Strict):
    metric: str = "slo_headroom"
    mode: Literal["max", "min"] = "max"
    reduction_factor: float = Field(2, gt=1)
    grace_period: int | None = Field(
        None, ge=1, description="null = the first step at twice the reference load (or the last step)"
    )


class BudgetSection(_Strict):
    num_samples: int = Field(8, ge=1)
    time_budget_s: float | None = Field(None, gt=0)
    max_concurrent_trials: int | None = Field(None, ge=1)
    engine_start_timeout_s: float = Field(600, gt=0)
    trial_timeout_s: float | None = Field(None, gt=0, description="a trial running longer is infeasible")


class ConfirmSection(_Strict):
    """After the search: re-measure the finalists and the baseline in interleaved rounds (tuner.confirm)."""

    finalists: int = Field(1, ge=1, description="best configs under the SLO re-measured against the baseline")
    rounds: int | None = Field(
        None,
        ge=0,
        description="0 = off; null = enough to detect a 30% gain with 90% power at the measured repeatability",
    )
    resolution: float | None = Field(None, gt=0, description="bracket width of a re-measurement; null = capacity's")
    reference_step: bool = Field(
        False,
        description="start each re-measurement with a step at the reference load: intervals on the latencies "
        "there, at one more step per measurement",
    )

    @field_validator("rounds")
    @classmethod
    def _rounds(cls, value: int | None) -> int | None:
        if value == 1:
            raise ValueError("1 round gives no interval: use 0 (off) or at least 2")
        return value


class FaultSection(_Strict):
    kind: Literal["kill", "freeze"]
    at_load: float = Field(1.0, gt=0, description="strikes in the first step at or above this load factor")
    at_fraction: float = Field(0.5, gt=0, lt=1, description="when, as a fraction of the step's duration")
    replica: int = Field(0, ge=0, description="which replica (modulo the trial's replica count)")


class HealthSection(_Strict):
    heartbeat_period_s: float = Field(5, gt=0)
    heartbeat_timeout_s: float = Field(10, gt=0)
    failure_threshold: int = Field(3, ge=1)


class TrackingSection(_Strict):
    uri: str | None = Field(None, description="null = sqlite:///<repo>/reports/mlflow.db")


class RaySection(_Strict):
    address: str | None = None


class SearchConfig(_Strict):
    """A whole search: what to tune, against what traffic, judged how, within what budget."""

    name: str = "tiny-default"
    model: ModelSection = ModelSection()
    hardware: HardwareSection = HardwareSection()
    workload: WorkloadSection = WorkloadSection()
    space: str = "cpu-smoke"
    slo: str = "ttft:p95<2s; tpot:p95<30ms"
    serving: Literal["openai-server", "in-process"] = Field(
        "openai-server", description="replicas as deployed (vLLM's OpenAI server, over HTTP) or in-process"
    )
    capacity: CapacitySection = CapacitySection()
    objectives: list[Objective] = Field(
        default_factory=lambda: [
            Objective(metric="capacity_rps_per_accel", mode="max"),
            Objective(metric="ref_ttft_p95_s", mode="min"),
        ],
        min_length=1,
    )
    asha: AshaSection = AshaSection()
    budget: BudgetSection = BudgetSection()
    confirm: ConfirmSection = ConfirmSection()
    health: HealthSection = Field(HealthSection(), description="defaults when the space does not tune them")
    faults: list[FaultSection] = Field(default_factory=list)
    tracking: TrackingSection = TrackingSection()
    ray: RaySection = RaySection()
    penalty_latency_s: float = Field(60, gt=0, description="latency reported when none was measured")
    seed: int = 0

    @field_validator("slo")
    @classmethod
    def _slo(cls, value: str) -> str:
        return str(parse_slo(value))

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ladder" in data:
            raise ValueError(
                "ladder: the fixed load ladder was replaced by a capacity search per trial; write a `capacity:` "
                "section instead, e.g. capacity: {start_factor: 1, growth: 2, max_factor: 16, resolution: 0.1} "
                "(step_duration_s and warmup_s became measured_requests and warmup_requests; see the README)"
            )
        for index, fault in enumerate(data.get("faults") or [] if isinstance(data, dict) else []):
            if isinstance(fault, dict) and "step" in fault:
                raise ValueError(
                    f"faults.{index}.step: faults are keyed to a load now, not a step number: write at_load: "
                    "FACTOR (the fault strikes in the first step at or above that multiple of the reference load)"
                )
        return data

    @model_validator(mode="after")
    def _enough_requests(self) -> SearchConfig:
        capacity = self.capacity
        if capacity.measured_requests is not None:
            needed = required_requests(slo_percentiles(parse_slo(self.slo)), capacity.tail_requests)
            if capacity.measured_requests < needed:
                raise ValueError(
                    f"capacity.measured_requests: {capacity.measured_requests} requests per step leave fewer than "
                    f"tail_requests={capacity.tail_requests} above the SLO's highest percentile (that needs "
                    f"{needed}); raise measured_requests or lower capacity.tail_requests"
                )
        return self

    def confirm_rounds(self) -> int:
        """Confirmation rounds: as configured, or the fewest that detect a 30% gain with 90% power."""
        if self.confirm.rounds is not None:
            return self.confirm.rounds
        from tuner.confirm import REPEATABILITY_CV
        from tuner.verdict import rounds_for

        return rounds_for(cv=REPEATABILITY_CV, resolution=self.confirm_resolution(), finalists=self.confirm.finalists)

    def confirm_resolution(self) -> float:
        return self.confirm.resolution or self.capacity.resolution

    def measured_requests(self) -> int:
        """Counted requests per step: as configured, or sized from the SLO's highest percentile."""
        if self.capacity.measured_requests is not None:
            return self.capacity.measured_requests
        return required_requests(slo_percentiles(parse_slo(self.slo)), self.capacity.tail_requests)


def slo_percentiles(slo: Slo) -> list[float]:
    """The percentiles an SLO's terms judge (the mean and p50 count as the 50th)."""
    return [50.0 if term.stat == "mean" else float(term.stat[1:]) for term in slo.terms]


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, flags: dict[str, str] | None = None
) -> SearchConfig:
    """Read a search config (the embedded default when `path` is None) and apply dotted overrides.

    Relative paths inside the file are resolved against the file's folder. Raises ConfigError naming
    the file and the field path.
    """
    source = Path(path) if path is not None else DEFAULT_CONFIG
    if not source.is_file():
        raise ConfigError(f"{source}: config file not found")
    try:
        raw = yaml.safe_load(source.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of config keys at the top level")
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    _resolve_relative(raw, source.parent)
    try:
        return SearchConfig.model_validate(raw)
    except ValidationError as error:
        where = ".".join(str(p) for p in error.errors()[0]["loc"])
        flag = (flags or {}).get(where) if (overrides or {}).get(where) is not None else None
        if flag:
            raise ConfigError(f"{flag}: {validation_line(error).split(': ', 1)[-1]}") from None
        raise ConfigError(f"{source}: {validation_line(error)}") from None
    except ConfigError as error:
        if (overrides or {}).get("slo") is not None and flags:
            raise ConfigError(f"{flags.get('slo', 'slo')}: {error}") from None
        raise ConfigError(f"{source}: slo: {error}") from None


def _resolve_relative(raw: dict[str, Any], base: Path) -> None:
    for section, key in (("workload", "path"), ("model", "path")):
        value = (raw.get(section) or {}).get(key)
        if isinstance(value, str) and not Path(value).is_absolute() and (base / value).exists():
            raw[section][key] = str((base / value).resolve())
    space = raw.get("space")
    if isinstance(space, str) and (base / space).exists() and Path(space).suffix:
        raw["space"] = str((base / space).resolve())
