"""Tianshou over `make_tianshou_vector_env`: the same data as Tianshou's own DummyVectorEnv.

Tianshou's ``Collector`` steps any subset of the envs, resets finished ones itself and reads
``env_id`` from each info; the asynchronous mode (``wait_num``/``wait_timeout``) returns the
envs that finished first.
"""

from __future__ import annotations

import contextlib
import functools
import time

import gymnasium as gym
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tianshou")
from tianshou.algorithm.algorithm_base import Policy  # noqa: E402
from tianshou.data import Batch, Collector, VectorReplayBuffer  # noqa: E402
from tianshou.env import BaseVectorEnv, DummyVectorEnv  # noqa: E402

from ray_multiprocess_env import (  # noqa: E402
    GymAPIBridge,
    TianshouVectorEnv,
    make_tianshou_vector_env,
)
from tests.envs import DictObsEnv, FlakyEnv, WalkEnv  # noqa: E402
from tests.helpers import assert_loaded_on_first_use, assert_same  # noqa: E402

CARTPOLE = functools.partial(gym.make, "CartPole-v1")


class LeanPolicy(Policy):
    """Push the cart the way the pole leans: deterministic, episodes of a few dozen steps."""

    def forward(self, batch, state=None, **kwargs):
        """One action per row of `batch.obs` (CartPole observations)."""
        return Batch(act=(np.asarray(batch.obs)[:, 2] > 0.05).astype(np.int64), state=state)


def _policy():
    probe = CARTPOLE()
    return LeanPolicy(action_space=probe.action_space, observation_space=probe.observation_space)


def _buffer_fields(buffer):
    rows = buffer.sample_indices(0)  # every stored row of every env's sub-buffer
    assert len(rows) == len(buffer)
    data = buffer[rows]
    fields = {k: np.asarray(getattr(data, k)) for k in ("obs", "act", "rew", "obs_next")}
    fields |= {k: np.asarray(getattr(data, k)) for k in ("terminated", "truncated")}
    fields["env_id"] = np.asarray(data.info.env_id)
    return fields


@pytest.mark.in_process
@pytest.mark.parametrize("amount", [{"n_step": 600}, {"n_episode": 25}], ids=["steps", "episodes"])
def test_collected_buffer_equals_dummy_vector_env(amount):
    """A Collector's buffer and statistics over ours equal those over DummyVectorEnv."""
    ours = make_tianshou_vector_env("CartPole-v1", 6, num_workers=2, seed=7)
    theirs = DummyVectorEnv([CARTPOLE] * 6)
    theirs.seed(7)
    assert isinstance(ours, BaseVectorEnv)
    assert len(ours) == 6
    results = []
    with contextlib.closing(ours), contextlib.closing(theirs):
        for envs in (ours, theirs):
            collector = Collector(_policy(), envs, VectorReplayBuffer(6000, 6))
            collector.reset()
            stats = collector.collect(**amount)
            results.append((stats, _buffer_fields(collector.buffer)))
    (mine, my_buffer), (expected, their_buffer) = results
    assert mine.n_collected_episodes == expected.n_collected_episodes >= 6
    np.testing.assert_array_equal(mine.returns, expected.returns)
    np.testing.assert_array_equal(mine.lens, expected.lens)
    assert set(my_buffer) == set(their_buffer)
    for key, value in their_buffer.items():
        np.testing.assert_array_equal(my_buffer[key], value, err_msg=key)


@pytest.mark.in_process
def test_steps_on_subsets_and_resets_equal_dummy_vector_env():
    """Random subsets of envs in any order, resets of some with seeds and options, per step."""
    fns = [functools.partial(DictObsEnv, 5 + i) for i in range(5)]
    ours = TianshouVectorEnv(fns, envs_per_worker=3)
    theirs = DummyVectorEnv(fns)
    rng = np.random.default_rng(0)
    with contextlib.closing(ours), contextlib.closing(theirs):
        assert ours.seed([3, 4, 5, 6, 7])[:2] == [[3], [4]]
        theirs.seed([3, 4, 5, 6, 7])
        assert_same(ours.reset(), theirs.reset())  # (object arrays of Dict observations)
        for step in range(150):
            ids = rng.permutation(5)[: rng.integers(1, 6)]
            actions = rng.integers(0, 3, size=len(ids))
            mine, expected = ours.step(actions, ids), theirs.step(actions, ids)
            assert_same(tuple(mine), tuple(expected), f"step {step}")
            done = ids[np.logical_or(mine[2], mine[3])]
            if len(done):
                kwargs = {"seed": step} if step % 2 else {}
                assert_same(ours.reset(done, **kwargs), theirs.reset(done, **kwargs))
        assert_same(ours.reset(int(ids[0])), theirs.reset(int(ids[0])))


