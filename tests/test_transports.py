"""Every transport gives the same results, faults included (the transport-differential suite).

Each test runs over ``transport="auto"`` (same-node pipes with shared memory), ``"pipe"`` (pipes
only), ``"tcp"`` (the TCP stream that workers on other nodes get, here forced on the driver's
node) and ``"ray"`` (Ray calls), so it tests each of them even when the suite runs again with
``RAY_MULTIPROCESS_ENV_TRANSPORT=ray``.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import resource
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import ray
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env import (
    EnvCrashedError,
    GymnasiumVectorEnv,
    RayVectorEnv,
    RemoteEnvError,
)
from ray_multiprocess_env._engine.ray_launcher import _worker_class
from ray_multiprocess_env._engine.transports.base import Ticket
from ray_multiprocess_env._engine.transports.channel import ChannelTransport, Link
from ray_multiprocess_env._engine.transports.ray_calls import RayCallTransport
from ray_multiprocess_env._engine.transports.shared_memory import SharedRows
from ray_multiprocess_env._engine.transports.tcp import StreamRows
from ray_multiprocess_env._protocol.pipes import loads
from ray_multiprocess_env._protocol.shared_layout import SharedBatch
from ray_multiprocess_env._protocol.status import DOORBELL, is_record
from tests.envs import FlakyEnv, ThreadBoundEnv, UnpicklableInfoEnv
from tests.helpers import assert_killed, interrupt_after, transport_kinds, worker_pids
from tests.interrupts import Gate

TRANSPORTS = ["auto", "pipe", "tcp", "ray"]
_cartpole = functools.partial(gym.make, "CartPole-v1")


def _main_module_class():
    """A class whose module is ``__main__`` and which stdlib pickle cannot find there."""
    namespace: dict = {}
    exec(
        "class Note:\n    def __init__(self, v):\n        self.v = v\n",
        {"__name__": "__main__"},
        namespace,
    )
    return namespace["Note"]


def test_auto_uses_pipes_to_local_workers_and_ray_uses_none(monkeypatch):
    """`transport="auto"` serves local workers over pipes and shared memory; the others too."""
    with contextlib.closing(
        GymnasiumVectorEnv([_cartpole] * 4, envs_per_worker=2, transport="auto")
    ) as envs:
        assert transport_kinds(envs) == ["shared_memory", "shared_memory"]
    with contextlib.closing(
        GymnasiumVectorEnv([_cartpole] * 4, envs_per_worker=2, transport="pipe")
    ) as envs:
        assert transport_kinds(envs) == ["pipe", "pipe"]
    with contextlib.closing(
        GymnasiumVectorEnv([_cartpole] * 4, envs_per_worker=2, transport="tcp")
    ) as envs:
        assert transport_kinds(envs) == ["tcp", "tcp"]
    with contextlib.closing(
        GymnasiumVectorEnv([_cartpole] * 4, envs_per_worker=2, transport="ray")
    ) as envs:
        assert transport_kinds(envs) == ["ray", "ray"]
    monkeypatch.setenv("RAY_MULTIPROCESS_ENV_TRANSPORT", "ray")
    with contextlib.closing(GymnasiumVectorEnv([_cartpole] * 2, envs_per_worker=2)) as envs:
        assert transport_kinds(envs) == ["ray"]


def test_ray_calls_carry_the_streams_bytes_a_record_then_the_rows():
    """Over Ray calls a step is the TCP stream's bytes: nothing of it is pickled.

    Its actions go as raw rows after a doorbell; the worker answers with its record, then the
    rows it wrote, which land in the driver's batch: those of envs stepped in-process. Once the
    transport is closed, a reply read is lost with the worker, as over a closed channel.
    """
    envs = [_cartpole(), _cartpole()]
    batch = SharedBatch.create(envs[0].observation_space, envs[0].action_space, 2, share=False)
    views = batch.views(0, 2)
    actor = _worker_class().remote([_cartpole] * 2, [0, 1])
    calls = RayCallTransport(actor, StreamRows(batch, (0, 2)))

    def call(op, args, shared=False):
        ticket = Ticket(0, 0, op, args, (0, 1), shared_args=shared)
        data = calls.encode(ticket)
        reply = ray.get(actor.message.remote(data), timeout=60)
        assert is_record(reply), loads(reply)  # (a pickle: what went wrong)
        outcome = calls.outcome(ticket, reply)
        assert outcome.ok, outcome.error
        assert outcome.value.observations is None  # in place: in the batch
        return data

    try:
        calls.use_rows(time.monotonic() + 60)
        call("reset", ([3, 4], None, None))
        want = [env.reset(seed=seed)[0] for env, seed in zip(envs, (3, 4), strict=True)]
        np.testing.assert_array_equal(views.observations, want)
        for i in range(20):
            actions = np.array([i % 2, 1 - i % 2])
            assert call("step", (actions, None), shared=True).startswith(DOORBELL)
            results = [env.step(a)[:4] for env, a in zip(envs, actions, strict=True)]
            for got, want in zip(views[1:5], zip(*results, strict=True), strict=True):
                np.testing.assert_array_equal(got, want)
        ticket = Ticket(0, 0, "step", (np.array([0, 1]), None), (0, 1), shared_args=True)
        calls.submit(ticket)
        ray.wait([ticket.handle], timeout=60)
        calls.close()  # (its worker was lost, say): a reply read now is lost with it
        calls.waiter.wait([ticket], time.monotonic() + 60, 1)
        assert ticket.outcome.died
    finally:
        calls.close()
        ray.kill(actor)


@pytest.mark.parametrize("kind", ["shared_memory", "tcp"])
def test_a_channel_whose_link_cannot_be_made_lets_go_of_its_rows(kind):
    """`ChannelTransport.open` opens every channel (pipes alone take the stream's rows too)."""
    env = _cartpole()
    batch = SharedBatch.create(env.observation_space, env.action_space, 2, share=False)
    rows = SharedRows(batch, (0, 2)) if kind == "shared_memory" else StreamRows(batch, (0, 2))
    assert rows.leaf is not None

    def refused() -> Link:
        raise OSError("no pipes (simulated)")

    with pytest.raises(OSError, match="simulated"):
        ChannelTransport.open(kind, refused, 0.0, 0, rows, None)
    assert rows.leaf is None  # (its views of the batch let go)


def test_a_bad_transport_is_named(monkeypatch):
    """A bad `transport` (argument or environment variable) is a ValueError naming it."""
    with pytest.raises(ValueError, match=r"must be one of 'auto', 'pipe', 'tcp', 'ray', got 'shm'"):
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


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_env_error_names_the_env_and_keeps_the_traceback(transport):
    """An env that raises is named with its traceback; its siblings stepped and keep going."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    envs.reset()
    with pytest.raises(
        RemoteEnvError, match=r"env 3 failed in `step`: ValueError: negative"
    ) as info:
        envs.step(np.array([1, 1, 1, -1]))
    assert info.value.env_indices == (3,)
    assert "tests/envs.py" in info.value.remote_traceback
    obs = envs.step(np.array([1, 1, 1, 1]))[0]
    assert obs[:, 0].tolist() == [2.0, 2.0, 2.0, 1.0]  # env 2 stepped; env 3 did not
    envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_timeout_keeps_the_answers_and_step_wait_collects_the_rest(transport):
    """A late worker raises TimeoutError; the answers already in are kept for `step_wait`."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1, timeout=0.5, transport=transport)
    envs.reset()
    envs.set_attr("delay", [0.0, 1.5])
    with pytest.raises(
        TimeoutError,
        match=r"timed out after 0.5 s: env\(s\) \[1\] did not answer\. The envs that answered",
    ):
        envs.step(np.array([1, 1]))
    obs = envs.step_wait(timeout=10)[0]
    assert obs[:, 0].tolist() == [1.0, 1.0]
    envs.set_attr("delay", [0.0, 0.0])
    assert envs.step(np.array([2, 2]))[0][:, 0].tolist() == [3.0, 3.0]
    envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_keyboard_interrupt_mid_step_leaves_the_env_usable(transport, tmp_path):
    """Ctrl-C while a step is out (Jupyter's interrupt): the next calls work, results exact."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=30)
    envs.reset()
    gate = Gate(str(tmp_path))
    envs.set_attr("gate", [str(gate)] * 4)
    with pytest.raises(KeyboardInterrupt), gate.interrupt_when_entered(2):
        envs.step(np.array([1, 1, 1, 1]))  # (once both workers are inside it)
    for _ in range(2):  # (the workers still wait at the gate: these wait behind that step)
        with pytest.raises(KeyboardInterrupt), interrupt_after(0.1, signal_now=True):
            envs.step(np.array([1, 1, 1, 1]))
    gate.open()
    envs.set_attr("gate", [None] * 4)  # runs after the interrupted steps
    obs = envs.step(np.array([1, 1, 1, 1]))[0]
    assert obs[:, 0].tolist() == [4.0, 4.0, 4.0, 4.0]  # every interrupted step ran once
    with pytest.raises(KeyboardInterrupt), interrupt_after(0.05):  # noqa: PT012
        for _ in range(100_000):  # interrupts land anywhere in a fast loop
            envs.step(np.array([0, 0, 0, 0]))
    assert envs.step(np.array([1, 1, 1, 1]))[0][:, 0].tolist() == [5.0, 5.0, 5.0, 5.0]
    envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_steps_queued_behind_an_interrupted_one_keep_their_own_actions(transport, tmp_path):
    """Steps given up on while the worker is still busy run later, each with its own actions."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1, transport=transport, timeout=30)
    envs.reset()
    gate = Gate(str(tmp_path))
    envs.set_attr("gate", [str(gate)] * 2)
    with pytest.raises(KeyboardInterrupt), gate.interrupt_when_entered(2):
        envs.step(np.array([0, 0]))  # the workers stay busy with it until the gate opens
    with pytest.raises(KeyboardInterrupt), interrupt_after(0.05, signal_now=True):
        envs.step(np.array([2, 2]))  # waits in the pipe behind it (the gate is shut)
    gate.open()
    envs.set_attr("gate", [None, None])
    obs = envs.step(np.array([1, 1]))[0]  # behind both: must not overwrite their actions
    assert obs[:, 0].tolist() == [3.0, 3.0]
    envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_worker_results_of_an_error_stay_as_they_were(transport):
    """`worker_results` of a failed step are the caller's own: later steps do not change them."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1, transport=transport)
    envs.reset()
    with pytest.raises(RemoteEnvError) as caught:
        envs.step(np.array([-1, 1]))
    kept = np.array(caught.value.worker_results[1][0])
    envs.step(np.array([1, 1]))
    assert np.array_equal(caught.value.worker_results[1][0], kept)
    envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_results_with_a_class_from_main_come_back(transport):
    """Infos holding a class defined in `__main__` (a notebook cell) step on every transport."""
    note = _main_module_class()

    class NoteWrapper(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, _ = self.env.step(action)
            return obs, reward, terminated, truncated, {"note": note(int(obs[0]))}

    envs = GymnasiumVectorEnv(
        [lambda: NoteWrapper(FlakyEnv())] * 2, envs_per_worker=2, transport=transport
    )
    envs.reset()
    for expected in (1, 2):
        infos = envs.step(np.array([1, 1]))[4]
        assert [type(n).__name__ for n in infos["note"]] == ["Note", "Note"]
        assert [n.v for n in infos["note"]] == [expected, expected]
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=2, transport=transport)
    vec.set_attr("tag", [note(0), note(1)])  # and from the driver to the worker
    assert [t.v for t in vec.get_attr("tag")] == [0, 1]
    vec.close()
    envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_result_that_cannot_be_serialized_names_the_env(transport):
    """A lock in an info is a RemoteEnvError naming that env; the env goes on."""
    envs = GymnasiumVectorEnv([UnpicklableInfoEnv] * 2, envs_per_worker=1, transport=transport)
    envs.reset()
    with pytest.raises(RemoteEnvError, match=r"env 1 failed in `step`.*(pickle|serializ)"):
        envs.step(np.array([1, 2]))
    assert envs.step(np.array([1, 1]))[0][:, 0].tolist() == [2.0, 3.0]
    envs.close()


def test_over_pipes_the_env_whose_result_cannot_be_serialized_is_named():
    """With several envs in a worker, the pipe transport names the env whose info fails."""
    envs = GymnasiumVectorEnv([UnpicklableInfoEnv] * 3, envs_per_worker=3, transport="auto")
    envs.reset()
    with pytest.raises(
        RemoteEnvError,
        match=r"env 2 failed in `step`: TypeError: the result of `step` cannot be serialized",
    ) as info:
        envs.step(np.array([1, 1, 2]))
    assert info.value.env_indices == (2,)
    envs.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_env_method_runs_on_the_thread_that_built_the_env(transport):
    """Thread-bound envs (EGL, pygame, signal.alarm in step) work with every transport."""
    vec = RayVectorEnv.from_env_fns([ThreadBoundEnv] * 2, envs_per_worker=2, transport=transport)
    vec.reset()
    vec.step([1, 1])
    vec.call("render")
    envs = GymnasiumVectorEnv([ThreadBoundEnv] * 2, envs_per_worker=2, transport=transport)
    envs.reset(seed=0)
    envs.step(np.array([1, 1]))
    envs.render()
    envs.async_reset()
    envs.recv()
    envs.close()
    vec.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_driver_with_many_open_descriptors_steps(transport):
    """Descriptors numbered over 1024 in the driver do not break waiting (no `select`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"the descriptor limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1, transport=transport)
        envs.reset()
        assert envs.step(np.array([1, 1]))[0][:, 0].tolist() == [1.0, 1.0]
        envs.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("moment", ["between steps", "during a step"])
def test_a_worker_killed_is_named(transport, moment, tmp_path, caplog):
    """SIGKILL: EnvCrashedError names every env of the dead worker, idle or busy.

    It says plainly that the process is gone (not Ray's guesses of why), and how to go on;
    `close` does not ask the dead worker to close its envs, so it logs no failure.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    envs.reset()
    pid = worker_pids(envs)[1]
    if moment == "during a step":
        gate = Gate(str(tmp_path))  # (never opened: the worker is killed inside its step)
        envs.set_attr("gate", [None, None, str(gate), str(gate)])
        envs.step_async(np.array([1, 1, 1, 1]))
        gate.wait_entered()
    os.kill(pid, signal.SIGKILL)
    assert_killed(envs.remote_envs[1])
    finish = envs.step_wait if moment == "during a step" else lambda: envs.step(np.ones(4, int))
    with pytest.raises(EnvCrashedError, match=r"env 2 failed in `step` \(env\(s\) \[3\]") as info:
        finish()
    message = str(info.value)
    assert f"its worker process (pid {pid}) is gone: it ended without raising an error" in message
    assert "The worker of envs [2, 3], and their state, are gone" in message
    assert 'pass `on_actor_failure="restart"`' in message
    assert "OOM" not in message  # (Ray's guesses stay in `__cause__`)
    with pytest.raises(EnvCrashedError, match=r"its worker process \(pid \d+\) is gone"):
        envs.step(np.ones(4, int))  # (and again: the worker stays gone)
    with caplog.at_level(logging.WARNING, logger="ray_multiprocess_env"):
        envs.close()
    assert "failed `close`" not in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sb3_faces_agree_across_transports(transport):
    """SB3VecEnv gives DummyVecEnv's results over every transport."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from ray_multiprocess_env import SB3VecEnv

    ours = SB3VecEnv([_cartpole] * 4, envs_per_worker=2, transport=transport)
    reference = DummyVecEnv([_cartpole] * 4)
    ours.seed(1)
    reference.seed(1)
    np.testing.assert_array_equal(ours.reset(), reference.reset())
    for step in range(60):
        actions = np.array([(step + i) % 2 for i in range(4)])
        got, want = ours.step(actions), reference.step(actions)
        for a, b in zip(got[:3], want[:3], strict=True):
            np.testing.assert_array_equal(a, b)
    ours.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_int_subclass_from_a_cell_travels_as_an_action(transport):
    """Subclasses of plain types (an IntEnum defined in a cell) go through cloudpickle."""

    class Move(enum.IntEnum):
        STAY = 0
        UP = 1

    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=2, transport=transport)
    vec.reset()
    obs = vec.step([Move.UP, Move.UP])[0]
    assert [o.item() for o in obs] == [1.0, 1.0]
    vec.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_recv_keeps_the_good_answers_when_another_env_fails(transport):
    """An env error in `recv` leaves the other envs' finished results for the next `recv`."""
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=1, transport=transport)
    vec.async_reset()
    vec.recv()
    vec.send([1, -1], [0, 1])  # (`recv` waits for both: every env in flight)
    with pytest.raises(RemoteEnvError, match=r"env 1 failed in `recv`: ValueError: negative"):
        vec.recv()
    env_ids, (obs, *_) = vec.recv()
    assert env_ids == [0]
    assert obs[0].item() == 1.0
    vec.close()


def test_an_action_that_cannot_be_serialized_is_refused_before_sending():
    """Over pipes, unserializable arguments raise a TypeError naming the envs; nothing steps."""
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_worker=2, transport="auto")
    vec.reset()
    with pytest.raises(TypeError, match=r"arguments of `step` for env\(s\) \[2, 3\] cannot be"):
        vec.step([1, 1, threading.Lock(), 1])
    assert vec.get_attr("count") == (0, 0, 0, 0)
    vec.close()


def test_threaded_worker_options_are_refused():
    """`max_concurrency` or `concurrency_groups` would break the one env thread: ValueError."""
    with pytest.raises(ValueError, match=r"`actor_options` sets 'max_concurrency' = 4, but"):
        GymnasiumVectorEnv([FlakyEnv], actor_options={"max_concurrency": 4})
    with pytest.raises(ValueError, match=r"sets 'concurrency_groups'"):
        RayVectorEnv.from_env_fns([FlakyEnv], actor_options={"concurrency_groups": {"io": 2}})
