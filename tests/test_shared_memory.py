"""The shared-memory transport of ``transport="auto"`` (`transports/shared_memory.py`).

Same results as gymnasium's `SyncVectorEnv` for every covered space, the ``copy`` option, the
fallbacks (spaces not covered, actions of another dtype), restarts, and nothing left behind.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env._engine.lanes import Lanes
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports import shared_memory
from ray_multiprocess_env._protocol.shared_layout import write_actions
from ray_multiprocess_env.batch import copy_batch
from tests.envs import FlakyEnv
from tests.envs_spaces import NestedSpacesEnv
from tests.helpers import (
    assert_killed,
    memory_files,
    transport_kinds,
    wait_until_ready,
    worker_pids,
)

_KINDS = {"auto": "shared_memory", "tcp": "tcp", "pipe": "pipe"}


def _shared(envs):
    """Whether each worker shares memory with the driver."""
    return [kind == "shared_memory" for kind in transport_kinds(envs)]


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype


def _run(envs, steps=20):
    """Reset and step with seeded random actions; every result (copied)."""
    envs.action_space.seed(3)
    obs, info = envs.reset(seed=11)
    out = [(copy_batch(obs), info)]
    for _ in range(steps):
        obs, rewards, terms, truncs, info = envs.step(envs.action_space.sample())
        out.append((copy_batch(obs), rewards, terms, truncs, info))
    return out


def test_nested_spaces_match_sync_vector_env_over_shared_memory():
    """Dict/Tuple/Box/Discrete/MultiDiscrete/MultiBinary: the same results as SyncVectorEnv.

    Over shared memory, over the TCP stream (the same layout, as raw bytes) and over pipes.
    """
    expected = _run(SyncVectorEnv([NestedSpacesEnv] * 6))
    for transport in ("auto", "tcp", "pipe"):
        with contextlib.closing(
            GymnasiumVectorEnv([NestedSpacesEnv] * 6, envs_per_worker=4, transport=transport)
        ) as envs:
            assert transport_kinds(envs) == [_KINDS[transport]] * 2
            got = _run(envs)
        for mine, theirs in zip(got, expected, strict=True):
            assert all(_equal(a, b) for a, b in zip(mine[:-1], theirs[:-1], strict=True))
            assert mine[-1].keys() == theirs[-1].keys()
            for key in mine[-1]:
                assert _equal(mine[-1][key], theirs[-1][key]), key


def test_actions_go_through_shared_memory_unless_their_dtype_differs(monkeypatch):
    """Actions of the space's dtype go through shared memory; others are sent serialized.

    float64 actions for a float32 Box reach the env as float64, as they would in-process.
    """
    written, copied = [], []

    def spy(*args):
        written.append(write_actions(*args))
        return written[-1]

    put = BatchStore.put

    def put_spy(self, start, positions, reply):
        copied.append(reply.observations is not None)
        put(self, start, positions, reply)

    monkeypatch.setattr(shared_memory, "write_actions", spy)
    monkeypatch.setattr(BatchStore, "put", put_spy)
    with contextlib.closing(GymnasiumVectorEnv([NestedSpacesEnv] * 2, envs_per_worker=1)) as envs:
        envs.reset(seed=0)
        move = np.zeros((2, 2), dtype=np.float32)
        *_, info = envs.step({"move": move, "pick": np.array([1, 2])})
        assert list(info["action_dtype"]) == ["float32"] * 2
        assert not any(copied)  # the replies carried no arrays: they are in shared memory
        *_, info = envs.step({"move": move.astype(np.float64), "pick": np.array([1, 2])})
        assert list(info["action_dtype"]) == ["float64"] * 2
    assert written == [True, True, False, False]


def test_copy_false_returns_a_view_that_the_next_step_overwrites():
    """``copy=False`` hands out the shared batch itself; ``copy=True`` arrays of their own."""
    fns = [functools.partial(gym.make, "CartPole-v1")] * 4
    with contextlib.closing(GymnasiumVectorEnv(fns, envs_per_worker=2, copy=False)) as envs:
        first, _ = envs.reset(seed=0)
        kept = first.copy()
        second, *_ = envs.step(np.ones(4, dtype=np.int64))
        assert second is first or np.shares_memory(first, second)
        assert not np.array_equal(first, kept)  # overwritten in place
    with contextlib.closing(GymnasiumVectorEnv(fns, envs_per_worker=2)) as envs:
        first, _ = envs.reset(seed=0)
        kept = first.copy()
        second, *_ = envs.step(np.ones(4, dtype=np.int64))
        assert not np.shares_memory(first, second)
        assert np.array_equal(first, kept)


@pytest.mark.parametrize("transport", ["auto", "tcp", "ray"])
def test_copy_false_hands_out_read_only_views_and_copy_true_arrays_of_their_own(transport):
    """What the docs promise: with ``copy=False`` the batch cannot be changed in place."""
    fns = [functools.partial(gym.make, "CartPole-v1")] * 4
    with contextlib.closing(
        GymnasiumVectorEnv(fns, envs_per_worker=2, copy=False, transport=transport)
    ) as envs:
        obs, _ = envs.reset(seed=0)
        results = envs.step(np.ones(4, dtype=np.int64))
        for array in (obs, results[0]):
            assert not array.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                array[0] = array[0]
        assert all(array.flags.writeable for array in results[1:4])  # (as gymnasium: new)
        envs.send(np.ones(4, dtype=np.int64), env_ids=[0, 1, 2, 3])
        received = envs.recv(2)  # (a `recv`'s rows are copies of their own)
        assert all(array.flags.writeable for array in received[:4])
        if len(received[4]["env_id"]) < 4:  # (both workers may have answered already)
            envs.recv()
    with contextlib.closing(
        GymnasiumVectorEnv(fns, envs_per_worker=2, transport=transport)
    ) as envs:
        obs, _ = envs.reset(seed=0)
        results = envs.step(np.ones(4, dtype=np.int64))
        assert all(array.flags.writeable for array in (obs, *results[:4]))


def test_spaces_not_covered_are_serialized():
    """A Text observation space has no shared layout: the pipes carry everything, as before."""

    class TextEnv(gym.Env):
        observation_space = gym.spaces.Text(8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return "start", {}

        def step(self, action):
            return f"a{action}", 0.0, False, False, {}

    with contextlib.closing(GymnasiumVectorEnv([TextEnv] * 4, envs_per_worker=2)) as envs:
        assert _shared(envs) == [False, False]
        envs.reset()
        obs, *_ = envs.step(np.array([0, 1, 1, 0]))
        assert obs == ("a0", "a1", "a1", "a0")


def test_the_memory_is_released_by_close():
    """No memory file stays open once the vector env is closed; nothing is left in /dev/shm."""
    before = set(memory_files())
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    envs = GymnasiumVectorEnv([NestedSpacesEnv] * 2, envs_per_worker=1)
    assert set(memory_files()) - before  # the file, and the mapping's own descriptor
    envs.reset(seed=0)
    envs.close()
    assert set(memory_files()) == before
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) <= shm_before


def _mapped_memory_files():
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return [line for line in maps if "memfd:ray-multiprocess-env" in line]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_info_columns_are_released_by_close(transport):
    """The info columns (mapped once more by each TCP stream) are unmapped by `close`."""
    before = (set(memory_files()), len(_mapped_memory_files()))
    make = functools.partial(gym.make, "HalfCheetah-v5")
    envs = GymnasiumVectorEnv([make] * 4, envs_per_worker=2, transport=transport)
    envs.reset(seed=0)
    for _ in range(3):
        envs.step(np.zeros((4, 6), dtype=np.float32))
    assert envs._engine._store.columns  # (private engine) x_position etc. have columns
    assert len(_mapped_memory_files()) > before[1]
    envs.close()
    assert (set(memory_files()), len(_mapped_memory_files())) == before


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_restarted_worker_shares_the_memory_again(transport):
    """After SIGKILL and restart the new worker maps the same memory; results stay right.

    Over the TCP stream, the new worker's stream mirrors the same rows.
    """
    fns = [functools.partial(gym.make, "CartPole-v1")] * 4
    with contextlib.closing(
        GymnasiumVectorEnv(fns, envs_per_worker=2, on_actor_failure="restart", transport=transport)
    ) as envs:
        envs.reset(seed=0)
        wait_until_ready(envs)
        os.kill(worker_pids(envs)[1], signal.SIGKILL)
        assert_killed(envs.remote_envs[1])
        obs, _, _, truncs, info = envs.step(np.zeros(4, dtype=np.int64))
        assert list(truncs) == [False, False, True, True]
        assert list(info["env_crashed"][2:]) == [True, True]
        assert transport_kinds(envs) == [_KINDS[transport]] * 2
        fresh = obs[2:].copy()
        obs, *_ = envs.step(np.zeros(4, dtype=np.int64))  # the reset obs was real, now stepped
        assert np.abs(fresh).max() <= 0.05
        assert not np.array_equal(obs[2:], fresh)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("copy", [True, False])
def test_partial_reset_keeps_the_other_envs_rows(copy, transport):
    """A masked reset rewrites only its worker's rows; the others keep their last observation."""
    fns = [functools.partial(gym.make, "CartPole-v1")] * 4
    with contextlib.closing(
        GymnasiumVectorEnv(fns, envs_per_worker=2, copy=copy, transport=transport)
    ) as envs:
        envs.reset(seed=0)
        stepped, *_ = envs.step(np.ones(4, dtype=np.int64))
        stepped = stepped.copy()
        mask = np.array([False, False, True, False])
        obs, _ = envs.reset(seed=5, options={"reset_mask": mask})
        assert np.array_equal(obs[[0, 1, 3]], stepped[[0, 1, 3]])
        assert not np.array_equal(obs[2], stepped[2])


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_first_ready_mixing_whole_workers_and_some_envs_matches_plain_envs(transport):
    """Sends of whole workers (the hot path) and of some envs (the slow path), mixed.

    Each `recv` hands back exactly the envs sent, with what plain envs give (infos in their
    columns included: over the stream, only the rows a call wrote travel).
    """
    make = functools.partial(gym.make, "HalfCheetah-v5")
    plain = [make() for _ in range(4)]
    for i, env in enumerate(plain):
        env.reset(seed=5 + i)
    rng = np.random.default_rng(0)

    def plain_step(ids, actions):
        results = [plain[i].step(a) for i, a in zip(ids, actions, strict=True)]
        return np.stack([r[0] for r in results]), np.array([r[1] for r in results]), results

    with contextlib.closing(
        GymnasiumVectorEnv([make] * 4, envs_per_worker=2, transport=transport)
    ) as envs:
        assert transport_kinds(envs) == [_KINDS[transport]] * 2
        envs.reset(seed=5)
        rounds = [([1], None), ([0, 1], [3]), ([2, 3], [0, 1]), ([0, 1, 2, 3], None)]
        for first, second in rounds * 3:
            sent = []
            for ids in (first, second):
                if ids is not None:
                    actions = rng.uniform(-1, 1, (len(ids), 6)).astype(np.float32)
                    envs.send(actions, ids)
                    sent.append((ids, actions))
            expected_ids = sorted(i for ids, _ in sent for i in ids)
            obs, rewards, _, _, info = envs.recv(batch_size=len(expected_ids))
            assert info["env_id"].tolist() == expected_ids
            order = {env: row for row, env in enumerate(expected_ids)}
            for ids, actions in sent:
                want_obs, want_rewards, results = plain_step(ids, actions)
                rows = [order[i] for i in ids]
                np.testing.assert_array_equal(obs[rows], want_obs)
                np.testing.assert_array_equal(rewards[rows], want_rewards)
                for row, result in zip(rows, results, strict=True):
                    assert info["x_position"][row] == result[4]["x_position"]
        actions = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
        obs, rewards, *_ = envs.step(actions)  # the full step after it, also on the hot path
        np.testing.assert_array_equal(obs, plain_step(range(4), actions)[0])


def test_a_dead_worker_outside_the_calls_leaves_them_on_the_hot_path(monkeypatch):
    """A worker that died idle does not take the other workers' calls off the hot path.

    Only the workers a call waits on matter; the next call to the dead one finds it dead.
    """
    answered = []
    read = Lanes.read

    def spy(self, tickets, wanted, deadline):
        went = read(self, tickets, wanted, deadline)
        if wanted is not None:  # (a first-ready `recv`'s read; False: the failures branch's)
            answered.append(went)
        return went

    monkeypatch.setattr(Lanes, "read", spy)
    with contextlib.closing(GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=1)) as envs:
        envs.reset()
        os.kill(worker_pids(envs)[2], signal.SIGKILL)
        assert_killed(envs.remote_envs[2])
        for _ in range(3):
            envs.send(np.array([1, 1]), [0, 1])
            *_, info = envs.recv(batch_size=2, timeout=5)
            assert info["env_id"].tolist() == [0, 1]
        assert answered == [True] * 3
