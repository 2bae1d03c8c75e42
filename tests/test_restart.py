"""Actor death: named by default, or the worker restarts and the loop goes on (SIGKILL tests)."""

from __future__ import annotations

import functools
import logging
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env import (
    EnvCrashedError,
    GymnasiumVectorEnv,
    NoPendingCallError,
    RayVectorEnv,
    SB3VecEnv,
)
from ray_multiprocess_env._engine import engine as engine_module
from ray_multiprocess_env._engine.seeds import restart_seed
from tests.envs import EndOnTwoEnv, FlakyEnv, bridged_cartpole
from tests.envs_faults import env_failing_once_flagged
from tests.helpers import assert_killed, worker_pids

pytestmark = pytest.mark.slow


def _kill(envs, worker, pid=None) -> None:
    """SIGKILL worker `worker` of `envs` and wait until Ray knows it is dead."""
    os.kill(pid or worker_pids(envs)[worker], signal.SIGKILL)
    assert_killed(envs.remote_envs[worker])


def test_by_default_a_dead_worker_raises_naming_its_envs():
    """on_actor_failure='raise': EnvCrashedError names every env the dead worker held."""
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_worker=2)
    vec.reset()
    _kill(vec, 1)
    with pytest.raises(EnvCrashedError, match=r"env 2 failed in `step` \(env\(s\) \[3\]"):
        vec.step([1, 1, 1, 1])
    vec.close()


def test_pfrl_style_restart_marks_lost_envs_for_reset():
    """on_actor_failure='restart': lost envs come back reset with needs_reset; others go on."""
    vec = RayVectorEnv.from_env_fns(
        [bridged_cartpole] * 4, envs_per_worker=2, on_actor_failure="restart"
    )
    vec.seed(0)
    vec.reset()
    vec.step([0, 0, 0, 0])
    before = vec.get_attr("np_random_seed")
    _kill(vec, 0)
    _, rewards, dones, infos = vec.step([1, 1, 1, 1])
    assert dones[:2] == (False, False)  # pfrl's convention for an episode cut short
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
    _kill(ours, 1)
    obs, rewards, _, truncated, infos = ours.step(actions)
    expected = reference.step(actions)
    np.testing.assert_array_equal(obs[:2], expected[0][:2])  # the other worker lost nothing
    assert truncated.tolist() == [False, False, True, True]
    assert rewards[2:].tolist() == [0.0, 0.0]
    if mode == AutoresetMode.SAME_STEP:  # the truncated step's info is the final_info
        assert infos["_final_obs"].tolist() == [False, False, True, True]
        assert infos["final_info"]["env_crashed"].tolist() == [False, False, True, True]
    assert infos["env_crashed"].tolist() == [False, False, True, True]  # in every mode
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
    _kill(envs, 0)
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


def test_restart_replaces_a_hung_worker_and_the_step_goes_on():
    """With restart, a worker that outlives `timeout` is replaced within the same call."""
    vec = RayVectorEnv.from_env_fns(
        [FlakyEnv] * 4, envs_per_worker=2, timeout=2.0, on_actor_failure="restart"
    )
    vec.reset()
    vec.step([1, 1, 1, 1])
    vec.set_attr("delay", [0.0, 0.0, 60.0, 0.0])
    obs, _, _, truncated, infos = vec.step([1, 1, 1, 1])
    assert [o.item() for o in obs] == [2.0, 2.0, 0.0, 0.0]  # envs 2 and 3 came back reset
    assert truncated == (False, False, True, True)
    assert [info.get("env_crashed", False) for info in infos] == [False, False, True, True]
    assert vec.get_attr("count") == (2, 2, 0, 0)
    obs = vec.step([1, 1, 1, 1])[0]
    assert [o.item() for o in obs] == [3.0, 3.0, 1.0, 1.0]
    vec.close()


def test_a_hung_worker_does_not_lose_another_envs_terminal_transition():
    """Restart after a timeout keeps the other worker's answer: its termination is reported."""
    envs = GymnasiumVectorEnv(
        [EndOnTwoEnv] * 2, envs_per_worker=1, timeout=2.0, on_actor_failure="restart"
    )
    envs.reset()
    envs.set_attr("delay", [0.0, 60.0])
    _, _, terminated, truncated, infos = envs.step(np.array([2, 1]))
    assert terminated.tolist() == [True, False]  # env 0's terminal transition is delivered
    assert truncated.tolist() == [False, True]
    assert infos["env_crashed"].tolist() == [False, True]
    _, rewards, _, _, _ = envs.step(np.array([1, 1]))
    assert rewards.tolist() == [0.0, 0.0]  # both autoreset (NEXT_STEP), none stepped past
    envs.close()


