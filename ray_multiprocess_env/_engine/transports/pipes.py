"""The same-node transport: each worker's operations over two named pipes.

A Ray actor call costs the driver about 0.4 ms and the worker about 0.6 ms of CPU (see
docs/performance.md), more than 64 CartPole steps. For a worker on the driver's node the driver
writes each operation to the worker's "go" pipe; the worker's `EnvWorker.serve`, which holds the
actor's main thread (the env thread), runs it and writes the reply to the "done" pipe (the
protocol is `_protocol/pipes.py`, the worker's loop `_worker/serve_loop.py`). Both sides block
in the kernel (``poll``), so a slow env leaves the cores to the others; a worker with a core of
its own polls for its next message a while first (`worker_spin`). Replies to tickets given up
on (an interrupted or timed-out call) are dropped by sequence number.

The pipes are made in a private directory (mode 0700, in ``/dev/shm`` where it exists) and
unlinked as soon as both ends are open; the directory's name carries the driver's pid, so one
left behind by a driver killed in that moment is removed by the next driver on the machine.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any, cast

import ray
from ray.exceptions import RayError

from ray_multiprocess_env._engine.interrupts import DEFERRED, POLL_SLICE_MS, deferred_interrupts
from ray_multiprocess_env._engine.transports.base import Outcome, Ticket, remaining
from ray_multiprocess_env._protocol.pipes import (
    PIPE_SIZE,
    Inbox,
    Outbox,
    dumps,
    infos_answer,
    loads,
)
from ray_multiprocess_env._protocol.status import (
    RECORD,
    code_of,
    is_record,
    reply_of_code,
    reply_of_infos,
)
from ray_multiprocess_env.errors import RemoteFailure

__all__ = [
    "PipeTransport",
    "decode_reply",
    "outcome_of_code",
    "outcome_of_infos",
    "pipes_supported",
]

_PREFIX = "ray-multiprocess-env-"
_F_SETPIPE_SZ = 1031


def pipes_supported() -> bool:
    """Whether this platform has named pipes and ``poll`` (POSIX)."""
    return hasattr(os, "mkfifo") and hasattr(select, "poll")


class _PipeWaiter:
    """Polls the "done" pipes of the tickets' transports (``poll``, so any descriptor number)."""

    def __init__(self) -> None:
        self._last: tuple[tuple[PipeTransport, ...], Any, dict[int, PipeTransport]] | None = None

    def wait(self, tickets: Sequence[Ticket], deadline: float | None, min_count: int) -> None:
        pipes = tuple({id(t.transport): cast(PipeTransport, t.transport) for t in tickets}.values())
        count = len(tickets)
        while True:
            settled = 0
            for ticket in tickets:
                if ticket.outcome is not None:
                    settled += 1
            if settled >= min_count or settled == count:
                return
            live = tuple(pipe for pipe in pipes if not pipe.broken)  # (a broken one stays ready)
            if not live:
                return  # (every ticket of theirs has its outcome)
            poller, readers, writers = self._poller(live)
            left = remaining(deadline)
            wait = POLL_SLICE_MS if left is None else min(int(left * 1000) + 1, POLL_SLICE_MS)
            ready = poller.poll(wait)  # (in slices, so that a Ctrl-C comes through)
            for fd, event in ready:
                writer = writers.get(fd)
                if writer is not None and (event & select.POLLOUT or fd not in readers):
                    writer.flush()
                reader = readers.get(fd)
                if reader is not None and (writer is None or event & ~select.POLLOUT):
                    reader.pump()
            if left is not None and left <= 0:
                return

    def _poller(
        self, pipes: tuple[PipeTransport, ...]
    ) -> tuple[Any, dict[int, PipeTransport], dict[int, PipeTransport]]:
        """A ``poll`` object for `pipes` (the last one again when only the same pipes read)."""
        writers = {pipe.write_fileno(): pipe for pipe in pipes if pipe.wants_write}
        if not writers and self._last is not None and self._last[0] == pipes:
            return self._last[1], self._last[2], writers
        poller, readers = select.poll(), {}
        for pipe in pipes:
            readers[pipe.fileno()] = pipe
            poller.register(pipe.fileno(), select.POLLIN)
        for fd in writers:  # a message still half in its out-buffer (a socket reads too)
            poller.register(fd, select.POLLOUT | (select.POLLIN if fd in readers else 0))
        self._last = None if writers else (pipes, poller, readers)
        return poller, readers, writers


