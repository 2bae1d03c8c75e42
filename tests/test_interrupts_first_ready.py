"""A Ctrl-C at any line of the first-ready verbs (`send`, `recv`, `async_reset`) loses nothing.

Each test sends a real SIGINT when the main thread reaches one chosen line (`interrupt_at_line`),
for every line of the functions that take results out of flight, put calls in flight, or hand
them to the user, one line per round; after each round every env's result must come back
exactly once, and the next calls must work. The lockstep verbs (`step`, `reset`) and `close`:
tests/test_interrupts.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env._engine import first_ready
from ray_multiprocess_env._engine.call_state import CallState, hand_out, put_back, take_out
from ray_multiprocess_env._engine.calls import Calls
from ray_multiprocess_env._engine.failures import Failures
from ray_multiprocess_env._engine.first_ready import FirstReadyVerbs
from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.lanes import Lane, Lanes
from ray_multiprocess_env._engine.lost_episodes import LostEpisodes
from ray_multiprocess_env._engine.transports.channel import ChannelTransport
from ray_multiprocess_env.errors import RemoteEnvError
from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv as GymFace
from tests.envs import EndOnTwoEnv, FlakyEnv
from tests.envs_faults import DyingEnv
from tests.helpers import counts
from tests.interrupts import interrupt_at_line, line_of, lines_of, rounds_of

TRANSPORTS = ["auto", "pipe", "tcp", "ray"]

#: Where `recv` takes results out of flight and hands them out.
RECV_CODE: list[Callable[..., Any]] = [
    CallState.take,
    take_out,
    put_back,
    LostEpisodes.deliver,
    CallState.put_in_flight,
    hand_out,
    Lanes.read,
    first_ready._env_ids,
    Lanes.batch,
    FirstReadyVerbs.recv,
    FirstReadyVerbs._first,
]


#: Where `send` rings the workers and puts their envs in flight.
SEND_CODE: list[Callable[..., Any]] = [
    FirstReadyVerbs.send,
    FirstReadyVerbs._send_step,
    Lanes.rung,
    Lane.ring,
    CallState.has_call_to,
    CallState.put_in_flight,
    Calls.launch,  # (the slow path's: the pipe and Ray transports, some of a worker's envs)
]


#: Where `async_reset` sends each worker's reset and puts its envs in flight.
ASYNC_RESET_CODE: list[Callable[..., Any]] = [
    FirstReadyVerbs.async_reset,
    FirstReadyVerbs._send_reset,
    Calls.launch,
    ChannelTransport.submit,
    CallState.put_in_flight,
]


#: Where `recv` hands the calls the lanes sent to the slow path (an env raised in one).
RECV_TAKE_OVER_CODE: list[Callable[..., Any]] = [
    Lanes.read,
    ChannelTransport.read_lane,
    ChannelTransport._take_infos,
    ChannelTransport._settle_messages,
    ChannelTransport._received,
    FirstReadyVerbs.recv,
]


def _ids(infos: dict[str, Any]) -> list[int]:
    return [int(env) for env in infos["env_id"]]


def _seeded(seed: int) -> np.ndarray:
    """The first observations of 4 `FlakyEnv` s after a reset with `seed` (gymnasium's seeds)."""
    return np.array([FlakyEnv().reset(seed=seed + env)[0][0] for env in range(4)])


@pytest.mark.parametrize(
    ("transport", "sent", "batch_size"),
    [(transport, "steps", None) for transport in TRANSPORTS]
    + [("auto", "reset", None), ("tcp", "reset", None), ("auto", "steps", 2), ("tcp", "steps", 2)],
)
def test_ctrl_c_at_any_line_of_recv_loses_no_result_and_wedges_nothing(transport, sent, batch_size):
    """Ctrl-C anywhere in `recv` of steps or a reset: each env's result comes back once.

    A `recv` of every env in flight waits for each worker in turn; one of fewer (`batch_size`)
    polls every worker's pipe at once (`Lanes.read`).
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        _recv_at_each_line(envs, rounds_of(RECV_CODE), sent, batch_size=batch_size)


#: Where `recv` hands results out (the first Ctrl-C), and where a key held down lands again:
#: the library's own code on the way out, where an ``except`` clause once put results back.
#: (Inside the guard that holds Ctrl-C back, see tests/test_interrupt_guard.py.)
HAND_OUT_CODE: list[Callable[..., Any]] = [hand_out, FirstReadyVerbs.recv]


HELD_DOWN: list[Callable[..., Any]] = [
    hand_out,
    take_out,
    put_back,
    first_ready._env_ids,
    Lanes.batch,
    CallState.take,
    CallState.put_in_flight,
    LostEpisodes.restore,
    LostEpisodes.deliver,
    FirstReadyVerbs.recv,
]


@pytest.mark.parametrize("moment", ["held-down", "as-the-guard-lets-go"])
@pytest.mark.parametrize("transport", ["auto", "ray"])  # (the lanes' hand-out, the slow path's)
def test_ctrl_c_held_down_or_as_the_guard_lets_go_in_a_hand_out_loses_no_result(transport, moment):
    """A Ctrl-C at each line of the hand-out, then again at every line after (a key held down).

    Or one at each line of the guard's end of the hand-out's block: one that lands just as the
    guard lets go comes out of the block after it let go, and is undone by the ``except`` of
    the verb whose block it is (`hand_out`'s, or on the lanes `recv`'s own). Either way the
    results taken out of flight go back before the `KeyboardInterrupt` comes out: the next
    `recv` hands out each env's result once.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        if moment == "held-down":
            _recv_at_each_line(envs, rounds_of(HAND_OUT_CODE), "steps", HELD_DOWN, min_fired=5)
        else:
            ends = [type(DEFERRED).__exit__]  # (`_end` runs only after a Ctrl-C)
            # (the end of the block that hands out only: `hand_out`'s, or on the lanes
            # `recv`'s own, which reads and hands out)
            within = [hand_out, FirstReadyVerbs.recv]
            _recv_at_each_line(envs, rounds_of(ends), "steps", within=within, min_fired=8)


def _recv_at_each_line(
    envs: GymnasiumVectorEnv,
    rounds: list[tuple[Callable[..., Any], int]],
    sent: str,
    held: list[Callable[..., Any]] | tuple[()] = (),
    min_fired: int = 11,
    within: list[Callable[..., Any]] | tuple[()] = (),
    batch_size: int | None = None,
) -> None:
    """Per round: send steps (or a reset), `recv` with a Ctrl-C at the line, collect the rest.

    At least `min_fired` of the lines must run (the interrupts were real). `batch_size`: the
    interrupted `recv`'s.
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
                got = envs.recv(batch_size=batch_size)
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
        for function, line in rounds_of(SEND_CODE if verb == "send" else ASYNC_RESET_CODE):
            if verb == "async_reset":
                envs.step(np.ones(4, dtype=np.int64))  # (away from the seeded counts)
            before = counts(envs)
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
                assert counts(envs) == before, (function, line)  # (none stepped unsent)
        assert fired_in > 5  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_a_recv_the_slow_path_takes_over_loses_no_result(transport):
    """Ctrl-C anywhere while `recv` hands a reply it cannot read to the slow path.

    Env 0 raises, so worker 0's reply is a pickle the lanes leave to the slow path: the other
    envs' results still come back exactly once, and the calls after it work.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        _take_over_rounds(
            envs.send,
            envs.recv,
            lambda received: _recv_into(envs, received),
            lambda: counts(envs),
            envs._engine.busy_envs,  # (private) what is still in flight
        )
        before = counts(envs)
        obs = envs.step(np.ones(4, dtype=np.int64))[0]
        assert obs[:, 0].tolist() == [count + 1 for count in before]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_a_take_over_of_info_dict_answers_loses_no_result(transport):
    """As above, with an info dict per env (Tianshou's layout): answers read as `INFOS`.

    Worker 1's answer (a record, its info dicts after it) is read on the lanes, then worker
    0's pickle (env 0 raises; env 1, beside it, is slow) hands both to the slow path: worker
    1's ticket, settled by `_take_infos`, carries the dicts read (`Ticket.code`: `INFOS`). Each
    env's result and info dict still come back exactly once.
    """
    from ray_multiprocess_env import TianshouVectorEnv

    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, wait_num=2, transport=transport)
    engine = envs._engine  # (private: the first-ready verbs the face's `step` uses)
    with contextlib.closing(envs):
        envs.reset()
        envs.set_env_attr("delay", 0.05, id=1)  # (worker 1 answers first, read on the lanes)
        _take_over_rounds(
            engine.send,
            engine.recv,
            lambda received: _recv_batch_into(engine, received),
            lambda: [float(count) for count in envs.get_env_attr("count")],  # (Tianshou's)
            engine.busy_envs,
        )


