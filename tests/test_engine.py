"""The engine's own logic on the in-process transport: no Ray, workers on threads.

Restart decisions, late against dead workers, resumable timeouts, first-ready bookkeeping and
the one call state, each driven directly through the engine's verbs.
"""

from __future__ import annotations

import contextlib
import functools
import time

import gymnasium as gym
import numpy as np
import pytest

from ray_multiprocess_env import ClosedEnvError, EnvCrashedError, RemoteEnvError
from ray_multiprocess_env._engine import Engine, Options
from ray_multiprocess_env._engine.call_state import State
from ray_multiprocess_env._engine.seeds import restart_seed
from ray_multiprocess_env._engine.transports.in_process import InProcessLauncher
from ray_multiprocess_env.errors import NoPendingCallError, PendingCallError
from tests.envs import DictObsEnv, FlakyEnv
from tests.helpers import assert_same


def _engine(env_fns, per_worker=2, info_layout="batched", **options):
    """An engine over in-process workers."""
    made = Options.make(options)
    launcher = InProcessLauncher(made.worker_args(info_layout))
    return Engine.start(
        env_fns,
        per_worker,
        made,
        name="TestVec",
        info_layout=info_layout,
        launcher=launcher,
    )


def _workers(engine):
    """Every in-process worker the engine started (replacements included), to kill them."""
    return engine._pool.launcher.started


def _counts(batch):
    return batch.observations[:, 0].tolist()


def test_batches_equal_sync_vector_env_with_infos():
    """Whole batches (observations, rewards, flags, batched infos) equal SyncVectorEnv's."""
    fns = [functools.partial(DictObsEnv, max_steps=5)] * 5
    engine = _engine(fns, per_worker=2)
    reference = gym.vector.SyncVectorEnv(fns)
    with contextlib.closing(engine):
        batch = engine.reset([3 + i for i in range(5)])
        obs, infos = reference.reset(seed=3)
        np.testing.assert_array_equal(batch.observations["position"], obs["position"])
        assert_same(batch.infos, infos)
        rng = np.random.default_rng(0)
        for _ in range(12):
            actions = rng.integers(0, 3, 5)
            engine.step_async(actions)
            batch = engine.step_wait()
            want = reference.step(actions)
            np.testing.assert_array_equal(batch.observations["steps"], want[0]["steps"])
            for mine, theirs in zip(batch.arrays(), want[1:4], strict=True):
                np.testing.assert_array_equal(mine, theirs)
            assert_same(batch.infos, want[4])


def test_a_dead_worker_raises_naming_its_envs():
    """on_actor_failure='raise': a killed worker's envs are named in EnvCrashedError."""
    engine = _engine([FlakyEnv] * 4)
    with contextlib.closing(engine):
        engine.reset([None] * 4)
        _workers(engine)[1].kill()
        engine.step_async(np.ones(4, dtype=np.int64))
        with pytest.raises(EnvCrashedError, match=r"env 2 failed in `step` \(env\(s\) \[3\]"):
            engine.step_wait()


def test_a_dead_worker_is_restarted_with_derived_seeds_and_reports_lost_episodes():
    """on_actor_failure='restart': the step goes on; lost envs are truncated, then step on."""
    engine = _engine([FlakyEnv] * 4, on_actor_failure="restart")
    with contextlib.closing(engine):
        engine.reset([10, 11, 12, 13])
        engine.step_async(np.ones(4, dtype=np.int64))
        before = _counts(engine.step_wait())
        _workers(engine)[0].kill()
        engine.step_async(np.ones(4, dtype=np.int64))
        batch = engine.step_wait()
        assert batch.truncations.tolist() == [True, True, False, False]
        assert batch.infos["env_crashed"].tolist() == [True, True, False, False]
        assert _counts(batch)[2:] == [c + 1 for c in before[2:]]
        expected = [FlakyEnv().reset(seed=restart_seed(s, 1))[0].item() for s in (10, 11)]
        assert _counts(batch)[:2] == expected
        assert len(_workers(engine)) == 3  # one replacement


