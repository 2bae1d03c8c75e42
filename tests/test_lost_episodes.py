"""A lost-episode report belongs to the env: it survives every error, interrupt or failed restart.

A restarted worker's envs report their lost episode as truncated (``env_crashed``) at their
next step, and an env rebuilt after it raised (``env_error``) at the step that rebuilt it. When
the call that carried that report never reaches the user (another env raised, a second restart
failed, Ctrl-C in the wait for the replacement or for another env), the next step reports it:
once, whether or not the trainer reads a failed step's ``error.results``.
"""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
import pytest

from ray_multiprocess_env import GymnasiumVectorEnv, RemoteEnvError, TianshouVectorEnv
from ray_multiprocess_env._engine.call_state import CallState, State, hand_out
from ray_multiprocess_env._engine.calls import Calls
from ray_multiprocess_env._engine.engine import Engine
from ray_multiprocess_env._engine.failures import Failures
from ray_multiprocess_env._engine.lost_episodes import LostEpisodes
from ray_multiprocess_env._engine.transports.base import Outcome, Ticket
from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv as GymFace
from tests.envs import FlakyEnv
from tests.envs_faults import DyingEnv, FaultyShiftingEnv, env_failing_once_flagged
from tests.interrupts import Gate, interrupt_at_line, line_of, lines_of

ALIVE = -100  # (a `DyingEnv`'s `taken` that never reaches its death)


@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_a_report_survives_another_envs_error_in_the_same_step(transport):
    """Worker 0 dies while env 2 raises: the step raises; the next one reports envs 0 and 1.

    The error's `results` show the reports as pending, not as episode ends: a trainer that
    reads them and one that does not each count every lost episode once.
    """
    envs = GymnasiumVectorEnv(
        [DyingEnv] * 4, envs_per_worker=2, on_actor_failure="restart", transport=transport
    )
    with contextlib.closing(envs):
        envs.reset(seed=0)
        envs.set_attr("taken", [1, ALIVE, ALIVE, ALIVE])  # worker 0 dies at its next step
        with pytest.raises(RemoteEnvError, match=r"env 2 failed in `step`") as caught:
            envs.step(np.array([1, 1, -1, 1]))  # (env 2 raises on a negative action)
        _, _, terminated, truncated, infos = caught.value.results
        assert infos["lost_episode_pending"].tolist() == [True, True, False, False]
        assert infos["env_error"].tolist() == [False, False, True, False]
        assert "env_crashed" not in infos
        ended_in_results = terminated | truncated
        assert not ended_in_results.any()
        _, _, _, truncated, infos = envs.step(np.array([1, 1, 1, 1]))
        assert truncated.tolist() == [True, True, False, False]
        assert infos["env_crashed"].tolist() == [True, True, False, False]
        ended = ended_in_results.astype(int) + truncated  # (a trainer reading `results` too)
        assert ended.tolist() == [1, 1, 0, 0]
        _, _, _, truncated, _ = envs.step(np.array([1, 1, 1, 1]))
        assert not truncated.any()  # reported once, then the envs step again


@pytest.mark.parametrize("transport", ["auto", "tcp", "ray"])
def test_an_env_error_report_survives_ctrl_c_while_another_env_steps(tmp_path, transport):
    """Env 0 is rebuilt while env 2 is inside its step, and Ctrl-C lands: env 0 reports later.

    Its next step is its lost episode's end (truncated, with the error's text), reported once.
    """
    envs = GymnasiumVectorEnv(
        [FaultyShiftingEnv] * 4, envs_per_worker=2, on_env_error="restart", transport=transport
    )
    gate = Gate(str(tmp_path))
    with contextlib.closing(envs):
        envs.reset(seed=0)
        envs.set_attr("gate", [None, None, str(gate), None])
        with pytest.raises(KeyboardInterrupt), gate.interrupt_when_entered(1):
            envs.step(np.array([2, 0, 0, 0]))  # (action 2: env 0 raises, and is rebuilt)
        gate.open()
        _, rewards, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert truncated.tolist() == [True, False, False, False]
        assert infos["_env_error"].tolist() == [True, False, False, False]
        assert infos["env_error"][0] == "ValueError: boom at t=0"
        assert rewards[0] == 0.0
        envs.step(np.zeros(4, dtype=np.int64))  # (env 0's autoreset step)
        _, _, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert not truncated[0]
        assert "env_error" not in infos  # reported once


