"""`tuner validate`: serve the exported config as written, replay traffic through it with vLLM's own
`bench serve`, and judge the SLO with this tool's rule.

The search measures configs on its own engine pool; a user deploys files. Validation closes that gap:
it renders the export (the same pick as `tuner export`), starts `vllm-serve.yaml` with vLLM's OpenAI
server exactly as written (only the listening address is set: 127.0.0.1 and a free port), and starts
the comparison (vLLM's defaults as the search's baseline ran them, or a `vllm serve --config` file the
user runs today) the same way, one server at a time on the cores the search's replicas used. Each
server is driven by `bench serve --dataset-name timed_trace --self-timed --save-detailed`, the search's
own step sample (or one from `--workload`) at each rate, its per-request values judged by
tuner.metrics.summarize_step, the rule every trial step used. Rates are per server, and every server is
one replica: `serve-llm.yaml` is served as a copy at one replica (the plan's replica count or
autoscaling range is sized for production traffic, need not fit here, and must not scale mid-step).

`--rates auto` is the planned operating point (the confirmed capacity's lower bound less `headroom`)
and the confirmed capacity itself; the lower bound is the lowest capacity the winner's confirmation
rounds measured (its trial's capacity when the search had no confirmation). The exported config
passes the validation when it holds the SLO at the planned operating point.
"""

from __future__ import annotations

import dataclasses
import math
import os
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
from tuner.vocabulary import TrialStatus, latency_name

STACKS = ("vllm", "ray-serve")
# How long the scale-up check waits, after the burst, for a replica Serve added to come up.
REPLICA_START_WAIT_S = 300.0
NO_COMPARISON = "none"  # --against none: the exported config alone, judged by the SLO
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
    latency_name("e2e", "mean"),  # the scale-up check's burst by Little's law
)


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
    scale_up: dict[str, Any] | None = None  # the scale-up check on Ray Serve, when asked for and possible

    @property
    def passed(self) -> bool:
        """Held the SLO at the planned operating point, and Serve scaled up under the burst if checked."""
        return self.held and (self.scale_up is None or bool(self.scale_up.get("scaled")))

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
        text = (
            f"the exported config (trial {self.trial_id}) {verb} the SLO '{self.slo}' at {which} "
            f"{first.rps:.3g} requests/s per replica ({where or 'nothing measured'})"
        )
        if self.scale_up is not None:
            text += f"; scale-up check: {self.scale_up['text']}"
        return text

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
            "scale_up": self.scale_up,
            "passed": self.passed,
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


