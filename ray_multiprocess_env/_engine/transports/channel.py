"""A worker served over a channel: framed messages on a pair of descriptors, and the rows.

A channel is two named pipes to a worker on the driver's node (`pipes.py`) or one TCP socket to
a worker on another node (`tcp.py`); the worker's loop (`_worker/serve_loop.py`) serves either
on the thread that built its envs, and the messages are framed as `_protocol/pipes.py` says.
`ChannelTransport` is the driver's end of one, whatever its descriptors: it writes each
operation (a `Ticket`, pickled), reads the replies as ``poll`` says they came, and settles the
tickets by sequence number (replies to tickets given up on are dropped). A channel that ends
settles every ticket as lost with the worker, with Ray's word on why.

A transport with rows (`Rows`) carries a step's actions and results in the batch's layout: in
memory shared with the worker (`shared_memory.SharedRows`), or as raw bytes after the messages
(`tcp.StreamRows`). It is hot: the lanes (`lanes.py`) ring a step (`ring`, a doorbell) with
its ticket, and read the answer, a status record, with `read_lane` (a reset's too, sent as a
pickled call by `submit`), which settles the ticket with it; any other reply it reads settles
its ticket as `pump`'s read would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import ray
from ray.exceptions import RayError

from ray_multiprocess_env._engine.interrupts import DEFERRED, deferred_interrupts
from ray_multiprocess_env._engine.transports.base import (
    Outcome,
    Rows,
    Ticket,
    outcome_of_code,
    outcome_of_infos,
    outcome_of_reply,
    use_rows,
)
from ray_multiprocess_env._engine.transports.waiting import CHANNELS
from ray_multiprocess_env._protocol.pipes import Inbox, Outbox, dumps, infos_answer
from ray_multiprocess_env._protocol.status import (
    ANSWERS,
    DOORBELL,
    FRAMED_RECORD,
    RECORD,
    code_of,
    is_record,
)

__all__ = [
    "INFOS",
    "NOTHING",
    "OTHER",
    "ChannelTransport",
    "Link",
    "encode_message",
]

#: What `ChannelTransport.read_lane` returns when no whole reply is in yet.
NOTHING = -2
#: What it returns when a reply that is not a record of everything in place came, or the
#: channel ended; also `Ticket.code` until an answer in place settles the ticket.
OTHER = -1
#: What it returns for a record with an info dict per env after it (`status.answer_infos`):
#: the dicts and old gym's API are in the ticket's outcome.
INFOS = -3


def encode_message(op: str, args: Any, rows: Rows | None, in_rows: bool) -> bytes:
    """The message of operation `op` with `args` to a worker whose replies carry `rows`.

    A step's actions (``args[0]``, at the positions ``args[1]``) go into the rows where they
    fit their layout, if `in_rows` (the worker uses them): a doorbell then, and what the rows
    need after it. Anything else is pickled (serialization errors are raised here).
    """
    if in_rows:
        actions, positions = args
        if rows.place(actions, positions):  # type: ignore[union-attr]  # (`in_rows`: rows)
            head = DOORBELL if positions is None else dumps((op, (None, positions)))
            return rows.message(head, positions)  # type: ignore[union-attr]
    data = dumps((op, args))
    return data if rows is None else rows.plain(data)


class Link(NamedTuple):
    """A channel as made: its descriptors and the worker's Ray call that serves it.

    Messages are written to `go` and replies read from `done` (one socket may be both);
    `serve_ref` ends when the worker stops serving, and Ray's word on it says why the channel
    ended, unless `ended` gives the cause (a worker with no Ray call: `in_process`).
    """

    go: int
    done: int
    serve_ref: Any
    ended: Callable[[], BaseException] | None = None


class ChannelTransport:
    """The driver's end of one worker's channel (`link`), with its `rows` if it has them.

    `kind` names it (``"pipe"``, ``"shared_memory"``, ``"tcp"``, ``"in_process"``); `grace`:
    seconds to wait for Ray's word on a worker whose channel ended; `spin_us`: how long the
    worker polls for its next message before it sleeps (`worker_spin`). A transport with rows
    is hot (the lanes'); `open` makes one and has the worker use them before anything else
    is sent.
    """

    waiter = CHANNELS

    def __init__(
        self, kind: str, link: Link, grace: float, spin_us: int = 0, rows: Rows | None = None
    ) -> None:
        self.kind, self.hot, self._rows = kind, rows is not None, rows
        self._rows_follow = rows is not None and not rows.shared  # (the rows after replies)
        self._go, self._done, self.serve_ref, self._ended = link
        self.spin_us = spin_us
        self._grace = grace
        self._seq = 0
        self._answered = 0  # the sequence number of the last reply read
        self._waiting: dict[int, Ticket] = {}
        self._outbox = Outbox(deferred_interrupts)
        self._inbox = Inbox(deferred_interrupts)
        self.broken = False  # the channel closed: the worker died, or serving ended
        self._lost: Outcome | None = None  # the outcome of every ticket once broken
        self._leaf: np.ndarray | None = None  # the rows of actions `ring` writes
        self._actions_shared = False  # the worker uses the rows: actions may go through them

    @classmethod
    def open(
        cls,
        kind: str,
        open_link: Callable[[], Link],
        grace: float,
        spin_us: int,
        rows: Rows | None,
        deadline: float | None,
        columns: Sequence[dict[str, Any]] = (),
    ) -> ChannelTransport:
        """The channel over the link `open_link` makes, its worker using `rows` (`base.use_rows`).

        The worker writes the info `columns` made so far too. All or nothing: the rows are
        closed if the link cannot be made, and the channel if the worker does not take its
        rows or columns by `deadline` (its serving ends then).
        """
        try:
            link = open_link()
        except BaseException:
            if rows is not None:
                rows.close()
            raise
        transport = cls(kind, link, grace, spin_us, rows)
        try:
            if rows is not None and use_rows(transport, rows, deadline):
                transport._leaf, transport._actions_shared = rows.leaf, True
            if columns:
                transport.share_infos(columns)
        except BaseException:  # half made: its channel closed, so the worker's serving ends
            transport.close()
            raise
        return transport

    @property
    def idle(self) -> bool:
        """Whether the worker has answered every message sent to it."""
        return self._answered == self._seq

    def fileno(self) -> int:
        """The descriptor replies arrive on."""
        return self._done

    def write_fileno(self) -> int:
        """The descriptor messages are written to."""
        return self._go

    @property
    def action_rows(self) -> np.ndarray | None:
        """The rows of actions `ring` writes: the worker's, in the batch's layout (or None)."""
        return self._leaf

    @property
    def wants_write(self) -> bool:
        """Whether part of a message still waits to be written."""
        return bool(self._outbox.pending)

    def encode(self, ticket: Ticket) -> bytes:
        """`ticket`'s operation as bytes (done before anything is sent, so errors come first).

        A step's actions go into the rows while the worker uses them (`encode_message`), in
        shared rows only while it has answered every message sent (one still unread may read
        the rows).
        """
        rows = self._rows
        shared = rows is not None and rows.shared
        in_rows = ticket.shared_args and self._actions_shared and (self.idle or not shared)
        return encode_message(ticket.op, ticket.args, rows, in_rows)

    def submit(self, ticket: Ticket, data: Any = None) -> None:
        """Queue `ticket`'s operation and write as much of it as the channel takes now."""
        ticket.transport = self
        if self.broken:
            ticket.outcome = self._death()
            return
        data = self.encode(ticket) if data is None else data
        with deferred_interrupts():
            self._seq += 1
            ticket.handle = self._seq
            self._waiting[self._seq] = ticket
            sent = self._outbox.send(self._go, self._seq, data)
        if not sent:
            self._break()  # the worker closed its end: it is gone

    def flush(self) -> None:
        """Write what the channel takes now of the queued messages, without blocking."""
        if not self.broken and not self._outbox.flush(self._go):
            self._break()  # the worker closed its end: it is gone

    def pump(self) -> None:
        """Read what has arrived and settle the tickets whose whole reply is in."""
        with DEFERRED:  # from the kernel's buffer to the outcomes in one go
            messages, ended = self._inbox.read(self._done)
            self._settle_messages(messages)
        if ended:
            self._break()  # outside the deferral: asking Ray why may take a moment

    # -- the lanes' (a hot transport's): a doorbell, and records read as they come ----------
    def ring(self, actions: np.ndarray, ticket: Ticket) -> int:
        """Send a step of all of this worker's envs as a doorbell: its sequence number.

        The lanes'; call it with interrupts held back, after `can_ring`, with `actions` in the
        layout of the rows (`action_rows`). The actions go into the rows, the doorbell onto
        the channel (with the rows, if they travel); `ticket` waits for the reply
        (`read_lane` settles it, or `pump`'s read).
        """
        self._leaf[...] = actions  # type: ignore[index]  # (not None: see `action_rows`)
        data = self._rows.message(DOORBELL, None)  # type: ignore[union-attr]
        self._seq = seq = self._seq + 1
        ticket.transport, ticket.handle = self, seq
        self._waiting[seq] = ticket
        if not self._outbox.send(self._go, seq, data):
            self._break()  # the worker closed its end: it is gone (as in `submit`)
        return seq

    def can_ring(self) -> bool:
        """Whether `ring` can send a step now: the worker answered all, nothing waits."""
        return not self.broken and self._answered == self._seq and not self._outbox.pending

    def read_lane(self) -> int:
        """Read the replies that came (the last message's, as a rule): a code, or a constant.

        The code (`status.code_of`) if the reply is a record of everything in place (the
        usual; rows that follow it are copied into the batch); `INFOS` if it is a record with
        an info dict per env after it (SB3's and Tianshou's layout); the ticket waiting for
        it is settled with either (`Ticket.code` says which). `NOTHING` if no whole message is
        in yet; `OTHER` if anything else came (its tickets settled as `pump` settles them), or
        the channel ended (found again by the next read: `pump` settles what waits as lost).
        Call it with interrupts held back, when ``poll`` says a reply is readable.
        """
        inbox = self._inbox
        scratch = inbox.scratch
        try:
            count = os.readv(self._done, [scratch])
        except BlockingIOError:
            return NOTHING
        except OSError:  # (a socket reset by the worker's end: as its end)
            count = 0
        if count == FRAMED_RECORD.size and inbox.empty:
            seq, size, head, columns = FRAMED_RECORD.unpack_from(scratch)  # (nothing after)
            old_api = ANSWERS.get(head)
            if old_api is not None and seq == self._seq and size == RECORD.size:
                return self._answer(seq, columns << 1 | old_api)  # (`status.code_of`)
        messages = inbox.feed(memoryview(scratch)[:count])
        while not messages and count == len(scratch):  # (a long message: rows over TCP)
            try:
                count = os.readv(self._done, [scratch])
            except BlockingIOError:
                return NOTHING
            except OSError:
                count = 0
            messages = inbox.feed(memoryview(scratch)[:count])
        if not messages and count:
            return NOTHING  # (part of a message)
        if len(messages) == 1 and count:
            seq, payload = messages[0]
            if seq != self._seq:
                pass  # (an answer to an earlier message: settled below)
            elif self._rows_follow:  # (the TCP stream: the rows after a record copied in)
                if is_record(payload) and self._rows_in(payload):
                    code = code_of(*RECORD.unpack_from(payload))
                    if code >= 0:
                        return self._answer(seq, code)
                    if self._take_infos(seq, payload):
                        return INFOS
            elif self._take_infos(seq, payload):  # (a record alone was read at once above)
                return INFOS
        self._settle_messages(messages)
        return OTHER

    def _answer(self, seq: int, code: int) -> int:
        """`read_lane`'s answer `code` to `seq`, which settles the ticket waiting for it."""
        self._answered = seq
        if self._waiting:  # (else nothing waits for it: given up)
            ticket = self._waiting.pop(seq, None)
            if ticket is not None:
                ticket.outcome, ticket.code = outcome_of_code(code), code
        return code

    def _rows_in(self, payload: bytes) -> bool:
        """Copy the rows after a reply into the batch; False if they do not fit.

        (`_received` says what is wrong then.)
        """
        try:
            self._rows.take(payload)  # type: ignore[union-attr]  # (`_rows_follow`: not None)
        except Exception:
            return False
        return True

    def _take_infos(self, seq: int, payload: bytes) -> bool:
        """Whether `payload`, the reply to `seq`, is an `answer_infos`: its ticket settled then.

        Call it with interrupts held back.
        """
        try:
            answer = infos_answer(payload)
        except Exception:  # (`_received`'s `decode_reply` says what is wrong)
            return False
        if answer is None:
            return False
        self._answered = seq
        ticket = self._waiting.pop(seq, None)
        if ticket is not None:
            ticket.outcome, ticket.code = outcome_of_infos(answer), INFOS
        return True

    # -- replies, and the end ----------------------------------------------------------------
    def _settle_messages(self, messages: list[tuple[int, bytes]]) -> None:
        """Settle the tickets of these whole replies, in order (interrupts held back)."""
        for seq, payload in messages:
            self._answered = seq
            self._received(seq, payload)

    def _received(self, seq: int, payload: bytes) -> None:
        """Settle the ticket of `seq` (if one waits) with the reply `payload`.

        Rows after it are copied into the batch first, for a ticket given up on too: a worker
        on shared memory would have written them there.
        """
        ticket = self._waiting.pop(seq, None)
        if ticket is not None:
            outcome = ticket.outcome = outcome_of_reply(payload, self._rows)
            if outcome.ok and is_record(payload):  # (an answer in place, read here: the lanes
                code = code_of(*RECORD.unpack_from(payload))  # take it as one of theirs)
                ticket.code = INFOS if code < 0 else code
        elif self._rows is not None:  # (a reply to a ticket given up on: its rows only)
            with contextlib.suppress(Exception):
                self._rows.take(payload)

    def forget(self, ticket: Ticket) -> None:
        """Drop interest in `ticket`; its reply is skipped when it comes."""
        self._waiting.pop(ticket.handle, None)

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Have the worker write numeric infos into these columns (with rows); nothing waits.

        Without rows, infos travel in the replies.
        """
        rows = self._rows
        if rows is None or self.broken:
            return  # (a worker given up on: nothing to share)
        ticket = Ticket(-1, -1, "share_infos", (list(specs),), ())
        data = self.encode(ticket)
        with deferred_interrupts():  # the rows and the worker's columns agree, or neither
            if rows.add_columns(specs):
                self.submit(ticket, data)
                self.forget(ticket)

    def _break(self) -> None:
        lost = self._death()  # (asking Ray why may take a moment: outside the block below)
        with DEFERRED:  # lost, with every ticket waiting settled, or nothing changed
            self._lost = lost
            self.broken = True
            self._settle_waiting(lost)
            self._outbox.clear()

    def _settle_waiting(self, outcome: Outcome) -> None:
        """Give every ticket still waiting on this transport `outcome` (the worker is lost)."""
        for ticket in self._waiting.values():
            ticket.outcome = outcome
        self._waiting.clear()

    def _death(self) -> Outcome:
        """Ray's word on why the channel closed (the worker died, in every case seen)."""
        if self._ended is not None:
            return Outcome(False, error=self._ended(), died=True)
        try:
            ray.get(self.serve_ref, timeout=self._grace)
        except RayError as err:
            return Outcome(False, error=err, died=True)
        cause = RuntimeError("the worker stopped serving its channel but is alive")
        return Outcome(False, error=cause, died=True)

    def close(self) -> None:
        """Close the channel and let go of the rows; the worker's serving sees the end.

        Tickets still waiting are settled as lost with the worker (a restart sends them to
        the new one), so none waits on a closed (and maybe reused) descriptor.
        """
        with DEFERRED:  # closed, with every ticket settled, or nothing changed
            if self._lost is None:
                cause = RuntimeError("the worker's channel was closed")
                self._lost = Outcome(False, error=cause, died=True)
            self._settle_waiting(self._lost)
            fds = {self._go, self._done} - {-1}  # (one socket is both)
            self._go = self._done = -1
            self.broken = True
            self._leaf, self._actions_shared = None, False  # (a step now: as to a lost worker)
            for fd in fds:  # (never closed twice: a number the kernel may give out again)
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._rows is not None:
            self._rows.close()