@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_an_env_error_report_survives_ctrl_c_at_any_line_after_the_steps_block(transport):
    """Ctrl-C at each line of a step from its guarded block's end to the hand-out: env 0 reports.

    Env 0 raises and is rebuilt in the step; its report (``env_error``, off the info columns)
    sends the step to the failures branch, which waits for it, judges it and hands it out.
    Wherever the Ctrl-C lands, the step's results or the next step's carry the report, once.
    """
    envs = GymnasiumVectorEnv(
        [FaultyShiftingEnv] * 4, envs_per_worker=2, on_env_error="restart", transport=transport
    )
    zeros = np.zeros(4, dtype=np.int64)
    code = [Engine._wait_slow, Engine._made, Calls.wait]
    rounds = [(Engine.step, line_of(Engine.step, "return self._wait_slow"))]
    rounds += [(function, line) for function in code for line in lines_of(function)]
    with contextlib.closing(envs):
        envs.reset(seed=0)
        fired_in = 0
        for function, line in rounds:
            fired = []
            try:
                with interrupt_at_line(function, line, within=[Engine.step]) as fired:
                    out = envs.step(np.array([2, 0, 0, 0]))  # (env 0 raises, and is rebuilt)
            except KeyboardInterrupt:
                out = envs.step(zeros)
            fired_in += bool(fired)
            truncated, infos = out[3], out[4]
            assert truncated.tolist() == [True, False, False, False], (function, line)
            assert infos["_env_error"].tolist() == [True, False, False, False], (function, line)
            envs.step(zeros)  # (env 0's autoreset step)
            assert "env_error" not in envs.step(zeros)[4], (function, line)  # (reported once)
        assert fired_in > 10  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_an_env_error_report_survives_a_step_that_fails_for_another_env(transport):
    """Env 0 is rebuilt in the step where env 2's rebuilds are spent: env 0 reports later.

    The error's `results` keep env 0's report pending (``lost_episode_pending``) and name the
    env that failed in ``env_error``; the next step reports env 0's end with its text, once.
    """
    envs = GymnasiumVectorEnv(
        [FaultyShiftingEnv] * 4,
        envs_per_worker=2,
        on_env_error="restart",
        max_restarts=1,
        transport=transport,
    )
    with contextlib.closing(envs):
        envs.reset(seed=0)
        envs.step(np.array([0, 0, 2, 0]))  # env 2 is rebuilt once: its budget is spent
        envs.step(np.zeros(4, dtype=np.int64))  # (env 2's autoreset step)
        with pytest.raises(RemoteEnvError, match=r"env 2 failed in `step`") as caught:
            envs.step(np.array([2, 0, 2, 0]))
        assert "max_restarts=1" in str(caught.value)
        _, _, terminated, truncated, infos = caught.value.results
        assert not (terminated | truncated).any()
        assert infos["lost_episode_pending"].tolist() == [True, False, False, False]
        assert infos["env_error"].tolist() == [False, False, True, False]
        _, _, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert truncated.tolist() == [True, False, False, False]
        assert infos["env_error"][0] == "ValueError: boom at t=2"
        envs.step(np.zeros(4, dtype=np.int64))  # (env 0's autoreset step)
        _, _, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert not truncated[0]
        assert "env_error" not in infos  # reported once


