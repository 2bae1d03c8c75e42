"""Per-env arguments split per worker (`_engine/splits.py`), without Ray."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from ray_multiprocess_env._engine.splits import whole_worker_runs

#: Workers of 3, 1, 2 and 3 envs: each worker's envs, consecutive, worker after worker.
SIZES = (3, 1, 2, 3)
ENV_LISTS = [list(range(sum(SIZES[:w]), sum(SIZES[: w + 1]))) for w in range(len(SIZES))]
OWNER = [w for w, envs in enumerate(ENV_LISTS) for _ in envs]


def _runs_by_definition(ids: list[int]) -> list[tuple[int, int]] | None:
    """``(worker, first row)`` of each worker, by worker, if `ids` are whole workers' envs."""
    runs, row = [], 0
    for worker in dict.fromkeys(OWNER[env] for env in ids):  # (the workers, in order of ids)
        if ids[row : row + len(ENV_LISTS[worker])] != ENV_LISTS[worker]:
            return None
        runs.append((worker, row))
        row += len(ENV_LISTS[worker])
    return sorted(runs) if row == len(ids) else None


def _id_lists() -> list[list[int]]:
    """Whole workers in every order and choice, and lists that are not whole workers'."""
    out = []
    workers = range(len(SIZES))
    for count in range(1, len(SIZES) + 1):
        for chosen in itertools.permutations(workers, count):
            out.append([env for worker in chosen for env in ENV_LISTS[worker]])
    rng = random.Random(0)
    every = list(range(len(OWNER)))
    for _ in range(300):
        ids = rng.sample(every, rng.randint(1, len(every)))
        if rng.random() < 0.5:
            ids.sort()
        out.append(ids)
    out += [[1, 2, 3], [0, 1, 2, 3, 4], [3, 4, 5, 6, 7], [0, 2, 1], [4, 5, 3, 6, 7, 8]]
    return out


@pytest.mark.parametrize("kind", ["list", "array"])
def test_whole_worker_runs_are_the_workers_whose_envs_come_whole_and_in_order(kind):
    """Consecutive workers, workers in any order, and ids that split a worker or skip envs."""
    for ids in _id_lists():
        given = ids if kind == "list" else np.array(ids, dtype=np.int64)
        assert whole_worker_runs(ENV_LISTS, OWNER, given) == _runs_by_definition(ids), ids