def user_engine_args(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The engine arguments of a `vllm serve --config` file by their Python names (what a Serve LLM app's
    `engine_kwargs` takes), and the keys left out: the server's own (host, port, api-key, ...)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    engine = {f.name for f in dataclasses.fields(AsyncEngineArgs)} - {"model", "served_model_name"}
    raw = yaml.safe_load(path.read_text()) or {}
    args: dict[str, Any] = {}
    left_out: list[str] = []
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name in engine:
            args[name] = value
        elif name not in ("model", "served_model_name"):
            left_out.append(str(key))
    return args, left_out


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
    scale_up_s: float = 0.0,
    progress: Callable[[str], None] = print,
) -> ValidationOutcome:
    """Export, serve and measure; see the module docstring. With `scale_up_s` > 0 and the ray-serve stack,
    also the scale-up check (`_scale_up_check`). Raises ConfigError / ExportError / TrackingError for bad
    input, StackError when a server cannot start or be measured."""
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
    if scale_up_s and "ray-serve" not in stacks:
        raise ConfigError("--scale-up-s: the scale-up check runs on Ray Serve; add --stack ray-serve (or both)")
    if scale_up_s < 0 or (scale_up_s and scale_up_s < 60):
        raise ConfigError(f"--scale-up-s must be 0 (off) or at least 60 s, but got {scale_up_s:g}")
    given = parse_rates(rates)
    notes: list[str] = []
    compare = against != NO_COMPARISON
    against_path = None if against in ("vllm-defaults", NO_COMPARISON) else Path(against).expanduser().resolve()
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

    baseline = TrialRow("baseline", "", TrialStatus.COMPLETED, params=dict(record.baseline or prepared.baseline))
    defaults = deployment_for(record, baseline, ExportOptions())
    mine = deployment_for(record, trial, options, replica_plan(record, trial, headroom=headroom))
    note = ["The comparison: vLLM's defaults as the search's baseline ran them."]
    if not compare:
        notes.append("no comparison (--against none): the exported config is judged by the SLO alone")
    elif against_path is None and record.baseline_trial() is not None and record.baseline_trial() == trial:
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
            if compare and against_path is None:
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
            elif against_path is not None:  # the user's own file (--against FILE)
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
            # One replica, as the rates are per replica: the plan's replica count (or autoscaling range) is
            # sized for the production traffic and need not fit here; Serve must not scale during a step.
            one = dataclasses.replace(mine, num_replicas=1, autoscaling=None)
            path = out_dir / "serve-llm-one-replica.yaml"
            sized = (
                f"autoscaling {mine.autoscaling['min_replicas']}-{mine.autoscaling['max_replicas']} replicas"
                if mine.autoscaling
                else f"{mine.num_replicas} replica(s)"
            )
            copy_note = [
                f"tuner validate's copy of serve-llm.yaml at one replica (the export has {sized}): the "
                "validated rates are per replica; everything else is the exported file's."
            ]
            path.write_text(render_serve_llm(one, copy_note, app_name=k8s_name(experiment)))
            if mine.autoscaling or mine.num_replicas != 1:
                notes.append(
                    f"ray-serve: served at one replica (serve-llm-one-replica.yaml), the export has {sized}; "
                    "the replica count and autoscaling are not validated, only what each replica holds"
                )
            served.append(
                Served(
                    "exported",
                    "serve-llm.yaml as exported, at one replica",
                    path,
                    mine.served_name,
                    prepared.model_path,
                    stack,
                )
            )
            if compare and against_path is None:
                path = out_dir / "comparison-serve-llm-vllm-defaults.yaml"
                one_default = dataclasses.replace(defaults, num_replicas=1, autoscaling=None)
                path.write_text(render_serve_llm(one_default, note, app_name=k8s_name(experiment)))
                served.append(
                    Served(
                        "comparison",
                        "vLLM's defaults (the search's baseline), at one replica",
                        path,
                        defaults.served_name,
                        prepared.model_path,
                        stack,
                    )
                )
            elif against_path is not None:  # the user's own file (--against FILE)
                assert comparison_names is not None
                args, left_out = user_engine_args(against_path)
                theirs = dataclasses.replace(
                    defaults,
                    model_source=comparison_names[1],
                    served_name=comparison_names[0],
                    engine_args=args,
                    num_replicas=1,
                    autoscaling=None,
                )
                path = out_dir / "comparison-serve-llm-against.yaml"
                dropped = f"; its server-only keys left out: {', '.join(left_out)}" if left_out else ""
                against_note = [
                    f"The comparison: the engine arguments of {against_path.name} (--against) on Ray Serve."
                ]
                path.write_text(render_serve_llm(theirs, against_note, app_name=k8s_name(experiment)))
                notes.append(f"ray-serve: the --against file's engine arguments served as a Serve LLM app{dropped}")
                served.append(
                    Served(
                        "comparison",
                        f"{against_path} (--against) as a Serve LLM app, at one replica",
                        path,
                        comparison_names[0],
                        prepared.model_path,
                        stack,
                    )
                )

    outcome = ValidationOutcome(
        experiment, trial.trial_id, exported.slo, planned, served, out_dir=out_dir, notes=notes, workload=source
    )
    for number, server in enumerate(served):
        port = peer.free_port()
        progress(f"[{server.stack}] starting {server.role}: {server.description} on 127.0.0.1:{port}")
        with _started(server, out_dir, port) as url:
            for index, rate in enumerate(planned):
                measured = _measure(peer, context, slo, url, server, rate, step=index + 100 * number, work=out_dir)
                outcome.measured.append(measured)
                progress(f"[{server.stack}] {server.role} at {rate.rps:.3g} requests/s per replica: {_line(measured)}")
    if scale_up_s:
        at_rate = next(
            (m for m in outcome.measured if (m.stack, m.role, m.rate) == ("ray-serve", "exported", planned[0])), None
        )
        outcome.scale_up = _scale_up_check(
            peer,
            context,
            mine,
            record,
            out_dir=out_dir,
            experiment=experiment,
            rate=planned[0],
            e2e_mean_s=None if at_rate is None else at_rate.figures.get(latency_name("e2e", "mean")),
            duration_s=scale_up_s,
            tokenizer=prepared.model_path,
            progress=progress,
        )
    outcome.wall_s = time.monotonic() - began
    return outcome


