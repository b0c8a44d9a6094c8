"""Search spaces and search configs: the shipped ones load, and bad input is one line naming the field."""

from __future__ import annotations

import pytest

from tuner.config import load_config
from tuner.errors import ConfigError
from tuner.space import SPACES_DIR, load_space

KNOWN = {
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
    "tensor_parallel_size",
}


@pytest.mark.parametrize("name", ["cpu-smoke", "default", "throughput", "latency"])
def test_shipped_spaces_load(name):
    space = load_space(name, known_engine_args=KNOWN)
    assert "max_num_seqs" in space.tunable


def test_define_by_run_honours_constraints():
    import optuna

    space = load_space(SPACES_DIR / "cpu-smoke.yaml", known_engine_args=KNOWN)
    study = optuna.create_study(directions=["maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    sample = space.define_by_run()
    repaired = 0
    for _ in range(50):
        trial = study.ask()
        config = {**trial.params, **sample(trial)}  # what Ray's OptunaSearch makes the trial's config
        assert config["enable_chunked_prefill"] is True and config["enable_prefix_caching"] is True
        assert config["max_num_batched_tokens"] >= config["max_num_seqs"]
        assert config["max_num_batched_tokens"] % 64 == 0, "repaired onto the declared grid"
        repaired += config["max_num_batched_tokens"] != trial.params["max_num_batched_tokens"]
        study.tell(trial, 0.0)
    assert repaired, "some samples broke the constraint and were repaired"


def test_a_constraint_may_name_a_parameter_written_after_it_and_a_baseline_outside_the_range_runs(tmp_path):
    import optuna

    space = load_space(
        _space(
            tmp_path,
            "parameters:\n  max_num_batched_tokens: {type: int, low: 8, high: 512}\n"
            "  max_num_seqs: {type: int, low: 2, high: 256}\n"
            "constraints: [max_num_batched_tokens >= max_num_seqs]\n",
        ),
        known_engine_args=KNOWN,
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    study.enqueue_trial({"max_num_batched_tokens": 2048, "max_num_seqs": 128})  # vLLM's defaults, say
    sample = space.define_by_run()
    configs = []
    for _ in range(40):
        trial = study.ask()
        configs.append({**trial.params, **sample(trial)})
        study.tell(trial, 0.0)
    assert configs[0] == {"max_num_batched_tokens": 2048, "max_num_seqs": 128}, "the baseline runs as given"
    assert all(c["max_num_batched_tokens"] >= c["max_num_seqs"] for c in configs)


def test_the_distributions_stay_the_same_so_model_based_samplers_see_every_parameter():
    import optuna

    space = load_space(SPACES_DIR / "cpu-smoke.yaml", known_engine_args=KNOWN)
    study = optuna.create_study(directions=["maximize"], sampler=optuna.samplers.RandomSampler(seed=1))
    sample = space.define_by_run()
    for _ in range(10):
        trial = study.ask()
        sample(trial)
        study.tell(trial, 0.0)
    intersection = optuna.search_space.intersection_search_space(study.get_trials(deepcopy=False))
    assert set(intersection) == set(space.tunable)


def _space(tmp_path, text: str):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "parameters:\n  max_num_seq: {type: int, low: 1, high: 4}\n",
            "parameters.max_num_seq: unknown parameter (did you mean 'max_num_seqs'?)",
        ),
        (
            "parameters:\n  max_num_seqs: {type: int, low: 8, high: 4}\n",
            "parameters.max_num_seqs: `low <= high` must hold, but got low=8 and high=4",
        ),
        ("parameters:\n  num_replicas: {type: categorical, choices: []}\n", "parameters.num_replicas.choices"),
        (
            "parameters:\n  max_num_seqs: {type: int, low: 64, high: 128}\n  max_num_batched_tokens: "
            "{type: int, low: 8, high: 32}\nconstraints: [max_num_batched_tokens >= max_num_seqs]\n",
            "can never hold",
        ),
        (
            "parameters:\n  max_num_seqs: {type: int, low: 1, high: 4}\nconstraints: [max_num_seqs > 2]\n",
            "expected 'PARAM >= PARAM|NUMBER'",
        ),
    ],
)
def test_bad_spaces_fail_with_one_line_naming_file_and_field(tmp_path, text, expected):
    path = _space(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_space(path, known_engine_args=KNOWN)
    message = str(error.value)
    assert str(path) in message and expected in message and "\n" not in message


def test_missing_space_lists_bundled_ones():
    with pytest.raises(ConfigError, match="bundled: cpu-smoke, default, faults-smoke, latency, throughput"):
        load_space("no-such-space")


def test_default_config_loads_and_overrides_apply():
    config = load_config(None, {"budget.num_samples": 3, "slo": "ttft:p99<1s", "name": None})
    assert config.budget.num_samples == 3
    assert config.slo == "ttft:p99<1s"
    assert config.name == "tiny-default"


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "ladder: {factors: [1.0, 2.0], reference_factor: 1.0}\n",
            "ladder: the fixed load ladder was replaced by a capacity search per trial; write a `capacity:` section",
        ),
        ("faults: [{kind: kill, step: 2}]\n", "faults.0.step: faults are keyed to a load now"),
        (
            "capacity: {start_factor: 0.3}\n",
            "start_factor must be 1 or growth^-k so that the climb measures the "
            "reference load (1x), but got 0.3 with growth 2.0 (try 0.25)",
        ),
        ("capacity: {min_factor: 2}\n", "`min_factor <= start_factor <= max_factor` must hold"),
        (
            "capacity: {measured_requests: 50}\n",
            "capacity.measured_requests: 50 requests per step leave fewer than "
            "tail_requests=10 above the SLO's highest percentile (that needs 200)",
        ),
        ("budget: {num_sample: 3}\n", "budget.num_sample: unknown field"),
        ("slo: 'ttft:p95<5x'\n", "slo"),
        ("- just a list\n", "expected a mapping"),
    ],
)
def test_bad_configs_fail_with_one_line(tmp_path, text, expected):
    path = tmp_path / "search.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert expected in str(error.value) and str(path) in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_asha_first_rung_defaults_to_twice_the_reference_load():
    from tuner.search import asha_grace_period

    config = load_config()  # climb 1x, 2x, 4x, ...
    assert config.capacity.plan().climb_factors()[asha_grace_period(config) - 1] == 2.0
    below = load_config(overrides={"capacity.start_factor": 0.25, "capacity.min_factor": 0.25})
    assert below.capacity.plan().climb_factors()[asha_grace_period(below) - 1] == 2.0
    assert asha_grace_period(load_config(overrides={"asha.grace_period": 2})) == 2
    short = load_config(overrides={"capacity.max_factor": 1.5, "capacity.growth": 1.5})
    assert asha_grace_period(short) == 2, "no climb step at 2x: the last one, where ASHA stops nothing"


