"""Asynchronous stepping: step_async/step_wait, first-ready send/recv, reset of one env."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest

from ray_multiprocess_env import RayVectorEnv, make_remote_class
from tests.envs import FlakyEnv, TwoAgentEnv, TwoAgentHolder
from tests.helpers import LAYOUTS, flaky_vec, wait_until_ready


@pytest.mark.parametrize("layout", LAYOUTS)
def test_step_async_then_step_wait_equals_step(layout):
    """step_async + step_wait give what step gives; misuse is a clear error."""
    with flaky_vec(3, layout) as a, flaky_vec(3, layout) as b:
        a.reset()
        b.reset()
        a.step_async([1, 2, 0])
        with pytest.raises(RuntimeError, match=r"`step_async` was called while a `step_async`"):
            a.step_async([1, 2, 0])
        got = a.step_wait()
        expected = b.step([1, 2, 0])
        np.testing.assert_array_equal(np.stack(got[0]), np.stack(expected[0]))
        assert got[1:] == expected[1:]
        with pytest.raises(RuntimeError, match=r"`step_wait` was called without a `step_async`"):
            a.step_wait()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_first_ready_results_match_synchronous_stepping(layout):
    """Under random completion orders, each env's results equal stepping it on its own."""
    num_envs, rounds = 4, 6
    rng = random.Random(0)
    actions = [[rng.randrange(3) for _ in range(rounds)] for _ in range(num_envs)]
    with flaky_vec(num_envs, layout) as vec:
        vec.seed(0)
        vec.reset()
        vec.set_attr("delay", [0.0, 0.05, 0.01, 0.03])
        expected = []
        for env_id in range(num_envs):
            env = FlakyEnv()
            env.reset(seed=env_id)
            expected.append([env.step(a)[0].item() for a in actions[env_id]])
        got: list[list[float]] = [[] for _ in range(num_envs)]
        vec.send([actions[i][0] for i in range(num_envs)], list(range(num_envs)))
        sent = [1] * num_envs
        batches = []
        while any(len(g) < rounds for g in got):
            env_ids, (obs, rewards, *_) = vec.recv(batch_size=1)
            batches.append(env_ids)
            assert env_ids == sorted(env_ids)
            assert len(obs) == len(rewards) == len(env_ids)
            for env_id, o in zip(env_ids, obs, strict=True):
                got[env_id].append(o.item())
            again = [i for i in env_ids if sent[i] < rounds]
            if again:
                vec.send([actions[i][sent[i]] for i in again], again)
                for i in again:
                    sent[i] += 1
        assert got == expected
        if layout == "actor-per-env":  # fast envs came back before slow ones at least once
            assert any(len(batch) < num_envs for batch in batches)


@pytest.mark.parametrize("layout", ["actor-per-env", "workers-of-2"])
def test_async_reset_comes_back_as_a_step_with_zero_reward(layout):
    """After async_reset, recv returns (obs, 0.0, False, False, info) per env, like envpool.

    (The user's own actors have no batch layout: each env's reset comes back as its own.)
    """
    with flaky_vec(2, layout) as vec:
        vec.seed(3)
        vec.async_reset()
        env_ids, (obs, rewards, terminated, truncated, _) = vec.recv()
        assert env_ids == [0, 1]
        assert rewards == (0.0, 0.0)
        assert terminated == truncated == (False, False)
        expected = [FlakyEnv().reset(seed=3 + i)[0].item() for i in range(2)]
        assert [o.item() for o in obs] == expected


