"""Open-loop replay of one load step: send each request at its scheduled time, record what came back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from trainables.pool import EnginePool
from trainables.protocol import Finished, FirstToken, GenerateRequest
from tuner.records import PlannedRequest, RequestRecord


async def replay_step(
    pool: EnginePool,
    plan: list[PlannedRequest],
    *,
    deadline_s: float,
    id_prefix: str,
    clock: Callable[[], float] = time.perf_counter,
) -> list[RequestRecord]:
    """Send the plan open-loop (never waiting for earlier responses); returns one record per request.

    Requests unfinished `deadline_s` after the last scheduled send are aborted on the engines and
    recorded as failed, so a step always ends and leaves no work behind.
    """
    start = clock()
    state: dict[int, dict] = {}
    tasks: list[asyncio.Task] = []

    async def run(planned: PlannedRequest) -> None:
        entry = state[planned.index]
        request = GenerateRequest(entry["id"], planned.prompt_token_ids, planned.output_tokens)
        async for replica, item in pool.generate(request):
            entry["replica"] = replica
            if isinstance(item, FirstToken):
                entry["first"] = clock() - start
            elif isinstance(item, Finished):
                entry["finished"] = clock() - start
                entry["item"] = item

    for planned in sorted(plan, key=lambda p: p.scheduled_s):
        delay = start + planned.scheduled_s - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        state[planned.index] = {"id": f"{id_prefix}-{planned.index}", "sent": clock() - start}
        tasks.append(asyncio.create_task(run(planned)))

    last = max((p.scheduled_s for p in plan), default=0.0)
    remaining = max(0.0, start + last + deadline_s - clock())
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=remaining)
        if pending:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            unfinished = [e["id"] for e in state.values() if "item" not in e]
            await pool.abort(unfinished)
    return [_record(p, state[p.index]) for p in plan]


def _record(planned: PlannedRequest, entry: dict) -> RequestRecord:
    item: Finished | None = entry.get("item")
    common = dict(
        index=planned.index,
        scheduled_s=planned.scheduled_s,
        sent_s=entry["sent"],
        prompt_tokens=len(planned.prompt_token_ids),
        output_tokens=planned.output_tokens,
        in_warmup=planned.in_warmup,
        replica=entry.get("replica", -1),
    )
    if item is None:
        return RequestRecord(
            **common, first_token_s=entry.get("first"), finished_s=None, ok=False, error="missed the step deadline"
        )
    error = item.error
    if error is None and item.output_tokens != planned.output_tokens:
        error = f"produced {item.output_tokens} of {planned.output_tokens} output tokens"
    return RequestRecord(
        **common,
        first_token_s=entry.get("first"),
        finished_s=entry["finished"] if error is None else None,
        token_gaps_s=item.token_gaps_s,
        queue_s=item.queue_s,
        ok=error is None,
        error=error,
        retries=item.retries,
        replica_error=item.replica_error,
    )
