"""pfrl's per-env results, from the engine's batches, and the actions as the engine takes them.

pfrl's ``MultiprocessVectorEnv`` hands out one tuple per field with one entry per env (``obs,
rewards, dones, infos``; gymnasium envs' ``terminated`` and ``truncated`` apart); `RayVectorEnv`
hands out the same, as rows of the engine's batch (copies unless ``copy=False``), or, for the
user's own actors, what each returned, unzipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env._engine import Batch
from ray_multiprocess_env._engine.records import EngineSpec
from ray_multiprocess_env._protocol.infos import unbatch_infos
from ray_multiprocess_env.batch import copy_batch, stack, unstack, unzip
from ray_multiprocess_env.compat import is_obs_and_info

__all__ = ["action_batch", "fields", "gives_info", "observations"]


def fields(batch: Batch, spec: EngineSpec, copy: bool, reset: bool = False) -> tuple[Any, ...]:
    """Pfrl's per-field tuples, one entry per row: rows of the batch (copies if `copy`).

    A step gives ``(obs, rewards, terminated, truncated, infos)`` (old gym: ``(obs,
    rewards, dones, infos)``); a reset ``(obs, infos)``. For envs that are the user's own
    actors, what each returned, unzipped (a reset's as ``(obs, info)`` pairs).
    """
    if batch.rows is not None:
        if reset:
            pairs = [r if r is None or is_obs_and_info(r) else (r, {}) for r in batch.rows]
            return tuple(p[0] if p else None for p in pairs), tuple(p and p[1] for p in pairs)
        return unzip(batch.rows)
    batched = batch.observations
    if copy and batch.shared:
        batched = copy_batch(batched)
    rewards, terminations, truncations = batch.arrays()
    count = len(rewards)
    if isinstance(batched, np.ndarray):
        obs = tuple(batched)
    else:
        obs = tuple(unstack(batch_space(spec.observation_space, count), batched))
    infos = tuple(unbatch_infos(batch.infos, count))
    if reset:
        return obs, infos
    if batch.old_api:
        return obs, tuple(rewards.tolist()), tuple(terminations.tolist()), infos
    return (
        obs,
        tuple(rewards.tolist()),
        tuple(terminations.tolist()),
        tuple(truncations.tolist()),
        infos,
    )


def observations(batch: Batch, step_fields: tuple[Any, ...]) -> tuple[Any, ...]:
    """Each row's observation, from the `fields` of a step."""
    if batch.rows is None:
        return tuple(step_fields[0])
    return tuple(r[0] if isinstance(r, tuple) else r for r in batch.rows)


def gives_info(batch: Batch) -> bool:
    """Whether the envs' ``reset`` gives gymnasium's ``(obs, info)`` (not old gym's obs)."""
    if batch.rows is None:
        return not batch.old_api
    return all(is_obs_and_info(r) for r in batch.rows if r is not None)


def action_batch(actions: Sequence[Any], spec: EngineSpec) -> Any:
    """The actions (one per env, as pfrl gives them) as the engine takes them.

    For a Dict or Tuple space they are stacked into a batch; other spaces take the
    sequence as it is (each env gets exactly its item).
    """
    space = spec.action_space
    if isinstance(space, (spaces.Dict, spaces.Tuple)) and spec.uniform:
        return stack(space, list(actions))
    return actions
