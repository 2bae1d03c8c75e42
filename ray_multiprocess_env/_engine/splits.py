"""Per-env arguments split per worker: a step's actions and positions, a reset's arguments.

`Engine.step_envs` and first-ready `send` step any envs, in any order; each worker called gets
its rows of the actions and the positions of its envs among its own. The usual case, the envs
`recv` handed back (whole workers' envs, in order), is a slice per worker with no index work.

A face gives a reset one seed per env (`SeedBook.for_reset`), options (one dict for every env,
or one per env) and maybe a mask. Envs with no batch layout are reset one by one with their
keyword arguments (`env_kwargs`); a worker of a batch layout takes its part of each in one
message (`worker_args`), and resets the positions its mask marks (`reset_positions`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.pool import Worker
from ray_multiprocess_env._engine.transports.base import Ticket
from ray_multiprocess_env.batch import split_batch, take

__all__ = [
    "Split",
    "env_kwargs",
    "reset_positions",
    "split_per_worker",
    "ticket_positions",
    "whole_worker_runs",
    "worker_args",
]

#: Each worker's step arguments ``(its actions, their positions)`` (None: not called), and the
#: envs each worker steps (None: all of its envs, in order, positions None).
Split = tuple[list[tuple[Any, ...] | None], list[Sequence[int] | None]]


def split_per_worker(
    workers: Sequence[Worker], owner: Sequence[int], action_space: Any, actions: Any, env_ids: Any
) -> Split:
    """Row i of `actions` for env ``env_ids[i]``, split per worker (`owner`: each env's).

    `env_ids` None: every env (row i for env i), a slice per worker.
    """
    if env_ids is None:
        chunks = split_batch(action_space, actions, [(w.envs.start, w.envs.stop) for w in workers])
        return [(chunk, None) for chunk in chunks], [None] * len(workers)
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


def whole_worker_runs(
    env_lists: Sequence[list[int]], owner: Sequence[int], env_ids: Any
) -> list[tuple[int, int]] | None:
    """``(worker, first row)`` for each worker, by worker, if `env_ids` are whole workers' envs.

    Each worker's envs in order, the workers in any order.

    `env_lists`: each worker's envs (consecutive, worker after worker); `owner`: each env's
    worker. None if `env_ids` are not such envs (what `recv` hands back is).
    """
    if type(env_ids) is list:  # (as the faces' checks leave them: only read here)
        ids = env_ids
    else:
        ids = env_ids.tolist() if type(env_ids) is np.ndarray else list(env_ids)
    if ids:  # (one worker's envs: what a `recv` usually hands back)
        worker = owner[ids[0]]
        envs = env_lists[worker]
        if ids == envs:
            return [(worker, 0)]
        first, last = ids[0], ids[-1]  # (consecutive workers' envs, in order: a run each)
        if first == envs[0] and first < last < len(owner) and ids == list(range(first, last + 1)):
            end = owner[last]
            if last == env_lists[end][-1]:
                return [(w, env_lists[w][0] - first) for w in range(worker, end + 1)]
            return None  # (the last worker's envs cut short)
    runs, row, count, seen = [], 0, len(ids), 0
    while row < count:
        worker = owner[ids[row]]
        envs = env_lists[worker]
        if seen >> worker & 1 or ids[row : row + len(envs)] != envs:
            return None
        seen |= 1 << worker
        runs.append((worker, row))
        row += len(envs)
    runs.sort()  # (by worker: a call's errors name its envs in order)
    return runs


def _split_whole_workers(
    workers: Sequence[Worker], owner: Sequence[int], action_space: Any, actions: Any, env_ids: Any
) -> Split | None:
    """`split_per_worker` for whole workers' envs (each worker's in order): a slice each.

    None if `env_ids` are not such envs.
    """
    runs = whole_worker_runs([worker.env_list for worker in workers], owner, env_ids)
    if runs is None:
        return None
    args: list[tuple[Any, ...] | None] = [None] * len(workers)
    envs: list[Sequence[int] | None] = [()] * len(workers)
    bounds = [(row, row + len(workers[index].envs)) for index, row in runs]
    chunks = split_batch(action_space, actions, bounds)
    for (index, _), chunk in zip(runs, chunks, strict=True):
        args[index], envs[index] = (chunk, None), None
    return args, envs


def env_kwargs(seeds: Sequence[int | None], options: Any) -> list[dict[str, Any]]:
    """The keyword arguments of each env's ``reset``: its seed and options (None left out)."""
    out = []
    for env, seed in enumerate(seeds):
        kwargs: dict[str, Any] = {} if seed is None else {"seed": seed}
        env_options = options if options is None or isinstance(options, Mapping) else options[env]
        if env_options is not None:
            kwargs["options"] = env_options
        out.append(kwargs)
    return out


def worker_args(
    workers: Sequence[Worker], seeds: Sequence[int | None], options: Any, mask: Any = None
) -> list[tuple[Any, ...]]:
    """Each worker's ``(seeds, options, mask)``: its part of each (its mask a list, or None).

    `options`: one dict for every env, or one per env; `mask`: an array, one flag per env.
    """
    out = []
    for worker in workers:
        span = slice(worker.envs.start, worker.envs.stop)
        part = options if options is None or isinstance(options, Mapping) else list(options[span])
        out.append((seeds[span], part, None if mask is None else mask[span].tolist()))
    return out


def reset_positions(args: tuple[Any, ...] | None) -> list[int] | None:
    """The positions a ``reset`` with these arguments resets (None: all of the worker's)."""
    mask = None if args is None else args[2]
    return None if mask is None else [k for k, m in enumerate(mask) if m]


def ticket_positions(ticket: Ticket) -> list[int] | None:
    """The positions a ``step`` or ``reset`` ticket ran in its worker (None: all)."""
    return ticket.args[1] if ticket.op == "step" else reset_positions(ticket.args)
