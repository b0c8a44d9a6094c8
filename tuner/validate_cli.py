"""The `validate` command: parse options, call tuner.validate, print the table, record it, set the exit code.

Exit codes: 0 the exported config held the SLO at the planned operating point (and, with --scale-up-s, Serve
added a replica under the burst); 1 it missed (or Serve did not scale up); 2 bad input
(any other TunerError, from the main group); 3 a stack could not start or be measured (StackError).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tuner.report_cli import _URI_HELP, _tracking_uri, _writable_folder
from tuner.selection import PICKS
from tuner.validate import DEFAULT_HEADROOM, STACKS


@click.command("validate")
@click.option("--experiment", required=True, help="Experiment (search name) whose exported config to validate.")
@click.option("--tracking-uri", default=None, help=_URI_HELP)
@click.option(
    "--workload", default=None, help="Trace to replay (default: the search's own); any format the search reads."
)
@click.option(
    "--against",
    default="vllm-defaults",
    show_default=True,
    help="The comparison: vLLM's defaults (the search's baseline), a `vllm serve --config` YAML you run today, "
    "or none (the export alone, judged by the SLO: half the servers to start).",
)
@click.option(
    "--stack",
    type=click.Choice([*STACKS, "both"]),
    default="vllm",
    show_default=True,
    help="Start vllm-serve.yaml with vLLM's OpenAI server, serve-llm.yaml with Ray Serve (a Ray of its own), or both.",
)
@click.option(
    "--rates",
    default="auto",
    show_default=True,
    help="Requests/s per server: 'auto' (the planned operating point and the confirmed capacity) or R1,R2,...",
)
@click.option(
    "--headroom",
    type=float,
    default=DEFAULT_HEADROOM,
    show_default=True,
    help="Planned operating point = confirmed capacity's lower bound x (1 - headroom).",
)
@click.option("--pick", type=click.Choice(PICKS), default="max-capacity", show_default=True, help="As for export.")
@click.option(
    "--scale-up-s",
    type=float,
    default=0,
    show_default=True,
    help="Ray Serve only: also check that the exported autoscaling adds a replica under this many seconds of "
    "traffic keeping twice its target_ongoing_requests in flight on one replica, at least twice the first rate "
    "(0 = off; at least 60).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Folder for the files.")
def validate(
    experiment: str,
    tracking_uri: str | None,
    workload: str | None,
    against: str,
    stack: str,
    rates: str,
    headroom: float,
    pick: str,
    scale_up_s: float,
    out_dir: str,
) -> None:
    """Serve the exported config as written, replay traffic through it with vLLM's bench serve, and judge the SLO."""
    from tuner.errors import StackError
    from tuner.tracking import client_for, record_validation, write_json
    from tuner.validate import validate as run_validation

    uri = _tracking_uri(tracking_uri)
    out = Path(_writable_folder(out_dir))
    stacks = list(STACKS) if stack == "both" else [stack]
    try:
        outcome = run_validation(
            tracking_uri=uri,
            experiment=experiment,
            out_dir=out,
            workload=workload,
            against=against,
            stacks=stacks,
            rates=rates,
            headroom=headroom,
            pick=pick,
            scale_up_s=scale_up_s,
            progress=lambda line: click.echo(line),
        )
    except StackError as error:
        if (ctx := click.get_current_context()).obj and ctx.obj.get("debug"):
            raise
        click.secho(f"error: a stack could not start or be measured: {error}", fg="red", err=True)
        sys.exit(3)
    document = outcome.document()
    write_json(out / "validation.json", document)
    client = client_for(uri)
    from tuner.recorded import load_search

    parent = load_search(client, experiment).parent_run_id
    # The files validate wrote; a user's own --against file is named in validation.json, never uploaded
    # (a vllm serve config may hold an api-key).
    ours = [s.config_path for s in outcome.served if s.config_path.parent == out]
    run_id = record_validation(client, experiment, parent, document, [out / "validation.json", *dict.fromkeys(ours)])
    for ratio in document["ratios"]:
        click.echo(
            f"[{ratio['stack']}] at the {ratio['rate']} rate the exported config gives "
            f"{_x(ratio['goodput_ratio'])} the comparison's goodput, {_x(ratio['ttft_p95_ratio'])} its TTFT p95"
        )
    for note in outcome.notes:
        click.echo(f"note: {note}")
    click.echo(f"wrote {out / 'validation.json'}; MLflow run {run_id} (run_kind=validate) under the search's parent")
    verdict = outcome.text()
    if outcome.passed:
        click.secho(verdict, fg="green")
        return
    click.secho(verdict, fg="red")
    sys.exit(1)


def _x(value: float | None) -> str:
    return "no ratio" if value is None else f"x{value:.2f}"
