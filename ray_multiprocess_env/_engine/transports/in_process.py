"""The in-process transport: each worker on a thread of the driver's process, no Ray.

Messages are serialized both ways exactly as on the pipes (`_protocol.pipes.answer`), so a
reply is the driver's own copy and serialization errors surface as they would. A worker can be
killed (`InProcessWorker.kill`): its tickets then settle as lost, as after a real death, and its
thread drops whatever it was doing when it finishes. The engine's logic (restart decisions, late
against dead workers, resumable timeouts, first-ready bookkeeping) is tested on it without
starting Ray; it is not offered to users.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from ray_multiprocess_env._engine.interrupts import POLL_SLICE_MS
from ray_multiprocess_env._engine.pool import Worker
from ray_multiprocess_env._engine.transports.base import Outcome, Ticket, decode_reply, remaining
from ray_multiprocess_env._protocol.pipes import HEADER, answer, dumps
from ray_multiprocess_env._worker.env_worker import EnvWorker
from ray_multiprocess_env.errors import EnvCrashedError

__all__ = ["InProcessLauncher", "InProcessTransport", "InProcessWorker"]

_CHANGED = threading.Condition()  # notified whenever a reply arrives or a worker dies


class InProcessWorker:
    """An `EnvWorker` on a thread of its own, built there and serving a queue of messages."""

    def __init__(self, make: Callable[[], EnvWorker], env_indices: list[int]) -> None:
        self.env_indices = env_indices
        self.dead = False
        self.error: BaseException | None = None
        self.started = threading.Event()
        self.replies: list[bytes] = []
        self._inbox: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(make,), daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], EnvWorker]) -> None:
        try:
            worker = make()
        except BaseException as err:
            self.error = err
            return
        finally:
            self.started.set()
        while True:
            message = self._inbox.get()
            if message is None or self.dead:
                return
            reply = answer(worker.handle, self.env_indices, *message)
            with _CHANGED:
                if not self.dead:
                    self.replies.append(reply)
                _CHANGED.notify_all()

    def send(self, seq: int, data: bytes) -> None:
        """Queue a message."""
        self._inbox.put((seq, data))

    def kill(self) -> None:
        """Die: no more replies (the message being run finishes on its own)."""
        with _CHANGED:
            self.dead = True
            _CHANGED.notify_all()
        self._inbox.put(None)


class _InProcessWaiter:
    """Waits on the condition every in-process worker notifies."""

    def wait(self, tickets: Sequence[Ticket], deadline: float | None, min_count: int) -> None:
        transports = {id(t.transport): cast(InProcessTransport, t.transport) for t in tickets}
        with _CHANGED:
            while True:
                for transport in transports.values():
                    transport.collect()
                settled = sum(t.outcome is not None for t in tickets)
                left = remaining(deadline)
                if settled >= min_count or left == 0:
                    return
                slice_s = POLL_SLICE_MS / 1000  # (as the pipes' waits: a Ctrl-C comes through)
                _CHANGED.wait(slice_s if left is None else min(left, slice_s))


class InProcessTransport:
    """The driver's end of an `InProcessWorker`."""

    kind = "in_process"
    waiter = _InProcessWaiter()
    hot = False

    def __init__(self, worker: InProcessWorker) -> None:
        self._worker = worker
        self._seq = itertools.count(1)
        self._waiting: dict[int, Ticket] = {}

    def encode(self, ticket: Ticket) -> bytes:
        """The operation as bytes (as on a pipe)."""
        return dumps((ticket.op, ticket.args))

    def submit(self, ticket: Ticket, data: Any = None) -> None:
        """Queue the operation; a dead worker's ticket settles as lost at once."""
        ticket.transport = self
        if self._worker.dead:
            ticket.outcome = _lost()
            return
        ticket.handle = next(self._seq)
        self._waiting[ticket.handle] = ticket
        self._worker.send(ticket.handle, self.encode(ticket) if data is None else data)

    def collect(self) -> None:
        """Settle the tickets whose replies are in (call with `_CHANGED` held)."""
        replies, self._worker.replies = self._worker.replies, []
        for reply in replies:
            seq, size = HEADER.unpack_from(reply)
            ticket = self._waiting.pop(seq, None)
            if ticket is not None:
                ticket.outcome = decode_reply(reply[HEADER.size : HEADER.size + size])
        if self._worker.dead:
            for ticket in self._waiting.values():
                ticket.outcome = _lost()
            self._waiting.clear()

    def forget(self, ticket: Ticket) -> None:
        """Drop interest in `ticket`."""
        self._waiting.pop(ticket.handle, None)

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Nothing: infos travel in the replies."""

    def close(self) -> None:
        """Tickets still waiting settle as lost."""
        with _CHANGED:
            for ticket in self._waiting.values():
                ticket.outcome = _lost()
            self._waiting.clear()


def _lost() -> Outcome:
    return Outcome(False, error=RuntimeError("the in-process worker was killed"), died=True)


class InProcessLauncher:
    """Starts workers as `InProcessWorker` threads (see the module docstring)."""

    def __init__(self, worker_args: dict[str, Any] | None = None) -> None:
        self._worker_args = dict(worker_args or {})
        self.started: list[InProcessWorker] = []  # every worker started, for tests to kill

    def create(
        self, index: int, env_fns: Sequence[Callable[[], Any]], envs: range, seeds: Any
    ) -> InProcessWorker:
        """Start the thread of worker `index`."""
        args = (list(env_fns), list(envs))

        def make() -> EnvWorker:
            worker = EnvWorker(*args, restart_seeds=seeds, **self._worker_args)
            if worker.start_error is not None:  # (a factory raised: as Ray's first call)
                raise worker.start_error
            return worker

        worker = InProcessWorker(make, list(envs))
        self.started.append(worker)
        return worker

    def connect(self, workers: Sequence[Worker], deadline: float | None, label: str) -> None:
        """Wait until the workers built their envs."""
        for worker in workers:
            thread = cast(InProcessWorker, worker.actor)
            if not thread.started.wait(remaining(deadline)):
                raise TimeoutError(f"`{label}`: the worker of envs {list(worker.envs)} is late")
            if thread.error is not None:
                error = thread.error
                every = workers[-1].envs.stop if label == "start" else None  # (as Ray's)
                raise EnvCrashedError(
                    worker.envs.start, label, error, env_indices=worker.envs, num_envs=every
                ) from error
            worker.node_id, worker.transport = "in-process", InProcessTransport(thread)

    def open(self, *args: Any, **kwargs: Any) -> None:
        """Nothing more: no pipes or shared memory in process (as `ActorLauncher.open`)."""

    def kill(self, worker: Worker, *, wait_gone: bool = False) -> None:
        """Kill the worker's thread (it drops what it was doing)."""
        worker.transport.close()
        cast(InProcessWorker, worker.actor).kill()

    def release(self) -> None:
        """Nothing to release."""

    @staticmethod
    def reachable() -> bool:
        """Always: the workers are threads of this process."""
        return True
