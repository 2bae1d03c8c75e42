"""The same-node transport: each worker's operations over two named pipes.

A Ray actor call costs the driver about 0.4 ms and the worker about 0.6 ms of CPU (see
docs/performance.md), more than 64 CartPole steps. For a worker on the driver's node the driver
writes each operation to the worker's "go" pipe; the worker's `EnvWorker.serve`, which holds the
actor's main thread (the env thread), runs it and writes the reply to the "done" pipe. Both
sides block in the kernel (``poll``, no spinning), so a slow env leaves the cores to the others.

Interrupt safety: the driver reads replies without blocking into a buffer and takes out only
whole messages, and writes each message from a buffer that survives an interrupted wait, so a
``KeyboardInterrupt`` can never leave half a message behind; the few statements that move bytes
between the kernel and those buffers run with SIGINT held back (`deferred_interrupts`). Replies
to tickets given up on (an interrupted or timed-out call) are dropped by sequence number.

With shared memory (`share`, ``transport="auto"``), a full step's actions and the worker's
batched results travel through `_shared_memory` instead, and the pipe carries a doorbell and
the infos; replies answered with None are filled with this link's views (`_shared_in`).

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
from typing import Any

import ray
from ray.exceptions import RayError

from ray_multiprocess_env._engine.interrupts import deferred_interrupts
from ray_multiprocess_env._engine.transport import Outcome, Ticket, remaining
from ray_multiprocess_env._shared_memory import BatchViews, SharedBatch, write_actions
from ray_multiprocess_env._wire import HEADER, dumps, loads
from ray_multiprocess_env.batch import copy_batch
from ray_multiprocess_env.errors import RemoteFailure

__all__ = ["PipeLink", "pipes_supported", "wait_pipes"]

_PREFIX = "ray-multiprocess-env-"
_PIPE_SIZE = 1 << 20  # ask the kernel for 1 MiB pipes (Linux), so frames pass in one go
_F_SETPIPE_SZ = 1031


def pipes_supported() -> bool:
    """Whether this platform has named pipes and ``poll`` (POSIX)."""
    return hasattr(os, "mkfifo") and hasattr(select, "poll")


class PipeLink:
    """The driver's end of one worker's pipes.

    Creating it starts `EnvWorker.serve` on the worker (a Ray call that lasts as long as the
    pipes), so every later operation of that worker must come through this link.

    Raises:
        TimeoutError: If the worker does not open its end before `deadline`.
    """

    kind = "pipe"

    def __init__(self, actor: Any, deadline: float | None, grace: float) -> None:
        _remove_orphans()
        directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_pipe_dir())
        go, done = os.path.join(directory, "go"), os.path.join(directory, "done")
        try:
            os.mkfifo(go, 0o600)
            os.mkfifo(done, 0o600)
            self._done = os.open(done, os.O_RDONLY | os.O_NONBLOCK)
            try:
                self.serve_ref = actor.serve.remote(go, done)
                self._go = self._open_writer(go, deadline)
            except BaseException:
                _release(go)  # a `serve` waiting to open `go` returns, so Ray calls work again
                os.close(self._done)
                raise
        finally:
            shutil.rmtree(directory, ignore_errors=True)  # open pipes outlive their names
        for fd in (self._go, self._done):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        self._grace = grace
        self._seq = 0
        self._waiting: dict[int, Ticket] = {}
        self._inbox = bytearray()
        self._outbox = bytearray()
        self.broken = False  # the pipe closed: the worker died, or serving ended
        self.views: BatchViews | None = None  # this worker's rows of the shared arrays, if any
        self._answered = 0  # the sequence number of the last reply read
        self._share_seq = -1  # the sequence number of the `share` request
        self._actions_shared = False  # the worker maps the memory: actions may go through it
        self._action_space: Any = None

    def share(self, shared: SharedBatch, start: int, stop: int, deadline: float | None) -> None:
        """Have the worker use rows ``start..stop-1`` of `shared` (see `_shared_memory`).

        The views are in place before the request goes out, so whenever the worker starts
        answering None for its arrays (even after this wait timed out or was interrupted),
        the replies are filled; actions go through the memory only once the worker has said
        it maps it.

        Raises:
            TimeoutError: If the worker does not answer before `deadline`.
            RemoteFailure: If it cannot map the memory (it then goes on without).
        """
        self.views, self._action_space = shared.views(start, stop), shared.spec["action_space"]
        ticket = Ticket(-1, -1, "share", (shared.spec, start, stop), tuple(range(start, stop)))
        self.submit(ticket)
        self._share_seq = ticket.handle
        wait_pipes([ticket], deadline, 1)
        if ticket.outcome is None:
            self.forget(ticket)
            raise TimeoutError("the worker did not answer")
        if not ticket.outcome.ok:
            raise ticket.outcome.error or RuntimeError("the worker could not share memory")

    @property
    def idle(self) -> bool:
        """Whether the worker has answered every message sent to it."""
        return self._answered == self._seq

    def _open_writer(self, path: str, deadline: float | None) -> int:
        """Open `path` for writing once the worker's `serve` has opened it for reading."""
        while True:
            try:
                return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                if err.errno != errno.ENXIO:
                    raise
                ready, _ = ray.wait([self.serve_ref], timeout=0)
                if ready:  # `serve` ended before opening: the worker failed
                    ray.get(self.serve_ref)
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
        return bool(self._outbox)

    def encode(self, ticket: Ticket) -> bytes:
        """`ticket`'s operation as bytes (done before anything is sent, so errors come first).

        With shared memory, a full step's actions are copied there and sent as None, but only
        when the worker has answered everything sent before: an operation given up on (an
        interrupted step) may still wait in the pipe, and must run with its own actions.
        """
        if (
            ticket.op == "step"
            and self._actions_shared
            and self.views is not None
            and self.idle
            and len(ticket.args) == 1
            and write_actions(self.views, self._action_space, ticket.args[0])
        ):
            return dumps(("step", (None,)))
        return dumps((ticket.op, ticket.args))

    def submit(self, ticket: Ticket, data: bytes | None = None) -> None:
        """Queue `ticket`'s operation and write as much of it as the pipe takes now."""
        ticket.link = self
        if self.broken:
            ticket.outcome = self._death()
            return
        data = self.encode(ticket) if data is None else data
        self._seq += 1
        ticket.handle = self._seq
        with deferred_interrupts():
            self._outbox += HEADER.pack(self._seq, len(data)) + data
            self._waiting[self._seq] = ticket
        self.flush()

    def flush(self) -> None:
        """Write what the pipe takes now of the queued messages, without blocking."""
        gone = False
        while self._outbox and not gone and not self.broken:
            with deferred_interrupts():
                try:
                    del self._outbox[: os.write(self._go, self._outbox)]
                except BlockingIOError:
                    return
                except OSError:  # the worker closed its end: it is gone
                    gone = True
        if gone:
            self._break()

    def pump(self) -> None:
        """Read what has arrived and settle the tickets whose whole reply is in."""
        ended = False
        with deferred_interrupts():
            while not ended:
                try:
                    chunk = os.read(self._done, _PIPE_SIZE)
                except BlockingIOError:
                    break
                ended = not chunk
                self._inbox += chunk
                if len(chunk) < _PIPE_SIZE // 2:
                    break  # all there was, most likely: `poll` tells when more comes
            self._take_messages()
        if ended:
            self._break()  # outside the deferral: asking Ray why may take a moment

    def _take_messages(self) -> None:
        view, start = memoryview(self._inbox), 0
        while len(view) - start >= HEADER.size:
            seq, size = HEADER.unpack_from(view, start)
            if len(view) - start - HEADER.size < size:
                break
            payload = bytes(view[start + HEADER.size : start + HEADER.size + size])
            start += HEADER.size + size
            self._answered = seq
            ticket = self._waiting.pop(seq, None)
            if ticket is None and seq != self._share_seq:
                continue  # a reply to a ticket given up on
            outcome = _decode(payload)
            if seq == self._share_seq:  # also when the `share` request was given up on
                self._actions_shared = outcome.ok
            if ticket is not None:
                ticket.outcome = self._shared_in(ticket.op, outcome)
        view.release()
        del self._inbox[:start]

    def _shared_in(self, op: str, outcome: Outcome) -> Outcome:
        """`outcome` with the views of the shared arrays where the worker answered None."""
        views, value = self.views, outcome.value
        if views is None or not outcome.ok or type(value) is not tuple or value[0] is not None:
            return outcome
        if op == "step":
            arrays = (views.observations, views.rewards, views.terminations, views.truncations)
            return Outcome(True, (*arrays, value[4]))
        return Outcome(True, (views.observations, value[1]))  # a reset

    def detached(self, op: str, value: Any) -> Any:
        """`value` (a result of `op`) with copies in place of views of the shared memory."""
        views = self.views
        if views is None or type(value) is not tuple or not value:
            return value
        if op == "step" and len(value) == 5 and value[1] is views.rewards:
            return (*(copy_batch(part) for part in value[:4]), value[4])
        if op == "reset" and len(value) == 2 and value[0] is views.observations:
            return (copy_batch(value[0]), value[1])
        return value

    def forget(self, ticket: Ticket) -> None:
        """Drop interest in `ticket`; its reply is skipped when it comes."""
        self._waiting.pop(ticket.handle, None)

    def _break(self) -> None:
        self.broken = True
        self._settle_waiting(self._death())
        self._outbox.clear()

    def _settle_waiting(self, outcome: Outcome) -> None:
        """Give every ticket still waiting on this link `outcome` (the worker is lost)."""
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
        self._settle_waiting(
            Outcome(False, error=RuntimeError("the worker's pipes were closed"), died=True)
        )
        self.views = None
        if self._go >= 0:
            for fd in (self._go, self._done):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._go = self._done = -1
        self.broken = True


