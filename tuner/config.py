"""The one config loader: YAML via safe_load, CLI overrides merged, then strict pydantic validation.

Every key of a search config is a field below; an unknown or mistyped key fails at load time with its
field path. See the README's "Search config" section for the documented file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import ConfigError
from tuner.slo import parse_slo
from tuner.space import validation_line
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


class LadderSection(_Strict):
    factors: list[float] = Field(default_factory=lambda: [0.5, 1.0, 1.5, 2.0, 2.5, 3.0], min_length=1)
    reference_factor: float = 1.0
    step_duration_s: float = Field(15, gt=0)
    warmup_s: float = Field(3, ge=0)
    deadline_s: float = Field(15, gt=0, description="after the last send; unfinished = failed")

    @model_validator(mode="after")
    def _check(self) -> LadderSection:
        if sorted(self.factors) != self.factors or any(f <= 0 for f in self.factors):
            raise ValueError(f"factors must be positive and increasing, but got {self.factors}")
        if self.reference_factor not in self.factors:
            raise ValueError(f"reference_factor {self.reference_factor} is not one of factors {self.factors}")
        if self.warmup_s >= self.step_duration_s:
            raise ValueError("warmup_s must be shorter than step_duration_s")
        return self


class Objective(_Strict):
    metric: str
    mode: Literal["max", "min"]


class AshaSection(_Strict):
    metric: str = "slo_headroom"
    mode: Literal["max", "min"] = "max"
    reduction_factor: float = Field(2, gt=1)
    grace_period: int | None = Field(
        None, ge=1, description="null = the first step at twice the reference load (or the last step)")


class BudgetSection(_Strict):
    num_samples: int = Field(8, ge=1)
    time_budget_s: float | None = Field(None, gt=0)
    max_concurrent_trials: int | None = Field(None, ge=1)
    engine_start_timeout_s: float = Field(600, gt=0)
    trial_timeout_s: float | None = Field(None, gt=0, description="a trial running longer is infeasible")


class FaultSection(_Strict):
    kind: Literal["kill", "freeze"]
    step: int = Field(1, ge=1, description="1-based load step in which the fault strikes")
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
    ladder: LadderSection = LadderSection()
    objectives: list[Objective] = Field(
        default_factory=lambda: [Objective(metric="capacity_rps_per_accel", mode="max"),
                                 Objective(metric="ref_ttft_p95_s", mode="min")], min_length=1)
    asha: AshaSection = AshaSection()
    budget: BudgetSection = BudgetSection()
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

    @model_validator(mode="after")
    def _faults_within_ladder(self) -> SearchConfig:
        for index, fault in enumerate(self.faults):
            if fault.step > len(self.ladder.factors):
                raise ValueError(f"faults.{index}.step: {fault.step} is beyond the ladder's "
                                 f"{len(self.ladder.factors)} steps")
        return self


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                flags: dict[str, str] | None = None) -> SearchConfig:
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