def test_late_against_dead_and_resumable_timeouts():
    """A shorter step_wait timeout only raises (resumable); the env's own timeout restarts."""
    engine = _engine([FlakyEnv] * 2, per_worker=1, timeout=1.0, on_actor_failure="restart")
    with contextlib.closing(engine):
        engine.reset([None, None])
        engine.call("set_attr", [("delay", 0.0), ("delay", 0.4)])
        engine.step_async(np.ones(2, dtype=np.int64))
        with pytest.raises(TimeoutError, match=r"env\(s\) \[1\] did not answer\. The envs"):
            engine.step_wait(timeout=0.1)
        assert engine._state.state is State.WAITING_STEP  # still pending: wait again
        assert _counts(engine.step_wait()) == [1.0, 1.0]
        assert len(_workers(engine)) == 2  # late but not past `timeout`: no restart
        engine.call("set_attr", [("delay", 0.0), ("delay", 30.0)])
        engine.step_async(np.ones(2, dtype=np.int64))
        batch = engine.step_wait()  # the vector env's own timeout: the late worker restarts
        assert batch.truncations.tolist() == [False, True]
        assert len(_workers(engine)) == 3


def test_without_restart_a_late_worker_raises_and_keeps_its_answers():
    """A late worker without restart: TimeoutError naming it; the call stays waitable."""
    engine = _engine([FlakyEnv] * 2, per_worker=1, timeout=0.3)
    with contextlib.closing(engine):
        engine.reset([None, None])
        engine.call("set_attr", [("delay", 0.0), ("delay", 0.6)])
        engine.step_async(np.ones(2, dtype=np.int64))
        with pytest.raises(TimeoutError, match=r"timed out after 0.3 s: env\(s\) \[1\]"):
            engine.step_wait()
        assert _counts(engine.step_wait(timeout=5)) == [1.0, 1.0]


def test_first_ready_returns_the_first_envs_and_keeps_the_rest_in_flight():
    """Recv returns what finished first; busy envs are refused; a timeout keeps them out."""
    engine = _engine([FlakyEnv] * 3, per_worker=1)
    with contextlib.closing(engine):
        engine.reset([None] * 3)
        engine.call("set_attr", [("delay", 0.0), ("delay", 0.5), ("delay", 0.0)])
        engine.send(np.ones(3, dtype=np.int64), [0, 1, 2])
        assert engine._state.state is State.IN_FLIGHT
        with pytest.raises(ValueError, match=r"env 1 already has a call in flight"):
            engine.send(np.ones(1, dtype=np.int64), [1])
        first = engine.recv(batch_size=2)
        assert first.env_ids.tolist() == [0, 2]
        assert _counts(first) == [1.0, 1.0]
        with pytest.raises(TimeoutError, match=r"`recv` timed out after 0.05 s: env\(s\) \[1\]"):
            engine.recv(timeout=0.05)
        last = engine.recv(timeout=5)
        assert last.env_ids.tolist() == [1]
        assert engine._state.state is State.IDLE
        with pytest.raises(NoPendingCallError, match=r"nothing in flight"):
            engine.recv()


def test_an_env_error_in_recv_keeps_the_good_answers_for_the_next_recv():
    """An env that raises in first-ready: named; the others' results come with the next recv."""
    engine = _engine([FlakyEnv] * 2, per_worker=1)
    with contextlib.closing(engine):
        engine.reset([None, None])
        engine.send(np.array([1, -1]), [0, 1])  # (`recv` waits for both: all in flight)
        with pytest.raises(RemoteEnvError, match=r"env 1 failed in `recv`: ValueError: negative"):
            engine.recv()
        batch = engine.recv()
        assert batch.env_ids.tolist() == [0]
        assert _counts(batch) == [1.0]