def test_measured_requests_are_sized_from_the_slos_highest_percentile():
    assert load_config(overrides={"capacity.tail_requests": 10}).measured_requests() == 200
    assert load_config(overrides={"capacity.tail_requests": 10, "slo": "ttft:p99<2s"}).measured_requests() == 1000
    assert load_config(overrides={"capacity.measured_requests": 300}).measured_requests() == 300


def test_the_sampler_is_optunas_gp_with_few_start_up_trials():
    from optuna.samplers import GPSampler

    from tuner.search import make_sampler, startup_trials

    assert isinstance(make_sampler(0, 8), GPSampler)
    assert [startup_trials(n) for n in (1, 8, 12, 20, 100)] == [2, 2, 2, 4, 10]


def test_asha_compares_a_trial_that_left_the_climb_by_its_last_climb_value():
    from types import SimpleNamespace

    from tuner.search import RecordingASHA

    asha = RecordingASHA(
        time_attr="load_step",
        metric="slo_headroom",
        mode="max",
        max_t=12,
        grace_period=2,
        reduction_factor=2,
        stop_last_trials=False,
        growth=2.0,
    )
    trials = {name: SimpleNamespace(trial_id=name, status="RUNNING") for name in "abc"}
    for trial in trials.values():
        asha.on_trial_add(None, trial)
    a, b, c = trials.values()
    asha.on_trial_result(None, a, {"load_step": 1, "slo_headroom": 5.0, "phase": "climb"})
    asha.on_trial_result(None, a, {"load_step": 2, "slo_headroom": 3.0, "phase": "climb"})
    asha.on_trial_result(None, b, {"load_step": 1, "slo_headroom": 0.8, "phase": "climb"})
    # b's second step refines at a lower load and passes easily: ASHA must still see its failure at rung 2,
    # scaled down by the load it did not reach (a conservative stand-in: headroom falls as load rises).
    asha.on_trial_result(None, b, {"load_step": 2, "slo_headroom": 4.0, "phase": "refine"})
    # c's last result (a refine step) reaches ASHA through on_trial_complete: the same rule applies.
    asha.on_trial_result(None, c, {"load_step": 1, "slo_headroom": 0.9, "phase": "climb"})
    asha.on_trial_complete(None, c, {"load_step": 2, "slo_headroom": 6.0, "phase": "refine", "done": True})
    recorded = {trial: value for _, rung in asha._trial_info["a"]._rungs for trial, value in rung.items()}
    assert recorded == {"a": 3.0, "b": 0.4, "c": 0.45}
    # Under the majority rule a trial can climb again after refining (its ending failure outvoted), but
    # steps behind: its later climb steps are at lower loads than the rung's, so they count the same way.
    d = SimpleNamespace(trial_id="d", status="RUNNING")
    asha.on_trial_add(None, d)
    for step, value, phase in ((1, 0.9, "climb"), (2, 3.0, "refine"), (3, 0.9, "remeasure"), (4, 2.0, "climb")):
        asha.on_trial_result(None, d, {"load_step": step, "slo_headroom": value, "phase": phase})
    rung4 = next(rung for milestone, rung in asha._trial_info["d"]._rungs if milestone == 4)
    assert rung4["d"] == pytest.approx(0.9 / 8)


