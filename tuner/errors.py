"""The one exception tree of vllm-tuner; the CLI turns any of these into a one-line error.

TunerError
 ├── ConfigError      a search config, search space or SLO string is invalid
 ├── WorkloadError    a trace file cannot be read or is empty after filtering
 ├── EngineError      a vLLM engine would not start or crashed
 │    └── EngineDied  a replica's engine or server is gone: the replica is dead, not one request
 ├── TrackingError    MLflow holds no usable record for the request
 ├── ExportError      no trial can be exported
 └── StackError       a serving stack under validation could not start or be measured (exit 3)
"""

from __future__ import annotations

from pydantic import ValidationError


class TunerError(Exception):
    """Root of every error the tool raises on purpose."""


class ConfigError(TunerError):
    """A search config, search space, SLO string or CLI option is invalid."""


class WorkloadError(TunerError):
    """A trace file is malformed, of an unknown format, or empty after filtering."""


class EngineError(TunerError):
    """A vLLM engine failed to start, crashed, or timed out."""


class EngineDied(EngineError):
    """A replica's engine or server is gone (its process ended, its actor died): the replica is dead, as
    opposed to one request failing. The health monitor and the router act on this type, never on text."""


class TrackingError(TunerError):
    """The tracking store has no usable record for what was asked."""


class ExportError(TunerError):
    """No trial can be exported (none feasible, or none meets the SLO)."""


class StackError(TunerError):
    """A serving stack under validation (vLLM's server, Ray Serve) could not start or be measured: the
    validation has no verdict, and `tuner validate` exits 3 with the stack's own message."""


def validation_line(error: ValidationError) -> str:
    """The first pydantic error as one line: `field.path: message` (union branch labels left out)."""
    first = error.errors()[0]
    where = ".".join(
        str(p)
        for p in first["loc"]
        if str(p) not in _BRANCH_LABELS and not str(p).startswith(("function-", "tagged-union"))
    )
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    return f"{where}: {message}" if where else message


_BRANCH_LABELS = {
    "int",
    "float",
    "categorical",
    "bool",
    "str",
    "dict[str,any]",
    "literal['vllm-defaults']",
    "IntParam",
    "FloatParam",
    "CategoricalParam",
}
