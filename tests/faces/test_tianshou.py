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
    ClosedEnvError,
    GymAPIBridge,
    NoPendingCallError,
    PendingCallError,
    RemoteEnvError,
    TianshouVectorEnv,
    make_tianshou_vector_env,
)
from tests.envs import DictObsEnv, FlakyEnv, WalkEnv  # noqa: E402
from tests.envs_faults import RaisingEnv  # noqa: E402
from tests.helpers import assert_loaded_on_first_use, assert_same  # noqa: E402
from tests.interrupts import Gate  # noqa: E402

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


# -- every verb recovers (an error, a timeout or Ctrl-C in a step of some envs) ---------------
@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_a_subset_step_that_raises_leaves_every_call_usable(transport):
    """`step(action, id=[3, 1])` where env 1 raises: then `reset(1)`, `reset()`, steps work."""
    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        with pytest.raises(RemoteEnvError, match="env 1 failed in `step`"):
            envs.step(np.array([1, -1]), [3, 1])
        obs, _ = envs.reset(1)
        assert obs.tolist() == [[0.0]]
        envs.reset()
        obs, _, _, _, infos = envs.step(np.array([2, 1]), [3, 1])
        assert obs[:, 0].tolist() == [2.0, 1.0]
        assert [info["env_id"] for info in infos] == [3, 1]


class _ZeroPolicy(Policy):
    """Action 0 for every row (for envs whose observations CartPole's policy cannot read)."""

    def forward(self, batch, state=None, **kwargs):
        """Zeros, one per row."""
        return Batch(act=np.zeros(len(batch.obs), dtype=np.int64), state=state)


@pytest.mark.in_process
def test_a_collector_goes_on_after_an_env_raised():
    """Tianshou's Collector: `collect` raises (an env raised), then `reset` and `collect` work."""
    fns = [functools.partial(RaisingEnv, every) for every in (0, 5, 0, 0)]
    envs = TianshouVectorEnv(fns, envs_per_worker=2)
    probe = RaisingEnv()
    policy = _ZeroPolicy(action_space=probe.action_space, observation_space=probe.observation_space)
    with contextlib.closing(envs):
        collector = Collector(policy, envs, VectorReplayBuffer(1000, 4))
        collector.reset()
        with pytest.raises(RemoteEnvError, match="env 1 failed in `step`"):
            collector.collect(n_episode=2)  # (it steps envs 0 and 1)
        collector.reset()
        assert collector.collect(n_step=8).n_collected_steps == 8  # (env 1 raises at 10)


def test_ctrl_c_in_a_subset_step_leaves_every_call_usable(tmp_path):
    """Ctrl-C during `step(action, id=[2, 0])`: then `reset()` and steps work."""
    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2)
    gate = Gate(str(tmp_path))
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("gate", str(gate))
        with pytest.raises(KeyboardInterrupt), gate.interrupt_when_entered(2):
            envs.step(np.array([1, 1]), [2, 0])  # (interrupted once both workers are in it)
        gate.open()
        envs.set_env_attr("gate", None)  # (behind the interrupted step, which ran)
        obs, _ = envs.reset()
        assert obs[:, 0].tolist() == [0.0] * 4
        assert envs.step(np.array([1, 2]), [2, 0])[0][:, 0].tolist() == [1.0, 2.0]


def test_a_subset_step_that_times_out_leaves_every_call_usable(tmp_path):
    """A `TimeoutError` in a subset step; once the env answers, the next calls work."""
    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, timeout=1.0)
    gate = Gate(str(tmp_path))
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("gate", str(gate), id=[1])
        with pytest.raises(TimeoutError, match=r"env\(s\) \[1\] did not answer"):
            envs.step(np.array([1, 1]), [3, 1])  # (env 1 waits at the shut gate)
        gate.open()  # the late step finishes in its worker
        envs.set_env_attr("gate", None)
        envs.reset()
        assert envs.step(np.array([1, 1]), [3, 1])[0][:, 0].tolist() == [1.0, 1.0]