def wait_pipes(tickets: list[Ticket], deadline: float | None, min_count: int) -> None:
    """Pump the links of unsettled `tickets` until `min_count` of them settle or `deadline`."""
    while True:
        open_tickets = [t for t in tickets if t.outcome is None]
        if len(tickets) - len(open_tickets) >= min_count or not open_tickets:
            return
        links = tuple({id(t.link): t.link for t in open_tickets}.values())
        poller, readers, writers = _poller(links)
        left = remaining(deadline)
        ready = poller.poll(None if left is None else int(left * 1000) + 1)
        for fd, _ in ready:
            if fd in readers:
                readers[fd].pump()
            else:
                writers[fd].flush()
        if not ready and left is not None and left <= 0:
            return


_last_poller: tuple[tuple[PipeLink, ...], Any, dict[int, PipeLink]] | None = None


def _poller(links: tuple[PipeLink, ...]) -> tuple[Any, dict[int, PipeLink], dict[int, PipeLink]]:
    """A ``poll`` object for `links` (the last one again when only the same links read)."""
    global _last_poller
    writers = {link.write_fileno(): link for link in links if link.wants_write}
    if not writers and _last_poller is not None and _last_poller[0] == links:
        return _last_poller[1], _last_poller[2], writers
    poller, readers = select.poll(), {}
    for link in links:
        readers[link.fileno()] = link
        poller.register(link.fileno(), select.POLLIN)
    for fd in writers:  # a message still half in its out-buffer
        poller.register(fd, select.POLLOUT)
    _last_poller = None if writers else (links, poller, readers)
    return poller, readers, writers


def _decode(payload: bytes) -> Outcome:
    try:
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