def _take_over_rounds(
    send: Callable[[np.ndarray, list[int]], Any],
    recv: Callable[[], Any],
    recv_into: Callable[[dict[int, float]], None],
    counts_now: Callable[[], list[float]],
    busy: Callable[[], list[int]],
) -> None:
    """A Ctrl-C at each line of `RECV_TAKE_OVER_CODE`, one round each; every result once.

    Each round `send` s all 4 envs (env 0 raises) and receives them with `recv_into` (the
    interrupted one, then what is still in flight, `busy`): envs 1 to 3 come back once each,
    one step further on (`counts_now`). It ends with a step of env 0 alone (`send`, `recv`),
    which hands its lost-episode report over: with a report owed, the next round's `send`
    would leave the lanes for the slow path.
    """
    fired_in = 0
    for function, line in rounds_of(RECV_TAKE_OVER_CODE):
        before = counts_now()
        send(np.array([-1, 1, 1, 1]), [0, 1, 2, 3])  # (env 0 raises)
        received: dict[int, float] = {}
        fired: list[bool] = []
        with contextlib.suppress(KeyboardInterrupt):
            with interrupt_at_line(function, line) as fired:
                recv_into(received)
        fired_in += bool(fired)
        while busy():  # what is still in flight comes back
            recv_into(received)
        expected = {env: before[env] + 1 for env in (1, 2, 3)}
        assert received == expected, (function, line)
        send(np.array([0]), [0])  # (env 0's report handed over)
        recv()
    assert fired_in > 10  # (the lines ran: the interrupts were real)


