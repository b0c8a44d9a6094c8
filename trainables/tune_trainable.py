"""The Ray Tune adapter: a class Trainable whose steps are load steps and whose cleanup stops the pool.

A class (not a function) trainable, because Tune calls `cleanup()` when ASHA stops a trial, which is
where the engines must be shut down.
"""

from __future__ import annotations

from typing import Any

import ray
from ray import tune

from trainables.pool import HealthPolicy, start_ray_pool
from trainables.trial import TrialContext, TrialRunner, engine_spec
from trainables.vllm_engine import EngineSpec


class PoolTrial(tune.Trainable):
    """Tune trainable: params dict -> `TrialRunner` -> one result per load step."""

    def setup(self, config: dict[str, Any], context: TrialContext) -> None:  # type: ignore[override]  # with_parameters
        placement_group = ray.util.get_current_placement_group()
        _, replicas, tp = engine_spec(context, config)
        # Tune drops an empty head bundle, so the replicas' bundles may start at 0.
        first_bundle = 0
        if placement_group is not None and len(placement_group.bundle_specs) > replicas:
            first_bundle = 1
        gpus = 0 if context.on_cpu else tp

        async def factory(spec: EngineSpec, replicas: int, health: HealthPolicy):
            return await start_ray_pool(
                spec,
                replicas,
                placement_group=placement_group,
                first_bundle=first_bundle,
                gpus_per_replica=gpus,
                start_timeout_s=context.start_timeout_s,
                health=health,
                replace=True,
            )

        self.runner = TrialRunner(context, config, factory, trial_id=self.trial_id)
        self.runner.start()

    def step(self) -> dict[str, Any]:
        return self.runner.next_step()

    def cleanup(self) -> None:
        self.runner.close()

    # A trial is one pass over the ladder on live engines: there is nothing to resume mid-way.
    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {}

    def load_checkpoint(self, checkpoint: Any) -> None:
        return None


def trial_resources(context: TrialContext):
    """The placement group a candidate needs: an empty bundle for the trial, one per replica."""

    def resources(config: dict[str, Any]) -> tune.PlacementGroupFactory:
        spec, replicas, tp = engine_spec(context, config)
        bundle = {"CPU": float(spec.cpu_cores)}
        if not context.on_cpu:
            bundle["GPU"] = float(tp)
        return tune.PlacementGroupFactory([{}] + [dict(bundle) for _ in range(replicas)], strategy="PACK")

    return resources
