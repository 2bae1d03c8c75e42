"""Tianshou over `make_tianshou_vector_env`: every verb recovers from what a step can meet.

An env error, a timeout, a Ctrl-C or a late worker in a step of some envs (Tianshou's
``step(action, id)``), and in the asynchronous mode (``wait_num``): each call after it works,
and every error speaks of the verb the user called.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("tianshou")
from tianshou.algorithm.algorithm_base import Policy
from tianshou.data import Batch, Collector, VectorReplayBuffer

from ray_multiprocess_env import (
    ClosedEnvError,
    NoPendingCallError,
    PendingCallError,
    RemoteEnvError,
    TianshouVectorEnv,
)
from tests.envs import FlakyEnv, WalkEnv
from tests.envs_faults import RaisingEnv
from tests.interrupts import Gate


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


@pytest.mark.parametrize("ids", [None, [1, 0]])
def test_a_late_worker_is_replaced_even_when_the_timeout_is_shorter_than_a_start(ids):
    """`timeout=0.5` (less than a worker's start takes): the late worker is still replaced.

    The replacement gets as long as a first start to start (`timeout`, at least 30 s), and the
    call returns with env 0 reported as a lost episode, in a full step and in `step(action,
    id)`; the next call works.
    """
    envs = TianshouVectorEnv(
        [FlakyEnv] * 4, envs_per_worker=1, timeout=0.5, on_actor_failure="restart"
    )
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("delay", 60.0, id=[0])
        order = [0, 1, 2, 3] if ids is None else ids
        _, _, _, truncated, infos = envs.step(np.ones(len(order), dtype=np.int64), ids)
        assert truncated.tolist() == [env == 0 for env in order]
        assert [bool(info.get("env_crashed")) for info in infos] == [env == 0 for env in order]
        obs, *_ = envs.step(np.ones(len(order), dtype=np.int64), ids)
        assert obs[order.index(1), 0] == 2.0


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
