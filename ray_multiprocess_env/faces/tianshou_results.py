"""Tianshou's step and reset results, from the engine's batches.

Tianshou's vector envs stack each env's observation (an object array where they differ, as
for Dict observations) and hand out one info dict per env, with its ``env_id`` after a step.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env._engine import Batch
from ray_multiprocess_env._engine.results import EngineSpec
from ray_multiprocess_env.batch import unstack
from ray_multiprocess_env.compat import is_obs_and_info

__all__ = ["reset_result", "step_result"]


def step_result(
    batch: Batch, ids: list[int], spec: EngineSpec
) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tianshou's step tuple for the envs `ids`, from a batch of them (or of all envs)."""
    if batch.rows is not None:
        rows = _rows_by_env(batch)
        picked = [rows[env] for env in ids]
        _refuse_old_api(any(len(r) != 5 for r in picked))
        obs = _stacked([r[0] for r in picked])
        rewards, terminated, truncated = (np.stack([r[k] for r in picked]) for k in (1, 2, 3))
        return obs, rewards, terminated, truncated, _infos([r[4] for r in picked], ids)
    _refuse_old_api(batch.old_api)
    positions = _positions(batch, ids)
    rewards, terminations, truncations = batch.arrays()
    return (
        _observations(batch, positions, spec),
        rewards[positions],
        terminations[positions],
        truncations[positions],
        _infos([batch.infos[p] for p in positions], ids),
    )


def reset_result(batch: Batch, ids: list[int], spec: EngineSpec) -> tuple[Any, np.ndarray]:
    """Tianshou's reset pair for the envs `ids`, from the batch of every env."""
    if batch.rows is not None:
        picked = [batch.rows[env] for env in ids]
        _refuse_old_api(not all(is_obs_and_info(r) for r in picked))
        return _stacked([r[0] for r in picked]), _infos([r[1] for r in picked], None)
    _refuse_old_api(batch.old_api)
    return _observations(batch, ids, spec), _infos([batch.infos[i] for i in ids], None)


def _observations(batch: Batch, positions: list[int], spec: EngineSpec) -> Any:
    """The rows `positions` of the batch's observations: an array of their own."""
    observations = batch.observations
    if isinstance(observations, np.ndarray):
        return observations[positions]  # (fancy indexing copies out of shared memory)
    space = batch_space(spec.observation_space, len(batch.arrays()[0]))
    rows = list(unstack(space, observations))
    return _stacked([copy.deepcopy(rows[p]) for p in positions])


def _positions(batch: Batch, ids: list[int]) -> list[int]:
    """The rows of `batch` that hold the envs `ids`."""
    if batch.env_ids is None:
        return ids
    positions: list[int] = np.searchsorted(batch.env_ids, ids).tolist()
    return positions


def _rows_by_env(batch: Batch) -> dict[int, Any]:
    assert batch.rows is not None
    envs = range(len(batch.rows)) if batch.env_ids is None else batch.env_ids.tolist()
    return dict(zip(envs, batch.rows, strict=True))


def _refuse_old_api(old: bool) -> None:
    if old:
        raise TypeError(
            "An env speaks old gym's API (`reset` gives only the observation, `step` four "
            "values); Tianshou 2 needs gymnasium's. Make the envs with gymnasium, or wrap "
            "them in `shimmy.GymV26CompatibilityV0`."
        )


def _stacked(rows: list[Any]) -> Any:
    """Rows stacked as Tianshou's own vector envs stack them (an object array if they differ)."""
    try:
        return np.stack(rows)
    except ValueError:
        return np.array(rows, dtype=object)


def _infos(infos: Sequence[Mapping[str, Any]], ids: list[int] | None) -> np.ndarray:
    """Tianshou's infos: an object array of one dict per env, with its ``env_id`` after a step."""
    out = np.empty(len(infos), dtype=object)
    for row, info in enumerate(infos):
        out[row] = dict(info)
        if ids is not None:
            out[row]["env_id"] = ids[row]
    return out