def test_a_masked_reset_after_first_ready_steps_returns_the_latest_rows():
    """The batch is the latest of every env, whichever verb ran last (issue #23's first bug)."""
    engine = _engine([FlakyEnv] * 4, per_worker=2)
    with contextlib.closing(engine):
        engine.reset([None] * 4)
        for _ in range(3):
            engine.send(np.ones(2, dtype=np.int64), [0, 2])
            engine.recv()
        batch = engine.reset(None, None, np.array([False, True, False, True]))
        assert _counts(batch) == [3.0, 0.0, 3.0, 0.0]


def test_the_call_state_refuses_what_gymnasium_refuses():
    """One state: a pending step refuses other calls; closed refuses all; close is idempotent."""
    engine = _engine([FlakyEnv] * 2)
    engine.reset([None, None])
    engine.step_async(np.ones(2, dtype=np.int64))
    for call in (
        lambda: engine.reset(),
        lambda: engine.send(np.ones(1, dtype=np.int64), [0]),
        lambda: engine.call("get_attr", [("count",), ("count",)]),
    ):
        with pytest.raises(PendingCallError, match=r"while a `step_async` is pending"):
            call()
    engine.step_wait()
    with pytest.raises(NoPendingCallError):
        engine.step_wait()
    engine.close()
    engine.close()
    with pytest.raises(ClosedEnvError, match=r"`reset` was called on a closed TestVec"):
        engine.reset()


def test_the_per_env_info_layout_gives_one_dict_per_env():
    """SB3's and pfrl's layout: each env's own info dict, for resets and steps."""
    engine = _engine([functools.partial(DictObsEnv, max_steps=2)] * 3, info_layout="per_env")
    with contextlib.closing(engine):
        batch = engine.reset([0, 1, 2])
        assert [sorted(info) for info in batch.infos] == [["start"]] * 3
        engine.step_async(np.zeros(3, dtype=np.int64))
        infos = engine.step_wait().infos
        assert all("distance" in info for info in infos)


class _SlowCallEnv(FlakyEnv):
    def slow(self) -> int:
        time.sleep(3.0)
        return 1


def test_a_replacement_given_up_is_restarted_by_the_next_call_whatever_its_tickets():
    """A replacement killed for not answering in time is restarted by the next call.

    Even when that call's ticket is older than the replacement (a `send` before the death).
    """
    engine = _engine([_SlowCallEnv] * 2, 2, timeout=1.0, on_actor_failure="restart")
    with contextlib.closing(engine):
        engine.reset([None, None])
        _workers(engine)[0].kill()
        engine.send(np.array([1]), [0])  # in flight to the dead worker
        with pytest.raises(EnvCrashedError, match="did not answer"):  # restarted, then too slow
            engine.call("call", [None, ("slow",)], in_flight_ok=True)
        batch = engine.recv()  # restarts it again
        assert batch.env_ids.tolist() == [0]
        assert batch.truncations.tolist() == [True]  # the lost episode, reported
        assert len(_workers(engine)) == 3


def test_a_worker_whose_factory_raises_answers_every_call_with_it_and_closes_the_rest():
    """`EnvWorker` keeps a factory's error (its constructor does not raise) for every call.

    Ray prints the traceback of an actor whose constructor raised on the driver's console;
    the worker instead answers its first call with the error (`start_error`), and the envs it
    built before the one that failed are closed.
    """
    from ray_multiprocess_env._worker.env_worker import EnvWorker

    closed: list[bool] = []

    class Recorded(FlakyEnv):
        def close(self) -> None:
            closed.append(True)

    def broken() -> FlakyEnv:
        raise OSError("no display")

    worker = EnvWorker([Recorded, broken], [4, 5])
    assert isinstance(worker.start_error, RuntimeError)
    assert str(worker.start_error) == "env 5: its factory raised OSError: no display"
    assert isinstance(worker.start_error.__cause__, OSError)
    assert closed == [True]
    for op, args in (("node_id", ()), ("reset", ([None] * 2, None, None))):
        with pytest.raises(RuntimeError, match="env 5: its factory raised OSError"):
            worker.handle(op, args)
