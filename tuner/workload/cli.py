"""The `workload` command group (inspect, convert, synth); the only workload module that prints."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from tuner.errors import ConfigError, validation_line
from tuner.workload.canonical import write_canonical
from tuner.workload.formats import FORMATS, load_workload
from tuner.workload.records import Workload
from tuner.workload.rows import Tokenizer
from tuner.workload.stats import summarize
from tuner.workload.synth import synthesize
from tuner.workload.transforms import TransformSpec, apply_transforms

F = TypeVar("F", bound=Callable[..., Any])


def load_hf_tokenizer(name: str) -> Tokenizer:
    """A Hugging Face tokenizer (local path or id) as a `str -> token ids` callable."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("--tokenizer needs the 'transformers' package") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load tokenizer {name!r}: {str(exc).splitlines()[0]}") from None
    return functools.partial(tokenizer.encode, add_special_tokens=False)


def _load_options(command: F) -> F:
    """The options every subcommand needs to read a trace."""
    options = [
        click.option(
            "--format",
            "trace_format",
            default="auto",
            show_default=True,
            type=click.Choice(["auto", *FORMATS]),
            help="Trace format.",
        ),
        click.option(
            "--time-unit",
            type=click.Choice(["ms", "s"]),
            default=None,
            help="Unit of mooncake/timed_trace timestamps (settles which of the two auto picks).",
        ),
        click.option(
            "--tokenizer",
            default=None,
            metavar="NAME_OR_PATH",
            help="Hugging Face tokenizer for traces with text (sharegpt, canonical 'prompt').",
        ),
        click.option(
            "--sharegpt-rate",
            type=click.FloatRange(min=0, min_open=True),
            default=1.0,
            show_default=True,
            help="Poisson arrival rate (req/s) given to ShareGPT conversations.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _read(
    path: str,
    trace_format: str,
    time_unit: str | None,
    tokenizer: str | None,
    sharegpt_rate: float,
    seed: int,
) -> Workload:
    return load_workload(
        path,
        trace_format,
        time_unit=time_unit,
        tokenizer=load_hf_tokenizer(tokenizer) if tokenizer else None,
        sharegpt_rate_rps=sharegpt_rate,
        seed=seed,
    )


def transform_spec(**options: Any) -> TransformSpec:
    """Validate transform options into a TransformSpec; raise ConfigError naming the option."""
    try:
        return TransformSpec(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        line = validation_line(exc)
        raise ConfigError(f"workload.transforms.{line}" if ": " in line else f"workload.transforms: {line}") from None


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _lengths(lengths: dict[str, float] | None) -> str:
    if lengths is None:
        return "n/a"
    return "  ".join(f"{key} {lengths[key]:,.0f}" for key in ("p50", "p90", "p99", "max"))


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable `inspect` report."""
    dropped = summary["dropped"]
    lines = [
        ("source", summary["source"]),
        (
            "format",
            summary["format"] + (f" (auto: {summary['detected']})" if summary["detected"] else ""),
        ),
        ("time unit", summary["time_unit"] or "n/a"),
        ("sha256", summary["sha256"]),
        ("requests", f"{summary['requests']:,} (rows read {summary['rows_read']:,})"),
        ("duration", f"{_number(summary['duration_s'])} s"),
        ("mean rate", f"{_number(summary['mean_rate_rps'], 4)} req/s"),
        (
            "burstiness",
            f"{_number(summary['burstiness_cv'])} (CV of inter-arrival gaps; Poisson = 1)",
        ),
        ("prompt tokens", _lengths(summary["prompt_tokens"])),
        ("output tokens", _lengths(summary["output_tokens"])),
        (
            "prefix sharing",
            _number(summary["prefix_sharing_ratio"])
            + ("" if summary["prefix_sharing_ratio"] is None else " of prefix blocks repeat an earlier prefix"),
        ),
        (
            "dropped",
            "none" if not dropped else "; ".join(f"{r}: {n:,}" for r, n in dropped.items()),
        ),
    ]
    for step in summary["transforms"]:
        details = ", ".join(f"{k}={v}" for k, v in step.items() if k != "op")
        lines.append(("transform", f"{step['op']}: {details}"))
    return "\n".join(f"{label:<15} {value}" for label, value in lines)


@click.group(name="workload")
def workload() -> None:
    """Traces: import, check, scale, summarise."""


@workload.command()
@click.argument("file", type=click.Path(dir_okay=False))
@_load_options
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for generated arrivals.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(
    file: str,
    trace_format: str,
    time_unit: str | None,
    tokenizer: str | None,
    sharegpt_rate: float,
    seed: int,
    as_json: bool,
) -> None:
    """Summarise a trace: size, rate, burstiness, lengths, prefix sharing, dropped rows."""
    summary = summarize(_read(file, trace_format, time_unit, tokenizer, sharegpt_rate, seed))
    click.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))


@workload.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Canonical JSONL to write.")
@_load_options
@click.option("--window-start", type=float, help="Keep arrivals >= this many seconds.")
@click.option("--window-end", type=float, help="Keep arrivals < this many seconds.")
@click.option("--first", "first_n", type=int, help="Keep the first N requests.")
@click.option("--sample-fraction", type=float, help="Keep each request with this probability.")
@click.option("--prompt-scale", type=float, help="Multiply prompt lengths.")
@click.option("--output-scale", type=float, help="Multiply output lengths.")
@click.option("--max-model-len", type=int, help="Fit prompt + output tokens to this context.")
@click.option(
    "--overflow",
    type=click.Choice(["clip", "drop"]),
    default="clip",
    show_default=True,
    help="Requests over --max-model-len: clip (prompt first) or drop.",
)
@click.option("--time-scale", type=float, help="Multiply arrival times (0.5 doubles the rate).")
@click.option("--target-rate", type=float, help="Scale arrival times to this mean rate (req/s).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for anything random.")
@click.option("--include-prompt-text", is_flag=True, help="Also write prompt text, if any.")
def convert(
    file: str,
    out: str,
    trace_format: str,
    time_unit: str | None,
    tokenizer: str | None,
    sharegpt_rate: float,
    window_start: float | None,
    window_end: float | None,
    first_n: int | None,
    sample_fraction: float | None,
    prompt_scale: float | None,
    output_scale: float | None,
    max_model_len: int | None,
    overflow: str,
    time_scale: float | None,
    target_rate: float | None,
    seed: int,
    include_prompt_text: bool,
) -> None:
    """Write a trace in the canonical format, optionally transformed."""
    spec = transform_spec(
        window_start_s=window_start,
        window_end_s=window_end,
        first_n=first_n,
        sample_fraction=sample_fraction,
        prompt_scale=prompt_scale,
        output_scale=output_scale,
        max_model_len=max_model_len,
        overflow=overflow,
        time_scale=time_scale,
        target_rate_rps=target_rate,
        seed=seed,
    )
    loaded = _read(file, trace_format, time_unit, tokenizer, sharegpt_rate, seed)
    converted = apply_transforms(loaded, spec)
    write_canonical(converted, out, include_prompt_text=include_prompt_text)
    summary = summarize(converted)
    click.echo(
        f"wrote {summary['requests']:,} requests over {summary['duration_s']:,.3f} s "
        f"({summary['mean_rate_rps']:,.4f} req/s) to {out}"
    )
    for reason, count in summary["dropped"].items():
        click.echo(f"dropped {count:,}: {reason}")
    for step in summary["transforms"]:
        if step.get("clipped"):
            click.echo(f"clipped {step['clipped']:,} to max_model_len {step['max_model_len']}")


@workload.command()
@click.option(
    "--from",
    "reference",
    required=True,
    type=click.Path(dir_okay=False),
    help="Trace to fit prompt and output lengths from.",
)
@_load_options
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    required=True,
    help="Mean arrival rate (req/s).",
)
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), help="Seconds of arrivals.")
@click.option("--count", type=click.IntRange(min=1), help="Number of requests.")
@click.option("--arrivals", type=click.Choice(["poisson", "gamma"]), default="poisson", show_default=True)
@click.option(
    "--cv",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Coefficient of variation of Gamma inter-arrival gaps.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Canonical JSONL to write.")
def synth(
    reference: str,
    trace_format: str,
    time_unit: str | None,
    tokenizer: str | None,
    sharegpt_rate: float,
    rate: float,
    duration: float | None,
    count: int | None,
    arrivals: str,
    cv: float,
    seed: int,
    out: str,
) -> None:
    """Generate a workload with Poisson or Gamma arrivals and lengths fitted from a trace."""
    if (duration is None) == (count is None):
        raise click.UsageError("give exactly one of --duration or --count")
    fitted_from = _read(reference, trace_format, time_unit, tokenizer, sharegpt_rate, seed)
    generated = synthesize(
        fitted_from,
        rate_rps=rate,
        duration_s=duration,
        count=count,
        arrivals=arrivals,  # type: ignore[arg-type]
        cv=cv,
        seed=seed,
    )
    write_canonical(generated, out)
    click.echo(f"wrote {len(generated.requests):,} requests over {generated.duration_s:,.3f} s to {out}")


if __name__ == "__main__":
    workload()
