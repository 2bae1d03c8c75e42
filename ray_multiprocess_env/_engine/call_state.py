"""The call state of a vector env: one `State`, what waits to be collected, the checks.

One tracker per engine (as gymnasium's ``AsyncVectorEnv`` keeps one ``AsyncState``), checked
first by every verb of the engine, so every face refuses the same calls with the same errors.
Every change of it is all or nothing under a Ctrl-C: the first-ready calls in flight are one
list, replaced in one assignment, and each method that changes more than one field runs inside
`deferred_interrupts`, so an interrupt lands before or after it, never inside.

The checks speak the face's own words for its first-ready verbs (`InFlightWords`): gymnasium's
and pfrl's faces expose envpool's ``send`` and ``recv``; Tianshou's has one ``step`` that sends
and collects, and ``step(None)`` that only collects. Given once at `Engine.start`, they make a
user read only verbs they call.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ray_multiprocess_env._engine.interrupts import DEFERRED, deferred_interrupts
from ray_multiprocess_env._engine.lost_episodes import LostEpisodes
from ray_multiprocess_env._engine.transports.base import Ticket
from ray_multiprocess_env.errors import (
    ClosedEnvError,
    NoPendingCallError,
    PendingCallError,
    env_list,
)

__all__ = [
    "SEND_RECV",
    "Call",
    "CallState",
    "InFlightWords",
    "State",
    "T",
    "as_is",
    "hand_out",
    "put_back",
    "refused",
    "take_out",
]

#: What a face makes of a batch (a verb's `finish`).
T = TypeVar("T")


def as_is(batch: Any) -> Any:
    """A verb's `finish` by default: the batch itself."""
    return batch


@dataclass(frozen=True)
class InFlightWords:
    """A face's words for its first-ready calls (the defaults: ``send``/``recv``).

    The templates are `str.format`-ted with the fields each one names.
    """

    #: The verb that puts envs in flight: errors of a send name it.
    send: str = "send"
    #: The verb that collects them: its errors and timeouts name it.
    recv: str = "recv"
    #: A send refused: env ``{env}`` has a call (a step or a reset) still in flight.
    busy_send: str = (
        "env {env} already has a call in flight; `recv` its result before sending it another "
        "action."
    )
    #: A reset refused: env ``{env}`` has a call (a step or a reset) still in flight.
    busy_reset: str = (
        "env {env} already has a call in flight; `recv` its result before resetting it."
    )
    #: A call ``{verb}`` refused while the envs ``{envs}`` have first-ready calls in flight (any
    #: verb that may not run beside them: a full reset, Tianshou's `seed` or `render`...).
    busy_all: str = (
        "`{verb}` was called while env(s) {envs} have calls in flight; `recv` them first."
    )
    #: A collect with nothing in flight.
    nothing: str = (
        "`recv` was called with nothing in flight; `send` actions (or `async_reset`) first."
    )
    #: How the user waits longer for the envs a timeout leaves in flight.
    again: str = "call `recv` again to wait longer"


#: envpool's words, which gymnasium's and pfrl's faces use.
SEND_RECV = InFlightWords()


class State(enum.Enum):
    """What a vector env is doing between calls."""

    IDLE = "idle"
    #: A `step_async` waits for its `step_wait`.
    WAITING_STEP = "waiting_step"
    #: First-ready calls (`send`, `async_reset`) are out; `recv` collects them.
    IN_FLIGHT = "in_flight"
    CLOSED = "closed"


class Call:
    """One operation launched on some workers: a ticket per worker."""

    __slots__ = ("label", "op", "tickets")

    def __init__(self, op: str, label: str, tickets: list[Ticket]) -> None:
        self.op, self.label, self.tickets = op, label, tickets


