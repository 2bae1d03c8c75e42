"""What every transport is: the `Transport` protocol, and the `Ticket` and `Outcome` of a call.

A transport carries one worker's operations (``step``, ``reset``, ``apply``, ...) and their
replies. Each operation sent is a `Ticket`; its `Outcome` is a value (a result, an env error, or
the worker's death), never an exception thrown across the engine. The transports, a module each:

* `ray_calls.RayCallTransport`: a Ray actor call per operation (any node);
  `ray_calls.ActorTransport` the same for a plain env actor of the user's (one env).
* `pipes.PipeTransport`: same-node named pipes, served on the worker's env thread.
* `shared_memory.SharedMemoryTransport`: the pipes carry a doorbell, and the batch (actions,
  observations, rewards, flags, numeric infos) is in memory the driver shares with the worker.
* `in_process.InProcessTransport`: the worker in the driver's process, on a thread of its own
  (no Ray), for tests of the engine's logic.

The engine holds every transport as a `Transport` and never asks which one it is; waiting on
tickets of several transports at once goes through each one's `Waiter` (`waiting.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

__all__ = [
    "HotTransport",
    "Outcome",
    "Ticket",
    "Transport",
    "Waiter",
    "all_hot",
    "remaining",
    "timeout_ms",
]


class Outcome(NamedTuple):
    """What became of one ticket: ``ok`` with `value`, or `error` (`died`: the worker is gone)."""

    ok: bool
    value: Any = None
    error: BaseException | None = None
    died: bool = False


class Ticket:
    """One operation sent to one worker (`worker`, as it was in `generation`).

    `envs` are the global indices of the envs it concerns; `shared_args` says that its first
    argument (a step's actions) is also in shared memory, for a transport that shares it.
    """

    __slots__ = (
        "args",
        "envs",
        "generation",
        "handle",
        "op",
        "outcome",
        "shared_args",
        "transport",
        "worker",
    )

    def __init__(
        self,
        worker: int,
        generation: int,
        op: str,
        args: tuple[Any, ...],
        envs: Sequence[int],
        shared_args: bool = False,
    ) -> None:
        self.worker, self.generation, self.op, self.args = worker, generation, op, args
        self.envs, self.shared_args = envs, shared_args
        self.transport: Transport | None = None  # set by `Transport.submit`
        self.handle: Any = None  # the transport's own: a Ray object ref, a sequence number
        self.outcome: Outcome | None = None


class Waiter(Protocol):
    """Waits on the tickets of one kind of transport."""

    def wait(self, tickets: Sequence[Ticket], deadline: float | None, min_count: int) -> None:
        """Settle tickets until `min_count` of them have an outcome, or until `deadline`."""


class Transport(Protocol):
    """One worker's connection: sends operations, settles their tickets (module docstring)."""

    @property
    def kind(self) -> str:
        """``"ray"``, ``"pipe"``, ``"shared_memory"`` or ``"in_process"`` (messages, tests)."""

    @property
    def waiter(self) -> Waiter:
        """Settles this transport's tickets; one object for every transport of a kind."""

    @property
    def hot(self) -> bool:
        """Whether it is a `HotTransport` (steps as doorbells, for the engine's hot path)."""

    def encode(self, ticket: Ticket) -> Any:
        """`ticket`'s operation ready to send; serialization errors are raised here, first."""

    def submit(self, ticket: Ticket, data: Any = None) -> None:
        """Send `ticket` (`data` from `encode`, else encoded now); its outcome comes later."""

    def forget(self, ticket: Ticket) -> None:
        """Drop interest in `ticket`: its reply, when it comes, is ignored."""

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Have the worker write its numeric infos into these shared columns, if it can."""

    def close(self) -> None:
        """Release the connection; tickets still waiting settle as lost with the worker."""


class HotTransport(Transport, Protocol):
    """A transport that steps all of its worker's envs with a doorbell (`lanes.Lanes`).

    Its replies arrive on one descriptor (`fileno`), which ``poll`` waits on. The lanes read
    them with `read_lane` (a step's or a reset's answer, a record, and the ticket of it, if
    one waits); the slow path with `pump`, which settles the tickets of whatever arrived.
    """

    broken: bool
    #: The info dicts (by position) and old gym's API of the last answer `read_lane` read as
    #: `INFOS` (one info dict per env: SB3's and Tianshou's layout).
    infos: tuple[dict[int, Any], bool] | None

    @property
    def wants_write(self) -> bool:
        """Whether part of a message still waits to be written."""

    def fileno(self) -> int:
        """The descriptor replies arrive on."""

    def pump(self) -> None:
        """Read what has arrived and settle the tickets whose whole reply is in."""

    def can_ring(self, actions: Any) -> bool:
        """Whether `ring` can send a step of all of the worker's envs with these `actions`."""

    def ring(self, actions: Any) -> int:
        """Send a step of all of the worker's envs (after `can_ring`): its sequence number.

        No ticket waits for its reply: `read_lane` reads it, or the ticket `adopt` ed does.
        """

    def can_post(self) -> bool:
        """Whether `post` can send a message now (the worker answered every one before)."""

    def encode_op(self, op: str, args: Any) -> bytes:
        """The message of `op` with `args` for `post` (serialization errors are raised here)."""

    def post(self, data: bytes) -> int:
        """Send the message `data` with no ticket (after `can_post`): its sequence number."""

    def read_lane(self) -> int:
        """The reply to the last `ring` or `post`, if a record of everything in place: its code.

        `INFOS` for a record with an info dict per env after it (then in `infos`); else
        `NOTHING` (no whole message yet) or `OTHER` (left for `settle`).
        """

    def adopt(self, ticket: Ticket, seq: int) -> None:
        """`ticket` stands for message `seq`, sent by `ring`: its reply settles it."""

    def settle(self) -> bool:
        """Settle what `read_lane` left, now that tickets stand for it (False: it ended)."""


#: The longest one wait blocks (``poll`` takes at most 2**31 ms); the waits loop until done.
_LONGEST_WAIT_S = 86_400.0


def remaining(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (never negative, at most a day), or None for no deadline."""
    if deadline is None:
        return None
    return min(max(0.0, deadline - time.monotonic()), _LONGEST_WAIT_S)


def timeout_ms(deadline: float | None) -> int | None:
    """What ``poll`` waits until `deadline`, in whole ms rounded up (None: no deadline)."""
    left = remaining(deadline)
    return None if left is None else int(left * 1000) + 1


def all_hot(transports: Sequence[Any]) -> bool:
    """Whether every one of `transports` is hot, and was working when last looked at."""
    return all(transport.hot and not transport.broken for transport in transports)


def deadline_in(seconds: float | None) -> float | None:
    """The monotonic time `seconds` from now, or None for no deadline."""
    return None if seconds is None else time.monotonic() + seconds
