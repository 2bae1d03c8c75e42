"""Actor death: named by default, or the worker restarts and the loop goes on (SIGKILL tests)."""

from __future__ import annotations

import os
import signal

import gymnasium as gym
import numpy as np
import pytest
import ray
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env import (
    EnvCrashedError,
    GymAPIBridge,
    GymnasiumVectorEnv,
    RayVectorEnv,
    SB3VecEnv,
)
from tests.envs import FlakyEnv
from tests.test_vector import assert_killed

pytestmark = pytest.mark.slow


def _kill(actor) -> None:
    pid = ray.get(actor.pid.remote(), timeout=60)
    os.kill(pid, signal.SIGKILL)
    assert_killed(actor)


def _bridged_cartpole():
    return GymAPIBridge(gym.make("CartPole-v1"))


def test_by_default_a_dead_worker_raises_naming_its_envs():
    """on_actor_failure='raise': EnvCrashedError names every env the dead worker held."""
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_actor=2)
    vec.reset()
    _kill(vec.remote_envs[1])
    with pytest.raises(EnvCrashedError, match=r"env 2 failed in `step` \(env\(s\) \[3\]"):
        vec.step([1, 1, 1, 1])
    vec.close()


def test_pfrl_style_restart_marks_lost_envs_for_reset():
    """on_actor_failure='restart': lost envs come back reset with needs_reset; others go on."""
    vec = RayVectorEnv.from_env_fns(
        [_bridged_cartpole] * 4, envs_per_actor=2, on_actor_failure="restart"
    )
    vec.seed(0)
    vec.reset()
    vec.step([0, 0, 0, 0])
    before = vec.get_attr("np_random_seed")
    _kill(vec.remote_envs[0])
    _, rewards, dones, infos = vec.step([1, 1, 1, 1])
    assert dones[:2] == (True, True)
    assert [info.get("needs_reset") for info in infos[:2]] == [True, True]
    assert [info.get("env_crashed", False) for info in infos] == [True, True, False, False]
    assert rewards[:2] == (0.0, 0.0)
    assert vec.get_attr("np_random_seed")[2:] == before[2:]
    vec.reset([False, False, True, True])
    vec.step([0, 0, 0, 0])  # the restarted worker steps on
    vec.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_gymnasium_restart_truncates_the_lost_envs(mode):
    """GymnasiumVectorEnv with restart: lost envs are truncated, autoreset stays exact."""
    make = [lambda: gym.make("CartPole-v1")] * 4
    ours = GymnasiumVectorEnv(
        make, envs_per_worker=2, autoreset_mode=mode, on_actor_failure="restart"
    )
    reference = gym.vector.SyncVectorEnv(make, autoreset_mode=mode)
    ours.reset(seed=5)
    reference.reset(seed=5)
    actions = np.array([1, 0, 1, 0])
    ours.step(actions)
    reference.step(actions)
    _kill(ours.remote_envs[1])
    obs, rewards, _, truncated, infos = ours.step(actions)
    expected = reference.step(actions)
    np.testing.assert_array_equal(obs[:2], expected[0][:2])  # the other worker lost nothing
    assert truncated.tolist() == [False, False, True, True]
    assert rewards[2:].tolist() == [0.0, 0.0]
    if mode == AutoresetMode.SAME_STEP:  # the truncated step's info is the final_info
        assert infos["_final_obs"].tolist() == [False, False, True, True]
        assert infos["final_info"]["env_crashed"].tolist() == [False, False, True, True]
    else:
        assert infos["env_crashed"].tolist() == [False, False, True, True]
    _, rewards, _, truncated, _ = ours.step(actions)
    if (
        mode == AutoresetMode.NEXT_STEP
    ):  # the step after a truncation resets, as gymnasium's autoreset does
        assert rewards[2:].tolist() == [0.0, 0.0]
    assert not truncated[2:].any()
    ours.close()


def test_sb3_restart_reports_done_with_terminal_observation():
    """SB3VecEnv with restart: lost envs are done, TimeLimit.truncated, terminal_observation."""
    envs = SB3VecEnv(
        [lambda: gym.make("CartPole-v1")] * 4, envs_per_worker=2, on_actor_failure="restart"
    )
    envs.reset()
    _kill(envs.remote_envs[0])
    obs, _, dones, infos = envs.step(np.zeros(4, dtype=np.int64))
    assert dones.tolist() == [True, True, False, False]
    assert all(
        infos[i]["TimeLimit.truncated"] and "terminal_observation" in infos[i] for i in (0, 1)
    )
    assert obs.shape == (4, 4)
    envs.close()


def test_bad_failure_policy():
    """An unknown on_actor_failure is a ValueError naming the choices."""
    with pytest.raises(ValueError, match=r"`on_actor_failure` must be 'raise' or 'restart'"):
        RayVectorEnv.from_env_fns([FlakyEnv], on_actor_failure="retry")


def test_restart_replaces_a_hung_worker_after_a_timeout():
    """With restart, a worker that outlives `timeout` is replaced; the vector env goes on."""
    vec = RayVectorEnv.from_env_fns(
        [FlakyEnv] * 4, envs_per_actor=2, timeout=2.0, on_actor_failure="restart"
    )
    vec.reset()
    vec.step([1, 1, 1, 1])
    vec.set_attr("delay", [0.0, 0.0, 60.0, 0.0])
    with pytest.raises(TimeoutError, match=r"env\(s\) \[2, 3\] did not answer\. Their worker"):
        vec.step([1, 1, 1, 1])
    assert vec.get_attr("count") == (2, 2, 0, 0)  # envs 2 and 3 were restarted and reset
    obs = vec.step([1, 1, 1, 1])[0]
    assert [o.item() for o in obs] == [3.0, 3.0, 1.0, 1.0]
    vec.close()