def _scale_up_check(
    peer,
    context,
    mine,
    record,
    *,
    out_dir: Path,
    experiment: str,
    rate: Rate,
    e2e_mean_s: float | None,
    duration_s: float,
    tokenizer: str,
    progress: Callable[[str], None],
) -> dict[str, Any] | None:
    """Does Serve add a replica under a burst, with the exported autoscaling_config? A functional check:
    the app starts at one replica with the exported target (max: the plan's, capped at what fits here),
    gets `duration_s` of traffic at `burst_rate` (more than one replica is set to hold), and the replica
    states Serve reports every 2 s say whether and when a second replica ran. None (and a note in the
    progress) when the export does not autoscale or a second replica cannot fit here."""
    from tuner.serve_stack import replica_timeline, serve_app

    if not mine.autoscaling:
        progress(f"[ray-serve] scale-up check: the export does not autoscale ({mine.num_replicas} replica(s))")
        return None
    # On CPU, Serve LLM reserves a replica's engine cores plus 1 CPU for its replica actor in one bundle. Where
    # two such replicas do not fit, the check's copy lets the actor ask for none (it shares the other cores).
    engine = mine.cpu_cores_per_replica * mine.tensor_parallel_size
    actor_cpus: float | None = None
    if record.device == "cpu":
        cpus = os.cpu_count() or 1
        fits = cpus // (engine + 1)
        if fits < 2 and cpus // engine >= 2:
            fits, actor_cpus = cpus // engine, 0
    else:
        fits = int(mine.autoscaling["max_replicas"])
    top = min(int(mine.autoscaling["max_replicas"]), fits)
    if top < 2:
        progress(f"[ray-serve] scale-up check: a second replica of {engine} core(s) does not fit here")
        return None
    autoscaling = {**mine.autoscaling, "min_replicas": 1, "max_replicas": top}
    copy = dataclasses.replace(mine, num_replicas=1, autoscaling=autoscaling, replica_actor_cpus=actor_cpus)
    path = out_dir / "serve-llm-scale-up.yaml"
    actor = (
        f" The replica actor asks for 0 CPUs (Serve's default 1, added to the engine's {engine} core(s), would let "
        f"only one replica fit on these {os.cpu_count()} cores)."
        if actor_cpus == 0
        else ""
    )
    note = [
        f"tuner validate's scale-up check: serve-llm.yaml with autoscaling 1-{top} replicas (the export has "
        f"{mine.autoscaling['min_replicas']}-{mine.autoscaling['max_replicas']}), everything else as exported.{actor}"
    ]
    path.write_text(render_serve_llm(copy, note, app_name=k8s_name(experiment)))
    burst, basis = burst_rate(rate, autoscaling.get("target_ongoing_requests"), e2e_mean_s)
    port = peer.free_port()
    log = out_dir / "scale-up-replicas.jsonl"
    log.unlink(missing_ok=True)
    progress(
        f"[ray-serve] scale-up check: autoscaling 1-{top} replicas (target_ongoing_requests "
        f"{autoscaling.get('target_ongoing_requests', 'Serve default')}), {duration_s:.0f} s at {burst:.3g} "
        f"requests/s ({basis}) on 127.0.0.1:{port}"
        + ("; the replica actor asks for 0 CPUs so that two replicas fit here" if actor_cpus == 0 else "")
    )
    trace = out_dir / "trace-scale-up.jsonl"
    offsets = peer.write_burst_trace(context.sample, burst, duration_s, trace, step=900)
    with serve_app(path, out_dir, port, copy.served_name, replicas_log=log) as url:
        try:
            raw = peer.bench(
                url,
                trace,
                len(offsets),
                model_path=tokenizer,
                served_name=copy.served_name,
                work=out_dir,
                name="bench-scale-up.json",
                seed=context.seed,
                timeout_s=duration_s * 3 + 600,
            )
            ended = time.time()
        finally:
            trace.unlink(missing_ok=True)
        # bench's times are its own clock: the burst began its span (first send to last finish) before it ended.
        finishes = [s + (lat or 0.0) for s, lat in zip(raw["start_times"], raw["latencies"], strict=True)]
        span = max(finishes) - min(raw["start_times"])
        began = ended - span
        # A replica Serve added under the burst may still be starting (an engine start on a busy machine):
        # wait for it a while, since the check is whether it comes up, not how fast on these cores.
        wait_until = time.time() + REPLICA_START_WAIT_S
        while time.time() < wait_until:
            time.sleep(2)
            latest = replica_timeline(log)[-1:]
            if not latest or _replicas(latest[0][1]) < 2 or _running(latest[0][1]) >= 2:
                break
        time.sleep(2)
    timeline = [(t - began, deployments) for t, deployments in replica_timeline(log)]
    added = next((t for t, d in timeline if t >= 0 and _replicas(d) >= 2), None)
    second = next((t for t, d in timeline if t >= 0 and _running(d) >= 2), None)
    failed = sum(1 for e in raw["errors"] if e)
    most = max((_running(d) for _, d in timeline), default=0)
    scaled = added is not None and added <= duration_s and second is not None
    if added is None or added > duration_s:
        text = f"Serve added no replica during the {duration_s:.0f} s burst"
    else:
        text = f"Serve added a second replica {added:.0f} s into the {duration_s:.0f} s burst"
        text += (
            f", running {second:.0f} s after the burst began"
            if second is not None
            else f", not running {REPLICA_START_WAIT_S:.0f} s after the burst's last request"
        )
    text += f" (last request done at {span:.0f} s; at most {most} ran); {failed} of {len(offsets)} requests failed"
    progress(f"[ray-serve] scale-up check: {text}")
    return {
        "scaled": scaled,
        "replica_added_after_s": None if added is None else round(added, 1),
        "second_replica_after_s": None if second is None else round(second, 1),
        "burst_span_s": round(span, 1),
        "max_running_replicas": most,
        "autoscaling_config": autoscaling,
        "replica_actor_cpus": actor_cpus,
        "burst_rps": burst,
        "burst_basis": basis,
        "burst_s": duration_s,
        "requests": len(offsets),
        "failed_requests": failed,
        "timeline": [{"t_s": round(t, 1), "running": _running(d), "replicas": _replicas(d)} for t, d in timeline],
        "text": text,
    }