class CallState:
    """The `State` of one vector env, its pending `step_async` and its first-ready calls.

    `name` is the face's class name, for messages, and `words` its words for first-ready
    calls (`InFlightWords`: every check of the calls in flight speaks them). A first-ready
    call is a `Ticket` in `in_flight`, whichever road sent it.
    """

    def __init__(self, name: str, words: InFlightWords = SEND_RECV) -> None:
        self.name, self.words = name, words
        #: `State.IDLE`, `State.WAITING_STEP` or `State.CLOSED`: `state` without what
        #: `in_flight` says (no second record of it to keep in line).
        self.mode = State.IDLE
        self.pending: Call | None = None  # the `step_async` waiting for its `step_wait`
        #: The first-ready tickets in flight (a step's or a reset's: `base.method_of`), each
        #: env in one at most. Replaced, never changed in place: a list read from it stays as
        #: it was, and each change of it is one assignment.
        self.in_flight: list[Ticket] = []

    @property
    def state(self) -> State:
        """What the vector env is doing: `mode`, or `State.IN_FLIGHT` while tickets are out."""
        if self.mode is State.IDLE and self.in_flight:
            return State.IN_FLIGHT
        return self.mode

    def has_call_to(self, worker: int) -> bool:
        """Whether a first-ready call to `worker` is in flight."""
        if not self.in_flight:  # (the lanes' usual: no generator per lane of each `send`)
            return False
        return any(ticket.worker == worker for ticket in self.in_flight)

    def check_open(self, name: str) -> None:
        """Raise `ClosedEnvError` naming `name` if the vector env is closed."""
        if self.mode is State.CLOSED:
            raise ClosedEnvError(f"`{name}` was called on a closed {self.name}; create a new one.")

    def check_idle(self, name: str, *, in_flight_ok: bool = False) -> None:
        """Raise unless the vector env is idle (or, with `in_flight_ok`, has first-ready calls).

        `ClosedEnvError` after `close`; `PendingCallError` for a pending `step_async`, or
        (unless `in_flight_ok`) for first-ready calls in flight.
        """
        if self.mode is State.IDLE and (in_flight_ok or not self.in_flight):
            return
        self.check_open(name)
        if self.mode is State.WAITING_STEP:
            raise PendingCallError(
                f"`{name}` was called while a `step_async` is pending; call `step_wait` first.",
                "step",
            )
        if not in_flight_ok:
            words = self.words
            message = words.busy_all.format(verb=name, envs=env_list(self.busy_envs()))
            raise PendingCallError(message, words.send)

    def begin_step(self, call: Call) -> None:
        """`call` is the pending `step_async`."""
        with deferred_interrupts():
            self.pending, self.mode = call, State.WAITING_STEP

    def take_pending(self) -> Call:
        """The pending `step_async`, which is no longer pending.

        Raises:
            NoPendingCallError: If there is none.
        """
        self.check_open("step_wait")
        if self.pending is None:
            raise NoPendingCallError(
                "`step_wait` was called without a `step_async` before it.", "step_wait"
            )
        with deferred_interrupts():
            call, self.pending, self.mode = self.pending, None, State.IDLE
        return call

    def keep_pending(self, call: Call) -> None:
        """`call` stays pending (its `step_wait` timed out and may be called again)."""
        self.begin_step(call)

    def put_in_flight(self, tickets: Iterable[Ticket]) -> None:
        """First-ready tickets are out (nothing, once closed: `close` gave them up).

        One assignment: a Ctrl-C leaves them all out, or none. Call it with interrupts held
        back all the same (its caller's block sends them, or puts back what a hand-out took).
        """
        items = list(tickets)
        if items and self.mode is not State.CLOSED:
            self.in_flight = self.in_flight + items

    def take(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        """These first-ready tickets, no longer in flight (one assignment, as `put_in_flight`).

        Call it with interrupts held back: its caller's block hands them out, all or nothing.
        """
        done: list[Ticket] = []
        left: list[Ticket] = []
        for ticket in self.in_flight:  # (`in`: by identity, a ticket equals only itself)
            (done if ticket in tickets else left).append(ticket)
        self.in_flight = left
        return done

    def close(self) -> tuple[Call | None, list[Ticket]]:
        """Closed; what was pending and in flight, to give up."""
        with deferred_interrupts():
            out = (self.pending, self.in_flight)
            self.pending, self.in_flight, self.mode = None, [], State.CLOSED
        return out

    def busy_envs(self) -> list[int]:
        """The envs with a first-ready call in flight, sorted."""
        return sorted(env for ticket in self.in_flight for env in ticket.envs)

    def check_not_busy(self, env_ids: Sequence[int], *, reset: bool) -> None:
        """A ValueError naming the first of `env_ids` with a first-ready call in flight.

        `reset`: the call checked resets them (else it steps them).
        """
        if not self.in_flight:
            return
        busy = {env for ticket in self.in_flight for env in ticket.envs}
        env = next((env for env in env_ids if env in busy), None)
        if env is not None:
            words = self.words
            raise ValueError((words.busy_reset if reset else words.busy_send).format(env=env))

    def recv_size(self, batch_size: Any) -> int:
        """How many envs `recv` waits for (`batch_size`, or all in flight if None)."""
        words = self.words
        self.check_open(words.recv)
        if not self.in_flight:
            raise NoPendingCallError(words.nothing, words.recv)
        wanted = batch_size
        if wanted is None:
            wanted = 0
            for ticket in self.in_flight:
                wanted += len(ticket.envs)
        if type(wanted) is int and wanted > 0:
            return wanted
        if isinstance(wanted, bool) or not isinstance(wanted, numbers.Integral) or wanted < 1:
            raise ValueError(f"`batch_size` must be a positive int or None, got {batch_size!r}.")
        return int(wanted)


def hand_out(
    state: CallState,
    lost_episodes: LostEpisodes,
    done: Sequence[Ticket],
    envs: Iterable[int] | None,
    make: Callable[[], T],
) -> T:
    """Take the tickets `done` out of flight and `make` what the verb returns, all or nothing.

    The lost-episode reports of `envs` (None: every env's; with `done`, those its tickets
    carry) are delivered with it (as `take_out` does, written out here). A Ctrl-C before the
    result is made leaves the tickets in flight and the reports owed (with no tickets, a
    lockstep call's: the reports its results carried too), so the next call finds both:
    nothing a worker sent is dropped on the way out, and a second Ctrl-C cannot cut that short:
    the guard undoes the hand-out before it lets the first one out (`undo_on_interrupt`). (The
    ``except`` below undoes after one that lands in the few bytecodes where the guard lets go;
    a second one within the next few could cut that short.) Another error from `make` (a face
    refusing what came back) is raised with the tickets taken, as the call's error; the
    reports stay owed (`refused`).
    """
    taken: list[Ticket] = []
    owed = None
    try:
        with DEFERRED:  # (`take_out`, written out: a frame less per lockstep step)
            taken = state.take(done) if done else []
            owed = lost_episodes.deliver(envs, done)
            DEFERRED.undo_on_interrupt(put_back, state, lost_episodes, taken, owed, envs, done)
            return make()
    except KeyboardInterrupt:
        put_back(state, lost_episodes, taken, owed, envs, done)  # (done already, as a rule)
        raise
    except BaseException:
        refused(lost_episodes, owed, envs)
        raise


def take_out(
    state: CallState,
    lost_episodes: LostEpisodes,
    done: Sequence[Ticket],
    envs: Iterable[int] | None,
) -> tuple[list[Ticket], np.ndarray | None]:
    """Take `done` out of flight and deliver the reports of `envs`: what `put_back` undoes.

    Call it in the hand-out's guarded block (first-ready `recv`'s, which reads and hands out
    in one; `hand_out` has the same lines written out), which is to put them back if a
    Ctrl-C ends it (`undo_on_interrupt`, registered here); the block's ``except
    KeyboardInterrupt`` puts them back too, for one that lands as the guard lets go.
    """
    taken = state.take(done) if done else []
    owed = lost_episodes.deliver(envs, done)
    DEFERRED.undo_on_interrupt(put_back, state, lost_episodes, taken, owed, envs, done)
    return taken, owed


def put_back(
    state: CallState,
    lost_episodes: LostEpisodes,
    taken: list[Ticket],
    owed: np.ndarray | None,
    envs: Iterable[int] | None,
    done: Sequence[Ticket],
) -> None:
    """Undo a hand-out a Ctrl-C cut: its tickets in flight again, its reports owed again.

    With no tickets (`done`: a lockstep call's results, dropped), the envs `envs` owe what
    those results carried. All or nothing, and once: a second run finds `taken` emptied and
    restores and owes the same reports.
    """
    with DEFERRED:
        state.put_in_flight(taken)
        taken.clear()
        lost_episodes.restore(owed)
        if not done:
            lost_episodes.owe_again(envs)


def refused(lost_episodes: LostEpisodes, owed: np.ndarray | None, envs: Any) -> None:
    """A hand-out's result was refused (an error of the face's): its reports owed again.

    All or nothing: a Ctrl-C as it runs cannot leave them delivered (`deliver` undone by
    `restore`, then the envs `envs` owe what the result carried).
    """
    with DEFERRED:
        lost_episodes.restore(owed)
        lost_episodes.owe_again(envs)
