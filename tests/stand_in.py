"""A small in-process stand-in engine for unit tests of the router, replay and trial logic.

It is never selectable by users: it lives under tests/ only. It models a server that decodes
`tokens_per_s` tokens per second shared among at most `max_batch` running requests (the rest queue),
which is enough for load to turn into latency the way it does on a real engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from trainables.protocol import Finished, FirstToken, GenerateRequest, StreamItem
from tuner.errors import EngineDied, EngineError


class StandInEngine:
    def __init__(
        self,
        tokens_per_s: float = 2000.0,
        max_batch: int = 8,
        fail_start: str | None = None,
        prefill_tokens_per_s: float = 50_000.0,
        ping_delay_s: float = 0.0,
    ) -> None:
        self.ping_delay_s = ping_delay_s
        self.killed = False
        self.frozen = asyncio.Event()
        self.tokens_per_s = tokens_per_s
        self.max_batch = max_batch
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.fail_start = fail_start
        self._slots: asyncio.Semaphore | None = None
        self.running = 0
        self.aborted: set[str] = set()
        self.prefix_resets = 0
        self.started = False
        self.shut_down = False
        self.requests: list[GenerateRequest] = []

    async def start(self) -> dict:
        if self.fail_start:
            raise EngineError(self.fail_start)  # as the real engines do
        self.started = True
        return {"pid": 0}

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StreamItem]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_batch)
        if self.killed:
            raise EngineDied("ActorDiedError: the actor died unexpectedly")
        self.requests.append(request)
        queued = time.perf_counter()
        async with self._slots:
            queue_s = time.perf_counter() - queued
            self.running += 1
            try:
                await asyncio.sleep(len(request.prompt_token_ids) / self.prefill_tokens_per_s)
                gaps = []
                last = time.perf_counter()
                for produced in range(request.output_tokens):
                    if self.frozen.is_set():
                        await asyncio.Event().wait()  # hangs, as a SIGSTOPped process does
                    if self.killed:
                        raise EngineDied("ActorDiedError: the actor died unexpectedly")
                    if request.request_id in self.aborted:
                        yield Finished(request.request_id, produced, tuple(gaps), queue_s)
                        return
                    if produced == 0:
                        yield FirstToken(request.request_id)
                    else:
                        # Decode speed is shared among the running requests.
                        await asyncio.sleep(self.running / self.tokens_per_s)
                        now = time.perf_counter()
                        gaps.append(now - last)
                        last = now
                yield Finished(request.request_id, request.output_tokens, tuple(gaps), queue_s)
            finally:
                self.running -= 1

    async def ping(self) -> float:
        if self.killed:
            raise EngineDied("ActorDiedError: the actor died unexpectedly")
        if self.frozen.is_set():
            await asyncio.Event().wait()
        if self.ping_delay_s:
            await asyncio.sleep(self.ping_delay_s)
        return time.monotonic()

    async def kill(self) -> None:
        self.killed = True

    async def freeze(self) -> None:
        self.frozen.set()

    async def abort(self, request_ids: list[str]) -> None:
        self.aborted.update(request_ids)

    async def reset_prefix_cache(self) -> None:
        self.prefix_resets += 1

    async def shutdown(self) -> None:
        self.shut_down = True


class JumpEngine(StandInEngine):
    """A stand-in whose latency jumps at a known load: fast while requests arrive at up to `jump_rps`,
    then every request waits `slow_s` before its first token. Each step (a prefix-cache reset starts
    one) draws its own threshold, `jump_rps` x lognormal(0, `noise_cv`), so verdicts near the jump
    are noisy the way measurements are."""

    def __init__(self, jump_rps: float, *, noise_cv: float = 0.0, slow_s: float = 1.0, seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        import numpy as np

        self.jump_rps = jump_rps
        self.noise_cv = noise_cv
        self.slow_s = slow_s
        self._rng = np.random.default_rng(seed)
        self._threshold = jump_rps
        self._arrivals: list[float] = []

    async def reset_prefix_cache(self) -> None:
        await super().reset_prefix_cache()
        self._threshold = self.jump_rps * float(self._rng.lognormal(0.0, self.noise_cv))
        self._arrivals = []

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StreamItem]:
        now = time.perf_counter()
        self._arrivals = [*self._arrivals[-29:], now]
        recent = self._arrivals
        # The mean rate of the last 30 arrivals of this step: a few requests bunched by an event-loop
        # pause, or sleeps rounded to the timer's millisecond at a few hundred requests/s, are not a
        # load above the jump.
        rate = (len(recent) - 1) / (recent[-1] - recent[0]) if len(recent) >= 10 and recent[-1] > recent[0] else 0.0
        if rate > self._threshold:
            await asyncio.sleep(self.slow_s)
        async for item in super().generate(request):
            yield item
