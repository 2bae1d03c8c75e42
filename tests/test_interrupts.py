"""A Ctrl-C at any line of the lockstep verbs (`step`, `reset`) or `close` leaves every face usable.

Each test sends a real SIGINT when the main thread reaches one chosen line (`interrupt_at_line`),
for every line of the functions that send a call, wait for it or hand it to the user, one line
per round; after each round the next calls must work and give each env's own result. The
first-ready verbs (`send`, `recv`, `async_reset`): tests/test_interrupts_first_ready.py.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ray_multiprocess_env import ClosedEnvError, GymnasiumVectorEnv, RayVectorEnv
from ray_multiprocess_env._engine.call_state import hand_out
from ray_multiprocess_env._engine.calls import Calls
from ray_multiprocess_env._engine.engine import Engine
from ray_multiprocess_env._engine.failures import Failures
from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.lanes import Lane, Lanes
from ray_multiprocess_env._engine.seeds import SeedBook
from ray_multiprocess_env._engine.transports.channel import ChannelTransport
from ray_multiprocess_env._engine.transports.tcp import StreamRows
from ray_multiprocess_env.errors import NoPendingCallError, RemoteEnvError
from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv as GymFace
from tests.envs import FlakyEnv
from tests.envs_faults import HangingSpacesEnv
from tests.helpers import counts, worker_pids
from tests.interrupts import Gate, interrupt_at_line, lines_of, rounds_of

#: Where a face's `step` sends, waits and hands the step out.
STEP_CODE: list[Callable[..., Any]] = [
    GymFace.step,
    RayVectorEnv.step,
    Engine.step,
    Engine._send_step,
    Engine._read,
    Engine._wait_slow,
    Engine._made,
    Lanes.rung,
    Lane.ring,
    Lanes.read,
    Lanes.batch,
    ChannelTransport.read_lane,
    ChannelTransport._answer,
    type(DEFERRED).poll,
    Calls.launch,
    hand_out,
]


#: Where `step_wait` takes the pending step, waits for it (on the lanes or the slow path) and
#: hands it out.
STEP_WAIT_CODE: list[Callable[..., Any]] = [
    GymFace.step_wait,
    Engine.step_wait,
    Engine._read,
    Engine._wait_slow,
    Engine._made,
    Lanes.read,
    Lanes.batch,
    ChannelTransport.read_lane,
    Calls.wait,
    hand_out,
]


#: Where the slow path takes a step over from the hot path (an env raised in it).
TAKE_OVER_CODE: list[Callable[..., Any]] = [
    Engine.step,
    Engine._read,
    Engine._wait_slow,
    Lanes.read,
    ChannelTransport._take_infos,  # (SB3's info dicts per env follow the record)
    ChannelTransport._rows_in,
    StreamRows.take,
    ChannelTransport.read_lane,
    ChannelTransport._answer,
    ChannelTransport._settle_messages,
]


#: Where a reset is sent, its answers read (records, as a step's: the rows are in place) and
#: judged, and where interrupts are held back.
RESET_CODE: list[Callable[..., Any]] = [
    Engine.reset,
    Engine._send_reset,
    Engine._made,
    Calls.launch,
    ChannelTransport.submit,
    Lanes.read,
    ChannelTransport.read_lane,
    Calls.wait,
    type(DEFERRED).__enter__,
    type(DEFERRED).__exit__,
]


#: Where a reset in which an env raised is judged and given up.
RESET_ERROR_CODE: list[Callable[..., Any]] = [
    Engine.reset,
    Engine._send_reset,
    Lanes.read,
    ChannelTransport.read_lane,
    Calls.wait,
    Failures.judge,
    Failures.error,
    ChannelTransport._settle_messages,
    ChannelTransport._received,
    ChannelTransport._take_infos,
]


#: Where a verb that reads the workers' pipes settles the tickets of a step pending on the lanes.
PENDING_TICKETS_CODE: list[Callable[..., Any]] = [
    Engine._beside_pending,
    ChannelTransport.pump,
    ChannelTransport._settle_messages,
    ChannelTransport._received,
]


#: Where a step of some envs (Tianshou's `step(action, id)`) is sent (rung on the lanes for
#: whole workers' envs), read on the lanes and handed out.
STEP_ENVS_CODE: list[Callable[..., Any]] = [
    Engine.step_envs,
    Engine._send_step,
    Engine._read,
    Engine._made,
    Calls.launch,
    Lane.ring,
    Lanes.rung,
    ChannelTransport.ring,
    Lanes.read,
    ChannelTransport.read_lane,
    ChannelTransport._take_infos,  # (Tianshou's info dicts per env follow the record)
    ChannelTransport._rows_in,
    StreamRows.take,
    Lanes.batch,
    hand_out,
]


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
        for function, line in rounds_of(STEP_CODE):
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.step(np.ones(4, dtype=np.int64))
            fired_in += bool(fired)
            before = counts(envs)
            obs = envs.step(np.ones(4, dtype=np.int64))[0]
            assert [float(np.asarray(o).ravel()[0]) for o in obs] == [c + 1 for c in before]
        assert fired_in > 5


@pytest.mark.parametrize("transport", ["auto", "tcp", "ray"])
def test_ctrl_c_at_any_line_of_step_wait_gives_the_step_up_or_leaves_it_pending(transport):
    """Ctrl-C anywhere in `step_wait`: the step given up whole, or still pending; none lost.

    Still pending if the Ctrl-C came before `step_wait` took it; either way each env's next
    step is its own, one further on. Over ``"ray"`` the step goes the slow way: a Ctrl-C
    after it was taken abandons it.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in rounds_of(STEP_WAIT_CODE):
            envs.step_async(np.ones(4, dtype=np.int64))
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.step_wait()
            fired_in += bool(fired)
            with contextlib.suppress(NoPendingCallError):  # (pending: the Ctrl-C came first)
                envs.step_wait(timeout=60)
            before = counts(envs)
            obs = envs.step(np.ones(4, dtype=np.int64))[0]
            assert obs[:, 0].tolist() == [c + 1 for c in before], (function, line)
        assert fired_in > 5  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("face", ["gymnasium", "sb3"])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_a_step_taken_over_by_the_slow_path_gives_it_up(transport, face):
    """Ctrl-C anywhere while the slow path takes a lane step over: the next `step` works.

    SB3's face keeps an info dict per env: worker 1's answer is read as `INFOS` first (the
    last rung is waited for first), then its ticket is made of it as worker 0's error comes.
    """
    if face == "sb3":
        from ray_multiprocess_env import SB3VecEnv

        envs: Any = SB3VecEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    else:
        envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in rounds_of(TAKE_OVER_CODE):
            fired = []
            with contextlib.suppress(KeyboardInterrupt, RemoteEnvError):
                with interrupt_at_line(function, line) as fired:
                    envs.step(np.array([-1, 1, 1, 1]))  # (env 0 raises: a pickled reply)
            fired_in += bool(fired)
            before = counts(envs)
            obs = envs.step(np.ones(4, dtype=np.int64))[0]
            assert obs[:, 0].tolist() == [c + 1 for c in before], (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("fails", [False, True], ids=["answered", "an-env-raised"])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_reset_or_of_the_guard_gives_the_reset_up(transport, fails):
    """Ctrl-C anywhere in a reset (or in holding interrupts back): the next calls all work.

    A reset every env answers (`RESET_CODE`), and one where env 1 raises (`RESET_ERROR_CODE`).
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        seeded = envs.reset(seed=7)[0][:, 0].tolist()
        fired_in = 0
        for function, line in rounds_of(RESET_ERROR_CODE if fails else RESET_CODE):
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
def test_ctrl_c_as_a_verb_settles_a_pending_steps_tickets_leaves_step_wait_its_results(transport):
    """Ctrl-C anywhere as `run_on_workers` reads a pending lane step's replies: it stays whole.

    The step stays pending (only `step_wait` takes it): each reply settles its ticket or waits
    in the pipe, and `step_wait` hands the results out.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for steps, (function, line) in enumerate(rounds_of(PENDING_TICKETS_CODE), start=1):
            envs.step_async(np.ones(4, dtype=np.int64))
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    worker_pids(envs)  # (reads the pipes: the step's replies settle its tickets)
            fired_in += bool(fired)
            obs = envs.step_wait(timeout=60)[0]
            assert obs[:, 0].tolist() == [float(steps)] * 4, (function, line)
        assert fired_in > 5  # (the lines ran: the interrupts were real)


@pytest.mark.parametrize("ids", [[4, 5, 0, 1], [0, 3, 4, 5]], ids=["rung", "sent"])
@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_ctrl_c_at_any_line_of_a_step_of_some_envs_gives_the_step_up(transport, ids):
    """Ctrl-C anywhere in a step of some envs: the next reset and steps all work.

    Whole workers' envs are rung on the lanes; others are sent as a pickled call, and read on
    the lanes all the same.
    """
    from ray_multiprocess_env import TianshouVectorEnv

    envs = TianshouVectorEnv([FlakyEnv] * 6, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        fired_in = 0
        for function, line in rounds_of(STEP_ENVS_CODE):
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.step(np.array([1, 1, 1, 1]), ids)
            fired_in += bool(fired)
            assert envs.reset()[0][:, 0].tolist() == [0.0] * 6, (function, line)
            obs = envs.step(np.array([1, 2, 2, 1]), ids)[0]
            assert obs[:, 0].tolist() == [1.0, 2.0, 2.0, 1.0], (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)


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
        # (in-process workers are threads, which say whether they ended; Ray actors processes)
        pids = [] if hasattr(workers[0], "dead") else worker_pids(envs)
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
        if not pids:
            assert all(worker.dead for worker in workers), line
        _wait_gone(pids, line)  # (Ray ends a killed actor's process on its own)
    assert fired_in > 5  # (the lines ran: the interrupts were real)


def test_ctrl_c_at_any_line_of_pfrls_masked_reset_leaves_its_observations_true():
    """Ctrl-C anywhere in pfrl's `reset(mask)`: it never hands out an observation that is stale.

    A reset that came back is noted in full inside the hand-out; one given up (its envs maybe
    reset in the workers) leaves its envs with no observation, so a reset that keeps them is
    refused until a full reset. Otherwise the observations the face keeps (what a reset that
    keeps every env returns) are the envs' own.
    """
    envs = RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_worker=2)
    code = [RayVectorEnv.reset, RayVectorEnv._reset_done, Engine.reset, Engine._send_reset]
    with contextlib.closing(envs):
        envs.reset()
        fired_in = given_up = 0
        for function, line in rounds_of([*code, Lanes.read, Calls.wait, Engine._made, hand_out]):
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
            assert [float(obs[0]) for obs in kept] == counts(envs), (function, line)
        assert fired_in > 10  # (the lines ran: the interrupts were real)
        assert given_up > 0


def test_ctrl_c_at_any_line_of_a_reset_uses_each_kept_seed_once():
    """Ctrl-C anywhere in a reset: the seeds `seed` kept go to that reset if it was sent.

    Else they go to the next reset; never to both, never to neither.
    """
    envs = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=2)
    seeded = [float(FlakyEnv().reset(seed=seed)[0][0]) for seed in (5, 6)]
    code = [Engine.reset, Engine._send_reset, Calls.launch, ChannelTransport.submit, SeedBook.sent]
    with contextlib.closing(envs):
        fired_in, seen = 0, set()
        for function, line in rounds_of(code):
            envs.reset()
            envs.step([1, 1])  # (1: neither reset nor seeded)
            envs.seed([5, 6])  # (gymnasium envs: kept for the next reset)
            fired = []
            with contextlib.suppress(KeyboardInterrupt):
                with interrupt_at_line(function, line) as fired:
                    envs.reset()
            fired_in += bool(fired)
            after = counts(envs)  # (asked after the reset, if it was sent: in order)
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


@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_ctrl_c_while_an_env_hangs_in_the_start_comes_at_once_and_kills_the_worker(
    tmp_path, transport
):
    """Ctrl-C while the vector env starts and an env hangs: raised at once, its worker killed.

    The start is given up without asking the envs to close (the hanging env would hold that up
    for 30 s); the gate never opens, so the env would hang 60 s.
    """
    gate = Gate(str(tmp_path))
    fns = [functools.partial(HangingSpacesEnv, str(gate))] + [FlakyEnv] * 3
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), gate.interrupt_when_entered(1):
        GymnasiumVectorEnv(fns, envs_per_worker=2, transport=transport)
    assert time.monotonic() - started < 20  # (it waited 30 s for the envs' `close`)
    (entered,) = os.listdir(str(gate))  # entered-<pid>-0: the worker inside the hang
    _wait_gone([int(entered.split("-")[1])])


def _wait_gone(pids: list[int], where: Any = None) -> None:
    """Wait (20 s at most) until none of the processes `pids` runs; `where`: the test's."""
    ends = time.monotonic() + 20
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < ends, (where, [pid for pid in pids if _alive(pid)])
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (not a zombie: Ray reaps its workers later)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # (gone before the open, or the read)
        return False