@pytest.mark.parametrize("op", ["get_attr", "call", "set_attr", "masked reset"])
def test_a_death_in_any_call_leaves_the_envs_ready_to_step(op):
    """A worker lost during get_attr/call/set_attr/masked reset comes back reset, not broken."""
    vec = RayVectorEnv.from_env_fns(
        [bridged_cartpole] * 4, envs_per_worker=2, on_actor_failure="restart"
    )
    vec.reset()
    _kill(vec, 0)
    if op == "get_attr":
        assert len(vec.get_attr("np_random_seed")) == 4
    elif op == "call":
        vec.call("render")
    elif op == "set_attr":
        vec.set_attr("marker", 1)
    else:
        vec.reset([False, True, True, True])
    infos = vec.step([0, 0, 0, 0])[3]  # CartPole would raise ResetNeeded if unreset
    crashed = [info.get("env_crashed", False) for info in infos]
    assert crashed == (
        [False, True, False, False] if op == "masked reset" else [True, True, False, False]
    )
    vec.close()


def test_two_calls_in_flight_to_one_dead_worker_restart_it_once(caplog):
    """First-ready: two sends to the same dead worker restart it once; both come back."""
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=2, on_actor_failure="restart")
    vec.async_reset()
    vec.recv()
    vec.set_attr("delay", [5.0, 5.0])
    pid = worker_pids(vec)[0]
    vec.send([1], [0])
    vec.send([1], [1])
    _kill(vec, 0, pid)
    env_ids, (_, _, _, truncated, _) = vec.recv()
    assert env_ids == [0, 1]
    assert truncated == (True, True)
    assert caplog.text.count("restarting it") == 1
    vec.close()


def _recv_into(vec, truncated, crashed, **kwargs):
    """One pfrl-style `recv`: each env's truncation flag and `env_crashed` info, by env."""
    env_ids, (_, _, _, flags, infos) = vec.recv(**kwargs)
    for env, flag, info in zip(env_ids, flags, infos, strict=True):
        truncated[env], crashed[env] = flag, bool(info.get("env_crashed"))


def _recv_until_error(vec, truncated, crashed):
    """`recv` of one env at least, again and again, until it raises."""
    while True:
        _recv_into(vec, truncated, crashed, batch_size=1)


def test_a_restart_past_its_budget_leaves_another_lost_workers_envs_for_the_next_recv():
    """Two workers lost in one `recv`, one of them past `max_restarts`: nothing else is lost.

    Worker 1 used its one restart; then workers 0 and 1 die together. The error names env 1
    only; env 0 (its worker restarted in that `recv`) comes back from the next `recv` with its
    lost episode, and env 2 comes back too: each env sent is returned or named.
    """
    vec = RayVectorEnv.from_env_fns(
        [FlakyEnv] * 3, envs_per_worker=1, on_actor_failure="restart", max_restarts=1
    )
    try:
        vec.async_reset()
        vec.recv()
        _kill(vec, 1)
        vec.send([1, 1, 1], [0, 1, 2])
        assert vec.recv()[0] == [0, 1, 2]  # (worker 1 restarted: its one restart)
        pids = worker_pids(vec)
        _kill(vec, 0, pids[0])
        _kill(vec, 1, pids[1])
        vec.send([1, 1, 1], [0, 1, 2])
        truncated: dict[int, bool] = {}  # (env: its truncation flag, as `recv` returned it)
        crashed: dict[int, bool] = {}  # (env: whether its info said `env_crashed`)
        with pytest.raises(EnvCrashedError, match=r"max_restarts=1") as caught:
            _recv_until_error(vec, truncated, crashed)  # (env 2 may come back first)
        assert list(caught.value.env_indices) == [1]
        while 0 not in truncated or 2 not in truncated:
            _recv_into(vec, truncated, crashed)
        assert truncated == {0: True, 2: False}
        assert crashed[0]  # (env 0's episode, lost with its worker, reported)
        with pytest.raises(NoPendingCallError):  # (nothing left in flight)
            vec.recv()
    finally:
        vec.close()


def test_a_restarted_env_gets_a_seed_derived_from_its_last():
    """Seeded runs stay reproducible: a restarted env is reset with a derived seed."""
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=1, on_actor_failure="restart")
    vec.seed(10)
    vec.reset()
    _kill(vec, 1)
    obs, *_ = vec.step([0, 0])
    expected, _ = FlakyEnv().reset(seed=restart_seed(11, 1))
    assert obs[1].item() == expected.item()
    vec.close()