def test_a_subset_step_restarts_a_late_worker_as_a_full_step_does():
    """With `on_actor_failure="restart"`, a subset step replaces a worker that hangs."""
    envs = TianshouVectorEnv(
        [FlakyEnv] * 4, envs_per_worker=2, timeout=2.0, on_actor_failure="restart"
    )
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("delay", 60.0, id=[1])
        _, _, _, truncated, infos = envs.step(np.array([1, 1]), [3, 1])
        assert truncated.tolist() == [False, True]
        assert infos[1]["env_crashed"]
        assert envs.step(np.array([1, 1]), [3, 1])[0][:, 0].tolist() == [2.0, 1.0]


@pytest.mark.in_process
def test_an_async_steps_errors_speak_of_step_the_users_call():
    """In async mode the user calls `step`, never `send` or `recv`: every error says `step`.

    An env error, a timeout (and how to wait again), an env still stepping, nothing to
    collect, and a closed vector env; a `seed` refused seeds no action space either.
    """
    fns = [functools.partial(WalkEnv, 1000, delay) for delay in (0.0, 0.0, 3.0)]
    envs = TianshouVectorEnv(fns, wait_num=2, timeout=1.0)  # (env 2 is always late)
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("position", None, id=[1])  # its next step raises (None + 1)
        with pytest.raises(RemoteEnvError, match=r"^env 1 failed in `step`: TypeError"):
            envs.step(np.ones(3), np.arange(3))
        timed_out = r"^`step` timed out after 1.0 s: env\(s\) \[2\] did not answer"
        with pytest.raises(TimeoutError, match=rf"{timed_out}.*`step\(None\)` waits for them"):
            envs.step(None)
        stepping = r"^env 2 in {} is still stepping .*`step\(None\)` before {}"
        with pytest.raises(ValueError, match=stepping.format("`id`", "stepping it again")):
            envs.step(np.ones(2), [1, 2])
        with pytest.raises(ValueError, match=stepping.format("`env_id`", "resetting it")):
            envs.reset([1, 2])
        spaces = [space.np_random.bit_generator.state for space in envs.action_space]
        for verb in ("seed", "render"):
            with pytest.raises(PendingCallError, match=r"^env\(s\) \[0, 2\] are still stepping"):
                getattr(envs, verb)()
        assert [s.np_random.bit_generator.state for s in envs.action_space] == spaces  # unseeded
        while envs.waiting_id:  # (env 2 answers once its step of 3 s is over)
            with contextlib.suppress(TimeoutError):
                envs.step(None)
        with pytest.raises(NoPendingCallError, match=r"^`step` got `action` None.*none is"):
            envs.step(None)
    for action in (None, np.ones(3)):
        with pytest.raises(ClosedEnvError, match=r"^`step` was called on a closed"):
            envs.step(action)
    for verb in ("seed", "render"):
        with pytest.raises(ClosedEnvError, match=rf"^`{verb}` was called on a closed"):
            getattr(envs, verb)()


def test_an_env_that_raises_in_async_mode_is_ready_again():
    """`wait_num=2`, env 1 raises: it leaves `waiting_id`; after `reset(1)` all works."""
    fns = [functools.partial(WalkEnv, 1000, delay) for delay in (0.2, 0.0, 0.2, 0.2)]
    envs = TianshouVectorEnv(fns, wait_num=2)
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("position", None, id=[1])  # its next step raises (None + 1)
        with pytest.raises(RemoteEnvError, match="env 1 failed"):
            envs.step(np.ones(4), np.arange(4))
        assert 1 not in envs.waiting_id
        while envs.waiting_id:
            envs.step(None)
        envs.reset(1)
        assert envs.waiting_id == []
        assert sorted(envs.ready_id) == [0, 1, 2, 3]
        assert envs.get_env_attr("size") == [1000] * 4  # (every env answers: none is out)
        *_, infos = envs.step(np.ones(4), np.arange(4))
        assert len(infos) >= 2


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
