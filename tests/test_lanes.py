"""Steps and resets, synchronous and first-ready, on the lanes, and where the failures take over.

A step on the lanes sends each doorbell with its ticket waiting, as a pickled call (a reset's)
does, and the lanes' read settles it with the record. These are the moments when a reply could
be read by one reader and lost to the call that waits for it, or a call could wait for an
answer to a message not all written: a worker that answered and then died while the other
still steps, a verb that reads the workers' pipes while a `step_async` is pending or
first-ready steps or resets are out, a TCP doorbell whose action rows the socket takes only
part of, a reset that times out (as a synchronous call, or in a first-ready `recv`) or whose
worker dies in it, a late answer read as a step's. Each must give the call's own results, as
Ray calls would. And once a worker is replaced, the steps must go on the lanes again, over its
new transport.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading

import numpy as np
import pytest

from ray_multiprocess_env import GymnasiumVectorEnv, RayVectorEnv, TianshouVectorEnv
from ray_multiprocess_env._engine.first_ready import FirstReadyVerbs
from ray_multiprocess_env._engine.lanes import Lane, Lanes
from ray_multiprocess_env._engine.transports.base import method_of
from ray_multiprocess_env._engine.transports.channel import ChannelTransport
from tests.envs import BigActionEnv, FlakyEnv, OddInfoEnv
from tests.helpers import answer_waits, assert_killed, transport_kinds, worker_pids
from tests.interrupts import Gate

LANE_TRANSPORTS = ["auto", "pipe", "tcp"]
_KINDS = {"auto": "shared_memory", "pipe": "pipe", "tcp": "tcp"}  # (each one's `transport_kinds`)


def _spy_reads(monkeypatch, of_recv):
    """``(op of the first ticket, whether it read enough)`` of each `Lanes.read`, in order.

    Of a first-ready `recv`'s reads (`of_recv`: `wanted` given) or of the others' (every answer
    of a call: a step's, or a reset's).
    """
    read, seen = Lanes.read, []

    def spy(self, tickets, wanted, deadline):
        went = read(self, tickets, wanted, deadline)
        if (wanted is not None) == of_recv:
            seen.append((tickets[0].op, went))
        return went

    monkeypatch.setattr(Lanes, "read", spy)
    return seen


@pytest.fixture
def roads(monkeypatch):
    """``(op, whether it ended on the lanes)`` of each call read on the lanes, in order."""
    return _spy_reads(monkeypatch, of_recv=False)


@pytest.fixture
def lane_sends(monkeypatch):
    """``(op, whether the lanes sent it)`` of each first-ready `send`."""
    seen, rung = [], []
    send, ring = FirstReadyVerbs.send, Lane.ring

    def ring_spy(self, actions):
        rung.append(self.worker)
        return ring(self, actions)

    def send_spy(self, *args):
        rung.clear()
        send(self, *args)
        seen.append(("step", bool(rung)))

    monkeypatch.setattr(Lane, "ring", ring_spy)
    monkeypatch.setattr(FirstReadyVerbs, "send", send_spy)
    return seen


@pytest.fixture
def recv_reads(monkeypatch):
    """``(op, whether it read enough)`` of each first-ready `recv`'s read on the lanes.

    (False leaves the `recv` to the failures branch.)
    """
    return _spy_reads(monkeypatch, of_recv=True)


def _in_flight(envs):
    """``(worker, env method, whether answered)`` of each first-ready call in flight (private)."""
    return [(t.worker, method_of(t), t.outcome is not None) for t in envs._engine._state.in_flight]


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_worker_that_answered_and_then_died_leaves_the_step_its_results(transport, tmp_path):
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=60)
    with contextlib.closing(envs):
        envs.reset()
        pid = worker_pids(envs)[0]
        gate = Gate(str(tmp_path))
        envs.set_attr("gate", [None, None, str(gate), str(gate)])
        envs.step_async(np.ones(4, dtype=np.int64))
        gate.wait_entered()  # worker 1 is inside its step
        assert answer_waits(envs, 0)  # worker 0 answered
        os.kill(pid, signal.SIGKILL)
        assert_killed(envs.remote_envs[0])
        gate.open()
        obs = envs.step_wait()[0]  # (its pipe ends after the answer: that answer counts)
        assert obs[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_verb_that_reads_the_pipes_while_a_step_is_pending_leaves_it_its_replies(
    transport, tmp_path
):
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=60)
    with contextlib.closing(envs):
        envs.reset()
        gate = Gate(str(tmp_path))
        envs.set_attr("gate", [None, None, str(gate), str(gate)])
        envs.step_async(np.ones(4, dtype=np.int64))
        gate.wait_entered()
        assert answer_waits(envs, 0)  # worker 0's answer waits in its pipe
        gate.open()
        pids = worker_pids(envs)  # reads both pipes: the answers behind it too
        assert len(pids) == 2
        obs = envs.step_wait()[0]
        assert obs[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0]
        envs.set_attr("gate", [None] * 4)
        assert envs.step(np.ones(4, dtype=np.int64))[0][:, 0].tolist() == [2.0] * 4


@pytest.mark.parametrize("verb", ["run_on_workers", "call"])
@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_verb_that_reads_the_pipes_while_sends_are_out_leaves_them_their_replies(
    transport, verb, lane_sends
):
    """The answers to a `send` on the lanes, read by another verb, still come to `recv`.

    A verb that reads the pipes before the `recv` (one allowed beside first-ready calls, as
    pfrl's and Tianshou's faces call them) settles the tickets waiting for those answers, and
    `recv` hands them out (it would wait for them forever if the answers were dropped).
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=60)
    with contextlib.closing(envs):
        envs.reset()
        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
        assert lane_sends == [("step", True)]
        assert answer_waits(envs, 0)  # both answers wait in the pipes
        assert answer_waits(envs, 1)
        if verb == "run_on_workers":
            assert len(worker_pids(envs)) == 2
        else:
            counts = envs._engine.call("get_attr", [("count",)] * 4, in_flight_ok=True)
            assert counts == [1, 1, 1, 1]
        assert _in_flight(envs) == [(0, "step", True), (1, "step", True)]  # (read, settled)
        obs, *_, infos = envs.recv(timeout=10)
        assert infos["env_id"].tolist() == [0, 1, 2, 3]
        assert obs[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0]
        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
        assert envs.recv(timeout=10)[0][:, 0].tolist() == [2.0] * 4


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_after_a_restart_the_full_step_goes_on_the_lanes_again(transport, monkeypatch):
    """A restarted worker's new transport gets a lane: the steps do not stay on the slow path.

    The lanes keep each worker's transport of when they were made; that of a worker that was
    replaced is closed and can no longer ring. Results alone cannot tell (the slow path gives
    the same), so each step's road is read where the lanes hand it back.
    """
    plan, rung = Lanes.rung, []

    def spy(self, actions, env_ids):
        made = plan(self, actions, env_ids)  # (None: not the lanes', the step goes slow)
        rung.append(made is not None)
        return made

    monkeypatch.setattr(Lanes, "rung", spy)
    envs = GymnasiumVectorEnv(
        [FlakyEnv] * 4,
        envs_per_worker=2,
        transport=transport,
        on_actor_failure="restart",
        timeout=60,
    )
    ones = np.ones(4, dtype=np.int64)
    with contextlib.closing(envs):
        envs.reset()
        envs.step(ones)
        assert rung == [True]
        os.kill(worker_pids(envs)[0], signal.SIGKILL)
        assert_killed(envs.remote_envs[0])
        truncated, infos = envs.step(ones)[3:]  # (restarts it within the call)
        assert truncated.tolist() == [True, True, False, False]
        assert "env_crashed" in infos
        rung.clear()
        envs.step(ones)  # (may take the slow path: it reads the workers' replies to the new
        # info column, `env_crashed`'s, which the restart's step shared with them)
        obs = envs.step(ones)[0]
        assert rung[-1], "steps after the restart stay on the slow path"
        assert obs[:, 0].tolist() == [1.0, 1.0, 4.0, 4.0]  # (its first step was an autoreset)
        assert transport_kinds(envs) == [_KINDS[transport]] * 2


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_resets_and_steps_of_some_workers_on_the_lanes_give_the_ray_calls_results(transport, roads):
    """A reset (of all envs, or some) read as records, and a step of whole workers' envs rung.

    Their results are those of Ray calls (no lanes), whatever order the workers come in and
    whichever info columns each worker wrote (worker 2's envs have ``odd``, worker 0's not).
    """
    results, made = {}, 0
    for kind in (transport, "ray"):
        envs = TianshouVectorEnv([OddInfoEnv] * 6, envs_per_worker=2, transport=kind)
        with contextlib.closing(envs):
            got: list = [envs.reset(seed=5)[0], envs.reset([3, 2])[0]]
            envs.reset()
            envs.step(np.array([1, 1, 0, 0, 1, 1]))  # (the column of ``odd`` is made)
            made = made or len(roads)
            obs, _, _, _, infos = envs.step(np.array([0, 0, 1, 1]), [4, 5, 0, 1])
            results[kind] = [*got, obs, [dict(info) for info in infos]]
    assert roads[:2] == [("reset", True), ("reset", True)]
    assert roads[made:] == [("step", True)]  # (the Ray calls' have no lanes)
    for ours, theirs in zip(results[transport], results["ray"], strict=True):
        np.testing.assert_equal(ours, theirs)
    marked = [{"env_id": env, "odd": 1} for env in (4, 5)]
    assert results["ray"][-1] == [*marked, {"env_id": 0}, {"env_id": 1}]


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_step_of_some_of_each_workers_envs_is_read_on_the_lanes_as_ray_calls_give(
    transport, roads
):
    """Envs 5, 0 and 3 (one of each worker's two): sent as a pickled call, read on the lanes.

    Their results are those of Ray calls (no lanes), in the order asked. Envs 5 and 3 have
    ``odd`` in their info, an info dict per env that the worker keys by the env's place among
    its own envs: the lanes find the env from its worker's first env (3 is worker 1's second).
    """
    results = {}
    for kind in (transport, "ray"):
        envs = TianshouVectorEnv([OddInfoEnv] * 6, envs_per_worker=2, transport=kind)
        with contextlib.closing(envs):
            envs.reset()
            seen = len(roads)
            obs, rewards, _, _, infos = envs.step(np.array([1, 2, 1]), [5, 0, 3])
            results[kind] = [obs, rewards, [dict(info) for info in infos]]
            assert roads[seen:] == ([("step", True)] if kind == transport else [])
    for ours, theirs in zip(results[transport], results["ray"], strict=True):
        np.testing.assert_equal(ours, theirs)
    assert results["ray"][-1] == [{"env_id": 5, "odd": 1}, {"env_id": 0}, {"env_id": 3, "odd": 1}]


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_step_of_some_workers_that_times_out_on_the_lanes_leaves_every_call_usable(
    transport, tmp_path
):
    """Whole workers' envs, one late at a shut gate: the slow path's `TimeoutError` names them."""
    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=3.0)
    gate = Gate(str(tmp_path))
    with contextlib.closing(envs):
        assert transport_kinds(envs) == [_KINDS[transport]] * 2  # (on the lanes: none fell back)
        envs.reset()
        envs.set_env_attr("gate", str(gate), id=[1])
        with pytest.raises(TimeoutError, match=r"env\(s\) \[0, 1\] did not answer"):
            envs.step(np.array([1, 1, 1, 1]), [2, 3, 0, 1])  # (env 1 waits at the gate)
        gate.open()  # the late step finishes in its worker
        envs.set_env_attr("gate", None)
        envs.reset()
        obs = envs.step(np.array([1, 2, 1, 2]), [2, 3, 0, 1])[0]
        assert obs[:, 0].tolist() == [1.0, 2.0, 1.0, 2.0]


