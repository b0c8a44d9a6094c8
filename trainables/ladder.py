"""Plans the requests of one load step from a workload: arrival times scaled to the step's rate, and
exact-length token-id prompts whose shared prefixes follow the workload's prefix ids."""

from __future__ import annotations

import numpy as np

from trainables.replay import PlannedRequest
from tuner.workload.records import PREFIX_BLOCK_TOKENS, Workload

# Ids below this are the tokenizer's special tokens (<unk>, <s>, </s>, ...): never used in prompts.
FIRST_ORDINARY_TOKEN = 16


def plan_step(workload: Workload, *, rate_rps: float, duration_s: float, warmup_s: float,
              step_seed: int, vocab_size: int) -> list[PlannedRequest]:
    """The requests of one step: the workload's arrivals compressed to mean `rate_rps`, cycling
    through the workload as often as needed, sent within `[0, duration_s)`; those before `warmup_s`
    are marked warm-up. Token ids depend on `step_seed`, so two steps never share a prompt.
    """
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError(f"rate_rps and duration_s must be > 0, but got {rate_rps} and {duration_s}")
    requests = workload.requests
    base = requests[0].arrival_s
    scale = workload.mean_rate_rps / rate_rps
    # One pass of the workload, scaled, plus one mean gap before the next pass starts.
    period = (workload.duration_s + 1.0 / workload.mean_rate_rps) * scale
    blocks: dict[int, np.ndarray] = {}
    plan: list[PlannedRequest] = []
    for cycle in range(10_000):
        for request in requests:
            at = cycle * period + (request.arrival_s - base) * scale
            if at >= duration_s:
                return plan
            index = len(plan)
            rng = np.random.default_rng([step_seed, index])
            prefix: list[int] = []
            for block_id in request.prefix_ids:
                if len(prefix) >= request.prompt_tokens:
                    break
                if block_id not in blocks:
                    blocks[block_id] = np.random.default_rng([step_seed, 1 << 20, block_id]).integers(
                        FIRST_ORDINARY_TOKEN, vocab_size, PREFIX_BLOCK_TOKENS)
                prefix.extend(blocks[block_id].tolist())
            prefix = prefix[: request.prompt_tokens]
            tail = rng.integers(FIRST_ORDINARY_TOKEN, vocab_size, request.prompt_tokens - len(prefix))
            plan.append(PlannedRequest(index=index, scheduled_s=at,
                                       prompt_token_ids=tuple(prefix + tail.tolist()),
                                       output_tokens=request.output_tokens,
                                       in_warmup=at < warmup_s))
    return plan
