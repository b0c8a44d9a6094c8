"""A trial's pool of replicas and its router; the one module that creates Ray actors.

`EnginePool` routes each request to the replica with the fewest outstanding requests and works over
any `Engine`s (in-process stand-ins in unit tests). `start_ray_pool` hosts each `VllmEngine` in its own
Ray actor pinned to its own placement-group bundle and starts them all in parallel.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Sequence

from trainables.protocol import Engine, Finished, GenerateRequest, StreamItem
from trainables.vllm_engine import EngineSpec, VllmEngine
from tuner.errors import EngineError

log = logging.getLogger(__name__)


class EnginePool:
    """Replicas behind a least-outstanding-requests router."""

    def __init__(self, replicas: Sequence[Engine], info: Sequence[dict[str, Any]] = ()) -> None:
        if not replicas:
            raise ValueError("a pool needs at least one replica")
        self.replicas = list(replicas)
        self.info = list(info)
        self.outstanding = [0] * len(self.replicas)
        self._assigned = [0] * len(self.replicas)

    def pick(self) -> int:
        """Index of the replica with the fewest outstanding requests (ties: the least used so far)."""
        return min(range(len(self.replicas)), key=lambda i: (self.outstanding[i], self._assigned[i], i))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[tuple[int, StreamItem]]:
        """Route one request; yields (replica index, stream item) until the replica's `Finished`."""
        index = self.pick()
        self.outstanding[index] += 1
        self._assigned[index] += 1
        try:
            async for item in self.replicas[index].generate(request):
                yield index, item
        except Exception as error:  # a dead actor surfaces here: the request failed, the pool goes on
            yield index, Finished(request.request_id, 0, (), error=f"replica {index}: {error_line(error)}")
        finally:
            self.outstanding[index] -= 1

    async def abort(self, request_ids: list[str]) -> None:
        """Abort the given requests on every replica (each ignores ids it does not hold)."""
        await asyncio.gather(*(r.abort(request_ids) for r in self.replicas), return_exceptions=True)

    async def reset_prefix_cache(self) -> None:
        await asyncio.gather(*(r.reset_prefix_cache() for r in self.replicas))

    async def shutdown(self) -> None:
        """Shut every replica down; errors are logged, never raised, so teardown always completes."""
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

    async def shutdown(self, timeout_s: float = 60.0) -> None:
        import ray

        try:
            await asyncio.wait_for(self.handle.shutdown.remote(), timeout_s)
        finally:
            ray.kill(self.handle, no_restart=True)


async def start_ray_pool(spec: EngineSpec, num_replicas: int, *, placement_group: Any,
                         first_bundle: int = 1, gpus_per_replica: float = 0,
                         start_timeout_s: float = 600.0) -> EnginePool:
    """Start `num_replicas` vLLM replicas in parallel, replica i on bundle `first_bundle + i`.

    Raises EngineError (naming vLLM's reason) if any replica fails to start in time; every replica
    already started is shut down first, so nothing is left running.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actor_class = ray.remote(VllmEngine)
    handles = []
    for i in range(num_replicas):
        strategy = None
        if placement_group is not None:
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=first_bundle + i)
        handles.append(actor_class.options(
            num_cpus=spec.cpu_cores, num_gpus=gpus_per_replica, scheduling_strategy=strategy,
            max_concurrency=10_000, name=None).remote(spec))
    replicas = [RayReplica(h) for h in handles]
    starts = [h.start.remote() for h in handles]
    try:
        info = await asyncio.wait_for(asyncio.gather(*starts), start_timeout_s)
    except BaseException as error:
        await asyncio.gather(*(r.shutdown(timeout_s=30) for r in replicas), return_exceptions=True)
        if isinstance(error, asyncio.TimeoutError):
            raise EngineError(f"engine start timed out after {start_timeout_s:.0f}s") from None
        if isinstance(error, (asyncio.CancelledError, KeyboardInterrupt)):
            raise
        raise EngineError(error_line(error)) from None
    return EnginePool(replicas, info)


def error_line(error: BaseException) -> str:
    """One line for an error, unwrapping Ray's task/actor error wrappers to the original message."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    text = str(error).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), "")
    return last if isinstance(error, EngineError) else f"{type(error).__name__}: {last}"
