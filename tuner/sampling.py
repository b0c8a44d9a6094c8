"""What one load step replays: a sample of the workload that represents the whole trace, at a target rate.

Real traces are bursty at every scale, so a window cut from a trace's start is not a sample of it.
A step's sample is `windows` runs of consecutive requests taken at stratified random offsets across the
trace (the burst structure inside each run is kept: its arrival gaps are the recorded ones), preceded
by warm-up requests sent evenly. All the gaps are then scaled by one factor so that the measured
requests arrive at exactly the target mean rate: bursts stay bursts, relative to each other too, and
the offered load is the load asked for. The sample depends only on the workload and the seed, so every
step and every trial replays the same requests (common random numbers): trials differ by config, not
by sample. Prompt token ids are drawn per step, so no step reuses an earlier step's prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tuner.records import PlannedRequest
from tuner.workload.records import PREFIX_BLOCK_TOKENS, Request, Workload

# Ids below this are the tokenizer's special tokens (<unk>, <s>, </s>, ...): never used in prompts.
FIRST_ORDINARY_TOKEN = 16


@dataclass(frozen=True)
class StepSample:
    """The requests steps replay: warm-up requests, then runs of consecutive trace requests (windows).

    A step at rate r counts `measured_at(r)` requests: at least `min_measured`, and enough to fill
    `min_window_s` seconds, so a high-rate step lasts long enough for an overloaded queue to show.
    They are the first requests of every window in equal shares, so each step covers the whole trace
    and a faster step replays a superset of a slower one's requests. `gaps[w][k]` is the recorded gap
    after request k of window w (the trace's mean gap after a window's last request or across a wrap).
    `starts` are the trace indices at which the windows begin (provenance).
    """

    warmup: tuple[Request, ...]
    windows: tuple[tuple[Request, ...], ...]
    gaps: tuple[tuple[float, ...], ...]
    starts: tuple[int, ...]
    min_measured: int
    min_window_s: float = 0.0
    mean_gap: float = 1.0

    @property
    def capacity(self) -> int:
        """The most measured requests a step can count."""
        return sum(len(window) for window in self.windows)

    def measured_at(self, rate_rps: float) -> int:
        """Counted requests of a step at `rate_rps` (capped at `capacity`)."""
        wanted = max(self.min_measured, math.ceil(rate_rps * self.min_window_s - 1e-9))
        return min(wanted, self.capacity)

    def layout(self, rate_rps: float) -> tuple[list[Request], list[float]]:
        """The step's requests (warm-up first) and their send offsets in seconds at `rate_rps`.

        The measured ones arrive within `[window_start, window_start + measured / rate)` at exactly
        that mean rate; warm-up ones are sent evenly at the same rate just before.
        """
        count = self.measured_at(rate_rps)
        shares = [
            count // len(self.windows) + (1 if i < count % len(self.windows) else 0) for i in range(len(self.windows))
        ]
        requests: list[Request] = []
        gap_after: list[float] = []
        for window, gaps, share in zip(self.windows, self.gaps, shares, strict=True):
            requests.extend(window[:share])
            # Inside a window the recorded gaps; after its last counted request, the trace's mean gap.
            gap_after.extend(gaps[: share - 1])
            if share:
                gap_after.append(self.mean_gap)
        scale = count / sum(gap_after) / rate_rps
        warm = len(self.warmup)
        offsets = [k / rate_rps for k in range(warm)]
        at = warm / rate_rps
        for gap in gap_after:
            offsets.append(at)
            at += gap * scale
        return [*self.warmup, *requests], offsets

    def window_s(self, rate_rps: float) -> float:
        """Length in seconds of the measured window at `rate_rps`."""
        return self.measured_at(rate_rps) / rate_rps

    def describe(self) -> dict[str, object]:
        """What MLflow records about the sample (no prompt content: there is none)."""
        return {
            "min_measured_requests": self.min_measured,
            "min_window_s": self.min_window_s,
            "max_measured_requests": self.capacity,
            "warmup_requests": len(self.warmup),
            "windows": len(self.starts),
            "window_starts": list(self.starts),
        }


def required_requests(percentiles: list[float], tail_requests: int) -> int:
    """Measured requests a step needs so that each percentile rests on `tail_requests` requests above it.

    A p95 over n requests has n x 0.05 above it: 10 tail requests need 200. The mean and p50 need
    `tail_requests` x 2. Raises ValueError for a percentile outside (0, 100).
    """
    if any(not 0 < p < 100 for p in percentiles):
        raise ValueError(f"percentiles must lie in (0, 100), but got {percentiles}")
    fractions = [1 - p / 100 for p in percentiles] or [0.5]
    return max(math.ceil(tail_requests / min(fraction, 0.5) - 1e-9) for fraction in fractions)


def sample_step(
    workload: Workload,
    *,
    measured: int,
    warmup: int,
    windows: int,
    seed: int,
    min_window_s: float = 0.0,
    max_rate_rps: float = 0.0,
) -> StepSample:
    """The sample every step of a search replays (see the module docstring).

    Steps count at least `measured` requests, and at rates up to `max_rate_rps` enough to fill
    `min_window_s`. Windows wrap around the end of the trace, so a short trace is replayed in whole
    passes. Raises ValueError for `measured` < 1, `warmup` < 0, `windows` < 1 or an empty workload.
    """
    if measured < 1 or warmup < 0 or windows < 1 or min_window_s < 0:
        raise ValueError(
            f"measured >= 1, warmup >= 0, windows >= 1 and min_window_s >= 0 must hold, but got "
            f"{measured}, {warmup}, {windows}, {min_window_s}"
        )
    requests = workload.requests
    count = len(requests)
    if count == 0:
        raise ValueError("the workload has no requests")
    arrivals = np.array([r.arrival_s for r in requests], dtype=float)
    gaps = np.diff(arrivals)
    mean_gap = float(gaps.mean()) if count > 1 and gaps.sum() > 0 else 1.0
    most = max(measured, math.ceil(max_rate_rps * min_window_s - 1e-9))
    windows = min(windows, measured)
    size = math.ceil(most / windows)
    rng = np.random.default_rng([seed, 0x5A3])
    # Stratified: window j starts at a random point of the j-th of `windows` equal slices of the trace.
    starts = [int((j + rng.random()) * count / windows) % count for j in range(windows)]
    runs, run_gaps = [], []
    for start in starts:
        indices = [(start + k) % count for k in range(size)]
        runs.append(tuple(requests[i] for i in indices))
        # The recorded gap to the next request, except across the trace's end (the mean gap there).
        run_gaps.append(tuple(float(gaps[i]) if i + 1 < count else mean_gap for i in indices[:-1]) + (mean_gap,))
    first = starts[0]
    warm = tuple(requests[(first - warmup + k) % count] for k in range(warmup))
    return StepSample(warm, tuple(runs), tuple(run_gaps), tuple(starts), measured, min_window_s, mean_gap)


def whole_trace(workload: Workload) -> StepSample:
    """The whole trace in order, no warm-up: at the workload's recorded rate its requests are sent at
    their recorded times (for benchmarks that replay a trace as it was)."""
    requests = workload.requests
    arrivals = np.array([r.arrival_s for r in requests], dtype=float)
    gaps = np.diff(arrivals)
    mean_gap = float(gaps.mean()) if len(requests) > 1 and gaps.sum() > 0 else 1.0
    return StepSample(
        (), (tuple(requests),), (tuple(float(g) for g in gaps) + (mean_gap,),), (0,), len(requests), 0.0, mean_gap
    )


def plan_step(sample: StepSample, *, rate_rps: float, step_seed: int, vocab_size: int) -> list[PlannedRequest]:
    """The requests of one step at mean rate `rate_rps` (see `StepSample.layout`), with exact-length
    token-id prompts whose shared prefixes follow the requests' prefix ids. Token ids depend on
    `step_seed`, so two steps never share a prompt. Raises ValueError for `rate_rps` <= 0.
    """
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0, but got {rate_rps}")
    requests, offsets = sample.layout(rate_rps)
    warm = len(sample.warmup)
    blocks: dict[int, np.ndarray] = {}
    plan: list[PlannedRequest] = []
    for index, (request, offset) in enumerate(zip(requests, offsets, strict=True)):
        rng = np.random.default_rng([step_seed, index])
        prefix: list[int] = []
        for block_id in request.prefix_ids:
            if len(prefix) >= request.prompt_tokens:
                break
            if block_id not in blocks:
                blocks[block_id] = np.random.default_rng([step_seed, 1 << 20, block_id]).integers(
                    FIRST_ORDINARY_TOKEN, vocab_size, PREFIX_BLOCK_TOKENS
                )
            prefix.extend(blocks[block_id].tolist())
        prefix = prefix[: request.prompt_tokens]
        tail = rng.integers(FIRST_ORDINARY_TOKEN, vocab_size, request.prompt_tokens - len(prefix))
        plan.append(
            PlannedRequest(
                index=index,
                scheduled_s=offset,
                prompt_token_ids=tuple(prefix + tail.tolist()),
                output_tokens=request.output_tokens,
                in_warmup=index < warm,
            )
        )
    return plan
