"""Find the non-dominated points of a set of trials' metrics, and the knee of that front."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

Objective = tuple[str, Literal["max", "min"]]


def dominates(a: Mapping[str, float], b: Mapping[str, float], objectives: Sequence[Objective]) -> bool:
    """Return True if `a` is at least as good as `b` in every objective and better in one.

    A missing or non-finite value is the worst possible. Raises ValueError if `objectives` is
    empty or names a direction other than "max" or "min".
    """
    _check(objectives)
    return _dominates(_scores(a, objectives), _scores(b, objectives))


def non_dominated(
    points: Sequence[Mapping[str, float]],
    objectives: Sequence[Objective],
    ties: Mapping[str, float] | None = None,
) -> list[int]:
    """Return the indices, in input order, of the points no other point dominates (ties all kept).

    `ties` maps an objective to a relative tolerance: that objective's values are grouped from the best
    down, each group holding the values within the tolerance of its best, and a value counts as its
    group's best: a point that ties another there and is worse in another objective is dominated.
    Anchoring each group at its best keeps dominance transitive, which comparing pairs within the
    tolerance would not.
    Raises ValueError as `dominates` does, or for a negative tolerance.
    """
    _check(objectives)
    scores = [_scores(p, objectives) for p in points]
    for column, (name, _) in enumerate(objectives):
        tolerance = (ties or {}).get(name, 0.0)
        if tolerance < 0:
            raise ValueError(f"objective {name!r}: tie tolerance must be >= 0, but got {tolerance}")
        if tolerance:
            grouped = _grouped([s[column] for s in scores], tolerance)
            scores = [s[:column] + (g,) + s[column + 1 :] for s, g in zip(scores, grouped, strict=True)]
    return [i for i, mine in enumerate(scores) if not any(_dominates(other, mine) for other in scores)]


def knee_index(points: Sequence[Mapping[str, float]], front: list[int], objectives: Sequence[Objective]) -> int:
    """Return the index (into `points`) of the front's best compromise.

    With two objectives, after min-max normalising over the front, that is the point furthest beyond
    the line joining the front's two extreme points, towards the ideal point. Otherwise (other
    objective counts, or no point beyond that line) it is the point nearest the ideal point; ties go
    to the earliest in `front`. A point missing a value is chosen only if every front point misses
    one. Raises ValueError for an empty front, or as `dominates` does.
    """
    _check(objectives)
    if not front:
        raise ValueError("the front is empty; there is no knee")
    scores = {i: _scores(points[i], objectives) for i in front}
    # A point missing a value is on the front only for its other values; prefer complete points.
    candidates = [i for i in front if all(map(math.isfinite, scores[i]))] or front
    norm = _normalised([scores[i] for i in candidates])
    if len(objectives) == 2:
        a = max(norm, key=lambda p: (p[0], p[1]))
        b = max(norm, key=lambda p: (p[1], p[0]))
        ideal_side = _cross(a, b, (1.0, 1.0))
        if ideal_side != 0:
            # Proportional to the signed distance from the line a-b, positive on the ideal's side.
            beyond = [_cross(a, b, p) * ideal_side for p in norm]
            best = max(range(len(candidates)), key=beyond.__getitem__)
            if beyond[best] > 0:
                return candidates[best]
    distances = [math.dist(p, (1.0,) * len(p)) for p in norm]
    return candidates[min(range(len(candidates)), key=distances.__getitem__)]


def _check(objectives: Sequence[Objective]) -> None:
    if not objectives:
        raise ValueError("objectives is empty; give at least one (name, 'max' or 'min')")
    for name, direction in objectives:
        if direction not in ("max", "min"):
            raise ValueError(f"objective {name!r}: direction must be 'max' or 'min', but got {direction!r}")


def _scores(point: Mapping[str, float], objectives: Sequence[Objective]) -> tuple[float, ...]:
    """The point's values oriented so that larger is better; missing or non-finite -> -inf."""
    scores = []
    for name, direction in objectives:
        value = point.get(name)
        value = float(value) if value is not None else -math.inf
        scores.append(-math.inf if not math.isfinite(value) else value if direction == "max" else -value)
    return tuple(scores)


def _grouped(values: list[float], tolerance: float) -> list[float]:
    """Each finite value replaced by the best (largest) value of its group, grouping from the best down."""
    grouped = list(values)
    anchor = math.nan
    for i in sorted((i for i, v in enumerate(values) if math.isfinite(v)), key=values.__getitem__, reverse=True):
        if not math.isclose(values[i], anchor, rel_tol=tolerance):
            anchor = values[i]
        grouped[i] = anchor
    return grouped


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x >= y for x, y in zip(a, b, strict=True)) and a != b


def _normalised(scores: list[tuple[float, ...]]) -> list[tuple[float, ...]]:
    """Min-max normalise each column to [0, 1] (1 best); -inf -> 0, a column of equal values -> 1."""
    columns = []
    for column in zip(*scores, strict=True):
        finite = [v for v in column if math.isfinite(v)]
        low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
        span = high - low
        columns.append([((v - low) / span if span else 1.0) if math.isfinite(v) else 0.0 for v in column])
    return list(zip(*columns, strict=True))


def _cross(o: tuple[float, ...], u: tuple[float, ...], v: tuple[float, ...]) -> float:
    """The z component of (u - o) x (v - o): its sign says which side of the line o-u `v` lies on."""
    return (u[0] - o[0]) * (v[1] - o[1]) - (u[1] - o[1]) * (v[0] - o[0])