def test_send_recv_errors_and_timeout():
    """Busy envs, bad env ids and nothing in flight are clear errors; a timeout keeps envs out."""
    vec = flaky_vec(3, "actor-per-env", timeout=30.0)
    wait_until_ready(vec)
    vec.reset()
    with pytest.raises(RuntimeError, match=r"`recv` was called with nothing in flight"):
        vec.recv()
    with pytest.raises(ValueError, match=r"`env_ids` contains 3 but there are 3 envs"):
        vec.send([0], [3])
    with pytest.raises(ValueError, match=r"`env_ids` repeats an env"):
        vec.send([0, 0], [1, 1])
    with pytest.raises(ValueError, match=r"`actions` has 1 entries but `env_ids` has 2"):
        vec.send([0], [0, 1])
    vec.set_attr("delay", [0.0, 2.0, 0.0])
    vec.send([1, 1], [0, 1])
    with pytest.raises(
        ValueError, match=r"env 1 already has a call in flight; `recv` .* before sending"
    ):
        vec.send([1], [1])
    with pytest.raises(RuntimeError, match=r"`reset` was called while env\(s\) \[0, 1\]"):
        vec.reset()
    env_ids, _ = vec.recv(batch_size=1)
    assert env_ids == [0]
    with pytest.raises(TimeoutError, match=r"`recv` timed out after 0.5 s: env\(s\) \[1\]"):
        vec.recv(timeout=0.5)
    env_ids, (obs, *_) = vec.recv(timeout=30)
    assert env_ids == [1]
    assert obs[0].item() == 1.0
    vec.send([1], [2])
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive int"):
        vec.recv(batch_size=0)
    vec.recv()
    vec.close()


def test_reset_one_env_while_others_are_in_flight():
    """reset_env resets a finished env while the others still step (RLlib's try_reset)."""
    with flaky_vec(3, "actor-per-env") as vec:
        vec.reset()
        vec.set_attr("delay", [0.0, 1.0, 1.0])
        vec.send([2, 2], [1, 2])
        obs, _ = vec.reset_env(0, seed=7)
        assert obs.item() == FlakyEnv().reset(seed=7)[0].item()
        with pytest.raises(
            ValueError, match=r"env 1 already has a call in flight; `recv` .* resetting"
        ):
            vec.reset_env(1)
        env_ids, (obs, *_) = vec.recv()
        assert env_ids == [1, 2]
        assert [o.item() for o in obs] == [2.0, 2.0]
        kept, _ = vec.reset([False, True, True])
        assert [o.item() for o in kept] == [0.0, 2.0, 2.0]  # env 0 reset; 1 and 2 as received


def test_multi_agent_dict_envs_pass_through_untouched():
    """Per-agent dicts (with "__all__") come back exactly as the env returns them."""
    remote = make_remote_class(TwoAgentHolder, "env", TwoAgentEnv)
    local = [TwoAgentEnv() for _ in range(2)]
    with RayVectorEnv([remote.remote() for _ in range(2)]) as vec:
        obs, _ = vec.reset()
        assert obs == [env.reset()[0] for env in local]
        actions = [{"left": -1, "right": 1}, {"left": 1}]
        got = vec.step(actions)
        expected = tuple(
            zip(*[e.step(a) for e, a in zip(local, actions, strict=True)], strict=True)
        )
        assert got == expected
        assert got[2][0]["__all__"] is False
        vec.send([{"left": 0, "right": 0}], [1])
        env_ids, (obs, *_) = vec.recv()
        assert env_ids == [1]
        assert obs[0] == local[1].step({"left": 0, "right": 0})[0]


def test_send_refuses_bad_id_types_and_a_pending_step_async():
    """Non-int env ids and send during a pending step_async are clear errors."""
    with flaky_vec(2, "actor-per-env") as vec:
        vec.reset()
        with pytest.raises(TypeError, match=r"`env_ids` must be a list of env indices"):
            vec.send([0], 1)
        with pytest.raises(TypeError, match=r"`env_ids` must hold ints, got '0'"):
            vec.send([0], ["0"])
        vec.step_async([0, 0])
        with pytest.raises(
            RuntimeError, match=r"`send` was called while a `step_async` is pending"
        ):
            vec.send([0], [0])
        vec.step_wait()


def test_reset_env_and_send_refuse_a_pending_step_async():
    """reset_env and send during a pending step_async raise AlreadyPendingCallError."""
    with flaky_vec(2, "workers-of-2") as vec:
        vec.reset()
        vec.step_async([1, 1])
        with pytest.raises(gym.error.AlreadyPendingCallError, match=r"`reset_env` was called"):
            vec.reset_env(0)
        with pytest.raises(gym.error.AlreadyPendingCallError, match=r"`send` was called"):
            vec.send([1], [0])
        assert [o.item() for o in vec.step_wait()[0]] == [1.0, 1.0]