_WAITER = _PipeWaiter()


class PipeTransport:
    """The driver's end of one worker's pipes.

    Creating it starts `EnvWorker.serve` on the worker (a Ray call that lasts as long as the
    pipes), so every later operation of that worker must come through this transport.

    Raises:
        TimeoutError: If the worker does not open its end before `deadline`.
    """

    kind = "pipe"
    waiter = _WAITER
    hot = False

    def __init__(self, actor: Any, deadline: float | None, grace: float, spin_us: int = 0) -> None:
        self._go, self._done, self.serve_ref = self._connect(actor, deadline, spin_us)
        self.spin_us = spin_us  # how long the worker polls before it sleeps (`worker_spin`)
        self._grace = grace
        self._seq = 0
        self._answered = 0  # the sequence number of the last reply read
        self._waiting: dict[int, Ticket] = {}
        self._outbox = Outbox(deferred_interrupts)
        self._inbox = Inbox(deferred_interrupts)
        self.broken = False  # the pipe closed: the worker died, or serving ended
        self._lost: Outcome | None = None  # the outcome of every ticket once broken
        # messages read (and whether the pipe ended) that wait for `settle`
        self._unsettled: tuple[list[tuple[int, bytes]], bool] | None = None

    def _connect(self, actor: Any, deadline: float | None, spin_us: int) -> tuple[int, int, Any]:
        """Start the worker's `serve` over new pipes: their "go" and "done" ends, and the call.

        `spin_us`: how long the worker polls for its next message before it sleeps
        (`worker_spin`).
        """
        _remove_orphans()
        directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_pipe_dir())
        go, done = os.path.join(directory, "go"), os.path.join(directory, "done")
        try:
            os.mkfifo(go, 0o600)
            os.mkfifo(done, 0o600)
            done_fd = os.open(done, os.O_RDONLY | os.O_NONBLOCK)
            try:
                serve_ref = actor.serve.remote(go, done, spin_us)
                go_fd = self._open_writer(go, serve_ref, deadline)
            except BaseException:
                _release(go)  # a `serve` waiting to open `go` returns, so Ray calls work again
                os.close(done_fd)
                raise
        finally:
            shutil.rmtree(directory, ignore_errors=True)  # open pipes outlive their names
        for fd in (go_fd, done_fd):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
        return go_fd, done_fd, serve_ref

    @property
    def idle(self) -> bool:
        """Whether the worker has answered every message sent to it."""
        return self._answered == self._seq

    @staticmethod
    def _open_writer(path: str, serve_ref: Any, deadline: float | None) -> int:
        """Open `path` for writing once the worker's `serve` has opened it for reading."""
        while True:
            try:
                return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                if err.errno != errno.ENXIO:
                    raise
                ready, _ = ray.wait([serve_ref], timeout=0)
                if ready:  # `serve` ended before opening: the worker failed
                    ray.get(serve_ref)
                    raise RuntimeError("the worker stopped serving its pipe") from err
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError("the worker did not open its end of the pipe") from err
                time.sleep(0.001)

    def fileno(self) -> int:
        """The descriptor replies arrive on."""
        return self._done

    def write_fileno(self) -> int:
        """The descriptor messages are written to."""
        return self._go

    @property
    def wants_write(self) -> bool:
        """Whether part of a message still waits to be written."""
        return bool(self._outbox.pending)

    def encode(self, ticket: Ticket) -> bytes:
        """`ticket`'s operation as bytes (done before anything is sent, so errors come first)."""
        return self.encode_op(ticket.op, ticket.args)

    def encode_op(self, op: str, args: Any) -> bytes:
        """The message of `op` with `args`, pickled (serialization errors are raised here)."""
        return dumps((op, args))

    def submit(self, ticket: Ticket, data: Any = None) -> None:
        """Queue `ticket`'s operation and write as much of it as the pipe takes now."""
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
        """Write what the pipe takes now of the queued messages, without blocking."""
        if not self.broken and not self._outbox.flush(self._go):
            self._break()  # the worker closed its end: it is gone

    def pump(self) -> None:
        """Read what has arrived and settle the tickets whose whole reply is in."""
        if self._unsettled is not None:  # (read by a lane step given up before its tickets)
            self.settle()
        with DEFERRED:  # from the kernel's buffer to the outcomes in one go
            messages, ended = self._inbox.read(self._done)
            self._settle_messages(messages)
        if ended:
            self._break()  # outside the deferral: asking Ray why may take a moment

    def adopt(self, ticket: Ticket, seq: int) -> None:
        """`ticket` stands for message `seq`, sent with no ticket (a lane's step, `ring`).

        Its reply settles it when it comes (or came, and waits for `settle`); once the
        transport is lost, it settles as lost at once. A reply already read and taken as a
        lane's is not this transport's to give: the caller settles that ticket.
        """
        ticket.transport, ticket.handle = self, seq
        if self.broken:
            ticket.outcome = self._lost
        elif seq > self._answered:
            self._waiting[seq] = ticket

    def settle(self) -> bool:
        """Settle the tickets of the messages a lane read but left (`_unsettled`).

        False if the pipe had ended: reading it again (`pump`) finds the end again and
        settles what still waits as lost, out of any block that holds interrupts back.
        """
        with DEFERRED:
            unsettled, self._unsettled = self._unsettled, None
            if unsettled is None:
                return True
            messages, ended = unsettled
            self._settle_messages(messages)
        return not ended

    def _settle_messages(self, messages: list[tuple[int, bytes]]) -> None:
        """Settle the tickets of these whole replies, in order (interrupts held back)."""
        for seq, payload in messages:
            self._answered = seq
            self._received(seq, payload)

    def _received(self, seq: int, payload: bytes) -> None:
        ticket = self._waiting.pop(seq, None)
        if ticket is not None:  # else a reply to a ticket given up on
            ticket.outcome = decode_reply(payload)

    def forget(self, ticket: Ticket) -> None:
        """Drop interest in `ticket`; its reply is skipped when it comes."""
        self._waiting.pop(ticket.handle, None)

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Nothing: infos travel in the replies."""

    def _break(self) -> None:
        lost = self._death()  # (asking Ray why may take a moment: outside the block below)
        with DEFERRED:  # lost, with every ticket waiting settled, or nothing changed
            self._lost = lost  # (before `broken`: `adopt` gives it to every new ticket)
            self.broken = True
            self._settle_waiting(lost)
            self._outbox.clear()

    def _settle_waiting(self, outcome: Outcome) -> None:
        """Give every ticket still waiting on this transport `outcome` (the worker is lost)."""
        for ticket in self._waiting.values():
            ticket.outcome = outcome
        self._waiting.clear()

    def _death(self) -> Outcome:
        """Ray's word on why the pipe closed (the worker died, in every case seen)."""
        try:
            ray.get(self.serve_ref, timeout=self._grace)
        except RayError as err:
            return Outcome(False, error=err, died=True)
        cause = RuntimeError("the worker stopped serving its pipe but is alive")
        return Outcome(False, error=cause, died=True)

    def close(self) -> None:
        """Close both pipes; the worker's `serve` sees the end and returns.

        Tickets still waiting are settled as lost with the worker (a restart sends them to
        the new one), so none waits on a closed (and maybe reused) descriptor.
        """
        with DEFERRED:  # closed, with every ticket settled, or nothing changed
            if self._lost is None:
                cause = RuntimeError("the worker's pipes were closed")
                self._lost = Outcome(False, error=cause, died=True)
            self._settle_waiting(self._lost)
            fds = {self._go, self._done} - {-1}  # (one socket is both)
            self._go = self._done = -1
            self.broken = True
            for fd in fds:  # (never closed twice: a number the kernel may give out again)
                with contextlib.suppress(OSError):
                    os.close(fd)


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


def _release(path: str) -> None:
    """Let a reader blocked opening the pipe `path` through, and give it end of file."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))


def _pipe_dir() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _remove_orphans() -> None:
    """Remove pipe directories left by drivers of this user that no longer run."""
    base = _pipe_dir() or tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            if not name.startswith(_PREFIX):
                continue
            pid = name[len(_PREFIX) :].split("-", 1)[0]
            path = os.path.join(base, name)
            if pid.isdigit() and not _alive(int(pid)) and os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
