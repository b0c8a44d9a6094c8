"""The command line: parse, validate, call one entry point, and turn any TunerError or bad command line into one
red line."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import click

from tuner.errors import TunerError
from tuner.tracking import capacity_text
from tuner.vocabulary import FINAL_STATUSES


class TunerGroup(click.Group):
    """A click group that prints a TunerError, or click's own error for a bad command line (a missing or
    invalid argument, an unknown option or command), as one line (exit 2); --debug shows the traceback
    of a TunerError and click's usage text instead."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _one_line_errors(ctx):
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        with _one_line_errors(ctx):
            return super().invoke(ctx)


# Click (8.2+) asks for the help text of a group called with nothing by raising a UsageError: let it show.
_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())


@contextlib.contextmanager
def _one_line_errors(ctx: click.Context) -> Iterator[None]:
    try:
        yield
    except (TunerError, click.UsageError) as error:
        if isinstance(error, _NoArgsIsHelp) or (ctx.obj and ctx.obj.get("debug")):
            raise
        message = error.format_message() if isinstance(error, click.UsageError) else str(error)
        click.secho(f"error: {message}", fg="red", err=True)
        sys.exit(2)


@click.group(cls=TunerGroup)
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """vllm-tuner: find the vLLM deployment config that sustains your traffic within your SLO."""
    ctx.ensure_object(dict)["debug"] = debug


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Search config YAML (default: the embedded examples/default.yaml).",
)
@click.option("--name", default=None, help="Experiment name (MLflow experiment); overrides `name`.")
@click.option("--num-samples", type=int, default=None, help="Number of trials; overrides budget.num_samples.")
@click.option("--time-budget-s", type=float, default=None, help="Stop starting trials after this many seconds.")
@click.option("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite:///reports/mlflow.db).")
@click.option("--address", default=None, help="Existing Ray cluster to run on (else RAY_ADDRESS or local).")
@click.option("--space", default=None, help="Search space file or bundled name; overrides `space`.")
@click.option("--slo", default=None, help="SLO string, e.g. 'ttft:p95<2s; tpot:p95<50ms'.")
@click.option("--model", default=None, help="Model path or Hugging Face id; overrides model.path.")
@click.option("--workload", default=None, help="Trace file; overrides workload.path.")
@click.option(
    "--trial-timeout-s",
    type=float,
    default=None,
    help="A trial still running after this long ends as infeasible; overrides budget.trial_timeout_s.",
)
@click.option(
    "--resume", is_flag=True, help="Continue the latest unfinished search named --name (after the driver was killed)."
)
@click.option(
    "--confirm/--no-confirm",
    default=None,
    help="Re-measure the finalists and the baseline after the search (default: as the config's confirm.rounds says).",
)
@click.option(
    "--dry-run", is_flag=True, help="Validate everything and check placement; start no engine and write nothing."
)
def search(
    config_path,
    name,
    num_samples,
    time_budget_s,
    tracking_uri,
    address,
    space,
    slo,
    model,
    workload,
    trial_timeout_s,
    resume,
    confirm,
    dry_run,
) -> None:
    """Run a search (on the embedded defaults when no --config is given)."""
    from tuner.config import load_config
    from tuner.search import run_search

    config = load_config(
        config_path,
        {
            "name": name,
            "budget.num_samples": num_samples,
            "budget.time_budget_s": time_budget_s,
            "tracking.uri": tracking_uri,
            "ray.address": address,
            "space": space,
            "slo": slo,
            "model.path": model,
            "workload.path": workload,
            "budget.trial_timeout_s": trial_timeout_s,
            "confirm.rounds": 0 if confirm is False else None,
        },
        flags=FLAGS,
    )
    if confirm and config.confirm.rounds == 0:  # --confirm over a config that turned it off: the default rounds
        config = config.model_copy(update={"confirm": config.confirm.model_copy(update={"rounds": None})})
    outcome = run_search(config, progress=lambda line: print(line, flush=True), dry_run=dry_run, resume=resume)
    if outcome is not None:
        print_summary(outcome)


# Where each override came from, so an error names the flag the user typed.
FLAGS = {
    "name": "--name",
    "budget.num_samples": "--num-samples",
    "budget.time_budget_s": "--time-budget-s",
    "tracking.uri": "--tracking-uri",
    "ray.address": "--address",
    "space": "--space",
    "slo": "--slo",
    "model.path": "--model",
    "workload.path": "--workload",
    "budget.trial_timeout_s": "--trial-timeout-s",
    "confirm.rounds": "--no-confirm",
}


