"""No face can tell which road a call took: the hot path's results are the slow path's.

A seeded random mix of verbs (`step`, `step_async`/`step_wait`, `reset` with a mask and seeds,
first-ready `send` of whole workers (the hot path) and of scattered envs (the slow path),
`recv` of some and then the rest, `get_attr`) runs over each transport. Over ``"ray"`` every
call takes the slow path; over ``"auto"`` and ``"tcp"`` the hot path takes what it can (whole
workers, infos that fit their columns) and the slow path the rest; over ``"pipe"`` nothing is
in shared memory. Each env's action depends only on how many it was given, so each env's own
history (what every call handed back for it) must be the same whatever the transport and in
whatever order `recv` returned the envs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

from ray_multiprocess_env import GymnasiumVectorEnv
from tests.envs import ShiftingInfoEnv
from tests.helpers import assert_same, transport_kinds

NUM_ENVS, CALLS = 6, 60
KINDS = {"auto": "shared_memory", "tcp": "tcp", "pipe": "pipe", "ray": "ray"}
VERBS = ("step", "step_async", "reset", "send_all", "send_scattered", "get_attr")


def _info(infos: dict[str, Any], row: int) -> dict[str, Any]:
    """Row `row`'s entries of gymnasium's batched infos (nested dicts too; no masks)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id" or not infos[f"_{key}"][row]:
            continue
        out[key] = _info(value, row) if isinstance(value, dict) else value[row]
    return out


def _history(transport: str, seed: int) -> dict[int, tuple[Any, ...]]:
    """Each env's history over a random mix of `CALLS` calls (the mix drawn from `seed`)."""
    rng, sizes = np.random.default_rng(seed), np.random.default_rng(seed + 1000)
    given = np.zeros(NUM_ENVS, dtype=np.int64)  # actions each env has been given
    history: dict[int, list[Any]] = {env: [] for env in range(NUM_ENVS)}

    def actions(envs: list[int]) -> np.ndarray:
        picked = np.array([(env + given[env]) % 2 for env in envs], dtype=np.int64)
        given[envs] += 1
        return picked

    def record(kind: str, out: tuple[Any, ...], ids: list[int]) -> None:
        obs, infos = out[0], out[-1]
        for row, env in enumerate(ids):
            flags = [out[k][row].item() for k in range(1, len(out) - 1)]
            history[env].append((kind, obs[row].copy(), flags, _info(infos, row)))

    every = list(range(NUM_ENVS))
    with contextlib.closing(
        GymnasiumVectorEnv([ShiftingInfoEnv] * NUM_ENVS, envs_per_worker=3, transport=transport)
    ) as envs:
        assert transport_kinds(envs) == [KINDS[transport]] * 2
        record("reset", envs.reset(seed=list(range(NUM_ENVS))), every)
        for _ in range(CALLS):
            verb = VERBS[rng.integers(len(VERBS))]
            if verb == "step":
                record(verb, envs.step(actions(every)), every)
            elif verb == "step_async":
                envs.step_async(actions(every))
                record(verb, envs.step_wait(), every)
            elif verb == "reset":
                mask = rng.random(NUM_ENVS) < 0.5
                mask[rng.integers(NUM_ENVS)] = True  # (at least one env)
                seeds = [int(s) for s in rng.integers(1000, size=NUM_ENVS)]
                out = envs.reset(seed=seeds, options={"reset_mask": mask})
                ids = np.flatnonzero(mask).tolist()
                record(verb, (out[0][mask], {k: _rows(v, mask) for k, v in out[1].items()}), ids)
            elif verb == "get_attr":
                for env, t in enumerate(envs.get_attr("t")):
                    history[env].append(("t", t))
            else:
                if verb == "send_all":  # whole workers, in two sends
                    groups = [[0, 1, 2], [3, 4, 5]]
                else:  # scattered envs: some of each worker's
                    order = rng.permutation(NUM_ENVS).tolist()
                    cut = int(rng.integers(1, NUM_ENVS))
                    groups = [sorted(order[:cut]), sorted(order[cut:])]
                for group in groups:
                    envs.send(actions(group), group)
                waiting = set(every)
                while waiting:  # (how many a `recv` waits for: drawn apart from the mix, which
                    # must not depend on the order the envs came back in)
                    out = envs.recv(batch_size=int(sizes.integers(1, len(waiting) + 1)))
                    ids = out[-1]["env_id"].tolist()
                    waiting -= set(ids)
                    record("recv", out, ids)
    return {env: tuple(items) for env, items in history.items()}


def _rows(value: Any, mask: np.ndarray) -> Any:
    """The rows `mask` picks of one batched info entry (nested dicts too)."""
    if isinstance(value, dict):
        return {k: _rows(v, mask) for k, v in value.items()}
    return value[mask]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("transport", ["auto", "tcp", "pipe"])
def test_every_envs_history_is_the_same_on_every_road(transport, seed):
    """Each env's results over a random verb mix equal those over Ray calls (the slow road)."""
    assert_same(_history(transport, seed), _history("ray", seed))