@pytest.mark.in_process
def test_envs_whose_spaces_differ_are_stepped_as_dummy_vector_env_does():
    """Envs with different observation spaces: each keeps its own, results as Tianshou's."""
    fns = [functools.partial(WalkEnv, size) for size in (2, 3, 5, 8)]
    ours = TianshouVectorEnv(fns, envs_per_worker=2)
    theirs = DummyVectorEnv(fns)
    with contextlib.closing(ours), contextlib.closing(theirs):
        assert ours.observation_space == theirs.observation_space
        assert ours.get_env_attr("size", [3, 0]) == [8, 2]
        assert_same(ours.reset(seed=4), theirs.reset(seed=4))  # (one seed for every env)
        for step in range(12):
            ids = np.arange(4) if step % 3 else np.array([2, 0])
            mine, expected = ours.step(np.ones(len(ids)), ids), theirs.step(np.ones(len(ids)), ids)
            assert_same(tuple(mine[:4]), tuple(map(np.asarray, expected[:4])), f"step {step}")
            assert [i["env_id"] for i in mine[4]] == [int(i["env_id"]) for i in expected[4]]
            done = ids[mine[2]]
            if len(done):
                options = {"start": 1}
                assert_same(ours.reset(done, options=options), theirs.reset(done, options=options))


@pytest.mark.in_process
def test_wait_num_returns_the_envs_that_finish_first():
    """With `wait_num`, `step` returns the fast envs; the slow one comes back later."""
    fns = [functools.partial(WalkEnv, 1000, delay) for delay in (0.0, 0.0, 0.0, 1.5)]
    envs = TianshouVectorEnv(fns, wait_num=2)
    with contextlib.closing(envs):
        assert envs.is_async
        envs.reset()
        start = time.monotonic()
        *_, infos = envs.step(np.ones(4), np.arange(4))
        assert time.monotonic() - start < 1.0
        first = [info["env_id"] for info in infos]
        assert 3 not in first
        assert len(first) >= 2
        assert 3 in envs.waiting_id
        assert set(first) <= set(envs.ready_id)
        with pytest.raises(ValueError, match=r"env 3"):
            envs.reset(3)
        while envs.waiting_id:  # collect what is still out
            *_, infos = envs.step(None)
            assert {info["env_id"] for info in infos} <= {0, 1, 2, 3}
        assert sorted(envs.ready_id) == [0, 1, 2, 3]


@pytest.mark.in_process
def test_waiting_and_ready_ids_are_the_calls_in_flight_and_cannot_be_set():
    """`waiting_id`/`ready_id` are read from the engine; setting either is refused by name."""
    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, wait_num=2)
    with contextlib.closing(envs):
        envs.reset()
        assert envs.waiting_id == []
        assert envs.ready_id == [0, 1, 2, 3]
        with pytest.raises(
            AttributeError,
            match=r"`waiting_id` follows the calls in flight and cannot be set; `step\(None\)`",
        ):
            envs.waiting_id = [1]
        with pytest.raises(AttributeError, match=r"`ready_id` follows the calls in flight"):
            envs.ready_id = []


@pytest.mark.in_process
def test_wait_timeout_returns_what_finished_in_time():
    """With `wait_timeout`, `step` returns after that long with the envs done by then."""
    fns = [functools.partial(WalkEnv, 1000, delay) for delay in (0.0, 2.0)]
    envs = TianshouVectorEnv(fns, wait_timeout=0.2)
    with contextlib.closing(envs):
        envs.reset()
        start = time.monotonic()
        *_, infos = envs.step(np.ones(2))
        assert time.monotonic() - start < 1.5
        assert [info["env_id"] for info in infos] == [0]
        assert envs.waiting_id == [1]


@pytest.mark.in_process
def test_asynchronous_steps_keep_each_env_on_its_own_trajectory():
    """Stepping whichever envs come back first: each env's steps are those of a plain env."""
    delays = (0.0, 0.003, 0.006, 0.02)
    envs = TianshouVectorEnv([functools.partial(WalkEnv, 4, d) for d in delays], wait_num=2)
    seen: dict[int, list[float]] = {env: [] for env in range(4)}
    with contextlib.closing(envs):
        envs.seed(5)
        obs, _ = envs.reset()
        for env in range(4):
            seen[env].append(float(obs[env][0]))
        ids = np.arange(4)
        for _ in range(60):
            obs, _, terminated, _, infos = envs.step(np.ones(len(ids), np.int64), ids)
            ids = np.array([info["env_id"] for info in infos])
            for env, row in zip(ids.tolist(), obs, strict=True):
                seen[env].append(float(row[0]))
            if terminated.any():
                restarted, _ = envs.reset(ids[terminated])
                for env, row in zip(ids[terminated].tolist(), restarted, strict=True):
                    seen[env].append(float(row[0]))
    assert len(seen[0]) > len(seen[3]) >= 3  # the fast env came back more often
    for env in range(4):
        plain = WalkEnv(4)
        plain.reset(seed=5 + env)  # (what `seed` does, as Tianshou's envs do)
        expected = [float(plain.reset()[0][0])]
        while len(expected) < len(seen[env]):
            row, _, terminated, _, _ = plain.step(1)
            expected.append(float(row[0]))
            if terminated:
                expected.append(float(plain.reset()[0][0]))
        assert seen[env] == expected[: len(seen[env])], env


