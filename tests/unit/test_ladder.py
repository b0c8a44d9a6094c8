"""Step planning: rate scaling, cycling, warm-up marking, exact lengths and shared prefixes."""

from __future__ import annotations

import pytest

from trainables.ladder import FIRST_ORDINARY_TOKEN, plan_step
from tuner.workload.records import PREFIX_BLOCK_TOKENS, Request, Workload


def _workload(n=10, gap=1.0, prefix=False) -> Workload:
    requests = tuple(Request(arrival_s=i * gap, prompt_tokens=600 if prefix else 20, output_tokens=5,
                             prefix_ids=(7, 100 + i) if prefix else ()) for i in range(n))
    return Workload(requests, {"source": "test"})


def test_rate_and_duration_are_honoured_by_cycling_the_workload():
    plan = plan_step(_workload(10, 1.0), rate_rps=4.0, duration_s=10.0, warmup_s=2.0, step_seed=1,
                     vocab_size=4096)
    # 10 requests a pass at 1 rps -> 4 rps: gaps of 0.25 s, 40 requests in 10 s.
    assert len(plan) == 40
    assert all(b.scheduled_s - a.scheduled_s == pytest.approx(0.25) for a, b in zip(plan, plan[1:], strict=False))
    assert max(p.scheduled_s for p in plan) < 10.0
    assert [p.in_warmup for p in plan] == [p.scheduled_s < 2.0 for p in plan]


def test_prompts_have_exact_lengths_and_no_special_tokens():
    plan = plan_step(_workload(), rate_rps=1.0, duration_s=5.0, warmup_s=0.0, step_seed=3, vocab_size=512)
    for planned in plan:
        assert len(planned.prompt_token_ids) == 20 and planned.output_tokens == 5
        assert all(FIRST_ORDINARY_TOKEN <= t < 512 for t in planned.prompt_token_ids)


def test_shared_prefix_ids_become_shared_token_prefixes_within_a_step_only():
    plan = plan_step(_workload(prefix=True), rate_rps=1.0, duration_s=3.0, warmup_s=0.0, step_seed=1,
                     vocab_size=4096)
    a, b = plan[0].prompt_token_ids, plan[1].prompt_token_ids
    assert a[:PREFIX_BLOCK_TOKENS] == b[:PREFIX_BLOCK_TOKENS]
    assert a[PREFIX_BLOCK_TOKENS:] != b[PREFIX_BLOCK_TOKENS:]
    other = plan_step(_workload(prefix=True), rate_rps=1.0, duration_s=3.0, warmup_s=0.0, step_seed=2,
                      vocab_size=4096)
    assert other[0].prompt_token_ids[:PREFIX_BLOCK_TOKENS] != a[:PREFIX_BLOCK_TOKENS]


def test_same_seed_same_plan():
    first = plan_step(_workload(), rate_rps=2.0, duration_s=4.0, warmup_s=1.0, step_seed=9, vocab_size=4096)
    again = plan_step(_workload(), rate_rps=2.0, duration_s=4.0, warmup_s=1.0, step_seed=9, vocab_size=4096)
    assert first == again


def test_bad_rate_is_refused():
    with pytest.raises(ValueError, match="rate_rps"):
        plan_step(_workload(), rate_rps=0, duration_s=1, warmup_s=0, step_seed=0, vocab_size=4096)
