"""The `report` and `export` commands: parse options, call one entry point, print where the files went.

Register them on the main group with `main.add_command(report)` and `main.add_command(export)`;
TunerErrors they raise become the group's one red line.
"""

from __future__ import annotations

import json
from collections import Counter

import click

from tuner.export import DEFAULT_IMAGE
from tuner.plan import DEFAULT_HEADROOM
from tuner.selection import PICKS
from tuner.verdict import confirmation_lead

_URI_HELP = "MLflow tracking URI (default sqlite:///<repo>/reports/mlflow.db)."


def _tracking_uri(uri: str | None) -> str:
    from tuner.config import REPO_ROOT
    from tuner.tracking import default_tracking_uri

    return uri or default_tracking_uri(REPO_ROOT)


def _writable_folder(path: str) -> str:
    """`path`, checked before any work is done: ConfigError naming --out when the folder cannot be created
    or written. Folders made to find out are removed again, so a command that fails later leaves none."""
    import os
    from pathlib import Path

    from tuner.errors import ConfigError

    folder = Path(path).absolute()
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--out {path}: a file is in the way of the folder") from None
    except OSError as error:
        raise ConfigError(f"--out {path}: cannot create the folder: {error.strerror}") from None
    writable = os.access(folder, os.W_OK | os.X_OK)
    for created in missing:  # deepest first
        created.rmdir()
    if not writable:
        raise ConfigError(f"--out {path}: the folder is not writable")
    return path


@click.command("report")
@click.option(
    "--experiment",
    "experiments",
    multiple=True,
    required=True,
    help="Experiment (search name) to report on; repeat it to compare searches side by side.",
)
@click.option("--tracking-uri", default=None, help=_URI_HELP)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for report.html and report.md (default reports/<experiment>[+<experiment>...]).",
)
@click.option("--no-log", is_flag=True, help="Do not log the report to the searches' parent runs.")
def report(experiments: tuple[str, ...], tracking_uri: str | None, out_dir: str | None, no_log: bool) -> None:
    """Write an HTML (interactive, offline) and a Markdown report of one or more searches."""
    from tuner.config import REPO_ROOT
    from tuner.report import default_out_dir, generate_report

    out = _writable_folder(str(out_dir or default_out_dir(REPO_ROOT, experiments)))
    result = generate_report(_tracking_uri(tracking_uri), list(experiments), out, log_to_mlflow=not no_log)
    for record in result.records:
        counts = Counter(t.status for t in record.trials)
        click.echo(
            f"{record.experiment}: {len(record.trials)} trials ("
            + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items())
            + f"), parent run {record.parent_run_id}"
        )
    click.echo(f"wrote {result.html_path}")
    click.echo(f"wrote {result.markdown_path}")
    if result.logged_to:
        click.echo("logged report.html and report.md to parent run(s) " + ", ".join(result.logged_to))


@click.command("export")
@click.option("--experiment", required=True, help="Experiment (search name) to export the best trial of.")
@click.option("--tracking-uri", default=None, help=_URI_HELP)
@click.option(
    "--slo",
    default=None,
    help="Judge trials under this SLO instead of the one the search recorded (re-judged per load step).",
)
@click.option(
    "--pick",
    type=click.Choice(PICKS),
    default="max-capacity",
    show_default=True,
    help="Which feasible trial: highest capacity (the confirmation's recommendation when there was one), "
    "lowest latency at the reference load, or the knee.",
)
@click.option("--model-uri", default=None, help="Production model id to deploy in place of the tuned local path.")
@click.option("--target-accelerator", default=None, help="Ray accelerator type for Ray Serve, e.g. H100, L4.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address vllm serve and Ray Serve listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port vllm serve and Ray Serve listen on.")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Container image for the RayService pods.")
@click.option(
    "--headroom",
    type=click.FloatRange(0, 1, max_open=True),
    default=DEFAULT_HEADROOM,
    show_default=True,
    help="Replica plan: run each replica at its confirmed capacity x (1 - headroom).",
)
@click.option(
    "--target-rps",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Replica plan for this request rate (default: the workload's rate profile, trough to peak).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Folder for the files.")
def export(
    experiment: str,
    tracking_uri: str | None,
    slo: str | None,
    pick: str,
    model_uri: str | None,
    target_accelerator: str | None,
    host: str,
    port: int,
    image: str,
    headroom: float,
    target_rps: float | None,
    out_dir: str,
) -> None:
    """Write vllm-serve.yaml, serve-llm.yaml, rayservice.yaml and best.json for the best trial."""
    from tuner.export import ExportOptions, export_search
    from tuner.selection import capacity_summary

    options = ExportOptions(
        model_uri=model_uri,
        target_accelerator=target_accelerator,
        host=host,
        port=port,
        image=image,
        headroom=headroom,
        target_rps=target_rps,
    )
    result = export_search(
        _tracking_uri(tracking_uri), experiment, _writable_folder(out_dir), slo=slo, pick=pick, options=options
    )
    trial = result.trial
    rejudged = " (re-judged from the per-step metrics)" if result.rejudged else ""
    click.echo(
        f"{experiment}: trial {trial.trial_id} ({pick}) sustains {capacity_summary(trial)['text']} "
        f"within SLO '{result.slo}'{rejudged}; TTFT p95 at the reference load "
        f"{trial.metrics.get('ref_ttft_p95_s', float('nan')):.3g} s"
    )
    verdict = result.record.verdict
    if verdict:
        recommended = (
            "the baseline" if verdict.get("winner") == verdict.get("baseline") else f"trial {verdict.get('winner')}"
        )
        lead = confirmation_lead(verdict, capitalized=False)
        click.echo(f"{lead}: {verdict.get('text')}; recommended: {recommended}")
    else:
        click.echo("no confirmation phase: the capacity above is one measurement (see the README)")
    plan = json.loads(result.files["best.json"].read_text())["plan"]
    click.echo(plan.get("text") or plan["note"])
    for path in result.files.values():
        click.echo(f"wrote {path}")
