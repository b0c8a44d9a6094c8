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