def _recv_batch_into(engine: Any, received: dict[int, float]) -> None:
    """`Engine.recv` each env's observation into `received` (an env error raised: none)."""
    with contextlib.suppress(RemoteEnvError):
        batch = engine.recv()
        assert [type(info) for info in batch.infos] == [dict] * len(batch.env_ids)
        for env, value in zip(
            batch.env_ids.tolist(), batch.observations[:, 0].tolist(), strict=True
        ):
            assert env not in received, f"env {env} came back twice"
            received[env] = value


def _recv_into(envs: Any, received: dict[int, float]) -> None:
    """`recv` each env's observation into `received` (an env error raised: none of it)."""
    with contextlib.suppress(RemoteEnvError):
        obs, *_, infos = envs.recv()
        for env, value in zip(_ids(infos), obs[:, 0].tolist(), strict=True):
            assert env not in received, f"env {env} came back twice"
            received[env] = value


def test_ctrl_c_at_any_line_of_a_tianshou_async_step_leaves_waiting_id_true():
    """Tianshou `wait_num`: Ctrl-C anywhere in `step` never hides an env in flight."""
    from ray_multiprocess_env import TianshouVectorEnv

    envs = TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, wait_num=2)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        code = [type(envs).step, FirstReadyVerbs.send, ChannelTransport.read_lane]
        for function, line in rounds_of([*code, ChannelTransport._take_infos]):
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
        for line in lines_of(ChannelTransport._break):
            envs.reset(seed=0)  # (not the autoreset of the envs cut short the round before)
            envs.set_attr("taken", [1, 1, -100, -100])  # worker 0 dies in its next step
            envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
            truncated: dict[int, bool] = {}
            fired: list[bool] = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(ChannelTransport._break, line) as fired:
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


@pytest.mark.parametrize(
    ("transport", "moment"),
    [
        ("auto", "pool.restart("),
        ("auto", "retries.append(retry)"),
        ("auto", "wait_tickets(retries"),
        ("tcp", "wait_tickets(retries"),
        ("ray", "pool.restart("),
    ],
)
def test_ctrl_c_in_a_restart_inside_recv_leaves_every_env_in_flight(transport, moment):
    """Ctrl-C while `recv` restarts a lost worker: every env stays in flight, none is lost.

    The next `recv` returns all four, the lost worker's envs with their lost episodes reported
    once (so the loop that sends what `recv` returned steps every env again).
    """
    envs = GymnasiumVectorEnv(
        [DyingEnv] * 4, envs_per_worker=2, on_actor_failure="restart", transport=transport
    )
    with contextlib.closing(envs):
        envs.reset(seed=0)
        envs.set_attr("taken", [1, 1, -100, -100])  # worker 0 dies in its next step
        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])
        fired: list[bool] = []
        with pytest.raises(KeyboardInterrupt):
            with interrupt_at_line(Failures._replace, line_of(Failures._replace, moment)) as fired:
                envs.recv()
        assert fired
        assert envs._engine.busy_envs() == [0, 1, 2, 3]  # (private) all still in flight
        truncated: dict[int, bool] = {}
        crashed: dict[int, bool] = {}
        while envs._engine.busy_envs():
            *_, cut, infos = envs.recv(timeout=30)
            for k, env in enumerate(_ids(infos)):
                assert env not in truncated, f"env {env} came back twice"
                truncated[env] = bool(cut[k])
                crashed[env] = bool(infos.get("env_crashed", np.zeros(len(cut)))[k])
        assert truncated == {0: True, 1: True, 2: False, 3: False}
        assert crashed == truncated
        envs.send(np.ones(4, dtype=np.int64), [0, 1, 2, 3])  # (the autoreset step of 0 and 1)
        *_, cut, infos = envs.recv()
        assert sorted(_ids(infos)) == [0, 1, 2, 3]
        assert not cut.any()  # reported once


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
        for function, line in rounds_of([*code, Calls.launch]):
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
