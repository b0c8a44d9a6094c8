"""Parse and print service-level objectives such as `ttft:p95<5s; tpot:p95<100ms`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tuner.errors import ConfigError

METRICS = ("ttft", "tpot", "itl", "e2e", "queue")
STATS = ("mean", "p50", "p90", "p95", "p99")
_UNITS_PER_SECOND = {"ms": 1000.0, "s": 1.0}
_EXAMPLE = "e.g. ttft:p95<5s"
_TERM = re.compile(r"(?P<metric>[^:]*):(?P<stat>[^<]*)<=?(?P<bound>.*)")
_BOUND = re.compile(r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>[A-Za-z]*)")


@dataclass(frozen=True)
class SloTerm:
    """One bound: the statistic `stat` of latency `metric` over a step's requests stays within `bound_s`."""

    metric: str
    stat: str
    bound_s: float

    def __str__(self) -> str:
        # Milliseconds read better below a second, but only when they parse back to the same float.
        millis = _shortest(self.bound_s, "ms") if self.bound_s < 1 else None
        return f"{self.metric}:{self.stat}<{millis or _shortest(self.bound_s, 's')}"


@dataclass(frozen=True)
class Slo:
    """All terms of an SLO; a step meets it when every term holds."""

    terms: tuple[SloTerm, ...]

    def __str__(self) -> str:
        return "; ".join(str(term) for term in self.terms)


def parse_slo(text: str) -> Slo:
    """Return the `Slo` written as `;`-separated terms `METRIC:STAT<BOUND` or `METRIC:STAT<=BOUND`.

    A bound needs a unit (`ms` or `s`); `<` and `<=` both mean "at most". Raises `ConfigError`
    (one line, naming the offending term) for an empty SLO, an unknown metric, statistic or unit,
    a bound that is not a positive finite number, or a metric:stat given twice.
    """
    terms: dict[tuple[str, str], SloTerm] = {}
    for raw in text.split(";"):
        if not raw.strip():
            continue
        term = _parse_term(raw.strip())
        key = (term.metric, term.stat)
        if key in terms:
            raise ConfigError(
                f"SLO term {raw.strip()!r}: {term.metric}:{term.stat} is already bounded by "
                f"'{terms[key]}' (give each metric:stat once)"
            )
        terms[key] = term
    if not terms:
        raise ConfigError(f"SLO {text!r} has no terms ({_EXAMPLE}; tpot:p95<100ms)")
    return Slo(tuple(terms.values()))


def _parse_term(raw: str) -> SloTerm:
    def fail(reason: str) -> ConfigError:
        return ConfigError(f"SLO term {raw!r}: {reason}")

    match = _TERM.fullmatch(raw)
    if match is None:
        raise fail(f"expected METRIC:STAT<BOUND ({_EXAMPLE})")
    metric, stat, bound = (match[name].strip() for name in ("metric", "stat", "bound"))
    if metric not in METRICS:
        raise fail(f"unknown metric {metric!r} (use one of {', '.join(METRICS)})")
    if stat not in STATS:
        raise fail(f"unknown percentile {stat!r} (use one of {', '.join(STATS)})")
    number = _BOUND.fullmatch(bound)
    if number is None:
        raise fail(f"bound {bound!r} is not a number with a unit ({_EXAMPLE} or 100ms)")
    unit = number["unit"]
    if unit not in _UNITS_PER_SECOND:
        problem = "missing unit" if not unit else f"unknown unit {unit!r}"
        raise fail(f"{problem} in bound {bound!r} (use ms or s)")
    # Dividing (not multiplying by 1e-3) gives the double nearest the decimal written: 7ms -> 0.007.
    bound_s = float(number["number"]) / _UNITS_PER_SECOND[unit]
    if not (math.isfinite(bound_s) and bound_s > 0):
        raise fail(f"bound {bound!r} must be a positive finite number")
    return SloTerm(metric, stat, bound_s)


def _shortest(bound_s: float, unit: str) -> str | None:
    """The shortest `NUMBERunit` that parses back to exactly `bound_s`, or None if there is none."""
    per_second = _UNITS_PER_SECOND[unit]
    for digits in range(1, 18):
        number = float(f"{bound_s * per_second:.{digits}g}")
        if number / per_second == bound_s:
            return repr(number).removesuffix(".0") + unit
    return None
