"""Unit tests of dominance, non-dominated sets and the knee of a front."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.pareto import Objective, dominates, knee_index, non_dominated

CAP_LAT: list[Objective] = [("capacity", "max"), ("latency", "min")]
NAN, INF = math.nan, math.inf


def points(*pairs: tuple[float, float]) -> list[dict[str, float]]:
    return [{"capacity": c, "latency": lat} for c, lat in pairs]


# --- dominates --------------------------------------------------------------------------------


def test_dominates_needs_no_worse_everywhere_and_better_somewhere() -> None:
    a, b, c = points((2, 1), (1, 1), (3, 2))
    assert dominates(a, b, CAP_LAT)
    assert not dominates(b, a, CAP_LAT)
    assert not dominates(a, c, CAP_LAT) and not dominates(c, a, CAP_LAT)
    assert not dominates(a, dict(a), CAP_LAT)


@pytest.mark.parametrize(
    "bad", [{"capacity": 5.0}, {"capacity": 5.0, "latency": NAN}, {"capacity": 5.0, "latency": INF}]
)
def test_missing_or_non_finite_value_is_the_worst(bad: dict[str, float]) -> None:
    slow = {"capacity": 5.0, "latency": 1e300}
    assert dominates(slow, bad, CAP_LAT)
    assert not dominates(bad, slow, CAP_LAT)


def test_infinite_value_is_the_worst_even_when_maximising() -> None:
    assert dominates({"capacity": 0.0}, {"capacity": INF}, [("capacity", "max")])
    assert dominates({"capacity": 0.0}, {"capacity": -INF}, [("capacity", "max")])


def test_two_missing_values_tie() -> None:
    assert not dominates({}, {}, CAP_LAT)


# --- non_dominated ----------------------------------------------------------------------------


def test_non_dominated_keeps_input_order() -> None:
    pts = points((3, 2), (1, 1), (2, 3), (2, 1.5), (1, 2))
    assert non_dominated(pts, CAP_LAT) == [0, 1, 3]


def test_identical_points_are_all_kept() -> None:
    pts = points((2, 1), (1, 0.5), (2, 1), (1, 1))
    assert non_dominated(pts, CAP_LAT) == [0, 1, 2]


def test_non_dominated_of_nothing_is_empty() -> None:
    assert non_dominated([], CAP_LAT) == []


def test_single_objective_keeps_only_the_best() -> None:
    pts = [{"x": 1.0}, {"x": 3.0}, {"x": 3.0}, {"x": NAN}]
    assert non_dominated(pts, [("x", "max")]) == [1, 2]
    assert non_dominated(pts, [("x", "min")]) == [0]


def test_points_missing_everything_survive_only_among_themselves() -> None:
    assert non_dominated([{}, {}], CAP_LAT) == [0, 1]
    assert non_dominated([{}, {"capacity": 0.0}], CAP_LAT) == [1]


def test_a_tie_within_the_tolerance_is_decided_by_the_other_objectives() -> None:
    """Capacities measured at one load differ in the arrival jitter (12.6399 against 12.6363): with a tie
    tolerance the slower of the two is dominated; without one both stay on the front."""
    pts = points((12.6399, 0.5), (12.6363, 0.3), (10.63, 0.1))
    assert non_dominated(pts, CAP_LAT) == [0, 1, 2]
    assert non_dominated(pts, CAP_LAT, {"capacity": 0.004}) == [1, 2]
    assert non_dominated(pts, CAP_LAT, {"latency": 0.004}) == [0, 1, 2]  # ties only where named
    # one load higher (15.03) is better capacity, whatever its latency
    assert non_dominated([*pts, {"capacity": 15.03, "latency": 0.9}], CAP_LAT, {"capacity": 0.004}) == [1, 2, 3]


def test_tie_groups_are_anchored_at_their_best_value() -> None:
    """12.60 ties 12.64 (0.3%); 12.56 ties 12.60 (0.3%) but not 12.64 (0.6%), so it starts the next group
    and keeps its own place on the front: the front holds the best of the top group, as `max-capacity`
    picks it, and grouping is transitive where pairwise comparison within the tolerance is not."""
    pts = points((12.64, 0.5), (12.60, 0.4), (12.56, 0.3))
    assert non_dominated(pts, CAP_LAT, {"capacity": 0.004}) == [1, 2]
    assert non_dominated(pts, CAP_LAT, {"capacity": 0.01}) == [2]


def test_a_tie_in_a_minimised_objective_and_in_missing_values() -> None:
    pts = [{"capacity": 5.0, "latency": 1.000}, {"capacity": 6.0, "latency": 1.002}, {"capacity": 4.0}]
    assert non_dominated(pts, CAP_LAT) == [0, 1]
    assert non_dominated(pts, CAP_LAT, {"latency": 0.004}) == [1]  # a missing latency stays the worst


def test_a_negative_tie_tolerance_is_rejected() -> None:
    with pytest.raises(ValueError, match="objective 'capacity': tie tolerance must be >= 0, but got -0.1"):
        non_dominated(points((1, 1)), CAP_LAT, {"capacity": -0.1})


@pytest.mark.parametrize(
    ("objectives", "message"),
    [
        (
            [("capacity", "maximize")],
            "objective 'capacity': direction must be 'max' or 'min', but got 'maximize'",
        ),
        ([], "objectives is empty"),
    ],
)
def test_bad_objectives_are_rejected(objectives: list[Objective], message: str) -> None:
    pts = points((1, 1))
    for call in (
        lambda: non_dominated(pts, objectives),
        lambda: dominates(pts[0], pts[0], objectives),
        lambda: knee_index(pts, [0], objectives),
    ):
        with pytest.raises(ValueError, match=message):
            call()


_values = st.one_of(
    st.floats(min_value=-5, max_value=5).map(lambda v: round(v, 1)),  # coarse, so ties happen
    st.sampled_from([NAN, INF, -INF]),
    st.none(),
)
_objectives = st.lists(
    st.tuples(st.sampled_from("abc"), st.sampled_from(["max", "min"])),
    min_size=1,
    max_size=3,
    unique_by=lambda o: o[0],
)


def _point(values: dict[str, float | None]) -> dict[str, float]:
    return {k: v for k, v in values.items() if v is not None}


_points = st.lists(st.dictionaries(st.sampled_from("abc"), _values).map(_point), max_size=25)


@given(_points, _objectives)
def test_no_returned_point_is_dominated(pts: list[dict[str, float]], objectives: list[Objective]) -> None:
    front = non_dominated(pts, objectives)
    assert front == sorted(set(front))
    assert not any(dominates(p, pts[i], objectives) for i in front for p in pts)


@given(_points, _objectives)
def test_every_excluded_point_is_dominated_by_a_returned_one(
    pts: list[dict[str, float]], objectives: list[Objective]
) -> None:
    front = non_dominated(pts, objectives)
    assert not pts or front
    for j in set(range(len(pts))) - set(front):
        assert any(dominates(pts[i], pts[j], objectives) for i in front)


@given(_points, _objectives, st.sampled_from([0.0, 0.05, 0.3]))
def test_a_tied_front_is_a_front_of_the_grouped_values(
    pts: list[dict[str, float]], objectives: list[Objective], tolerance: float
) -> None:
    """With ties, no front point is dominated and every other point is, once each value counts as the best of
    its group; a zero tolerance changes nothing."""
    ties = {name: tolerance for name, _ in objectives[:1]}
    front = non_dominated(pts, objectives, ties)
    if not tolerance:
        assert front == non_dominated(pts, objectives)
    name, direction = objectives[0]
    sign = 1 if direction == "max" else -1
    finite = sorted({sign * p[name] for p in pts if math.isfinite(p.get(name, NAN))}, reverse=True)
    anchors: list[float] = []
    for value in finite:
        if not anchors or not math.isclose(value, anchors[-1], rel_tol=tolerance):
            anchors.append(value)
    grouped = []
    for p in pts:
        value = p.get(name, NAN)
        if math.isfinite(value):
            value = sign * min(a for a in anchors if a >= sign * value)  # the group it joined, scanning down
        grouped.append({**p, name: value})
    assert front == non_dominated(grouped, objectives)


# --- knee_index -------------------------------------------------------------------------------


def test_knee_is_the_bend_of_a_convex_front() -> None:
    pts = points((1, 1), (2, 1.1), (3, 1.3), (3.2, 3), (3.3, 6))
    assert knee_index(pts, non_dominated(pts, CAP_LAT), CAP_LAT) == 2


def test_knee_returns_an_index_into_points() -> None:
    pts = points((0, 9), (1, 1), (2, 1.1), (3, 1.3), (3.2, 3), (3.3, 6))
    front = [1, 2, 3, 4, 5]
    assert knee_index(pts, front, CAP_LAT) == 3


def test_knee_of_a_single_point_is_that_point() -> None:
    assert knee_index(points((1, 1), (5, 5)), [1], CAP_LAT) == 1


def test_knee_of_two_points_is_the_first_nearest_the_ideal() -> None:
    pts = points((1, 1), (2, 2))
    assert knee_index(pts, [0, 1], CAP_LAT) == 0
    assert knee_index(pts, [1, 0], CAP_LAT) == 1


def test_knee_of_collinear_points_falls_back_to_the_ideal() -> None:
    pts = points((0, 0), (1, 1), (2, 2))
    assert knee_index(pts, [0, 1, 2], CAP_LAT) == 1


def test_knee_of_a_concave_front_falls_back_to_the_ideal() -> None:
    pts = points((0, 0), (1, 9), (2, 9.5), (10, 10))
    assert knee_index(pts, [0, 1, 2, 3], CAP_LAT) == 0


def test_knee_prefers_points_with_every_value() -> None:
    pts = [{"capacity": 5.0}, {"capacity": 1.0, "latency": 1.0}, {"capacity": 4.0, "latency": 2.0}]
    front = non_dominated(pts, CAP_LAT)
    assert front == [0, 1, 2]
    assert knee_index(pts, front, CAP_LAT) == 1
    assert knee_index(pts, [0], CAP_LAT) == 0


def test_knee_with_three_objectives_is_nearest_the_ideal() -> None:
    objectives: list[Objective] = [("a", "max"), ("b", "max"), ("c", "min")]
    pts = [{"a": 1.0, "b": 0.0, "c": 0.0}, {"a": 0.8, "b": 0.8, "c": 0.2}, {"a": 0.0, "b": 1.0, "c": 1.0}]
    assert knee_index(pts, [0, 1, 2], objectives) == 1


def test_knee_of_an_empty_front_is_an_error() -> None:
    with pytest.raises(ValueError, match="front is empty"):
        knee_index(points((1, 1)), [], CAP_LAT)


@given(_points.filter(bool), _objectives)
def test_knee_is_on_the_front(pts: list[dict[str, float]], objectives: list[Objective]) -> None:
    front = non_dominated(pts, objectives)
    assert knee_index(pts, front, objectives) in front