def print_summary(outcome) -> None:
    """The end-of-search table of Pareto-optimal configs, then where everything was recorded."""
    from rich.console import Console
    from rich.table import Table

    from tuner.selection import highest_capacity

    console = Console()
    console.width = max(console.width, 150)
    counts = {s: sum(t.status == s for t in outcome.trials) for s in FINAL_STATUSES}
    confirming = outcome.confirmation.wall_s if outcome.confirmation is not None else 0.0
    console.print(
        f"\n{len(outcome.trials)} trials in {(outcome.wall_s - confirming) / 60:.1f} min"
        + (f", then {confirming / 60:.1f} min of confirmation" if outcome.confirmation is not None else "")
        + ": "
        + ", ".join(f"{v} {k.value.replace('_', ' ')}" for k, v in counts.items())
    )
    table = Table(title="Pareto-optimal configs (capacity per accelerator vs latency at the reference load)")
    params = sorted({k for t in outcome.pareto for k, v in t.params.items() if not isinstance(v, bool)})
    for column in ["trial", "status", *params, "capacity rps/accel [bracket]", "ref ttft p95 s", "ref tpot p95 s"]:
        table.add_column(column)
    for trial in outcome.pareto:
        metrics = trial.metrics
        marker = " (baseline)" if outcome.baseline is trial else ""
        table.add_row(
            trial.trial_id + marker,
            str(trial.status),
            *[_show(trial.params.get(p)) for p in params],
            _capacity_cell(metrics),
            f"{metrics.get('ref_ttft_p95_s', 0):.3f}",
            f"{metrics.get('ref_tpot_p95_s', 0):.4f}",
        )
    console.print(table)
    if not outcome.pareto:
        console.print("no trial passed a load step: nothing is Pareto-optimal (see the trial reasons above)")
    base = outcome.baseline
    best = highest_capacity(outcome.pareto) if outcome.pareto else None  # a tie at the same load: lower TTFT
    if base is not None:
        line = (
            f"baseline (vLLM defaults), trial {base.trial_id}: {base.status}, "
            f"{capacity_text(base.metrics, base.status)}, ref ttft p95 "
            f"{base.metrics.get('ref_ttft_p95_s', 0):.3f}s"
        )
        if best is not None and best is not base:
            line += f"; highest capacity: trial {best.trial_id}, {capacity_text(dict(best.metrics), best.status)}"
            line += " (one measurement each)"
        console.print(line)
    confirmation = outcome.confirmation
    if confirmation is not None:
        from tuner.verdict import confirmation_lead

        verdict = confirmation.verdict
        for trial_id, measured in confirmation.measurements.items():
            if not measured:  # no round ran: the verdict's line below says so
                continue
            values = ", ".join(
                (f">= {m.capacity:.3g}" if m.censored else f"{m.capacity:.3g}-{m.hi:.3g}" if m.hi else "0")
                for m in measured
            )
            role = " (baseline)" if trial_id == verdict.baseline else ""
            console.print(f"confirmed {trial_id}{role}: {values} rps/accel")
        recommended = "the baseline" if verdict.winner == verdict.baseline else f"trial {verdict.winner}"
        lead = confirmation_lead({"rounds_done": confirmation.rounds_done}, capitalized=False)
        console.print(f"{lead}: {verdict.text}; recommended: {recommended}")
    else:
        console.print("no confirmation phase: the trials above are one measurement each (see the README)")
    console.print(
        f"MLflow: {outcome.tracking_uri}  experiment {outcome.experiment!r}, "
        f"parent run {outcome.parent_run_id} (pareto.json, pareto.png"
        + (", verdict.json)" if outcome.confirmation is not None else ")")
    )


def _capacity_cell(metrics: dict[str, float]) -> str:
    capacity = metrics.get("capacity_rps_per_accel", 0.0)
    if metrics.get("capacity_censored"):
        return f">= {capacity:.2f} (censored)"
    hi = metrics.get("capacity_hi_rps_per_accel")
    return f"{capacity:.2f} [{capacity:.2f}-{hi:.2f}]" if hi is not None else f"{capacity:.2f}"


def _show(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _register_subcommands() -> None:
    from tuner.record.cli import record
    from tuner.report_cli import export, report
    from tuner.validate_cli import validate
    from tuner.workload.cli import workload

    main.add_command(workload, "workload")
    main.add_command(report, "report")
    main.add_command(export, "export")
    main.add_command(validate, "validate")
    main.add_command(record, "record")


_register_subcommands()
