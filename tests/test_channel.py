"""The pipe transport (`channel.py`) against Ray calls: same results, errors, timeouts, deaths.

The pipe-specific tests ask for ``transport="auto"`` explicitly, so they test pipes even when
the suite runs again with ``RAY_MULTIPROCESS_ENV_TRANSPORT=ray`` (the README's test command).
"""

from __future__ import annotations

import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import ray
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env import EnvCrashedError, GymnasiumVectorEnv, RemoteEnvError
from ray_multiprocess_env.channel import ChannelError
from tests.envs import FlakyEnv
from tests.test_vector import assert_killed

TRANSPORTS = ["auto", "ray"]
_cartpole = functools.partial(gym.make, "CartPole-v1")


def _pid(envs: GymnasiumVectorEnv, worker: int) -> int:
    return ray.get(envs.remote_envs[worker].pid.remote(), timeout=60)


def test_auto_uses_pipes_to_local_workers_and_ray_uses_none(monkeypatch):
    """Pipes are opened at each worker's first full step, and only with transport='auto'."""
    envs = GymnasiumVectorEnv([_cartpole] * 4, envs_per_worker=2, transport="auto")
    envs.reset(seed=0)
    assert envs._vec._fanout.piped_groups == []  # opened at each worker's first step
    envs.step(np.zeros(4, dtype=np.int64))
    assert envs._vec._fanout.piped_groups == [0, 1]
    envs.close()
    envs = GymnasiumVectorEnv([_cartpole] * 4, envs_per_worker=2, transport="ray")
    envs.reset(seed=0)
    envs.step(np.zeros(4, dtype=np.int64))
    assert envs._vec._fanout.piped_groups == []
    envs.close()
    monkeypatch.setenv("RAY_MULTIPROCESS_ENV_TRANSPORT", "ray")
    envs = GymnasiumVectorEnv([_cartpole] * 2, envs_per_worker=2)
    envs.reset(seed=0)
    envs.step(np.zeros(2, dtype=np.int64))
    assert envs._vec._fanout.piped_groups == []
    envs.close()


def test_a_bad_transport_is_named(monkeypatch):
    with pytest.raises(ValueError, match=r"`transport` must be one of 'auto', 'ray', got 'shm'"):
        GymnasiumVectorEnv([_cartpole], transport="shm")
    monkeypatch.setenv("RAY_MULTIPROCESS_ENV_TRANSPORT", "fast")
    with pytest.raises(ValueError, match=r"RAY_MULTIPROCESS_ENV_TRANSPORT environment variable"):
        GymnasiumVectorEnv([_cartpole])


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_same_results_as_sync_vector_env(transport, mode):
    """Observations, rewards, dones and infos match SyncVectorEnv over 300 steps."""
    envs = GymnasiumVectorEnv(
        [_cartpole] * 6, envs_per_worker=3, autoreset_mode=mode, transport=transport
    )
    reference = gym.vector.SyncVectorEnv([_cartpole] * 6, autoreset_mode=mode)
    obs, _ = envs.reset(seed=3)
    np.testing.assert_array_equal(obs, reference.reset(seed=3)[0])
    rng = np.random.default_rng(0)
    for _ in range(300):
        actions = rng.integers(0, 2, 6)
        got, want = envs.step(actions), reference.step(actions)
        for a, b in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(a, b)
        assert got[4].keys() == want[4].keys()
        if mode == AutoresetMode.DISABLED and (got[2] | got[3]).any():
            mask = got[2] | got[3]
            envs.reset(options={"reset_mask": mask})
            reference.reset(options={"reset_mask": mask})
    envs.close()


