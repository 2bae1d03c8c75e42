"""What every transport is: the `Transport` protocol, the `Ticket` and `Outcome` of a call.

A transport carries one worker's operations (``step``, ``reset``, ``apply``, ...) and their
replies. Each operation sent is a `Ticket`; its `Outcome` is a value (a result, an env error, or
the worker's death), never an exception thrown across the engine (`decode_reply` makes one of a
reply's bytes). The transports:

* `ray_calls.RayCallTransport`: a Ray actor call per operation (any node), carrying the TCP
  stream's bytes and rows; `ray_calls.ActorTransport` a call of a plain env actor of the
  user's own methods (one env).
* `channel.ChannelTransport`: framed messages on the worker's channel, served on its env
  thread, with the batch's rows where it has them (`Rows`). It is made over same-node
  named pipes (`pipes.pipe_transport`); over those pipes with the batch (actions, observations,
  rewards, flags, numeric infos) in memory shared with the worker and a doorbell on the pipe
  (`shared_memory.shared_memory_transport`); or over a TCP stream to another node, the rows
  after the messages (`tcp.tcp_transport`).
* `in_process.InProcessWorker`: the worker in the driver's process, on a thread of its own
  (no Ray), served over a socket pair with a `channel.ChannelTransport`, for tests of the
  engine's logic.

The engine holds every transport as a `Transport` and never asks which one it is; waiting on
tickets of several transports at once goes through each one's `Waiter` (`waiting.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from ray_multiprocess_env._protocol.pipes import infos_answer, loads
from ray_multiprocess_env._protocol.status import (
    RECORD,
    code_of,
    is_record,
    reply_of_code,
    reply_of_infos,
)
from ray_multiprocess_env.errors import RemoteFailure

__all__ = [
    "Outcome",
    "Rows",
    "Ticket",
    "Transport",
    "Waiter",
    "all_hot",
    "decode_reply",
    "method_of",
    "outcome_of_code",
    "outcome_of_infos",
    "outcome_of_reply",
    "remaining",
    "timeout_ms",
    "use_rows",
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
    `code` says its answer is in place, as a channel read it (`channel.ChannelTransport`'s
    `read_lane`, or the read of a status record it decoded well): the record's
    `status.code_of`, or `channel.INFOS`; -1 (`channel.OTHER`) for anything else.
    """

    __slots__ = (
        "args",
        "code",
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
        self.code = -1


def method_of(ticket: Ticket) -> str:
    """The env method `ticket` runs (``"step"``, ``"reset"``...): its op, or what it applies."""
    method: str = ticket.args[0] if ticket.op == "apply" else ticket.op
    return method


class Waiter(Protocol):
    """Waits on the tickets of one kind of transport."""

    def wait(self, tickets: Sequence[Ticket], deadline: float | None, min_count: int) -> None:
        """Settle tickets until `min_count` of them have an outcome, or until `deadline`."""


class Transport(Protocol):
    """One worker's connection: sends operations, settles their tickets (module docstring)."""

    @property
    def kind(self) -> str:
        """``"ray"``, ``"pipe"``, ``"shared_memory"``, ``"tcp"`` or ``"in_process"`` (tests)."""

    @property
    def waiter(self) -> Waiter:
        """Settles this transport's tickets; one object for every transport of a kind."""

    @property
    def hot(self) -> bool:
        """Whether it steps all of its worker's envs with a doorbell (the lanes', `lanes.Lanes`).

        A `channel.ChannelTransport` with `Rows`: the only kind that is.
        """

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


class Rows(Protocol):
    """How a transport's steps travel in the batch's layout (a `channel.ChannelTransport`'s).

    In memory shared with the worker (`shared_memory.SharedRows`), or as raw bytes after the
    messages (`tcp.StreamRows`: over the TCP stream, or in Ray calls).
    """

    #: The worker reads the actions in memory it shares with the driver: they may be written
    #: there only while it has answered everything sent (else they travel in the message).
    shared: bool
    #: The one array of the worker's rows of actions (None: the layout has several, or none).
    leaf: np.ndarray | None

    def handshake(self) -> Ticket | None:
        """The operation that has the worker use its rows (None: nothing to ask)."""

    def place(self, actions: Any, positions: Any) -> bool:
        """Write a step's `actions` into the rows (at `positions`) if they fit their layout."""

    def message(self, head: bytes, positions: Any) -> bytes:
        """The message of a step whose actions were placed: `head` and what must follow it."""

    def plain(self, data: bytes) -> bytes:
        """The message of a pickled operation `data` (no rows with it)."""

    def take(self, payload: bytes) -> None:
        """Copy the rows after a reply into the batch (raises if they do not fit)."""

    def add_columns(self, specs: Sequence[dict[str, Any]]) -> bool:
        """Follow these info columns too; whether the worker is to write them."""

    def close(self) -> None:
        """Let go of the rows."""


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


#: The outcomes of the workers' answers seen, by their `status.code_of` (a few: one per set
#: of columns written); each is immutable, so every answer of that code shares it.
_ANSWER_OUTCOMES: dict[int, Outcome] = {}


def outcome_of_code(code: int) -> Outcome:
    """The outcome of a worker's answer (a status record) of this `status.code_of`."""
    outcome = _ANSWER_OUTCOMES.get(code)
    if outcome is None:
        outcome = Outcome(True, reply_of_code(code))
        if len(_ANSWER_OUTCOMES) < 256:
            _ANSWER_OUTCOMES[code] = outcome
    return outcome


def outcome_of_infos(answer: tuple[dict[int, Any], bool]) -> Outcome:
    """The outcome of a worker's `status.answer_infos`: its info dicts and old gym's API."""
    return Outcome(True, reply_of_infos(*answer))


def use_rows(transport: Transport, rows: Rows | None, deadline: float | None) -> bool:
    """Have `transport`'s worker use `rows` (their handshake, waited for until `deadline`).

    Whether it does (False: the rows ask nothing of it).

    Raises:
        TimeoutError: If the worker does not answer in time.
        RemoteFailure: If it cannot use them (it cannot map the memory, say).
    """
    handshake = None if rows is None else rows.handshake()
    if handshake is None:
        return False
    transport.submit(handshake)
    transport.waiter.wait([handshake], deadline, 1)
    if handshake.outcome is None:
        transport.forget(handshake)
        raise TimeoutError("the worker did not take its rows in time")
    if not handshake.outcome.ok:
        raise handshake.outcome.error or RuntimeError("the worker could not take its rows")
    return True


def outcome_of_reply(payload: bytes, rows: Rows | None) -> Outcome:
    """The outcome of a reply's bytes, the rows after them copied into the batch first."""
    if rows is not None:
        try:
            rows.take(payload)
        except Exception as err:  # (not from this library's worker)
            cause = RemoteFailure(err, f"the worker's rows did not fit the batch: {err}")
            return Outcome(False, error=cause)
    return decode_reply(payload)


def decode_reply(payload: bytes) -> Outcome:
    """The outcome a reply's bytes stand for (a status record, or a pickle)."""
    try:
        if is_record(payload):
            answer = infos_answer(payload)
            if answer is not None:
                return outcome_of_infos(answer)
            code = code_of(*RECORD.unpack_from(payload))
            if code < 0:
                raise ValueError(f"not a worker's answer: the record {bytes(payload[:16])!r}")
            return outcome_of_code(code)
        ok, value = loads(payload)
    except Exception as err:  # e.g. a class the driver cannot import
        cause = RemoteFailure(err, f"the reply could not be deserialized on the driver: {err!r}")
        return Outcome(False, error=cause)
    if ok:
        return Outcome(True, value)
    error, text = value
    return Outcome(False, error=RemoteFailure(error, text))