def test_a_trial_that_failed_later_ranks_above_one_that_failed_earlier_at_a_later_rung():
    from types import SimpleNamespace

    from tuner.search import RecordingASHA

    asha = RecordingASHA(
        time_attr="load_step",
        metric="slo_headroom",
        mode="max",
        max_t=12,
        grace_period=1,
        reduction_factor=2,
        stop_last_trials=False,
        growth=2.0,
    )
    early = SimpleNamespace(trial_id="early", status="RUNNING")
    late = SimpleNamespace(trial_id="late", status="RUNNING")
    for trial in (early, late):
        asha.on_trial_add(None, trial)
    for step, value in ((1, 5.0), (2, 0.8)):  # fails at 2x with a mild miss
        asha.on_trial_result(None, early, {"load_step": step, "slo_headroom": value, "phase": "climb"})
    for step in (3, 4):
        asha.on_trial_result(None, early, {"load_step": step, "slo_headroom": 3.0, "phase": "refine"})
    for step, value in ((1, 6.0), (2, 3.0), (3, 1.5), (4, 0.5)):  # fails at 8x, a harder miss
        asha.on_trial_result(None, late, {"load_step": step, "slo_headroom": value, "phase": "climb"})
    rung4 = next(rung for milestone, rung in asha._trial_info["late"]._rungs if milestone == 4)
    assert rung4["late"] > rung4["early"]


def test_the_baseline_is_matched_one_way_for_the_search_and_the_records():
    from tuner.space import matches_baseline

    baseline = {"max_num_seqs": 128, "gpu_memory_utilization": 0.92, "enable_prefix_caching": True}
    assert matches_baseline({**baseline, "num_replicas": 1}, baseline)
    # A float read back from MLflow, and a param logged as text, still match.
    assert matches_baseline({**baseline, "gpu_memory_utilization": 0.9200000000001}, baseline)
    assert matches_baseline({**baseline, "max_num_seqs": "128"}, baseline)
    assert not matches_baseline({**baseline, "gpu_memory_utilization": 0.93}, baseline)
    assert not matches_baseline(baseline, {}), "no baseline recorded: nothing is the baseline"
