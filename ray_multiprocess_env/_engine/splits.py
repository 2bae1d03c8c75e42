"""The per-worker arguments of a step of some envs: each worker's actions and positions.

`Engine.step_envs` and first-ready `send` step any envs, in any order; each worker called gets
its rows of the actions and the positions of its envs among its own. The usual case, the envs
`recv` handed back (whole workers' envs, in order), is a slice per worker with no index work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.pool import Worker
from ray_multiprocess_env.batch import split_batch, take

__all__ = ["Split", "split_per_worker"]

#: Each worker's step arguments ``(its actions, their positions)`` (None: not called), and the
#: envs each worker steps (None: all of its envs, in order, positions None).
Split = tuple[list[tuple[Any, ...] | None], list[Sequence[int] | None]]


def split_per_worker(
    workers: Sequence[Worker], owner: Sequence[int], action_space: Any, actions: Any, env_ids: Any
) -> Split:
    """Row i of `actions` for env ``env_ids[i]``, split per worker (`owner`: each env's)."""
    split = _split_whole_workers(workers, owner, action_space, actions, env_ids)
    if split is not None:
        return split
    ids = np.asarray(env_ids, dtype=np.int64)
    args: list[tuple[Any, ...] | None] = []
    envs: list[Sequence[int] | None] = []
    for worker in workers:
        rows = np.flatnonzero((ids >= worker.envs.start) & (ids < worker.envs.stop))
        mine = ids[rows].tolist()
        envs.append(mine)
        chunk = take(action_space, actions, rows.tolist()) if mine else None
        args.append((chunk, [e - worker.envs.start for e in mine]) if mine else None)
    return args, envs


def _split_whole_workers(
    workers: Sequence[Worker], owner: Sequence[int], action_space: Any, actions: Any, env_ids: Any
) -> Split | None:
    """`split_per_worker` for whole workers' envs in order: a slice of `actions` each.

    None if `env_ids` are not such envs.
    """
    args: list[tuple[Any, ...] | None] = [None] * len(workers)
    envs: list[Sequence[int] | None] = [()] * len(workers)
    row, count, bounds = 0, len(env_ids), []
    while row < count:
        worker = workers[owner[env_ids[row]]]
        start, stop = worker.envs.start, worker.envs.stop
        end = row + stop - start
        if env_ids[row] != start or end > count or env_ids[end - 1] != stop - 1:
            return None
        if args[worker.index] is not None or list(env_ids[row:end]) != worker.env_list:
            return None
        args[worker.index], envs[worker.index] = (), None
        bounds.append((worker.index, row, end))
        row = end
    chunks = split_batch(action_space, actions, [(a, b) for _, a, b in bounds])
    for (index, _, _), chunk in zip(bounds, chunks, strict=True):
        args[index] = (chunk, None)
    return args, envs