def test_a_report_survives_an_env_error_in_a_tianshou_subset_step():
    """Tianshou `step(action, id)`: the report of a worker lost beside an env error survives."""
    envs = TianshouVectorEnv([DyingEnv] * 4, envs_per_worker=2, on_actor_failure="restart")
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("taken", ALIVE)
        envs.set_env_attr("taken", 1, id=[1])  # worker 0 dies at env 1's next step
        with pytest.raises(RemoteEnvError, match=r"env 3 failed in `step`"):
            envs.step(np.array([1, -1]), [1, 3])
        _, _, _, truncated, infos = envs.step(np.array([1, 1, 1]), [0, 1, 2])
        assert truncated.tolist() == [True, True, False]
        assert [bool(info.get("env_crashed")) for info in infos] == [True, True, False]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_report_survives_a_second_restart_that_fails(tmp_path, transport):
    """Two workers die; the second cannot be replaced: the first's envs still report later.

    (Over the TCP stream, a step to the worker given up on once failed to be encoded.)
    """
    flag = str(tmp_path / "no-replacement")
    fns = [functools.partial(env_failing_once_flagged, flag, (2, 3), i) for i in range(6)]
    envs = GymnasiumVectorEnv(
        fns, envs_per_worker=2, on_actor_failure="restart", timeout=20, transport=transport
    )
    with contextlib.closing(envs):
        envs.reset(seed=0)
        envs.set_attr("taken", [1, ALIVE, 1, ALIVE, ALIVE, ALIVE])  # workers 0 and 1 die
        open(flag, "w").close()  # worker 1's envs cannot be built again
        with pytest.raises(RemoteEnvError, match=r"env 2"):
            envs.step(np.ones(6, dtype=np.int64))
        os.remove(flag)
        _, _, _, truncated, infos = envs.step(np.ones(6, dtype=np.int64))
        assert truncated.tolist() == [True, True, True, True, False, False]
        assert infos["env_crashed"].tolist() == [True, True, True, True, False, False]


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment",
    ["pool.restart(", "retries.append(retry)", "wait_tickets(retries", "failed: list[Ticket] = []"],
)
def test_a_report_survives_ctrl_c_while_the_replacement_answers(moment):
    """Ctrl-C before the restart, once it is sent, in the wait, once it answered: no loss."""
    envs = GymnasiumVectorEnv([DyingEnv] * 4, envs_per_worker=2, on_actor_failure="restart")
    with contextlib.closing(envs):
        envs.reset(seed=0)
        envs.set_attr("taken", [1, ALIVE, ALIVE, ALIVE])  # worker 0 dies at its next step
        fired = []
        with pytest.raises(KeyboardInterrupt):
            with interrupt_at_line(Failures._replace, line_of(Failures._replace, moment)) as fired:
                envs.step(np.array([1, 1, 1, 1]))
        assert fired
        _, _, _, truncated, infos = envs.step(np.array([1, 1, 1, 1]))
        assert truncated.tolist() == [True, True, False, False]
        assert infos["env_crashed"].tolist() == [True, True, False, False]


@pytest.mark.long
def test_a_report_survives_ctrl_c_at_any_line_of_a_restart():
    """Ctrl-C at each line of `_replace` (restart, resend, wait): the next step has the report."""
    envs = GymnasiumVectorEnv([DyingEnv] * 4, envs_per_worker=2, on_actor_failure="restart")
    with contextlib.closing(envs):
        envs.reset(seed=0)
        fired_in = 0
        for line in lines_of(Failures._replace):
            envs.set_attr("taken", [1, ALIVE, ALIVE, ALIVE])  # worker 0 dies at its next step
            fired, result = [], None
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(Failures._replace, line) as fired:
                    result = envs.step(np.array([1, 1, 1, 1]))
            fired_in += bool(fired)
            if result is None:  # (interrupted: the next step reports the lost episodes)
                result = envs.step(np.array([1, 1, 1, 1]))
            _, _, _, truncated, infos = result
            assert truncated.tolist() == [True, True, False, False], line
            assert infos["env_crashed"].tolist() == [True, True, False, False], line
            envs.step(np.array([1, 1, 1, 1]))  # (the autoreset step after the report)
        assert fired_in > 10  # (a few lines are for late workers and failed restarts only)


