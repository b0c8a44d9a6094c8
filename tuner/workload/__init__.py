"""Workloads: recorded LLM traffic read from trace files, transformed, summarised, synthesised."""

from tuner.workload.canonical import write_canonical
from tuner.workload.formats import FORMATS, detect_format, load_workload
from tuner.workload.records import PREFIX_BLOCK_TOKENS, Request, Workload
from tuner.workload.stats import summarize
from tuner.workload.synth import synthesize
from tuner.workload.transforms import TransformSpec, apply_transforms

__all__ = [
    "FORMATS",
    "PREFIX_BLOCK_TOKENS",
    "Request",
    "TransformSpec",
    "Workload",
    "apply_transforms",
    "detect_format",
    "load_workload",
    "summarize",
    "synthesize",
    "write_canonical",
]
