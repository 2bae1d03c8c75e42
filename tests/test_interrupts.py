"""A Ctrl-C at any line of the code that changes the call state leaves every face usable.

Each test sends a real SIGINT when the main thread reaches one chosen line (`interrupt_at_line`),
for every line of the functions that take results out of flight, put calls in flight, or
hand a step to the user, one line per round; after each round the next calls must work and
every env's result must come back exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ray_multiprocess_env import ClosedEnvError, GymnasiumVectorEnv, RayVectorEnv
from ray_multiprocess_env._engine import call_state, first_ready_lanes
from ray_multiprocess_env._engine.call_state import CallState, hand_out
from ray_multiprocess_env._engine.calls import Calls
from ray_multiprocess_env._engine.engine import Engine
from ray_multiprocess_env._engine.first_ready import FirstReadyVerbs
from ray_multiprocess_env._engine.first_ready_lanes import FirstReadyLanes, LaneSend
from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.lane_set import LaneSet
from ray_multiprocess_env._engine.lanes import LaneCall, Lanes, answer_part, lane_ticket, took_reply
from ray_multiprocess_env._engine.lost_episodes import LostEpisodes
from ray_multiprocess_env._engine.seeds import SeedBook
from ray_multiprocess_env._engine.transports.pipes import PipeTransport
from ray_multiprocess_env._engine.transports.shared_memory import SharedMemoryTransport
from ray_multiprocess_env._engine.transports.tcp import TcpTransport
from ray_multiprocess_env.errors import RemoteEnvError
from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv as GymFace
from tests.envs import DyingEnv, EndOnTwoEnv, FlakyEnv
from tests.helpers import worker_pids
from tests.interrupts import interrupt_at_line, lines_of

TRANSPORTS = ["auto", "pipe", "tcp", "ray"]

#: Where `recv` takes results out of flight and hands them out.
RECV_CODE: list[Callable[..., Any]] = [
    CallState.take,
    CallState._settle_state,
    CallState.put_in_flight,
    CallState.take_sent,
    CallState.put_sent,
    CallState.make_tickets,
    LaneSend.ticket,
    hand_out,
    FirstReadyLanes.recv,
    FirstReadyLanes._read,
    FirstReadyLanes._hand_out,
    FirstReadyVerbs.recv,
    FirstReadyVerbs._first,
]

#: Where `send` rings the workers and puts their envs in flight.
SEND_CODE: list[Callable[..., Any]] = [
    FirstReadyVerbs.send,
    FirstReadyLanes.send,
    Lanes.rung,
    CallState.has_call_to,
    CallState.put_sent,
    CallState.put_in_flight,
    Calls.launch,  # (the slow path's: the pipe and Ray transports, some of a worker's envs)
]

#: Where `async_reset` posts each worker's reset and puts its envs in flight.
ASYNC_RESET_CODE: list[Callable[..., Any]] = [
    FirstReadyVerbs.async_reset,
    FirstReadyLanes.reset,
    Lanes.posts,
    SharedMemoryTransport.post,
    CallState.put_sent,
    CallState.put_in_flight,
    Calls.launch,  # (the slow path's: the pipe and Ray transports)
]

#: Where a face's `step` sends, waits and hands the step out.
STEP_CODE: list[Callable[..., Any]] = [
    GymFace.step,
    RayVectorEnv.step,
    Engine.step,
    Engine._launch_step,
    Engine._wait_step,
    Lanes.launch,
    LaneCall.__init__,
    Lanes.wait,
    Lanes.batch,
    LaneCall.tickets,
    SharedMemoryTransport.read_lane,
    TcpTransport.read_lane,
    type(DEFERRED).poll,
    Calls.launch,
    hand_out,
]


#: Where the slow path takes a step over from the hot path (an env raised in it).
TAKE_OVER_CODE: list[Callable[..., Any]] = [
    Lanes.wait,
    Lanes._took_reply,
    PipeTransport.take_reply,
    LaneCall.tickets,
    SharedMemoryTransport.read_lane,
    TcpTransport.read_lane,
    PipeTransport.adopt,
    PipeTransport.settle,
]


#: Where `recv` hands the calls the lanes sent to the slow path (an env raised in one).
RECV_TAKE_OVER_CODE: list[Callable[..., Any]] = [
    FirstReadyLanes.recv,
    FirstReadyLanes._read,
    took_reply,
    PipeTransport.take_reply,
    CallState.make_tickets,
    LaneSend.ticket,
    lane_ticket,
    PipeTransport.adopt,
    PipeTransport.settle,
    FirstReadyVerbs.recv,
]


#: Where a reset is sent, waited for on the lanes, and where interrupts are held back.
RESET_CODE: list[Callable[..., Any]] = [
    Engine.reset,
    Engine._run_reset,
    Lanes.launch_reset,
    Lanes.posts,
    LaneSet.polled,
    SharedMemoryTransport.post,
    Lanes.wait,
    Lanes.replies,
    type(DEFERRED).__enter__,
    type(DEFERRED).__exit__,
]


#: Where the slow path takes a reset over from the lanes (an env raised in it).
RESET_TAKE_OVER_CODE: list[Callable[..., Any]] = [
    Engine._run_reset,
    Lanes.wait,
    Lanes._took_reply,
    took_reply,
    PipeTransport.take_reply,
    LaneCall.tickets,
    lane_ticket,
    PipeTransport.adopt,
    PipeTransport.settle,
]

#: Where a verb that reads the workers' pipes makes the tickets of a step pending on the lanes.
PENDING_TICKETS_CODE: list[Callable[..., Any]] = [
    Engine._beside_pending,
    LaneCall.tickets,
    lane_ticket,
    PipeTransport.adopt,
]

#: Where a step of some workers' envs (Tianshou's `step(action, id)`) goes on the lanes.
STEP_ENVS_CODE: list[Callable[..., Any]] = [
    Engine.step_envs,
    Lanes.launch,
    Lanes._some,
    Lanes.rung,
    LaneSet.polled,
    SharedMemoryTransport.ring,
    Lanes.wait,
    Lanes.batch,
    answer_part,
    hand_out,
]


def _rounds(functions: list[Callable[..., Any]]) -> list[tuple[Callable[..., Any], int]]:
    return [(function, line) for function in functions for line in lines_of(function)]


def _ids(infos: dict[str, Any]) -> list[int]:
    return [int(env) for env in infos["env_id"]]


def _seeded(seed: int) -> np.ndarray:
    """The first observations of 4 `FlakyEnv` s after a reset with `seed` (gymnasium's seeds)."""
    return np.array([FlakyEnv().reset(seed=seed + env)[0][0] for env in range(4)])


@pytest.mark.parametrize(
    ("transport", "sent"),
    [(transport, "steps") for transport in TRANSPORTS] + [("auto", "reset"), ("tcp", "reset")],
)
def test_ctrl_c_at_any_line_of_recv_loses_no_result_and_wedges_nothing(transport, sent):
    """Ctrl-C anywhere in `recv` of steps or a reset: each env's result comes back once."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        _recv_at_each_line(envs, _rounds(RECV_CODE), sent)


#: Where `recv` hands results out (the first Ctrl-C), and where a key held down lands again:
#: the library's own code on the way out, where an ``except`` clause once put results back.
#: (Inside the guard that holds Ctrl-C back, see tests/test_interrupt_guard.py.)
HAND_OUT_CODE: list[Callable[..., Any]] = [hand_out, FirstReadyLanes._hand_out]
HELD_DOWN: list[Callable[..., Any]] = [
    hand_out,
    call_state._put_back,
    FirstReadyLanes._hand_out,
    first_ready_lanes._put_back,
    CallState.take,
    CallState.take_sent,
    CallState.put_in_flight,
    CallState.put_sent,
    CallState._settle_state,
    LostEpisodes.restore,
    FirstReadyLanes.recv,
    FirstReadyVerbs.recv,
]


@pytest.mark.parametrize("moment", ["held-down", "as-the-guard-lets-go"])
@pytest.mark.parametrize("transport", ["auto", "ray"])  # (the lanes' hand-out, the slow path's)
def test_ctrl_c_held_down_or_as_the_guard_lets_go_in_a_hand_out_loses_no_result(transport, moment):
    """A Ctrl-C at each line of the hand-out, then again at every line after (a key held down).

    Or one at each line of the guard's end of the hand-out's block: one that lands just as the
    guard lets go comes out of the block after it let go, and is undone by the hand-out's own
    ``except``. Either way the results taken out of flight go back before the
    `KeyboardInterrupt` comes out: the next `recv` hands out each env's result once.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        if moment == "held-down":
            _recv_at_each_line(envs, _rounds(HAND_OUT_CODE), "steps", HELD_DOWN, min_fired=5)
        else:
            ends = [type(DEFERRED).__exit__]  # (`_end` runs only after a Ctrl-C)
            _recv_at_each_line(envs, _rounds(ends), "steps", within=HAND_OUT_CODE, min_fired=8)


def _recv_at_each_line(
    envs: GymnasiumVectorEnv,
    rounds: list[tuple[Callable[..., Any], int]],
    sent: str,
    held: list[Callable[..., Any]] | tuple[()] = (),
    min_fired: int = 11,
    within: list[Callable[..., Any]] | tuple[()] = (),
) -> None:
    """Per round: send steps (or a reset), `recv` with a Ctrl-C at the line, collect the rest.

    At least `min_fired` of the lines must run (the interrupts were real).
    """
    envs.reset()
    expected = np.zeros(4)
    fired_in = 0
    for n, (function, line) in enumerate(rounds):
        if sent == "steps":
            envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
            expected += 1
        else:  # (seeds 3 and 4 in turn: no env's first observation is the same in both)
            envs.async_reset(seed=3 + n % 2)
            expected = _seeded(3 + n % 2)
        received: dict[int, float] = {}
        got, fired = None, []
        with contextlib.suppress(KeyboardInterrupt):  # (it may land once `got` is set)
            with interrupt_at_line(function, line, held, within) as fired:
                got = envs.recv()
        if got is not None:
            received.update(zip(_ids(got[-1]), got[0][:, 0].tolist(), strict=True))
        fired_in += bool(fired)
        while envs._engine.busy_envs():  # (private) what is still in flight comes back
            obs, *_, infos = envs.recv()
            for env, value in zip(_ids(infos), obs[:, 0].tolist(), strict=True):
                assert env not in received, f"env {env} came back twice ({line})"
                received[env] = value
        assert received == dict(enumerate(expected.tolist())), (function, line)
    assert fired_in >= min_fired
    assert envs.step(np.ones(4, dtype=np.int64))[0][:, 0].tolist() == (expected + 1).tolist()
    envs.async_reset()
    assert sorted(_ids(envs.recv()[-1])) == [0, 1, 2, 3]


@pytest.mark.parametrize("verb", ["send", "async_reset"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ctrl_c_at_any_line_of_send_or_async_reset_puts_all_of_it_in_flight_or_none(
    transport, verb
):
    """Ctrl-C anywhere in `send` or `async_reset`: all of its envs in flight, or none touched."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in _rounds(SEND_CODE if verb == "send" else ASYNC_RESET_CODE):
            if verb == "async_reset":
                envs.step(np.ones(4, dtype=np.int64))  # (away from the seeded counts)
            before = _counts(envs)
            fired: list[bool] = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    if verb == "send":
                        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
                    else:
                        envs.async_reset(seed=3)
            fired_in += bool(fired)
            out = envs._engine.busy_envs()  # (private) what is in flight
            assert out in ([], [0, 1, 2, 3]), (function, line)
            if out:
                obs, *_, infos = envs.recv()
                assert sorted(_ids(infos)) == [0, 1, 2, 3]
                stepped = [c + 1 for c in before] if verb == "send" else _seeded(3).tolist()
                assert obs[:, 0].tolist() == stepped, (function, line)
            else:
                assert _counts(envs) == before, (function, line)  # (none stepped unsent)
        assert fired_in > 5  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("face", ["gymnasium", "pfrl"])
@pytest.mark.parametrize("transport", ["auto", "tcp", "ray"])
def test_ctrl_c_at_any_line_of_step_gives_the_step_up(face, transport):
    """Ctrl-C anywhere in `step`: the next `step` works (never "call step_wait first")."""
    if face == "gymnasium":
        envs: Any = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    else:
        envs = RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in _rounds(STEP_CODE):
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.step(np.ones(4, dtype=np.int64))
            fired_in += bool(fired)
            before = _counts(envs)
            obs = envs.step(np.ones(4, dtype=np.int64))[0]
            assert [float(np.asarray(o).ravel()[0]) for o in obs] == [c + 1 for c in before]
        assert fired_in > 5


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_a_step_taken_over_by_the_slow_path_gives_it_up(transport):
    """Ctrl-C anywhere while the slow path takes a lane step over: the next `step` works."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in _rounds(TAKE_OVER_CODE):
            fired = []
            with contextlib.suppress(KeyboardInterrupt, RemoteEnvError):
                with interrupt_at_line(function, line) as fired:
                    envs.step(np.array([-1, 1, 1, 1]))  # (env 0 raises: a pickled reply)
            fired_in += bool(fired)
            before = _counts(envs)
            obs = envs.step(np.ones(4, dtype=np.int64))[0]
            assert obs[:, 0].tolist() == [c + 1 for c in before], (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_a_recv_the_slow_path_takes_over_loses_no_result(transport):
    """Ctrl-C anywhere while `recv` hands a reply it cannot read to the slow path.

    Env 0 raises, so worker 0's reply is a pickle the lanes leave to the slow path: the other
    envs' results still come back exactly once, and the calls after it work.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in _rounds(RECV_TAKE_OVER_CODE):
            before = _counts(envs)
            envs.send(np.array([-1, 1, 1, 1]), [0, 1, 2, 3])  # (env 0 raises)
            received: dict[int, float] = {}
            fired: list[bool] = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    _recv_into(envs, received)
            fired_in += bool(fired)
            while envs._engine.busy_envs():  # (private) what is still in flight comes back
                _recv_into(envs, received)
            expected = {env: before[env] + 1 for env in (1, 2, 3)}
            assert received == expected, (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)
        before = _counts(envs)
        obs = envs.step(np.ones(4, dtype=np.int64))[0]
        assert obs[:, 0].tolist() == [count + 1 for count in before]


@pytest.mark.parametrize("fails", [False, True], ids=["answered", "an-env-raised"])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_reset_or_of_the_guard_gives_the_reset_up(transport, fails):
    """Ctrl-C anywhere in a reset (or in holding interrupts back): the next calls all work.

    A reset every env answers goes on the lanes (`RESET_CODE`); one where env 1 raises leaves them
    for the slow path (`RESET_TAKE_OVER_CODE`).
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        seeded = envs.reset(seed=7)[0][:, 0].tolist()
        fired_in = 0
        for function, line in _rounds(RESET_TAKE_OVER_CODE if fails else RESET_CODE):
            envs.set_attr("fail_reset", [False, fails, False, False])
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    if fails:
                        with pytest.raises(RemoteEnvError, match="env 1 failed in `reset`"):
                            envs.reset(seed=3)
                    else:
                        envs.reset(seed=3)
            fired_in += bool(fired)
            envs.set_attr("fail_reset", False)
            assert envs.reset(seed=7)[0][:, 0].tolist() == seeded, (function, line)
            stepped = envs.step(np.ones(4, dtype=np.int64))[0][:, 0].tolist()
            assert stepped == [c + 1 for c in seeded], (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_as_a_verb_makes_a_pending_steps_tickets_leaves_step_wait_its_results(transport):
    """Ctrl-C anywhere as `run_on_workers` makes a pending lane step's tickets: it stays whole.

    The step stays pending (only `step_wait` takes it): its tickets are all made, or none.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for steps, (function, line) in enumerate(_rounds(PENDING_TICKETS_CODE), start=1):
            envs.step_async(np.ones(4, dtype=np.int64))
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    worker_pids(envs)  # (reads the pipes: the step's tickets are made first)
            fired_in += bool(fired)
            obs = envs.step_wait(timeout=60)[0]
            assert obs[:, 0].tolist() == [float(steps)] * 4, (function, line)
        assert fired_in > 5  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_a_step_of_some_workers_gives_the_step_up(transport):
    """Ctrl-C anywhere in a step of whole workers' envs: the next reset and steps all work."""
    from ray_multiprocess_env import TianshouVectorEnv

    envs = TianshouVectorEnv([FlakyEnv] * 6, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in _rounds(STEP_ENVS_CODE):
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.step(np.array([1, 1, 1, 1]), [4, 5, 0, 1])
            fired_in += bool(fired)
            assert envs.reset()[0][:, 0].tolist() == [0.0] * 6, (function, line)
            obs = envs.step(np.array([1, 2, 2, 1]), [4, 5, 0, 1])[0]
            assert obs[:, 0].tolist() == [1.0, 2.0, 2.0, 1.0], (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)


def _recv_into(envs: Any, received: dict[int, float]) -> None:
    """`recv` each env's observation into `received` (an env error raised: none of it)."""
    with contextlib.suppress(RemoteEnvError):
        obs, *_, infos = envs.recv()
        for env, value in zip(_ids(infos), obs[:, 0].tolist(), strict=True):
            assert env not in received, f"env {env} came back twice"
            received[env] = value


def _counts(envs: Any) -> list[float]:
    return [float(count) for count in envs.get_attr("count")]


def test_ctrl_c_at_any_line_of_a_tianshou_async_step_leaves_waiting_id_true():
    """Tianshou `wait_num`: Ctrl-C anywhere in `step` never hides an env in flight."""
    from ray_multiprocess_env import TianshouVectorEnv

    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, wait_num=2)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in _rounds([type(envs).step, FirstReadyVerbs.send]):
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.step(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
            fired_in += bool(fired)
            assert envs.waiting_id == envs._engine.busy_envs()  # (private) what is out
            while envs.waiting_id:  # as Tianshou's AsyncCollector.reset_env does
                envs.step(None, id=envs.waiting_id)
            envs.reset()  # (AsyncCollector.reset: every env)
        assert fired_in > 5
        *_, infos = envs.step(np.ones(2, dtype=np.int64), [1, 3])
        assert sorted(info["env_id"] for info in infos) == [1, 3]


@pytest.mark.in_process  # (the engine's own `close`: its workers are threads here)
def test_ctrl_c_at_any_line_of_close_leaves_no_worker_running():
    """Ctrl-C anywhere in `close`: once a second `close` returns, no worker is left running.

    (As a user does after a Ctrl-C, or gymnasium's ``__del__``.) The first `close` may have
    released them already; once it began, every other verb is refused.
    """
    fired_in = 0
    for line in lines_of(Engine.close):
        envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2)
        workers = [worker.actor for worker in envs._engine.workers]  # (private)
        try:
            envs.reset()
            fired: list[bool] = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(Engine.close, line) as fired:
                    envs.close()
            fired_in += bool(fired)
            if envs._engine.closed:  # (private) the Ctrl-C came once `close` began
                with pytest.raises(ClosedEnvError):
                    envs.step(np.ones(4, dtype=np.int64))
        finally:
            envs.close()
        assert all(worker.dead for worker in workers), line
    assert fired_in > 5  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("transport", ["auto", "pipe", "tcp"])
def test_ctrl_c_at_any_line_of_a_lost_workers_break_leaves_recv_every_result(transport):
    """Ctrl-C anywhere while `recv` finds a worker's pipe ended: no ticket is left on it.

    The next `recv` restarts the worker, and each env's result (the lost worker's envs cut
    short) comes back once.
    """
    envs = GymnasiumVectorEnv(
        [DyingEnv] * 4, envs_per_worker=2, on_actor_failure="restart", transport=transport
    )
    with contextlib.closing(envs):
        fired_in = 0
        for line in lines_of(PipeTransport._break):
            envs.reset(seed=0)  # (not the autoreset of the envs cut short the round before)
            envs.set_attr("taken", [1, 1, -100, -100])  # worker 0 dies in its next step
            envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
            truncated: dict[int, bool] = {}
            fired: list[bool] = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(PipeTransport._break, line) as fired:
                    *_, cut, infos = envs.recv()
                    truncated.update(zip(_ids(infos), cut.tolist(), strict=True))
            fired_in += bool(fired)
            while envs._engine.busy_envs():  # (private) what is still in flight comes back
                *_, cut, infos = envs.recv(timeout=20)
                for env, value in zip(_ids(infos), cut.tolist(), strict=True):
                    assert env not in truncated, f"env {env} came back twice ({line})"
                    truncated[env] = value
            assert truncated == {0: True, 1: True, 2: False, 3: False}, line
        assert fired_in >= 3  # (the lines ran: the interrupts were real)


def test_ctrl_c_at_any_line_of_pfrls_masked_reset_leaves_its_observations_true():
    """Ctrl-C anywhere in pfrl's `reset(mask)`: it never hands out an observation that is stale.

    A reset that came back is noted in full inside the hand-out; one given up (its envs maybe
    reset in the workers) leaves its envs with no observation, so a reset that keeps them is
    refused until a full reset. Otherwise the observations the face keeps (what a reset that
    keeps every env returns) are the envs' own.
    """
    envs = RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_worker=2)
    code = [RayVectorEnv.reset, RayVectorEnv._reset_done, Engine.reset, Engine._run_reset]
    with contextlib.closing(envs):
        envs.reset()
        fired_in = given_up = 0
        for function, line in _rounds([*code, Lanes.wait, hand_out]):
            envs.step([1, 1, 1, 1])  # (away from 0: a reset of an env shows)
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.reset([False, True, False, True])  # (envs 0 and 2)
            fired_in += bool(fired)
            refused = None
            try:
                kept, _ = envs.reset([True] * 4)
            except ValueError as error:
                refused = str(error)
            if refused is not None:
                assert "env 0 has no observation yet" in refused, (function, line)
                given_up += 1
                kept, _ = envs.reset()
            assert [float(obs[0]) for obs in kept] == _counts(envs), (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)
        assert given_up > 0


def test_ctrl_c_at_any_line_of_a_reset_uses_each_kept_seed_once():
    """Ctrl-C anywhere in a reset: the seeds `seed` kept go to that reset if it was sent.

    Else they go to the next reset; never to both, never to neither.
    """
    envs = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=2)
    seeded = [float(FlakyEnv().reset(seed=seed)[0][0]) for seed in (5, 6)]
    code = [Engine.reset, Engine._run_reset, Lanes.launch_reset, Lanes.posts, SeedBook.sent]
    with contextlib.closing(envs):
        fired_in, seen = 0, set()
        for function, line in _rounds(code):
            envs.reset()
            envs.step([1, 1])  # (1: neither reset nor seeded)
            envs.seed([5, 6])  # (gymnasium envs: kept for the next reset)
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.reset()
            fired_in += bool(fired)
            after = _counts(envs)  # (asked after the reset, if it was sent: in order)
            observations, _ = envs.reset()
            again = [float(obs[0]) for obs in observations]
            if after == seeded:  # the reset was sent, with the kept seeds
                assert again == [0.0, 0.0], (function, line)
            else:
                assert after == [1.0, 1.0], (function, line)
                assert again == seeded, (function, line)
            if fired:
                seen.add(after == seeded)
        assert fired_in > 10  # (the lines ran: the interrupts were real)
        assert seen == {True, False}  # (Ctrl-C both before the reset was sent and after)


def test_ctrl_c_at_any_line_of_async_reset_notes_the_reset_with_its_send():
    """Ctrl-C anywhere in gymnasium's `async_reset` (DISABLED autoreset, every episode ended).

    The face's note of the reset goes with its send: a `send` to the envs is refused unless
    the reset was sent, and never refused once it was.
    """
    envs = GymnasiumVectorEnv([EndOnTwoEnv] * 4, envs_per_worker=2, autoreset_mode="disabled")
    code = [GymFace.async_reset, GymFace._async_reset_sent, FirstReadyVerbs.async_reset]
    ones = np.ones(4, dtype=np.int64)
    with contextlib.closing(envs):
        fired_in, seen = 0, set()
        for function, line in _rounds([*code, FirstReadyLanes.reset]):
            envs.reset()
            envs.step(np.full(4, 2))  # (action 2 ends every episode)
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.async_reset()
            fired_in += bool(fired)
            sent = bool(envs._engine.busy_envs())  # (private) the reset is in flight
            if sent:
                envs.recv()
                envs.send(ones, [0, 1, 2, 3])
                assert sorted(_ids(envs.recv()[-1])) == [0, 1, 2, 3], (function, line)
            else:
                with pytest.raises(ValueError, match=r"finished their episode"):
                    envs.send(ones, [0, 1, 2, 3])
            if fired:
                seen.add(sent)
        assert fired_in > 5  # (the lines ran: the interrupts were real)
        assert seen == {True, False}  # (Ctrl-C both before the reset was sent and after)
