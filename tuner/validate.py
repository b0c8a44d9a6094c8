"""`tuner validate`: serve the exported config as written, replay traffic through it with vLLM's own
`bench serve`, and judge the SLO with this tool's rule.

The search measures configs on its own engine pool; a user deploys files. Validation closes that gap:
it renders the export (the same pick as `tuner export`), starts `vllm-serve.yaml` with vLLM's OpenAI
server exactly as written (only the listening address is set: 127.0.0.1 and a free port), and starts
the comparison (vLLM's defaults as the search's baseline ran them, or a `vllm serve --config` file the
user runs today) the same way, one server at a time on the cores the search's replicas used. Each
server is driven by `bench serve --dataset-name timed_trace --self-timed --save-detailed`, the search's
own step sample (or one from `--workload`) at each rate, its per-request values judged by
tuner.metrics.summarize_step, the rule every trial step used. Rates are per server (one replica).

`--rates auto` is the planned operating point (the confirmed capacity's lower bound less `headroom`)
and the confirmed capacity itself; the lower bound is the lowest capacity the winner's confirmation
rounds measured (its trial's capacity when the search had no confirmation). The exported config
passes the validation when it holds the SLO at the planned operating point.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError
from tuner.export import ExportOptions, deployment_for, export_search, k8s_name, render_serve_llm, render_vllm_serve
from tuner.plan import DEFAULT_HEADROOM, confirmed_lower_bound, replica_plan
from tuner.recorded import TrialRow
from tuner.vocabulary import latency_name

STACKS = ("vllm", "ray-serve")
# What each measurement reports, by this tool's metric names (tuner.metrics.summarize_step).
FIGURES = (
    "offered_rps",
    "arrival_rps",
    "achieved_rps",
    "goodput_rps",
    "slo_attainment",
    "slo_headroom",
    "measured_requests",
    "failed_requests",
    *(latency_name(metric, stat) for metric in ("ttft", "tpot", "e2e") for stat in ("p50", "p95")),
)


PER_REPLICA = ("offered_rps", "arrival_rps", "achieved_rps", "goodput_rps")


@dataclass(frozen=True)
class Rate:
    label: str  # "planned" / "capacity" for --rates auto, "r1", "r2", ... for given rates
    rps: float  # requests/s offered to one server


@dataclass(frozen=True)
class Served:
    """One config as a server: its `vllm serve --config` file, as deployed."""

    role: str  # "exported" or "comparison"
    description: str
    config_path: Path
    served_name: str
    tokenizer: str  # bench serve builds prompts with it
    stack: str = "vllm"
    replicas: int = 1  # engine replicas behind the URL (Ray Serve); rates are per replica
    cores: tuple[int, ...] = ()  # the engine's cores (vLLM's server on CPU), the client kept off them


@dataclass(frozen=True)
class Measured:
    stack: str
    role: str
    rate: Rate
    passed: bool
    figures: dict[str, float]
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "config": self.role,
            "rate": self.rate.label,
            "rate_rps": self.rate.rps,
            "slo_pass": self.passed,
            **{k: round(v, 6) for k, v in self.figures.items()},
            "wall_s": round(self.wall_s, 1),
        }


@dataclass
class ValidationOutcome:
    experiment: str
    trial_id: str
    slo: str
    rates: list[Rate]
    served: list[Served]
    measured: list[Measured] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    out_dir: Path = Path(".")
    wall_s: float = 0.0
    workload: str = ""

    @property
    def held(self) -> bool:
        """The exported config held the SLO at the planned operating point (the first rate) on every stack."""
        first = self.rates[0]
        mine = [m for m in self.measured if m.role == "exported" and m.rate == first]
        return bool(mine) and all(m.passed for m in mine)

    def ratios(self) -> list[dict[str, Any]]:
        """Exported over comparison, per stack and rate: goodput and TTFT p95."""
        out = []
        for mine in (m for m in self.measured if m.role == "exported"):
            other = next(
                (m for m in self.measured if m.role == "comparison" and m.stack == mine.stack and m.rate == mine.rate),
                None,
            )
            if other is None:
                continue
            out.append(
                {
                    "stack": mine.stack,
                    "rate": mine.rate.label,
                    "goodput_ratio": _ratio(mine.figures.get("goodput_rps"), other.figures.get("goodput_rps")),
                    "ttft_p95_ratio": _ratio(mine.figures.get("ttft_p95_s"), other.figures.get("ttft_p95_s")),
                }
            )
        return out

    def text(self) -> str:
        first = self.rates[0]
        mine = [m for m in self.measured if m.role == "exported" and m.rate == first]
        held = sorted(m.stack for m in mine if m.passed)
        missed = sorted(m.stack for m in mine if not m.passed)
        where = "; ".join(
            part
            for part in (
                f"held on {', '.join(held)}" if held else "",
                f"missed on {', '.join(missed)}" if missed else "",
            )
            if part
        )
        verb = "held" if self.held else "missed"
        which = "the planned" if first.label == "planned" else "the first rate given,"
        return (
            f"the exported config (trial {self.trial_id}) {verb} the SLO '{self.slo}' at {which} "
            f"{first.rps:.3g} requests/s per replica ({where or 'nothing measured'})"
        )

    def document(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "trial_id": self.trial_id,
            "slo": self.slo,
            "held": self.held,
            "text": self.text(),
            "workload": self.workload,
            "rates": [{"label": r.label, "rps_per_replica": r.rps} for r in self.rates],
            "configs": [
                {"role": s.role, "description": s.description, "file": s.config_path.name} for s in self.served
            ],
            "measurements": [m.as_dict() for m in self.measured],
            "ratios": self.ratios(),
            "notes": list(self.notes),
            "wall_s": round(self.wall_s, 1),
            "client": "vllm bench serve --dataset-name timed_trace --self-timed --save-detailed",
        }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def parse_rates(text: str) -> list[Rate] | None:
    """`auto` -> None; `R1,R2,...` -> rates (requests/s per server, > 0). ConfigError otherwise."""
    if text.strip() == "auto":
        return None
    rates = []
    for index, part in enumerate(text.split(","), start=1):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"--rates: {part.strip()!r} is not a number (give 'auto' or R1,R2,...)") from None
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--rates: every rate must be > 0 requests/s, but got {part.strip()}")
        rates.append(Rate(f"r{index}", value))
    return rates


def user_config(path: Path) -> tuple[str, str]:
    """The (served model name, model) of a `vllm serve --config` file; ConfigError naming the file."""
    if not path.is_file():
        raise ConfigError(f"--against {path}: no such file (give vllm-defaults or a vllm serve --config YAML)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"--against {path}: not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(raw, dict) or not raw.get("model"):
        raise ConfigError(f"--against {path}: a vllm serve --config file needs a `model` key")
    served = raw.get("served-model-name") or raw.get("served_model_name") or raw["model"]
    if isinstance(served, list):
        served = served[0]
    return str(served), str(raw["model"])


def validate(
    *,
    tracking_uri: str,
    experiment: str,
    out_dir: Path,
    workload: str | None = None,
    against: str = "vllm-defaults",
    stacks: Sequence[str] = STACKS,
    rates: str = "auto",
    headroom: float = DEFAULT_HEADROOM,
    pick: str = "max-capacity",
    progress: Callable[[str], None] = print,
) -> ValidationOutcome:
    """Export, serve and measure; see the module docstring. Raises ConfigError / ExportError /
    TrackingError for bad input, StackError when a server cannot start or be measured."""
    from tuner import peer
    from tuner.config import load_config
    from tuner.search import prepare, trial_context
    from tuner.slo import parse_slo

    began = time.monotonic()
    unknown = [s for s in stacks if s not in STACKS]
    if unknown:
        raise ConfigError(f"--stack: {unknown[0]!r} is not a stack validate can start (one of: {', '.join(STACKS)})")
    if not 0 <= headroom < 1:
        raise ConfigError(f"--headroom must be in [0, 1), but got {headroom}")
    given = parse_rates(rates)
    notes: list[str] = []
    against_path = None if against == "vllm-defaults" else Path(against).expanduser().resolve()
    comparison_names = user_config(against_path) if against_path is not None else None
    if workload and not Path(workload).expanduser().is_file():
        raise ConfigError(f"--workload {workload}: no such file")
    out_dir = Path(out_dir)
    options = ExportOptions(headroom=headroom)
    exported = export_search(tracking_uri, experiment, out_dir, pick=pick, options=options)
    record, trial = exported.record, exported.trial
    progress(f"exported trial {trial.trial_id} into {out_dir} ({', '.join(sorted(exported.files))})")

    config = dict(record.config)
    if workload:  # another trace, read as `workload inspect` reads it (format and time unit detected)
        trace = str(Path(workload).expanduser().resolve())
        config["workload"] = {**(config.get("workload") or {}), "path": trace, "format": "auto", "time_unit": None}
    with tempfile.TemporaryDirectory(prefix="tuner-validate-") as scratch:
        recorded = Path(scratch) / "search_config.yaml"
        recorded.write_text(yaml.safe_dump(config, sort_keys=False))
        prepared = prepare(load_config(recorded), tracking_uri=tracking_uri, check_budget=False)
    context = trial_context(prepared)
    source = str(prepared.workload.provenance.get("source") or "the bundled workload")
    origin = "given with --workload" if workload else "the search's own"
    progress(
        f"replaying {source} ({origin}, {len(prepared.workload.requests)} requests): each measurement is the "
        f"search's step sample of it at the rate, after {context.sample.describe()['warmup_requests']} warm-up requests"
    )
    slo = parse_slo(exported.slo)

    per_replica = int(trial.params.get("tensor_parallel_size", 1) or 1)
    if given is None:
        capacity, source = confirmed_lower_bound(record, trial)
        if capacity <= 0:
            raise ConfigError(
                f"--rates auto: trial {trial.trial_id} has no capacity to plan with ({source} is 0); give --rates"
            )
        lower = capacity * per_replica
        planned = [Rate("planned", lower * (1 - headroom)), Rate("capacity", lower)]
        progress(
            f"rates per replica: planned {planned[0].rps:.3g} requests/s ({lower:.3g} less {headroom:.0%} "
            f"headroom), capacity {lower:.3g} ({source})"
        )
    else:
        planned = given
        progress(f"rates per replica: {', '.join(f'{r.rps:g}' for r in planned)} requests/s")

    baseline = TrialRow("baseline", "", "completed", params=dict(record.baseline or prepared.baseline))
    defaults = deployment_for(record, baseline, ExportOptions())
    mine = deployment_for(record, trial, options, replica_plan(record, trial, headroom=headroom))
    note = ["The comparison: vLLM's defaults as the search's baseline ran them."]
    if against_path is None and record.baseline_trial() is not None and record.baseline_trial() == trial:
        notes.append("the exported config is the search's baseline: the comparison runs the same config again")
    served: list[Served] = []

    def cores_for(params: Mapping[str, Any]) -> tuple[int, ...]:
        """On CPU the engine gets the cores one replica was measured on (as the search placed it)."""
        if record.device != "cpu":
            return ()
        return tuple(peer.engine_cores(record.cpu_cores_per_replica * int(params.get("tensor_parallel_size", 1) or 1)))

    for stack in stacks:
        if stack == "vllm":
            served.append(
                Served(
                    "exported",
                    "vllm-serve.yaml as exported",
                    exported.files["vllm-serve.yaml"],
                    mine.served_name,
                    prepared.model_path,
                    stack,
                    cores=cores_for(trial.params),
                )
            )
            if against_path is None:
                path = out_dir / "comparison-vllm-defaults.yaml"
                path.write_text(render_vllm_serve(defaults, note))
                served.append(
                    Served(
                        "comparison",
                        "vLLM's defaults (the search's baseline)",
                        path,
                        defaults.served_name,
                        prepared.model_path,
                        stack,
                        cores=cores_for(baseline.params),
                    )
                )
            else:
                assert comparison_names is not None
                served.append(
                    Served(
                        "comparison",
                        f"{against_path} (--against)",
                        against_path,
                        comparison_names[0],
                        prepared.model_path,
                        stack,
                        cores=cores_for(trial.params),
                    )
                )
        else:
            served.append(
                Served(
                    "exported",
                    "serve-llm.yaml as exported",
                    exported.files["serve-llm.yaml"],
                    mine.served_name,
                    prepared.model_path,
                    stack,
                    mine.num_replicas,
                )
            )
            if against_path is None:
                path = out_dir / "comparison-serve-llm-vllm-defaults.yaml"
                path.write_text(render_serve_llm(defaults, note, app_name=k8s_name(experiment)))
                served.append(
                    Served(
                        "comparison",
                        "vLLM's defaults (the search's baseline)",
                        path,
                        defaults.served_name,
                        prepared.model_path,
                        stack,
                        defaults.num_replicas,
                    )
                )
            else:
                notes.append(f"--against {against_path} is a vllm serve config: the ray-serve stack has no comparison")

    outcome = ValidationOutcome(
        experiment, trial.trial_id, exported.slo, planned, served, out_dir=out_dir, notes=notes, workload=source
    )
    for number, server in enumerate(served):
        port = peer.free_port()
        replicas = f" ({server.replicas} replicas: each rate x {server.replicas})" if server.replicas > 1 else ""
        progress(f"[{server.stack}] starting {server.role}: {server.description} on 127.0.0.1:{port}{replicas}")
        with _started(server, out_dir, port) as url:
            for index, rate in enumerate(planned):
                measured = _measure(peer, context, slo, url, server, rate, step=index + 100 * number, work=out_dir)
                outcome.measured.append(measured)
                progress(f"[{server.stack}] {server.role} at {rate.rps:.3g} requests/s per replica: {_line(measured)}")
    outcome.wall_s = time.monotonic() - began
    return outcome


def _started(server: Served, work: Path, port: int):
    from tuner import peer
    from tuner.serve_stack import serve_app

    if server.stack == "vllm":
        cores = list(server.cores)
        return peer.vllm_server(
            server.config_path, work, port, label=f"vllm-{server.role}", pinned=bool(cores), cores=cores or None
        )
    return serve_app(server.config_path, work, port, server.served_name)


def _measure(peer, context, slo, url: str, server: Served, rate: Rate, *, step: int, work: Path) -> Measured:
    """One bench serve run at `rate` per replica (the whole app gets rate x replicas); the step judged by
    the search's rule, rates reported per replica."""
    from tuner.metrics import summarize_step

    began = time.monotonic()
    total = rate.rps * server.replicas
    name = f"{server.stack}-{server.role}-{rate.label}"
    trace = work / f"trace-{name}.jsonl"
    offsets, warmup = peer.write_timed_trace(context.sample, total, trace, step=step)
    requests, _ = context.sample.layout(total)
    try:
        raw = peer.bench(
            url,
            trace,
            len(offsets),
            model_path=server.tokenizer,
            served_name=server.served_name,
            work=work,
            name=f"bench-{name}.json",
            seed=context.seed,
            engine=list(server.cores) or None,
        )
    finally:
        trace.unlink(missing_ok=True)
    records = peer.records(raw, offsets, warmup, [r.output_tokens for r in requests])
    summary = summarize_step(
        records,
        slo,
        load_step=step + 1,
        load_factor=rate.rps / context.reference_rps,
        offered_rps=total,
        window_s=context.sample.window_s(total),
        horizon_s=context.sustain_horizon_s,
    )
    figures = {k: float(summary.metrics[k]) for k in FIGURES if k in summary.metrics}
    for key in PER_REPLICA:
        if key in figures:
            figures[key] /= server.replicas
    return Measured(server.stack, server.role, rate, summary.passed, figures, time.monotonic() - began)


def _line(m: Measured) -> str:
    f = m.figures
    verdict = "pass" if m.passed else "FAIL"
    return (
        f"{verdict}; achieved {f.get('achieved_rps', 0):.3g}/s, goodput {f.get('goodput_rps', 0):.3g}/s, "
        f"TTFT p50/p95 {_s(f.get('ttft_p50_s'))}/{_s(f.get('ttft_p95_s'))}, "
        f"TPOT p50/p95 {_s(f.get('tpot_p50_s'))}/{_s(f.get('tpot_p95_s'))}, "
        f"E2E p95 {_s(f.get('e2e_p95_s'))}, failed {int(f.get('failed_requests', 0))}"
    )


def _s(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