@pytest.mark.slow
def test_a_report_survives_ctrl_c_while_the_face_makes_its_results():
    """Ctrl-C at each line of the gymnasium face's results: the next step has the report."""
    envs = GymnasiumVectorEnv([DyingEnv] * 4, envs_per_worker=2, on_actor_failure="restart")
    with contextlib.closing(envs):
        envs.reset(seed=0)
        for line in lines_of(GymFace._results):
            envs.set_attr("taken", [1, ALIVE, ALIVE, ALIVE])  # worker 0 dies at its next step
            fired = []
            with pytest.raises(KeyboardInterrupt):
                with interrupt_at_line(GymFace._results, line) as fired:
                    envs.step(np.array([1, 1, 1, 1]))
            assert fired
            _, _, _, truncated, infos = envs.step(np.array([1, 1, 1, 1]))
            assert truncated.tolist() == [True, True, False, False], line
            assert infos["env_crashed"].tolist() == [True, True, False, False], line
            envs.step(np.array([1, 1, 1, 1]))  # (the autoreset step after the report)


def test_a_report_is_owed_until_the_replacement_itself_answers():
    """An answer of the lost worker itself (an older generation) does not settle a report."""
    lost = LostEpisodes(4)
    lost.owe(range(0, 2), generation=1)
    old, new = Ticket(0, 0, "step", (None, None), (0,)), Ticket(0, 1, "step", (None, None), (1,))
    lost.deliver(tickets=[old, new])
    assert [lost.is_owed(env) for env in range(4)] == [True, False, False, False]
    before = lost.deliver([0])
    assert not lost.any
    lost.restore(before)  # (the call did not reach the user after all)
    assert lost.is_owed(0)
    assert lost.any


def test_hand_out_puts_results_back_on_ctrl_c_only():
    """Ctrl-C while results are handed out: back in flight; a face's own error: taken out."""
    state, lost = CallState("Vec"), LostEpisodes(2)
    ticket = Ticket(0, 0, "step", (None, None), (0, 1))
    ticket.outcome = Outcome(True, None)
    state.put_in_flight([ticket])

    def raising(error):
        def make():
            raise error

        return make

    with pytest.raises(KeyboardInterrupt):
        hand_out(state, lost, [ticket], None, raising(KeyboardInterrupt()))
    assert state.busy_envs() == [0, 1]
    with pytest.raises(TypeError, match="refused"):
        hand_out(state, lost, [ticket], None, raising(TypeError("refused")))
    assert state.busy_envs() == []
    assert state.state is State.IDLE
    assert [lost.is_owed(env) for env in range(2)] == [True, True]  # (what they carried)


def _raising(error: BaseException):
    def finish(batch):
        raise error

    return finish


def test_recv_on_the_lanes_puts_results_back_on_ctrl_c_and_owes_a_refused_batch():
    """A Ctrl-C in `recv`'s hand-out on the lanes puts every result back; a refusal owes them.

    `recv` reads and hands out in one block. A face's own error takes the results out, their
    envs owing what they carried; the next `send` and `recv` work, and deliver that.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport="auto")
    with contextlib.closing(envs):
        engine = envs._engine  # (private: the engine's `recv` with a `finish` that raises)
        lost = engine._pool.lost_episodes
        envs.reset(seed=0)
        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
        with pytest.raises(KeyboardInterrupt):
            engine.recv(None, None, _raising(KeyboardInterrupt()))
        assert engine.busy_envs() == [0, 1, 2, 3]
        with pytest.raises(TypeError, match="refused"):
            engine.recv(None, None, _raising(TypeError("refused")))
        assert engine.busy_envs() == []
        assert [lost.is_owed(env) for env in range(4)] == [True] * 4
        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
        infos = envs.recv()[4]
        assert sorted(infos["env_id"].tolist()) == [0, 1, 2, 3]
        assert not lost.any  # (delivered: the next step goes on the lanes again)
