"""pfrl's per-env results from the engine's batches, and its actions as the engine takes them.

pfrl's ``MultiprocessVectorEnv`` hands out one tuple per field with one entry per env (``obs,
rewards, dones, infos``; gymnasium envs' ``terminated`` and ``truncated`` apart); `RayVectorEnv`
hands out the same, as rows of the engine's batch (copies unless ``copy=False``), or, for the
user's own actors, what each returned, unzipped. Also here: the checks of its actions and of
its reset mask, and env 0's attributes (`env0_attr`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env._engine import Batch, Engine
from ray_multiprocess_env._engine.options import check_length
from ray_multiprocess_env._engine.results import EngineSpec
from ray_multiprocess_env._protocol.info_merge import unbatch_infos
from ray_multiprocess_env.batch import copy_batch, stack, unstack, unzip
from ray_multiprocess_env.compat import is_obs_and_info

__all__ = [
    "action_batch",
    "check_in_space",
    "env0_attr",
    "fields",
    "gives_info",
    "kept",
    "observations",
]


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


def check_in_space(space: Any, actions: Sequence[Any], env_ids: Iterable[int]) -> None:
    """A `ValueError` naming the first of `actions` (for the envs `env_ids`) outside `space`."""
    for position, (env, action) in enumerate(zip(env_ids, actions, strict=True)):
        if not space.contains(action):
            raise ValueError(
                f"`actions[{position}]` = {action!r} for env {env} is outside the action "
                f"space {space}; pass an action that `action_space.contains`."
            )


def kept(mask: Sequence[Any] | None, has_obs: np.ndarray) -> np.ndarray:
    """The envs pfrl's reset `mask` keeps (truthy), as booleans; each must have an observation.

    `has_obs`: whether each env has one (an env never reset, or whose last reset was given up,
    has none).
    """
    if mask is None:
        return np.zeros(len(has_obs), dtype=np.bool_)
    check_length("mask", mask, len(has_obs), "one flag per env (truthy = keep that env)")
    keep = np.array([bool(m) for m in mask], dtype=np.bool_)
    for index in np.flatnonzero(keep & ~has_obs).tolist():
        raise ValueError(
            f"`mask[{index}]` is truthy but env {index} has no observation yet; "
            "call `reset()` without a mask first."
        )
    return keep


def env0_attr(engine: Engine, cache: dict[str, Any], name: str) -> Any:
    """Env 0's attribute `name`: a space from the engine's spec, else fetched once (`cache`)."""
    spec = engine.spec
    if name in ("action_space", "observation_space") and getattr(spec, name) is not None:
        return getattr(spec, name)
    if name not in cache:
        args: list[tuple[Any, ...] | None] = [None] * spec.num_envs
        args[0] = (name,)
        try:
            cache[name] = engine.call("get_attr", args, in_flight_ok=True)[0]
        except ValueError as err:  # a plain actor without `get_attr`
            raise AttributeError(
                f"`{name}` is unknown: env 0's actor has no `get_attr` method. Build the "
                "actors with `make_remote_class`, or add `def get_attr(self, name)`."
            ) from err
    return cache[name]