def burst_rate(rate: Rate, target_ongoing: float | None, e2e_mean_s: float | None) -> tuple[float, str]:
    """The scale-up check's burst, requests/s, and why: enough to keep about twice `target_ongoing` requests in
    flight on one replica by Little's law (rate = in flight / mean E2E, at the mean E2E the exported config
    measured at `rate` on Serve: a lower bound, since latency only grows with load), and at least twice
    `rate`. Twice the rate alone is not enough where the rate is well below what a replica holds: its
    requests finish so fast that fewer than the target are in flight, and Serve rightly adds nothing."""
    twice = 2 * rate.rps
    if not target_ongoing or not e2e_mean_s or e2e_mean_s <= 0:
        return twice, f"twice the {rate.label} rate per replica"
    little = round(2 * float(target_ongoing) / e2e_mean_s, 2)
    if little <= twice:
        return twice, (
            f"twice the {rate.label} rate per replica: at least {twice * e2e_mean_s:.2g} in flight by Little's law, "
            f"against the target's {float(target_ongoing):g}"
        )
    return little, (
        f"Little's law: twice the target's {float(target_ongoing):g} in flight at the {e2e_mean_s:.2g} s mean E2E "
        f"measured at the {rate.label} rate; twice that rate, {twice:.3g}/s, would keep only {twice * e2e_mean_s:.2g}"
    )


def _running(deployments: Mapping[str, Mapping[str, int]]) -> int:
    """Running replicas of the engine deployment (not the ingress) in one replica-state snapshot."""
    engines = [states for name, states in deployments.items() if "ingress" not in name.lower()]
    return max((int(states.get("RUNNING", 0)) for states in engines), default=0)


def _replicas(deployments: Mapping[str, Mapping[str, int]]) -> int:
    """Replicas of the engine deployment in any state (starting ones included) in one snapshot."""
    engines = [states for name, states in deployments.items() if "ingress" not in name.lower()]
    return max((sum(int(n) for n in states.values()) for states in engines), default=0)


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
    """One bench serve run at `rate` against one replica; the step judged by the search's rule."""
    from tuner.metrics import summarize_step

    began = time.monotonic()
    total = rate.rps
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
