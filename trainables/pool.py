"""A trial's pool of replicas, its router and its health monitor; the one module that creates Ray actors.

`EnginePool` routes each request to the live replica with the fewest outstanding requests, pings every
replica on a heartbeat, declares a replica dead after `failure_threshold` missed pings in a row, kills
and replaces it, and retries its in-flight requests on the others. It works over any `Engine`s
(in-process stand-ins in unit tests). `start_ray_pool` hosts each replica (a `VllmServer`, whose
clients stream over HTTP, or an in-process `VllmEngine`) in its own Ray actor pinned to its own
placement-group bundle and starts them all in parallel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainables.http_replica import HttpReplica
from trainables.protocol import Engine, Finished, FirstToken, GenerateRequest, StreamItem
from trainables.vllm_engine import SERVED_MODEL_NAME, EngineSpec, VllmEngine, VllmServer
from tuner.errors import EngineDied, EngineError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthPolicy:
    """How replicas are health-checked: a ping every `period_s`; a ping unanswered within `timeout_s`
    (or answered with an error) is a miss; `failure_threshold` misses in a row declare the replica dead."""

    period_s: float = 5.0
    timeout_s: float = 10.0
    failure_threshold: int = 3

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.timeout_s <= 0 or self.failure_threshold < 1:
            raise ValueError(
                f"heartbeat period and timeout must be > 0 and failure_threshold >= 1, "
                f"but got {self.period_s}, {self.timeout_s}, {self.failure_threshold}"
            )


@dataclass(frozen=True)
class Declaration:
    """A replica declared dead: when, when a fault was injected into it, and the error it failed with.

    Without an injected fault it either crashed on its own (it answered with an error: `cause`) or was
    a false alarm (it only failed to answer in time: no cause).
    """

    replica: int
    declared_at: float
    fault_at: float | None
    cause: str | None = None

    @property
    def detection_s(self) -> float | None:
        return None if self.fault_at is None else self.declared_at - self.fault_at

    @property
    def crashed(self) -> bool:
        """Died on its own: no fault was injected, and it failed with an error rather than a timeout."""
        return self.fault_at is None and self.cause is not None

    @property
    def false_alarm(self) -> bool:
        return self.fault_at is None and self.cause is None


# Starts a replacement for slot i: returns the new replica and facts about it.
ReplaceFn = Callable[[int], Awaitable[tuple[Engine, dict[str, Any]]]]


class EnginePool:
    """Replicas behind a least-outstanding-requests router, with heartbeats, replacement and retries."""

    def __init__(
        self,
        replicas: Sequence[Engine],
        info: Sequence[dict[str, Any]] = (),
        *,
        health: HealthPolicy | None = None,
        replace: ReplaceFn | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise ValueError("a pool needs at least one replica")
        count = len(replicas)
        self.replicas = list(replicas)
        self.info = list(info) or [{} for _ in range(count)]
        self.health = health
        self.outstanding = [0] * count
        self.alive = [True] * count
        self.declarations: list[Declaration] = []
        self.faults: dict[int, float] = {}
        self.replacements_started = 0
        self._replace = replace
        self._clock = clock
        self._assigned = [0] * count
        self._suspect = [False] * count
        self._dead = [asyncio.Event() for _ in range(count)]
        self._tasks: list[asyncio.Task] = []
        self._pings: set[asyncio.Task] = set()
        self._misses = [0] * count
        self._errors: list[str | None] = [None] * count  # the latest error a replica failed with
        self._generation = [0] * count

    # -- routing -------------------------------------------------------------------------------------
    def pick(self) -> int | None:
        """The live replica with the fewest outstanding requests (ties: the least used); None if none."""
        live = [i for i in range(len(self.replicas)) if self.alive[i] and not self._suspect[i]]
        if not live:
            return None
        return min(live, key=lambda i: (self.outstanding[i], self._assigned[i], i))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[tuple[int, StreamItem]]:
        """Route one request; yields (replica, item) until a `Finished`. A request whose replica dies or
        is declared dead is retried on another live replica under a new id; its Finished then carries
        `retries`. With no live replica left (and none coming back in time) it fails with a reason."""
        attempt, first_sent, last_error = 0, False, None
        while True:
            index = self.pick()
            if index is None:
                index = await self._wait_for_live(timeout_s=self._revival_wait())
                if index is None:
                    reason = "no live replica to serve it" + (f" ({last_error})" if last_error else "")
                    yield -1, Finished(request.request_id, 0, (), error=reason, retries=attempt)
                    return
            attempt_id = request.request_id if attempt == 0 else f"{request.request_id}-retry{attempt}"
            outcome = None
            async for item in self._attempt(index, dataclasses.replace(request, request_id=attempt_id)):
                if isinstance(item, FirstToken):
                    if not first_sent:
                        first_sent = True
                        yield index, FirstToken(request.request_id)
                    continue
                outcome = item
            if outcome is not None and (outcome.error is None or (self.alive[index] and not self._suspect[index])):
                yield index, dataclasses.replace(outcome, request_id=request.request_id, retries=attempt)
                return
            last_error = outcome.error if outcome is not None else f"replica {index} declared dead"
            attempt += 1

    async def _attempt(self, index: int, request: GenerateRequest) -> AsyncIterator[StreamItem]:
        """Stream one attempt on one replica; ends early (no Finished) if the replica is declared dead."""
        self.outstanding[index] += 1
        self._assigned[index] += 1
        dead, generation = self._dead[index], self._generation[index]
        stream = self.replicas[index].generate(request).__aiter__()
        waiter = asyncio.ensure_future(dead.wait())
        try:
            while True:
                step = asyncio.ensure_future(stream.__anext__())
                done, _ = await asyncio.wait({step, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                    return
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                except Exception as error:  # the actor or its engine died: stop routing to it until
                    # the monitor decides; not the death of a replica we killed ourselves
                    if generation == self._generation[index] and proves_death(error):
                        self._suspect[index] = True
                        self._errors[index] = error_line(error)
                    yield Finished(
                        request.request_id, 0, (), error=f"replica {index}: {error_line(error)}", replica_error=True
                    )
                    return
                yield item
                if isinstance(item, Finished):
                    return
        finally:
            waiter.cancel()
            self.outstanding[index] -= 1

    def _revival_wait(self) -> float:
        # A replacement is on its way only when the pool can replace replicas.
        return 0.0 if self._replace is None else float("inf")

    async def _wait_for_live(self, timeout_s: float) -> int | None:
        deadline = self._clock() + timeout_s
        while self._clock() < deadline:
            await asyncio.sleep(0.05)
            index = self.pick()
            if index is not None:
                return index
        return None

    # -- health --------------------------------------------------------------------------------------
    def start_monitor(self) -> None:
        """Start heartbeats for every replica (no-op without a HealthPolicy)."""
        if self.health is not None and not self._tasks:
            self._tasks = [asyncio.ensure_future(self._watch(i)) for i in range(len(self.replicas))]

    async def _watch(self, index: int) -> None:
        """Send a ping every period, without waiting for the previous one: a frozen replica is then
        declared within period x failure_threshold + timeout of the fault."""
        policy = self.health
        assert policy is not None
        while True:
            if self.alive[index]:
                self._pings.add(asyncio.ensure_future(self._ping_once(index, self._generation[index])))
                self._pings = {t for t in self._pings if not t.done()}
            await asyncio.sleep(policy.period_s)

    async def _ping_once(self, index: int, generation: int) -> None:
        policy = self.health
        assert policy is not None
        error: str | None = None
        try:
            await asyncio.wait_for(self.replicas[index].ping(), policy.timeout_s)
            answered = True
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:  # no answer in time: a miss, but no sign of a crash
            answered = False
        except Exception as failure:  # the actor or its engine is gone: a miss with a reason
            answered, error = False, error_line(failure)
        if generation != self._generation[index] or not self.alive[index]:
            return  # an answer about a replica already declared dead or replaced
        if answered:
            self._misses[index] = 0
            self._errors[index] = None
            return
        if error is not None:
            self._errors[index] = error
        self._misses[index] += 1
        if self._misses[index] >= policy.failure_threshold:
            await self._declare_dead(index)

    async def _declare_dead(self, index: int) -> None:
        now = self._clock()
        self.alive[index] = False
        self._generation[index] += 1
        self._misses[index] = 0
        self.declarations.append(Declaration(index, now, self.faults.pop(index, None), self._errors[index]))
        self._errors[index] = None
        self._dead[index].set()
        replica = self.replicas[index]
        kill = getattr(replica, "kill", None)
        try:
            if kill is not None:
                await kill()
            else:
                await asyncio.wait_for(replica.shutdown(), 10)
        except Exception as error:
            log.warning("replica %d could not be killed cleanly: %s", index, error_line(error))
        if self._replace is not None:
            self.replacements_started += 1
            self._tasks.append(asyncio.ensure_future(self._start_replacement(index)))

    async def _start_replacement(self, index: int) -> None:
        assert self._replace is not None
        try:
            replica, info = await self._replace(index)
        except Exception as error:  # the slot stays dead; its share of the load goes to the others
            log.warning("replacement for replica %d failed: %s", index, error_line(error))
            return
        self.replicas[index], self.info[index] = replica, info
        self._dead[index] = asyncio.Event()
        self._suspect[index] = False
        self._errors[index] = None
        self.alive[index] = True

    def unexplained_deaths(self) -> list[tuple[int, str]]:
        """Replicas that failed requests with a death error, with no fault injected into them, that the
        monitor has not declared yet (it needs `failure_threshold` pings): (replica, error)."""
        return [
            (i, error)
            for i, error in enumerate(self._errors)
            if error is not None and self._suspect[i] and self.alive[i] and i not in self.faults
        ]

    async def inject_fault(self, index: int, kind: str) -> None:
        """Fault injection: `kill` the replica, or `freeze` it (it hangs without dying)."""
        self.faults[index] = self._clock()
        replica = self.replicas[index]
        if kind == "kill":
            await replica.kill()  # type: ignore[attr-defined]
        elif kind == "freeze":
            await replica.freeze()  # type: ignore[attr-defined]
        else:
            raise ValueError(f"unknown fault kind {kind!r} (use kill or freeze)")

    # -- the rest of the protocol, pool-wide ---------------------------------------------------------
    async def abort(self, request_ids: list[str]) -> None:
        """Abort the given requests (and their retries) on every live replica."""
        ids = request_ids + [f"{r}-retry{n}" for r in request_ids for n in range(1, 4)]
        await asyncio.gather(
            *(r.abort(ids) for i, r in enumerate(self.replicas) if self.alive[i]), return_exceptions=True
        )

    async def reset_prefix_cache(self) -> None:
        await asyncio.gather(
            *(r.reset_prefix_cache() for i, r in enumerate(self.replicas) if self.alive[i] and not self._suspect[i]),
            return_exceptions=True,
        )

    async def shutdown(self) -> None:
        """Stop heartbeats and replacements, then shut every replica down; errors are logged, never
        raised, so teardown always completes."""
        tasks = self._tasks + list(self._pings)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks, self._pings = [], set()
        results = await asyncio.gather(*(r.shutdown() for r in self.replicas), return_exceptions=True)
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                log.warning("replica %d did not shut down cleanly: %s", index, error_line(result))


class RayReplica:
    """The `Engine` protocol over a Ray actor that hosts a `VllmEngine`."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StreamItem]:
        stream = self.handle.generate.options(num_returns="streaming").remote(request)
        async for ref in stream:
            yield await ref

    async def ping(self) -> float:
        return float(await self.handle.ping.remote())

    async def abort(self, request_ids: list[str]) -> None:
        await self.handle.abort.remote(request_ids)

    async def reset_prefix_cache(self) -> None:
        await self.handle.reset_prefix_cache.remote()

    async def freeze(self) -> None:
        # The actor stops its own process (SIGSTOP), wherever it runs; the call never returns.
        self.handle.freeze.remote()

    async def kill(self) -> None:
        """Kill the actor, and first the server it hosts, if any: a server whose actor dies is left to
        shut its engine down on its own (or to the raylet), which can leave the engine running."""
        import ray

        try:
            await asyncio.wait_for(self.kill_server(), 5)
        except Exception:  # noqa: BLE001 - an in-process replica has no server; a dead actor, nothing to kill
            pass
        ray.kill(self.handle, no_restart=True)

    async def kill_server(self) -> None:
        await self.handle.kill_server.remote()

    async def shutdown(self, timeout_s: float = 60.0) -> None:

        try:
            await asyncio.wait_for(self.handle.shutdown.remote(), timeout_s)
        finally:
            await self.kill()


