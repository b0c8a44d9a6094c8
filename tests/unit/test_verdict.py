"""The verdict: paired confirmation rounds, the t-interval with the bracket floor, censored and zero
capacities, ties, and the error rates the issue "A verdict with error bars" asks for.

The error-rate tests replay the confirmation at the level of the capacity planner, 400 seeds each: each
measurement's breaking point is the config's true capacity x lognormal(0, CV) (a fresh engine per
measurement) and each step's verdict jitters by a further lognormal(0, 2%), the JumpEngine's model of
tests/stand_in.py without its wall time; `tuner.capacity` chooses the loads and `tuner.verdict` decides.
The wiring through real trial runners is tested below with the JumpEngine itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pytest
from stand_in import JumpEngine

from tuner.capacity import CapacityPlan, Observation, bracket, next_step
from tuner.confirm import REPEATABILITY_CV, finalists, run_confirmation, schedule, warm_plan
from tuner.recorded import TrialRow
from tuner.verdict import (
    Measurement,
    compare,
    confirmation_lead,
    decide,
    detection_power,
    power_at,
    rounds_for,
)

REF = 5.3
SEARCH_PLAN = CapacityPlan(start_factor=1, growth=2, max_factor=16, resolution=0.1)


def _m(lo: float, hi: float | None) -> Measurement:
    return Measurement(lo, hi)


def test_identical_brackets_are_not_a_certainty_the_bracket_width_is_the_floor():
    same = [_m(30, 33)] * 4
    result = compare("f", same, same)
    assert result.ratio == pytest.approx(1.0)
    assert not result.distinguishable
    assert result.ci_low < 0.95 and result.ci_high > 1.05, "zero spread between rounds is not zero uncertainty"
    assert "not distinguishable from the baseline at this noise (95% CI" in result.text


def test_a_clear_gain_is_a_ratio_with_an_interval_that_excludes_one():
    winner = [_m(40, 44), _m(39, 43), _m(41, 45), _m(40, 44)]
    base = [_m(30, 33), _m(31, 34), _m(30, 33), _m(29, 32)]
    result = compare("f", winner, base)
    assert result.distinguishable and 1 < result.ci_low < result.ratio < result.ci_high
    assert result.text.startswith(f"x{result.ratio:.2f} the baseline's capacity (95% CI")


def test_a_censored_finalist_is_a_lower_bound_never_a_ratio():
    result = compare("f", [_m(80, None)] * 3, [_m(30, 33)] * 3)
    assert result.lower_bound and result.ci_high is None
    assert result.text.startswith(">= x") and "lower bound" in result.text


def test_a_baseline_that_fails_everywhere_is_worded_never_divided():
    result = compare("f", [_m(20, 22)] * 3, [_m(0, 1.3)] * 3)
    assert result.distinguishable and result.ratio is None
    assert "baseline fails the SLO at every load tried" in result.text


def _lat(lo: float, hi: float | None, ttft: float | None, tpot: float | None = None) -> Measurement:
    reference = {"ref_ttft_p95_s": ttft} if ttft is not None else {}
    if tpot is not None:
        reference["ref_tpot_p95_s"] = tpot
    return Measurement(lo, hi, reference=reference)


def test_latencies_at_the_reference_load_get_a_paired_interval_and_a_missing_round_gives_no_pair():
    winner = [_lat(40, 44, 0.050, 0.020), _lat(39, 43, 0.056, 0.021), _lat(41, 45, None, 0.019)]
    base = [_lat(30, 33, 0.100, 0.020), _lat(31, 34, 0.108, 0.020), _lat(30, 33, 0.5, 0.020)]
    result = compare("f", winner, base)
    by_metric = {c.metric: c for c in result.latency}
    ttft, tpot = by_metric["ref_ttft_p95_s"], by_metric["ref_tpot_p95_s"]
    assert ttft.pairs == 2, "round 3: the finalist has no TTFT there, so no pair"
    assert ttft.ratio == pytest.approx(math.sqrt(0.5 * 0.056 / 0.108))
    assert ttft.ci_low < ttft.ratio < ttft.ci_high < 1
    assert "TTFT p95 at the reference load x0.51 the baseline's (95% CI" in ttft.text and "lower than" in ttft.text
    assert tpot.pairs == 3 and tpot.ci_low < 1 < tpot.ci_high and "not distinguishable" in tpot.text
    assert [c["metric"] for c in result.as_dict()["reference_latency"]] == ["ref_ttft_p95_s", "ref_tpot_p95_s"]
    one = compare("f", winner[:1] + [_lat(39, 43, None)], base[:2])
    assert {c.metric: c for c in one.latency}["ref_ttft_p95_s"].ratio is None, "one pair is no interval"
    assert compare("f", [_m(40, 44)] * 2, [_m(30, 33)] * 2).latency == (), "not measured: nothing said"


def test_a_finalist_that_failed_at_the_reference_load_in_every_round_still_gets_a_latency_line():
    # The baseline measured its latencies there; the finalist failed a request there each round (no value).
    result = compare("f", [_lat(8, 9, None)] * 2, [_lat(6, 7, 0.4)] * 2)
    (ttft,) = result.latency
    assert ttft.metric == "ref_ttft_p95_s" and ttft.pairs == 0 and ttft.ratio is None
    assert "0 paired round(s) measured it, a request failed there in the others" in ttft.text
    assert result.as_dict()["reference_latency"][0]["pairs"] == 0


def test_one_round_gives_no_interval():
    result = compare("f", [_m(40, 44)], [_m(30, 33)])
    assert not result.distinguishable and result.ci_low is None


def test_the_baseline_is_kept_unless_beaten_and_ties_go_by_the_stated_rule():
    base = [_m(30, 33)] * 4
    tied = decide({"a": [_m(31, 34)] * 4, "base": base}, "base")
    assert tied.winner == "base" and not tied.distinguishable
    assert "vLLM's defaults are fine for this traffic" in tied.text
    # a (2 accelerators) and b (1) both beat the baseline with overlapping intervals: b wins the tie.
    verdict = decide(
        {
            "a": [_m(45, 49), _m(44, 48), _m(46, 50), _m(45, 49)],
            "b": [_m(44, 48), _m(45, 49), _m(44, 48), _m(44, 48)],
            "base": base,
        },
        "base",
        tie_key={"a": (2.0, 0.05), "b": (1.0, 0.08), "base": (1.0, 0.05)},
    )
    assert verdict.winner == "b" and verdict.tied_with == ("a",)
    assert verdict.distinguishable and "tie rule: fewer accelerators" in verdict.text
    assert verdict.as_dict()["confidence"] == 0.95


def test_a_baseline_that_failed_in_its_trial_is_not_kept_on_a_tie():
    # Its trial passed no load step, so no export can recommend it: a finalist that held in every round wins.
    measured = {"a": [_m(31, 34)] * 3, "b": [_m(33, 36), _m(0, 20), _m(33, 36)], "base": [_m(30, 33)] * 3}
    verdict = decide(measured, "base", baseline_feasible=False)
    assert verdict.winner == "a" and verdict.best is not None and verdict.best.trial_id == "a"
    assert not verdict.distinguishable, "no interval excludes 1: the baseline gave way, it was not beaten"
    assert verdict.text.startswith("the baseline failed the SLO at every load tried in its trial; a passed")
    assert verdict.as_dict()["reason"] and verdict.as_dict()["winner"] == "a"
    # The same measurements with a baseline that passed in its trial: it is kept.
    assert decide(measured, "base").winner == "base"


def test_a_baseline_that_failed_a_round_gives_way_to_a_finalist_that_held_every_round():
    verdict = decide({"a": [_m(31, 34)] * 3, "base": [_m(30, 33), _m(0, 20), _m(30, 33)]}, "base")
    assert verdict.winner == "a" and "in round 2; a passed a load step in every round" in verdict.text
    # Both failed some round: the baseline stays while its trial passed, and gives way when it did not.
    both = {"a": [_m(0, 20), _m(31, 34), _m(31, 34)], "base": [_m(30, 33), _m(0, 20), _m(30, 33)]}
    assert decide(both, "base").winner == "base"
    fallback = decide(both, "base", baseline_feasible=False)
    assert fallback.winner == "a" and "no finalist passed in every round" in fallback.text


def test_no_round_done_keeps_the_baseline_only_if_its_trial_passed():
    empty: dict[str, list[Measurement]] = {"a": [], "b": [], "base": []}
    assert decide(empty, "base").winner == "base"
    unconfirmed = decide(empty, "base", baseline_feasible=False)
    assert unconfirmed.winner == "a" and "unconfirmed" in unconfirmed.text


# --- error rates over seeds -------------------------------------------------------------------------------


def _measure(plan: CapacityPlan, true_capacity: float, rng: np.random.Generator) -> Measurement:
    observations: list[Observation] = []
    while (chosen := next_step(plan, observations)) is not None:
        factor, phase = chosen
        rate = factor * REF
        observations.append(Observation(factor, rate, rate <= true_capacity * rng.lognormal(0, 0.02), phase))
    found = bracket(observations)
    return Measurement(found.capacity, found.hi)


def _declared(
    seed: int,
    gains: list[float],
    rounds: int,
    resolution: float,
    cv: float = REPEATABILITY_CV,
    noise: Callable[[np.random.Generator], float] | None = None,
) -> tuple[bool, str]:
    """One search-then-confirm through `run_confirmation`: (distinguishable declared, winner) for
    finalists at `gains` x the baseline's true capacity, each measurement's noise lognormal(0, `cv`), or
    the factor `noise(rng)` draws (benchmarks/verdict_replay.py replays it at a host's measured CV, or
    its recorded capacities' own spread)."""
    from trainables.trial import TrialContext

    rng = np.random.default_rng(seed)
    draw = noise or (lambda r: r.lognormal(0, cv))
    plan = CapacityPlan(start_factor=1, growth=2, max_factor=16, resolution=resolution)
    truths = {"base": 35.0, **{f"f{i}": 35.0 * g for i, g in enumerate(gains)}}
    trials = []
    for name, truth in truths.items():  # the search: one measurement each
        searched = _measure(plan, truth * draw(rng), rng)
        trials.append(_outcome(name, searched.capacity, searched.hi, truth=truth))

    def measure(context, params, trial_id, on_step=None):
        found = _measure(context.plan, params["truth"] * draw(rng), rng)
        result = {"capacity_rps_per_accel": found.capacity, "trial_status": "completed"}
        if found.hi is not None:
            result["capacity_hi_rps_per_accel"] = found.hi
        return result

    context = TrialContext(model="-", sample=None, reference_rps=REF, slo="ttft:p95<1s", plan=plan)  # type: ignore[arg-type]
    verdict = run_confirmation(
        context=context,
        trials=trials,
        baseline=trials[0],
        count=len(gains),
        rounds=rounds,
        resolution=resolution,
        measure=measure,
        progress=lambda line: None,
    ).verdict
    return verdict.distinguishable, verdict.winner


@pytest.mark.parametrize("resolution", [0.1, 0.2])
@pytest.mark.parametrize("finalists_count", [1, 3])
def test_configs_identical_to_the_baseline_are_rarely_declared_different(resolution, finalists_count):
    rounds = rounds_for(cv=REPEATABILITY_CV, resolution=resolution, finalists=finalists_count)
    declared = sum(_declared(seed, [1.0] * finalists_count, rounds, resolution)[0] for seed in range(400))
    assert declared / 400 <= 0.06, f"{declared}/400 declared distinguishable"


@pytest.mark.parametrize("resolution", [0.1, 0.2])
def test_a_config_30_percent_better_wins_at_the_default_rounds(resolution):
    rounds = rounds_for(cv=REPEATABILITY_CV, resolution=resolution)
    wins = sum(_declared(seed, [1.3], rounds, resolution) == (True, "f0") for seed in range(400))
    assert wins / 400 >= 0.90, f"{wins}/400 at {rounds} rounds"
    # The power the README quotes, from the noncentral t, is what the replay finds (within 8 points).
    assert detection_power(rounds, cv=REPEATABILITY_CV, resolution=resolution) == pytest.approx(wins / 400, abs=0.06)


def test_the_default_rounds_follow_from_the_measured_repeatability():
    assert rounds_for(cv=REPEATABILITY_CV, resolution=0.1) == 4
    assert rounds_for(cv=REPEATABILITY_CV, resolution=0.2) == 5
    assert rounds_for(cv=0.15, resolution=0.1) > 4, "noisier measurements need more rounds"
    assert detection_power(3, cv=REPEATABILITY_CV, resolution=0.2) < 0.9


def test_a_tie_says_whether_its_rounds_could_have_seen_a_gain():
    """ "Not distinguishable" from rounds too noisy to see a 30% gain is not "the defaults are fine": the
    verdict says how often these rounds would have caught one, at the spread they showed, and how many
    rounds would do."""
    steady = decide({"a": [_m(31, 34)] * 4, "base": [_m(30, 33)] * 4}, "base")
    assert "vLLM's defaults are fine for this traffic" in steady.text
    power, _ = steady.sensitivity()
    assert power is not None and power > 0.99
    # The AVX-512 host's spread (CV about 7%): capacities one or two 9% steps apart from round to round.
    noisy = decide(
        {
            "a": [_m(15.0, 16.4), _m(17.9, 19.5), _m(16.4, 17.9), _m(19.5, 21.3)],
            "base": [_m(17.9, 19.5), _m(16.4, 17.9), _m(17.9, 19.5), _m(17.9, 19.5)],
        },
        "base",
    )
    assert noisy.winner == "base" and not noisy.distinguishable
    power, needed = noisy.sensitivity()
    assert power is not None and 0.3 < power < 0.95 and needed is not None and needed > 4
    pair_sd = noisy.best.pair_sd
    assert power == pytest.approx(power_at(4, pair_sd))
    assert power_at(needed, pair_sd) >= 0.95 > power_at(needed - 1, pair_sd)
    assert "defaults are fine" not in noisy.text
    assert f"{power:.0%} of the time (computed, short of 95%)" in noisy.text
    assert f"{needed} rounds would reach it (confirm.rounds: {needed})" in noisy.text
    assert noisy.as_dict()["power_at_gain"] == power and noisy.as_dict()["rounds_for_power"] == needed
    # The demo's 2 rounds at 20% resolution: identical brackets, and still hardly able to see a gain.
    demo = decide({"a": [_m(35.7, 42.5)] * 2, "base": [_m(35.7, 42.5)] * 2}, "base")
    assert demo.sensitivity()[0] < 0.5 and "defaults are fine" not in demo.text
    # Spread no practical number of rounds overcomes: said so, with no number to set.
    wild = decide({"a": [_m(5, 5.5), _m(40, 44), _m(10, 11)], "base": [_m(20, 22), _m(8, 8.8), _m(30, 33)]}, "base")
    assert wild.sensitivity()[1] is None and "not even 20 rounds would" in wild.text


def test_the_power_from_a_cv_is_the_power_at_its_pair_spread():
    for rounds, cv, resolution in ((4, 0.049, 0.1), (5, 0.069, 0.2), (2, 0.1, 0.1)):
        sd = math.sqrt(2 * math.log1p(cv**2) + 2 * math.log1p(resolution) ** 2 / 12)
        assert detection_power(rounds, cv=cv, resolution=resolution) == pytest.approx(power_at(rounds, sd))
    assert power_at(1, 0.05) == 0.0


# --- the phase itself ---------------------------------------------------------------------------------------


def test_rounds_rotate_the_order_and_warm_plans_start_at_the_trials_capacity():
    assert schedule(["a", "b", "base"], 3) == [["a", "b", "base"], ["b", "base", "a"], ["base", "a", "b"]]
    plan = warm_plan(SEARCH_PLAN, {"capacity_rps_per_accel": 21.2, "capacity_hi_rps_per_accel": 23.3}, REF, 0.1)
    assert plan.start_factor == pytest.approx(4.0) and plan.growth == pytest.approx(1.1, rel=1e-3)
    censored = warm_plan(SEARCH_PLAN, {"capacity_rps_per_accel": 84.8}, REF, 0.1)
    assert censored.start_factor == pytest.approx(16.0) and censored.growth == 2.0
    nothing = warm_plan(SEARCH_PLAN, {"capacity_rps_per_accel": 0.0}, REF, 0.1)
    assert nothing.start_factor == SEARCH_PLAN.min_factor


def _outcome(trial_id: str, capacity: float, hi: float | None, status: str = "completed", **params) -> TrialRow:
    metrics = {"capacity_rps_per_accel": capacity, "ref_ttft_p95_s": 0.05, "num_accelerators": 1.0}
    if hi is not None:
        metrics["capacity_hi_rps_per_accel"] = hi
    return TrialRow(trial_id, f"run-{trial_id}", status, params=params, metrics=metrics)


def test_finalists_are_the_best_feasible_trials_other_than_the_baseline():
    base = _outcome("base", 30, 33)
    trials = [
        base,
        _outcome("a", 40, 44),
        _outcome("b", 50, 55, status="infeasible"),
        _outcome("c", 45, 50),
        _outcome("z", 0, 5),
    ]
    assert [t.trial_id for t in finalists(trials, base, 2)] == ["c", "a"]


def test_finalists_at_the_same_load_go_by_the_lower_reference_ttft():
    """Two trials that passed the same load measure rates a few hundredths of a percent apart: which of
    them is confirmed is the tie rule's (lower reference TTFT p95), not the arrival jitter's."""
    base = _outcome("base", 10.63, 12.64)
    jittered, quicker = _outcome("jittered", 12.6399, 15.03), _outcome("quicker", 12.6363, 15.03)
    jittered.metrics["ref_ttft_p95_s"], quicker.metrics["ref_ttft_p95_s"] = 0.5, 0.3  # type: ignore[index]
    assert [t.trial_id for t in finalists([base, jittered, quicker], base, 1)] == ["quicker"]
    assert [t.trial_id for t in finalists([base, jittered, quicker], base, 2)] == ["quicker", "jittered"]


def test_a_confirmation_through_stand_in_engines_records_every_measurement(tmp_path):
    """Two real trial runners per round, 3 rounds, over JumpEngines (the finalist breaks at twice the baseline's
    load), recorded in MLflow as nested confirm runs; the verdict names the finalist."""
    from mlflow.tracking import MlflowClient
    from test_trial_runner import _context, _factory

    from trainables.trial import TrialRunner, run_capacity_search
    from tuner.tracking import start_parent_run

    def measure(context, params, trial_id, on_step=None):
        engine = JumpEngine(params["jump"], noise_cv=0.02, seed=len(trial_id), tokens_per_s=5000, max_batch=64)
        return run_capacity_search(TrialRunner(context, params, _factory([engine]), trial_id=trial_id), on_step)[-1]

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    parent = start_parent_run(client, "confirm-unit", run_name="search", params={}, tags={}, documents={})
    context = _context(
        plan=CapacityPlan(start_factor=1, growth=2, max_factor=8, min_factor=0.5, resolution=0.2),
        slo="ttft:p95<500ms",
    )
    base = _outcome("base", 10, 20, jump=15)
    winner = _outcome("fast", 20, 40, jump=30)
    lines: list[str] = []
    outcome = run_confirmation(
        context=context,
        trials=[base, winner],
        baseline=base,
        count=1,
        rounds=3,
        resolution=0.2,
        measure=measure,
        client=client,
        experiment="confirm-unit",
        parent_run_id=parent,
        reference_step=True,
        progress=lines.append,
    )
    assert outcome.rounds_done == 3 and [len(v) for v in outcome.measurements.values()] == [3, 3]
    assert all(0 < m.reference["ref_ttft_p95_s"] < 0.5 for v in outcome.measurements.values() for m in v)
    latency = {c.metric: c for c in outcome.verdict.best.latency}
    assert latency["ref_ttft_p95_s"].pairs == 3 and latency["ref_ttft_p95_s"].ci_low is not None
    assert outcome.verdict.winner == "fast" and outcome.verdict.best is not None
    assert outcome.verdict.distinguishable and 1 < outcome.verdict.best.ci_low < 2 < outcome.verdict.best.ci_high
    runs = client.search_runs([client.get_experiment_by_name("confirm-unit").experiment_id])
    confirms = [r for r in runs if r.data.tags.get("run_kind") == "confirm"]
    assert len(confirms) == 6
    assert {r.data.tags["confirms_trial"] for r in confirms} == {"base", "fast"}
    assert all(r.data.tags["mlflow.parentRunId"] == parent for r in confirms)
    assert all(r.data.tags["trial_status"] == "completed" and r.info.status == "FINISHED" for r in confirms)
    assert all(math.isfinite(r.data.metrics["capacity_rps_per_accel"]) for r in confirms)
    assert all(0 < r.data.metrics["ref_ttft_p95_s"] < 0.5 for r in confirms), "measured at 1x, not the penalty"
    assert any(line.startswith("confirmation round 3/3") for line in lines)
    for trial_id, round_ in (("fast", 1), ("base", 3)):  # each step as it ends, before the outcome's line
        shown = [line for line in lines if line.startswith(f"  confirm {trial_id} (round {round_})")]
        assert [line.split()[5] for line in shown[:-1]] == [str(n) for n in range(1, len(shown))], shown
        assert len(shown) >= 4 and " step " not in shown[-1] and "capacity" in shown[-1], shown
    for run in confirms:  # every load step, at its step number; the last one is the measurement's outcome
        history = sorted(client.get_metric_history(run.info.run_id, "offered_rps"), key=lambda m: m.step)
        steps = int(run.data.metrics["load_step"])
        assert steps >= 3 and [m.step for m in history] == list(range(1, steps + 1))
        capacity = client.get_metric_history(run.info.run_id, "capacity_rps_per_accel")
        assert max(capacity, key=lambda m: m.step).value == run.data.metrics["capacity_rps_per_accel"]


def test_without_a_reference_step_a_confirmation_records_no_reference_latency(tmp_path):
    """The trial's reference latencies are the penalty until a step at 1x ran: never recorded as measured."""
    from mlflow.tracking import MlflowClient

    from tuner.tracking import start_parent_run

    base, winner = _outcome("base", 10, 20), _outcome("fast", 20, 40)

    def measure(context, params, trial_id, on_step=None):
        first = {"load_step": 1, "capacity_rps_per_accel": 20.0, "ref_ttft_p95_s": 60.0, "trial_status": "running"}
        final = {
            "done": True,
            "load_step": 2,
            "capacity_rps_per_accel": 20.0,
            "capacity_hi_rps_per_accel": 22.0,
            "ref_ttft_p95_s": 60.0,
            "trial_status": "completed",
        }
        for step in (first, final):
            on_step(step)
        return final

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    parent = start_parent_run(client, "no-ref", run_name="search", params={}, tags={}, documents={})
    outcome = run_confirmation(
        context=_context_stub(),
        trials=[base, winner],
        baseline=base,
        count=1,
        rounds=2,
        resolution=0.1,
        measure=measure,
        client=client,
        experiment="no-ref",
        parent_run_id=parent,
        progress=lambda line: None,
    )
    assert all(not m.reference for v in outcome.measurements.values() for m in v)
    assert outcome.verdict.best is not None and outcome.verdict.best.latency == ()
    runs = client.search_runs([client.get_experiment_by_name("no-ref").experiment_id])
    confirms = [r for r in runs if r.data.tags.get("run_kind") == "confirm"]
    assert len(confirms) == 4 and all("ref_ttft_p95_s" not in r.data.metrics for r in confirms)
    assert all(client.get_metric_history(r.info.run_id, "ref_ttft_p95_s") == [] for r in confirms), "in no step"
    assert all(
        sorted(m.step for m in client.get_metric_history(r.info.run_id, "capacity_rps_per_accel")) == [1, 2]
        for r in confirms
    )


def _confirm_pair(measure, **settings):
    """`run_confirmation` of a baseline "base" (capacity 10) and one finalist "fast" (20), 10% resolution,
    silent; `settings` adds or overrides its keyword arguments (rounds, deadline, measurement_s, ...)."""
    base, winner = _outcome("base", 10, 20), _outcome("fast", 20, 40)
    arguments = dict(
        context=_context_stub(), trials=[base, winner], baseline=base, count=1, resolution=0.1, measure=measure,
        progress=lambda line: None,
    )  # fmt: skip
    return run_confirmation(**{**arguments, **settings})


def test_each_measurement_starts_from_its_config_s_latest_closed_bracket():
    """Round 1 starts from the trial's bracket; each later round from that config's latest closed one (a
    measurement that passed nothing leaves the start where it was)."""
    starts: dict[str, list[float]] = {"base": [], "fast": []}
    readings = {
        "base": iter([(12.0, 13.5, "completed"), (0.0, 9.0, "infeasible"), (11.0, 12.0, "completed")]),
        "fast": iter([(24.0, 27.0, "completed"), (21.0, 23.0, "completed"), (22.0, 24.0, "completed")]),
    }

    def measure(context, params, trial_id, on_step=None):
        config = trial_id.split("-", 1)[1]
        starts[config].append(round(context.plan.start_factor * context.reference_rps, 6))
        capacity, hi, status = next(readings[config])
        return {"capacity_rps_per_accel": capacity, "capacity_hi_rps_per_accel": hi, "trial_status": status}

    outcome = _confirm_pair(measure, rounds=3)
    assert outcome.rounds_done == 3
    assert starts == {"base": [10.0, 12.0, 12.0], "fast": [20.0, 24.0, 21.0]}


def test_a_time_budget_too_short_for_a_second_round_says_there_is_no_interval():
    def measure(context, params, trial_id, on_step=None):
        time.sleep(1.5)
        return {"capacity_rps_per_accel": 20.0, "capacity_hi_rps_per_accel": 22.0, "trial_status": "completed"}

    outcome = _confirm_pair(measure, rounds=4, deadline=time.monotonic() + 5, measurement_s=2.0)
    assert outcome.rounds_done == 1
    assert not outcome.verdict.distinguishable and outcome.verdict.winner == "base"
    assert any("allowed 1 of 4" in note for note in outcome.notes)
    # One round is no evidence either way: the baseline stays, the verdict does not call it "fine", and it
    # says why there was only one (the notes: the budget).
    assert outcome.verdict.text.startswith(
        "1 confirmation round(s): too few for an interval; the baseline stays, as nothing was shown to beat it "
        "(the time budget allowed 1 of 4 confirmation rounds (a round of 2 measurements takes about"
    )


def test_the_reserve_holds_every_planned_round_when_measurements_run_over_their_estimate(monkeypatch):
    """The embedded demo's measurements on a fresh clone (2026-12-02): 104, 78, 98 and 67 s against an estimate
    of 78 s. The confirmation starts with the search's reserve left: at the estimate alone (6 x 78 s) the third
    round would not start; the reserve with its margin holds all three."""
    import types

    import tuner.confirm
    from tuner.confirm import ConfirmCost

    clock = [0.0]
    monkeypatch.setattr(tuner.confirm, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    durations = iter([104.0, 78.0, 98.0, 67.0, 104.0, 104.0])

    def measure(context, params, trial_id, on_step=None):
        clock[0] += next(durations)
        return {"capacity_rps_per_accel": 20.0, "capacity_hi_rps_per_accel": 22.0, "trial_status": "completed"}

    cost = ConfirmCost(78.0, 6)

    def confirm(reserve_s: float):
        clock[0] = 0.0
        return _confirm_pair(measure, rounds=3, deadline=reserve_s, measurement_s=cost.measurement_s)

    assert confirm(cost.reserve_s).rounds_done == 3
    durations = iter([104.0, 78.0, 98.0, 67.0])
    assert confirm(6 * 78.0).rounds_done == 2  # the bare estimate: what the demo ran


def test_a_confirmation_that_does_not_fit_says_what_a_round_costs_and_what_was_left(monkeypatch):
    """The embedded demo on a slow AVX2 host (2026-12-04): a re-measurement estimated at 219 s from the
    baseline's trial, 3.6 min of the budget left: no round could start. The note says what a round costs
    and what was left, so the user can size `budget.time_budget_s` (the verdict alone said 0 of 2)."""
    import types

    import tuner.confirm

    monkeypatch.setattr(tuner.confirm, "time", types.SimpleNamespace(monotonic=lambda: 0.0))
    nothing = lambda *args: pytest.fail("no round fits: nothing is measured")  # noqa: E731
    outcome = _confirm_pair(nothing, rounds=2, deadline=216.0, measurement_s=219.0)
    assert outcome.rounds_done == 0
    assert (
        "the time budget allowed 0 of 2 confirmation rounds (a round of 2 measurements takes about 7.3 min at "
        "219s each; 3.6 min were left)"
    ) in outcome.notes


def test_the_budget_s_end_stops_a_measurement_that_runs_over_and_its_round_is_not_counted(monkeypatch):
    """The embedded demo on an Ice Lake Xeon (2026-12-06): round 2 started with its estimate's time left, then
    its last measurement descended and took 163 s against 90. The budget's end is a hard one: the
    measurement running then gets the time left as its limit and is stopped there, and its round, no longer
    paired, is not counted (the finished measurement beside it is not half a pair in the verdict)."""
    import types

    import tuner.confirm

    clock = [0.0]
    monkeypatch.setattr(tuner.confirm, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    durations = iter([70.0, 70.0, 70.0, 163.0])  # round 1: fast, base; round 2: base, then fast descends
    limits: list[float | None] = []

    def measure(context, params, trial_id, on_step=None):
        limits.append(context.trial_timeout_s)
        took = next(durations)
        if context.trial_timeout_s is not None and took > context.trial_timeout_s:
            clock[0] += context.trial_timeout_s
            return {"capacity_rps_per_accel": 0.0, "trial_status": "infeasible", "status_reason": "time limit"}
        clock[0] += took
        return {"capacity_rps_per_accel": 20.0, "capacity_hi_rps_per_accel": 22.0, "trial_status": "completed"}

    outcome = _confirm_pair(measure, rounds=2, deadline=300.0, measurement_s=70.0)
    assert clock[0] == 300.0, "the confirmation ends at the budget's end, not 73 s past it"
    assert limits == [300.0, 230.0, 160.0, 90.0], "each measurement's limit is the time left"
    assert outcome.rounds_done == 1 and [len(v) for v in outcome.measurements.values()] == [1, 1]
    assert outcome.verdict.rounds == 1 and not outcome.verdict.distinguishable
    assert (
        "the time budget ended during the measurement of fast in confirmation round 2: the round is not counted; "
        "its 1 finished measurement(s) are recorded"
    ) in outcome.notes
    # A trial time limit shorter than the time left stays the measurement's own: over it, a config is
    # infeasible (a measured 0, counted), not cut by the budget.
    durations = iter([70.0, 70.0])
    clock[0], limits[:] = 0.0, []
    outcome = _confirm_pair(
        measure, context=_context_stub(trial_timeout_s=60.0), rounds=1, deadline=300.0, measurement_s=70.0
    )
    assert limits == [60.0, 60.0] and outcome.rounds_done == 1
    assert [m.capacity for v in outcome.measurements.values() for m in v] == [0.0, 0.0]


def test_a_round_is_started_when_the_time_left_holds_most_of_its_estimate(monkeypatch):
    """The embedded demo on an Ice Lake Xeon (2026-12-06 16:05): round 1 took 104 and 124 s, so round 2 was
    estimated at 228 s; with 216 s left it was not started, and the verdict had no interval. A round is now
    started when the time left holds ROUND_START_SHARE of its estimate (the budget's end stays hard), and
    the progress line says it may be cut; with less than that share left it is still not started."""
    import types

    import tuner.confirm
    from tuner.confirm import ROUND_START_SHARE

    clock = [0.0]
    monkeypatch.setattr(tuner.confirm, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    durations: list[float] = []

    def measure(context, params, trial_id, on_step=None):
        clock[0] += durations.pop(0)
        return {"capacity_rps_per_accel": 20.0, "capacity_hi_rps_per_accel": 22.0, "trial_status": "completed"}

    lines: list[str] = []
    durations[:] = [104.0, 124.0, 83.0, 64.0]  # round 2 as it took at 16:52 (0.64 of the estimate)
    outcome = _confirm_pair(measure, rounds=2, deadline=444.0, measurement_s=105.0, progress=lines.append)
    assert outcome.rounds_done == 2 and outcome.notes == [] and clock[0] == 375.0
    assert "confirmation round 2/2: base, fast (about 3.8 min at 114s a measurement, 3.6 min left: stopped" in (
        "\n".join(lines)
    )
    assert "round 1/2: fast, base\n" in "\n".join(lines) + "\n", "a round that fits says nothing of a cut"
    # Just short of the share: not started, and the note says what a round takes and what was left.
    clock[0], durations[:] = 0.0, [104.0, 124.0]
    short = _confirm_pair(measure, rounds=2, deadline=228.0 + 228.0 * ROUND_START_SHARE - 1, measurement_s=105.0)
    assert short.rounds_done == 1 and durations == []
    assert short.notes == [
        "the time budget allowed 1 of 2 confirmation rounds (a round of 2 measurements takes about 3.8 min at "
        "114s each; 3.0 min were left)"
    ]


def test_a_round_whose_next_measurement_has_no_time_left_is_not_counted_and_the_verdict_says_why(monkeypatch):
    """Round 2 fits its estimate, but its first measurement takes all the time left and finishes at the
    budget's end: the second is not started, the round (half a pair) is not counted, and the verdict's text
    names the reason rather than only "too few for an interval"."""
    import types

    import tuner.confirm

    clock = [0.0]
    monkeypatch.setattr(tuner.confirm, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    durations = iter([70.0, 70.0, 160.0])  # round 1: fast, base; round 2: base ends at 300 exactly
    measured: list[str] = []

    def measure(context, params, trial_id, on_step=None):
        measured.append(trial_id)
        clock[0] += next(durations)
        return {"capacity_rps_per_accel": 20.0, "capacity_hi_rps_per_accel": 22.0, "trial_status": "completed"}

    outcome = _confirm_pair(measure, rounds=2, deadline=300.0, measurement_s=70.0)
    assert measured == ["confirm1-fast", "confirm1-base", "confirm2-base"], "nothing starts with no time left"
    assert outcome.rounds_done == 1 and [len(v) for v in outcome.measurements.values()] == [1, 1]
    note = (
        "the time budget ended before the measurement of fast in confirmation round 2: the round is not counted; "
        "its 1 finished measurement(s) are recorded"
    )
    assert outcome.notes == [note]
    assert outcome.verdict.text == (
        "1 confirmation round(s): too few for an interval; the baseline stays, as nothing was shown to beat it "
        f"({note})"
    )


def test_a_real_trial_runner_is_stopped_at_the_budget_s_end_and_recorded_as_stopped(tmp_path):
    """Through a real trial runner over the stand-in engine: the budget's end reaches the runner as its time
    limit, the pool is shut down, and the measurement's MLflow run says the budget stopped it."""
    from mlflow.tracking import MlflowClient
    from stand_in import StandInEngine
    from test_trial_runner import _factory

    from trainables.trial import TrialRunner, run_capacity_search
    from tuner.tracking import start_parent_run

    engines: list[StandInEngine] = []

    def measure(context, params, trial_id, on_step=None):
        engines.append(StandInEngine(tokens_per_s=3000))
        return run_capacity_search(TrialRunner(context, params, _factory(engines[-1:]), trial_id=trial_id))[-1]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    parent = start_parent_run(client, "cut", run_name="search", params={}, tags={}, documents={})
    began = time.monotonic()
    outcome = _confirm_pair(
        measure, rounds=2, deadline=began + 1.5, measurement_s=0.1, client=client, experiment="cut",
        parent_run_id=parent,
    )  # fmt: skip
    assert time.monotonic() - began < 10, "stopped at the budget's end, not run to its capacity"
    assert outcome.rounds_done == 0 and len(engines) == 1 and engines[0].shut_down
    assert any(
        note.startswith("the time budget ended during the measurement of fast in confirmation round 1")
        for note in outcome.notes
    )
    runs = client.search_runs([client.get_experiment_by_name("cut").experiment_id])
    (confirm,) = [r for r in runs if r.data.tags.get("run_kind") == "confirm"]
    assert confirm.data.tags["trial_status"] == "early_stopped" and confirm.info.status == "FINISHED"
    assert "time budget ended" in confirm.data.tags["status_reason"]


def _context_stub(**overrides):
    from test_trial_runner import _context

    return _context(**overrides)


def test_a_baseline_whose_trial_failed_is_never_the_recommendation_the_export_cannot_make():
    """The baseline's trial passed no load step (say its first step's TPOT was over): however its
    confirmation rounds go, the verdict recommends a feasible trial, which is what the export exports."""
    from tuner.selection import feasible_trials

    base, finalist = _outcome("base", 0, 10, status="infeasible"), _outcome("fast", 20, 22)

    def measure(context, params, trial_id, on_step=None):  # both measure alike: no interval excludes 1
        return {"capacity_rps_per_accel": 20.0, "capacity_hi_rps_per_accel": 22.0, "trial_status": "completed"}

    outcome = run_confirmation(
        context=_context_stub(),
        trials=[base, finalist],
        baseline=base,
        count=1,
        rounds=2,
        resolution=0.1,
        measure=measure,
        progress=lambda line: None,
    )
    assert outcome.verdict.best is not None and not outcome.verdict.best.distinguishable
    assert outcome.verdict.winner == "fast" and outcome.verdict.winner in {
        t.trial_id for t in feasible_trials([base, finalist])
    }
    assert outcome.verdict.text.startswith("the baseline failed the SLO at every load tried in its trial")


@pytest.mark.parametrize(
    ("verdict", "lead"),
    [
        ({"rounds": 2, "rounds_done": 0}, "Not confirmed against the baseline (no paired round ran)"),
        ({"rounds": 2, "rounds_done": 1}, "Confirmed in 1 paired round against the baseline"),
        ({"rounds": 2, "rounds_done": 2}, "Confirmed in 2 paired rounds against the baseline"),
        ({"rounds": 3}, "Confirmed in 3 paired rounds against the baseline"),  # recorded before rounds_done
        ({"rounds": 2, "rounds_done": None}, "Not confirmed against the baseline (no paired round ran)"),
        ({}, "Not confirmed against the baseline (no paired round ran)"),
    ],
)
def test_the_export_and_reports_say_the_rounds_the_verdict_rests_on(verdict, lead):
    assert confirmation_lead(verdict) == lead


def test_a_verdict_with_no_round_is_exported_as_not_confirmed(tmp_path):
    from unit.test_export import _verdict, build_store, standard_trials

    from tuner.export import export_search

    verdict = {**_verdict("base0001", distinguishable=False), "rounds_done": 0, "text": "nothing to confirm"}
    uri = build_store(tmp_path, "unconfirmed", standard_trials(), verdict=verdict)
    export_search(uri, "unconfirmed", tmp_path / "out")
    header = (tmp_path / "out" / "vllm-serve.yaml").read_text()
    assert "Not confirmed against the baseline (no paired round ran): nothing to confirm" in header
    assert "Confirmed in" not in header


@pytest.mark.parametrize(
    ("done", "lead"),
    [
        (0, "not confirmed against the baseline (no paired round ran)"),
        (3, "confirmed in 3 paired rounds against the baseline"),
    ],
)
def test_the_export_command_says_the_rounds_its_verdict_rests_on(tmp_path, done, lead):
    from click.testing import CliRunner
    from unit.test_export import _verdict, build_store, cli, standard_trials

    verdict = {**_verdict("win00002"), "rounds_done": done}
    uri = build_store(tmp_path, "exported", standard_trials(), verdict=verdict)
    argv = ["export", "--experiment", "exported", "--tracking-uri", uri, "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(cli(), argv)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "recommended: " in line)
    assert line == f"{lead}: x1.90 the baseline's capacity (95% CI 1.50-2.40); recommended: trial win00002"


@pytest.mark.parametrize(
    ("done", "lead"),
    [(0, "not confirmed against the baseline (no paired round ran)"), (2, "confirmed in 2 paired rounds")],
)
def test_the_search_summary_says_the_rounds_its_verdict_rests_on(capsys, done, lead):
    from types import SimpleNamespace

    from tuner.cli import print_summary
    from tuner.confirm import ConfirmOutcome
    from tuner.search import SearchOutcome

    base = TrialRow("base0001", "run1", "completed", metrics={"capacity_rps_per_accel": 5.3})
    verdict = SimpleNamespace(baseline="base0001", winner="base0001", text="nothing to confirm")
    measured = {"base0001": [_m(5.3, 6.4)] * done}
    confirmation = ConfirmOutcome(verdict=verdict, measurements=measured, wall_s=60.0, rounds_done=done, notes=[])
    outcome = SearchOutcome("e", "parent", "sqlite:///x.db", [base], [base], 120.0, base, confirmation=confirmation)
    print_summary(outcome)
    out = capsys.readouterr().out
    assert lead in out and "nothing to confirm; recommended: the baseline" in out
    assert "0 paired rounds" not in out
    assert ("confirmed base0001 (baseline): 5.3-6.4" in out) == bool(done), "measurements listed only when made"


@pytest.mark.parametrize(("other", "named"), [(12.6399, False), (15.03, True)])
def test_the_search_summary_names_no_higher_capacity_for_a_tie_at_the_baselines_load(capsys, other, named):
    """The baseline passed 12.6363 rps/accel and another trial the same load at 12.6399 (arrival jitter) with a
    slower reference TTFT: the summary does not call it the highest capacity; one load higher, it does."""
    from tuner.cli import print_summary
    from tuner.search import SearchOutcome

    base = TrialRow("base0001", "r1", "completed", metrics={"capacity_rps_per_accel": 12.6363, "ref_ttft_p95_s": 0.1})
    rival = TrialRow("rival002", "r2", "completed", metrics={"capacity_rps_per_accel": other, "ref_ttft_p95_s": 0.3})
    print_summary(SearchOutcome("e", "parent", "sqlite:///x.db", [base, rival], [base, rival], 120.0, base))
    assert ("highest capacity: trial rival002" in capsys.readouterr().out) == named