def test_an_env_error_over_a_pipe_names_the_env_and_keeps_the_traceback():
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport="auto")
    envs.reset()
    with pytest.raises(
        RemoteEnvError, match=r"env 3 failed in `step`: ValueError: negative"
    ) as info:
        envs.step(np.array([1, 1, 1, -1]))
    assert isinstance(info.value.__cause__, ChannelError)
    assert info.value.env_indices == (3,)
    assert "tests/envs.py" in info.value.remote_traceback
    obs = envs.step(np.array([1, 1, 1, 1]))[0]
    assert obs[:, 0].tolist() == [2.0, 2.0, 2.0, 1.0]  # env 2 stepped; env 3 did not
    envs.close()


def test_a_late_reply_is_dropped_and_the_next_step_is_exact():
    """After a timeout the late step finishes in the worker; its reply is not mistaken."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1, timeout=1.0, transport="auto")
    envs.reset()
    envs.set_attr("delay", [0.0, 2.0])
    with pytest.raises(TimeoutError, match=r"`step` timed out after 1.0 s: env\(s\) \[1\]"):
        envs.step(np.array([1, 1]))
    time.sleep(1.5)
    envs.set_attr("delay", [0.0, 0.0])  # waits behind the late step, as a Ray call would
    obs = envs.step(np.array([2, 2]))[0]
    assert obs[:, 0].tolist() == [3.0, 3.0]
    envs.close()


def test_a_call_after_step_async_runs_after_the_step():
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=2, transport="auto")
    envs.reset()
    envs.step_async(np.array([2, 1]))
    assert envs.get_attr("count") == (2, 1)
    obs = envs.step_wait()[0]
    assert obs[:, 0].tolist() == [2.0, 1.0]
    envs.close()


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["between steps", "during a step"])
def test_a_worker_killed_is_named_or_restarted(moment):
    """SIGKILL: an idle worker's pipe is found broken at `send`, a busy one's at `receive`."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport="auto")
    envs.reset()
    envs.step(np.array([1, 1, 1, 1]))  # opens the pipes
    pid = _pid(envs, 1)
    if moment == "during a step":
        envs.set_attr("delay", [0.0, 0.0, 30.0, 30.0])
        envs.step_async(np.array([1, 1, 1, 1]))
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    assert_killed(envs.remote_envs[1])
    finish = envs.step_wait if moment == "during a step" else lambda: envs.step(np.ones(4, int))
    with pytest.raises(EnvCrashedError, match=r"env 2 failed in `step` \(env\(s\) \[3\]"):
        finish()
    envs.close()


@pytest.mark.slow
def test_restart_after_a_pipe_closes():
    envs = GymnasiumVectorEnv(
        [FlakyEnv] * 4, envs_per_worker=2, on_actor_failure="restart", transport="auto"
    )
    envs.reset()
    envs.step(np.array([1, 1, 1, 1]))
    os.kill(_pid(envs, 0), signal.SIGKILL)
    assert_killed(envs.remote_envs[0])
    obs, rewards, _, truncated, infos = envs.step(np.array([1, 1, 1, 1]))
    assert truncated.tolist() == [True, True, False, False]
    assert rewards.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert infos["env_crashed"].tolist() == [True, True, False, False]
    assert obs[2:, 0].tolist() == [2.0, 2.0]
    obs = envs.step(np.array([1, 1, 1, 1]))[0]
    assert obs[2:, 0].tolist() == [3.0, 3.0]
    assert envs._vec._fanout.piped_groups == [0, 1]  # the new worker got pipes at its step
    envs.close()


@pytest.mark.slow
def test_a_worker_that_dies_while_a_call_waits_for_its_step():
    """A Ray call made during `step_async` finds the dead worker; `step_wait` names it too."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1, transport="auto")
    envs.reset()
    envs.step(np.array([1, 1]))  # opens the pipes
    pid = _pid(envs, 1)
    envs.set_attr("delay", [0.0, 30.0])
    envs.step_async(np.array([1, 1]))
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    assert_killed(envs.remote_envs[1])
    with pytest.raises(EnvCrashedError, match=r"env 1 failed in `get_attr`"):
        envs.get_attr("count")
    with pytest.raises(EnvCrashedError, match=r"env 1 failed in `step`"):
        envs.step_wait()
    envs.close()