def _create_actor(spec: EngineSpec, placement_group: Any, bundle: int, gpus: float) -> Any:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = None
    if placement_group is not None:
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=placement_group, placement_group_bundle_index=bundle
        )
    host = VllmServer if spec.serving == "openai-server" else VllmEngine
    return (
        ray.remote(host)
        .options(num_cpus=spec.cpu_cores, num_gpus=gpus, scheduling_strategy=strategy, max_concurrency=10_000)
        .remote(spec)
    )


def _client(spec: EngineSpec, handle: Any, info: dict[str, Any]) -> Engine:
    """What the pool talks to: the actor itself, or the server it hosts (over HTTP, the actor as host)."""
    replica = RayReplica(handle)
    if spec.serving == "openai-server":
        return HttpReplica(info["url"], replica, SERVED_MODEL_NAME)
    return replica


async def start_ray_pool(
    spec: EngineSpec,
    num_replicas: int,
    *,
    placement_group: Any,
    first_bundle: int = 1,
    gpus_per_replica: float = 0,
    start_timeout_s: float = 600.0,
    health: HealthPolicy | None = None,
    replace: bool = False,
) -> EnginePool:
    """Start `num_replicas` vLLM replicas in parallel, replica i on bundle `first_bundle + i`.

    With `replace`, a replica declared dead is replaced by a new one on the same bundle.
    Raises EngineError (naming vLLM's reason) if any replica fails to start in time; every replica
    already started is shut down first, so nothing is left running.
    """
    handles = [_create_actor(spec, placement_group, first_bundle + i, gpus_per_replica) for i in range(num_replicas)]
    hosts = [RayReplica(h) for h in handles]
    try:
        starting = asyncio.gather(*(h.start.remote() for h in handles))
        starting.add_done_callback(_read_outcome)
        info = await asyncio.wait_for(starting, start_timeout_s)
    except BaseException as error:
        await asyncio.gather(*(r.shutdown(timeout_s=30) for r in hosts), return_exceptions=True)
        if isinstance(error, asyncio.TimeoutError):
            raise EngineError(f"engine start timed out after {start_timeout_s:.0f}s") from None
        if isinstance(error, (asyncio.CancelledError, KeyboardInterrupt)):
            raise
        raise EngineError(error_line(error)) from None

    async def replacement(index: int) -> tuple[Engine, dict[str, Any]]:
        handle = _create_actor(spec, placement_group, first_bundle + index, gpus_per_replica)
        try:
            facts = await asyncio.wait_for(handle.start.remote(), start_timeout_s)
        except BaseException:
            await RayReplica(handle).kill()
            raise
        return _client(spec, handle, facts), facts

    replicas = [_client(spec, h, i) for h, i in zip(handles, info, strict=True)]
    pool = EnginePool(replicas, info, health=health, replace=replacement if replace else None)
    pool.start_monitor()
    return pool


def _read_outcome(future: asyncio.Future) -> None:
    """Read a finished future's outcome, so asyncio never logs it as unread. `wait_for` does not read the
    gather it waits on when it is cancelled itself (a trial stopped at its time limit while its engines start):
    Python 3.11 then printed "_GatheringFuture exception was never retrieved" and a traceback."""
    if not future.cancelled():
        future.exception()


def proves_death(error: BaseException) -> bool:
    """Whether a failed call shows its replica is gone (actor died, engine dead), not one bad request."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    if isinstance(error, EngineDied):
        return True
    names = {t.__name__ for t in type(error).__mro__}  # Ray's actor errors, without importing Ray here
    return bool(names & {"RayActorError", "ActorDiedError", "ActorUnavailableError"})


def error_line(error: BaseException) -> str:
    """One line for an error, unwrapping Ray's task/actor error wrappers to the original message."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    text = str(error).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), "")
    return last if isinstance(error, EngineError) else f"{type(error).__name__}: {last}"