def test_spaces_attributes_render_and_seeded_random_actions():
    """`action_space` lists one space per env, seeded by `seed`; attributes; `render`."""
    ours = make_tianshou_vector_env(FlakyEnv, 3, num_workers=1)
    with contextlib.closing(ours):
        assert ours.action_space == [gym.spaces.Discrete(3)] * 3
        ours.seed(11)
        samples = [space.sample() for space in ours.action_space]
        ours.seed(11)
        assert [space.sample() for space in ours.action_space] == samples
        ours.set_env_attr("count", 7)
        assert ours.get_env_attr("count", 1) == [7]
        ours.set_env_attr("count", 40, [0, 2])
        assert ours.get_env_attr("count") == [40, 7, 40]
        frames = ours.render()
        assert [int(frame[0, 0, 0]) for frame in frames] == [40, 7, 40]
        assert ours.metadata == [{"render_modes": []}] * 3
    ours.close()  # (again: nothing happens)
    assert ours.is_closed


@pytest.mark.in_process
def test_user_errors_name_the_argument_and_the_fix():
    """Bad arguments raise TypeError/ValueError that say which and what to pass."""
    with pytest.raises(ValueError, match=r"`wait_num` is 5 but there are 2 envs"):
        TianshouVectorEnv([CARTPOLE] * 2, wait_num=5)
    with pytest.raises(ValueError, match=r"`wait_timeout` must be a positive number"):
        TianshouVectorEnv([CARTPOLE] * 2, wait_timeout=0)
    with pytest.raises(ValueError, match=r"`wait_timeout` must be .*\(finite\).* got inf"):
        TianshouVectorEnv([CARTPOLE] * 2, wait_timeout=float("inf"))
    with pytest.raises(ValueError, match=r"`wait_timeout` must be .*\(finite\).* got 1000"):
        TianshouVectorEnv([CARTPOLE] * 2, wait_timeout=10**400)  # (past any float)
    envs = make_tianshou_vector_env("CartPole-v1", 3, num_workers=1)
    with contextlib.closing(envs):
        envs.reset()
        with pytest.raises(ValueError, match=r"`action` is None.*`wait_num` or `wait_timeout`"):
            envs.step(None)
        with pytest.raises(ValueError, match=r"`action` has 2 entries for 3 env"):
            envs.step(np.zeros(2, np.int64))
        with pytest.raises(ValueError, match=r"`id` contains 3 but there are 3 envs"):
            envs.step(np.zeros(1, np.int64), [3])
        with pytest.raises(ValueError, match=r"`id` is \[\], which names no env"):
            envs.step(np.zeros(0, np.int64), [])
        envs.step(np.zeros(3, np.int64))  # (nothing was left half-done)
        with pytest.raises(ValueError, match=r"`env_id` repeats an env"):
            envs.reset([1, 1])
        with pytest.raises(TypeError, match=r"`reset` got \['return_info'\]"):
            envs.reset(return_info=True)
    old = TianshouVectorEnv([lambda: GymAPIBridge(CARTPOLE())] * 2)
    with contextlib.closing(old), pytest.raises(TypeError, match=r"old gym's API.*gymnasium"):
        old.reset()


def test_importing_the_package_does_not_import_tianshou():
    """The Tianshou face is loaded on first use; importing the package does not import it."""
    assert_loaded_on_first_use("tianshou", "make_tianshou_vector_env", "TianshouVectorEnv")


@pytest.mark.in_process
def test_resetting_some_envs_first_returns_their_observations():
    """`reset([1, 2], seed=3)` as the first call returns what DummyVectorEnv returns."""
    ours = TianshouVectorEnv([CARTPOLE] * 4, envs_per_worker=2)
    theirs = DummyVectorEnv([CARTPOLE] * 4)
    with contextlib.closing(ours), contextlib.closing(theirs):
        obs, infos = ours.reset([1, 2], seed=3)
        expected, _ = theirs.reset([1, 2], seed=3)
        np.testing.assert_array_equal(obs, expected)
        assert len(infos) == 2