@pytest.mark.parametrize("transport", [None, "tcp"])
def test_close_returns_with_dead_and_hung_workers_and_restarts_none(caplog, monkeypatch, transport):
    """close() neither restarts dead workers nor waits forever on hung ones (timeout=None).

    With no `timeout` the envs get `engine._CLOSE_S` to close (30 s), shortened here to 3 s:
    close must return within it (plus killing the workers), whatever it is. (Over the TCP
    stream the dead worker's connection, ready to read for ever, once kept the wait going.)
    """
    monkeypatch.setattr(engine_module, "_CLOSE_S", 3.0)
    vec = RayVectorEnv.from_env_fns(
        [FlakyEnv] * 4, envs_per_worker=2, on_actor_failure="restart", transport=transport
    )
    vec.reset()
    vec.set_attr("delay", [0.0, 0.0, 600.0, 600.0])
    pids = worker_pids(vec)
    vec.step_async([1, 1, 1, 1])
    _kill(vec, 0, pids[0])
    start = time.monotonic()
    vec.close()
    assert time.monotonic() - start < 3.0 + 20
    assert "restarting it" not in caplog.text


def test_a_restart_settles_the_first_ready_calls_of_the_old_worker():
    """A worker restarted by another call: its envs in flight come back as lost episodes."""
    vec = RayVectorEnv.from_env_fns(
        [FlakyEnv] * 2, envs_per_worker=2, timeout=3.0, on_actor_failure="restart"
    )
    vec.async_reset()
    vec.recv()
    vec.set_attr("delay", [10.0, 0.0])
    vec.send([1], [0])
    vec.reset_env(1)  # waits behind env 0's slow step: the worker is late and restarted
    env_ids, (_, _, _, truncated, infos) = vec.recv()
    assert env_ids == [0]
    assert truncated == (True,)
    assert infos[0]["env_crashed"]
    vec.close()


def test_a_shorter_step_wait_timeout_does_not_restart():
    """`step_wait(timeout=...)` shorter than the vector env's only raises; the step goes on."""
    envs = GymnasiumVectorEnv(
        [FlakyEnv] * 2, envs_per_worker=1, timeout=30.0, on_actor_failure="restart"
    )
    envs.reset()
    envs.set_attr("delay", [0.0, 1.5])
    envs.step_async(np.array([1, 1]))
    with pytest.raises(TimeoutError, match=r"env\(s\) \[1\] did not answer"):
        envs.step_wait(timeout=0.3)
    obs, _, _, truncated, infos = envs.step_wait()
    assert obs[:, 0].tolist() == [1.0, 1.0]
    assert not truncated.any()
    assert "env_crashed" not in infos
    envs.close()


def test_a_masked_reset_leaves_the_other_envs_seeds_for_their_restart():
    """A reset of env 0 with new seeds: env 1's restart seed still derives from env 1's own."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=2, on_actor_failure="restart")
    try:
        envs.reset(seed=10)  # env 1: seed 11
        envs.reset(seed=[20, 21], options={"reset_mask": np.array([True, False])})
        _kill(envs, 0)
        obs, _, _, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))
        assert truncated.tolist() == [True, True]
        assert obs[0, 0] == FlakyEnv().reset(seed=restart_seed(20, 1))[0][0]
        assert obs[1, 0] == FlakyEnv().reset(seed=restart_seed(11, 1))[0][0]  # (not 21)
    finally:
        envs.close()


def test_close_after_a_restart_given_up_logs_no_failure_of_its_own_kill(tmp_path, caplog):
    """A worker the library gave up on (its restart failed) is not asked to close its envs."""
    flag = str(tmp_path / "no-replacement")
    fns = [functools.partial(env_failing_once_flagged, flag, (0, 1), i) for i in range(4)]
    envs = GymnasiumVectorEnv(fns, envs_per_worker=2, on_actor_failure="restart", timeout=20)
    envs.reset(seed=0)
    envs.set_attr("taken", [1, -100, -100, -100])  # worker 0 dies at its next step
    open(flag, "w").close()  # and cannot be built again
    with pytest.raises(EnvCrashedError, match=r"env 0 failed in `step`"):
        envs.step(np.ones(4, dtype=np.int64))
    with caplog.at_level(logging.WARNING):
        envs.close()
    assert "failed `close`" not in caplog.text