@pytest.mark.parametrize("then", ["step", "step-sequence-only", "reset"])
@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_reset_that_times_out_leaves_every_call_usable(transport, then, roads, tmp_path):
    """Worker 1's envs late at a shut gate: the reset's `TimeoutError` names them.

    The late answer, when it comes, is nobody's: the next call, read on the lanes while that
    answer waits in the pipe, gives its own. A step: `can_ring` keeps it from being rung while
    an answer is still to come (it is sent as a pickled call); with that guard let through
    (``step-sequence-only``) it is rung. Either way it is read on the lanes, where the sequence
    number `read_lane` checks leaves the late answer to the failures branch, which drops it. A
    reset is read on the lanes whatever came before: the sequence number does the same. Either
    way the step after it is back on the lanes.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=3.0)
    gate = Gate(str(tmp_path))
    with contextlib.closing(envs):
        assert transport_kinds(envs) == [_KINDS[transport]] * 2  # (on the lanes: none fell back)
        envs.reset(seed=0)
        envs.set_attr("reset_gate", [None, None, str(gate), str(gate)])
        with pytest.raises(TimeoutError, match=r"env\(s\) \[2, 3\] did not answer"):
            envs.reset(seed=1)
        assert roads[-1] == ("reset", False)  # (read on the lanes until the deadline)
        seen = len(roads)
        with pytest.MonkeyPatch.context() as patch:  # (not `monkeypatch`: `roads` stays)
            if then == "step-sequence-only":
                patch.setattr(ChannelTransport, "can_ring", lambda self: not self.broken)
            gate.open()  # the late resets finish in their worker (and the next pass the gate)
            assert answer_waits(envs, 1)  # (seed 1's answer waits in its pipe)
            if then == "reset":
                got = envs.reset(seed=3)[0][:, 0].tolist()
                given = [FlakyEnv().reset(seed=3 + env)[0][0] for env in range(4)]
            else:  # (seed 1's reset went on in the workers)
                got = envs.step(np.ones(4, dtype=np.int64))[0][:, 0].tolist()
                given = [FlakyEnv().reset(seed=1 + env)[0][0] + 1 for env in range(4)]
        late = ("reset" if then == "reset" else "step", False)
        assert roads[seen:] == [late]  # (the late answer met: the failures branch)
        assert got == given
        stepped = envs.step(np.ones(4, dtype=np.int64))[0]
        assert stepped[:, 0].tolist() == [x + 1 for x in given]
        assert roads[-1] == ("step", True)  # (every answer read: back on the lanes)


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_worker_that_dies_inside_a_reset_gives_the_ray_calls_results(transport, roads):
    """Worker 0 dies in its reset (restarted within the call): what Ray calls alone give."""
    results = {}
    for kind in (transport, "ray"):
        envs = GymnasiumVectorEnv(
            [FlakyEnv] * 4, envs_per_worker=2, transport=kind, on_actor_failure="restart"
        )
        with contextlib.closing(envs):
            envs.reset(seed=0)
            pid = worker_pids(envs)[0]
            envs.set_attr("exit_on_reset", [True, False, False, False])
            first = envs.reset(seed=5)
            assert worker_pids(envs)[0] != pid  # (it died, and was replaced)
            results[kind] = [first, envs.step(np.ones(4, dtype=np.int64)), envs.reset(seed=7)]
            if kind == transport:
                assert roads[-3:] == [("reset", False), ("step", True), ("reset", True)]
                assert transport_kinds(envs) == [_KINDS[transport]] * 2
    for ours, theirs in zip(results[transport], results["ray"], strict=True):
        np.testing.assert_equal(ours, theirs)
    seeded = [FlakyEnv().reset(seed=5 + env)[0][0] for env in range(4)]  # (sent again as asked)
    assert results["ray"][0][0][:, 0].tolist() == seeded


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_async_reset_read_on_the_lanes_gives_the_ray_calls_results(transport, recv_reads):
    """`recv` reads the answers to `async_reset` on the lanes and gives the Ray calls' results.

    Then again with worker 0 dying in its reset: the failures branch of `recv` restarts it and
    sends the replacement the same reset (a new episode: no lost one to report).
    """
    results = {}
    for kind in (transport, "ray"):
        envs = GymnasiumVectorEnv(
            [OddInfoEnv] * 6, envs_per_worker=2, transport=kind, on_actor_failure="restart"
        )
        with contextlib.closing(envs):
            got, pid = [], worker_pids(envs)[0]
            for seed in (4, 9):
                if seed == 9:  # (this call also reads the workers' answers to the message
                    # sharing ``odd``'s new info column: each has answered all it was sent)
                    envs.set_attr("exit_on_reset", [True] + [False] * 5)
                recv_reads.clear()
                envs.async_reset(seed=seed)
                got.append(envs.recv(batch_size=6))
                if kind == transport:  # (the death leaves its `recv` to the failures branch)
                    assert recv_reads == [("reset", seed == 4)]
                envs.send(np.array([1, 0, 1, 0, 1, 1]), [0, 1, 2, 3, 4, 5])
                got.append(envs.recv(batch_size=6))
            assert worker_pids(envs)[0] != pid  # (it died in the second reset, and was replaced)
            results[kind] = got
    for ours, theirs in zip(results[transport], results["ray"], strict=True):
        np.testing.assert_equal(ours, theirs)
    obs, _, _, _, infos = results["ray"][2]  # (the replacement was sent the reset again)
    assert obs[:, 0].tolist() == [OddInfoEnv().reset(seed=9 + env)[0][0] for env in range(6)]
    assert "env_crashed" not in infos


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_verb_that_reads_the_pipes_while_an_async_reset_is_out_leaves_recv_the_reset(
    transport, recv_reads
):
    """A `get_attr` with resets out settles their tickets; `recv` gives the reset, as a record."""
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(vec):
        vec.reset()
        vec.step([2, 2, 2, 2])
        vec.async_reset()
        assert vec.get_attr("count") == (0, 0, 0, 0)  # (each worker reset first, in order)
        assert _in_flight(vec) == [(0, "reset", True), (1, "reset", True)]  # (read, settled)
        env_ids, (obs, rewards, terminated, truncated, _) = vec.recv()
        assert recv_reads == [("reset", True)]  # (settled as records: handed out by the lanes)
        assert env_ids == [0, 1, 2, 3]
        assert [float(o[0]) for o in obs] == [0.0] * 4
        assert rewards == (0.0,) * 4
        assert not any(terminated)
        assert not any(truncated)
        assert [float(o[0]) for o in vec.step([1, 1, 1, 1])[0]] == [1.0] * 4


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_recv_that_times_out_with_an_async_reset_out_keeps_the_late_reset_in_flight(
    transport, tmp_path, lane_sends, recv_reads
):
    """Worker 1's envs late at a shut gate in their `async_reset`: `recv` names them.

    Worker 0's reset comes first, read on the lanes. The timeout hands the resets left to the
    failures branch; its `recv`, once the gate opens, gives worker 1's own seeded reset, and
    the next `send` is back on the lanes.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=60)
    gate = Gate(str(tmp_path))
    seeded = [FlakyEnv().reset(seed=3 + env)[0][0] for env in range(4)]
    with contextlib.closing(envs):
        assert transport_kinds(envs) == [_KINDS[transport]] * 2  # (on the lanes: none fell back)
        envs.reset(seed=0)
        envs.set_attr("reset_gate", [None, None, str(gate), str(gate)])
        envs.async_reset(seed=3)
        obs, *_, infos = envs.recv(batch_size=2)
        assert recv_reads == [("reset", True)]
        assert infos["env_id"].tolist() == [0, 1]
        assert obs[:, 0].tolist() == seeded[:2]
        with pytest.raises(TimeoutError, match=r"`recv` timed out after 0.5 s: env\(s\) \[2, 3\]"):
            envs.recv(timeout=0.5)  # (only the gate could end it)
        assert _in_flight(envs) == [(1, "reset", False)]  # (the reset left: still out)
        gate.open()
        obs, rewards, terminated, truncated, infos = envs.recv()
        assert infos["env_id"].tolist() == [2, 3]
        assert obs[:, 0].tolist() == seeded[2:]
        assert rewards.tolist() == [0.0, 0.0]
        assert not terminated.any()
        assert not truncated.any()
        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
        assert lane_sends[-1] == ("step", True)  # (the lanes')
        assert envs.recv()[0][:, 0].tolist() == [x + 1 for x in seeded]


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_reset_options_that_cannot_be_serialized_are_a_type_error(transport, roads):
    """Nothing is sent, the error names the envs, and the next reset is read on the lanes."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        message = r"the arguments of `reset` for env\(s\) \[0, 1\] cannot be serialized"
        seen = len(roads)
        with pytest.raises(TypeError, match=message):
            envs.reset(options={"lock": threading.Lock()})
        assert roads[seen:] == []  # (nothing sent: nothing read)
        assert envs.reset(seed=7)[0].shape == (4, 1)
        assert roads[seen:] == [("reset", True)]


def test_a_tcp_doorbell_the_socket_takes_only_part_of_is_written_in_full():
    envs = GymnasiumVectorEnv([BigActionEnv] * 4, envs_per_worker=2, transport="tcp", timeout=60)
    with contextlib.closing(envs):
        envs.reset()
        transports = [worker.transport for worker in envs._engine._pool.workers]  # (private)
        for transport in transports:  # (a copy of the descriptor: the same socket)
            with socket.socket(fileno=os.dup(transport.write_fileno())) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        actions = np.random.default_rng(0).uniform(-1, 1, (4, 1 << 19)).astype(np.float32)
        envs.step_async(actions)
        assert any(transport.wants_write for transport in transports)  # (only part written)
        obs = envs.step_wait()[0]
        assert obs[:, 0].tolist() == (actions[:, 0] + actions[:, -1]).tolist()
