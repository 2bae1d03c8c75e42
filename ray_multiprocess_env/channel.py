"""The pipe transport: a same-node data plane for batched `step` calls, beside Ray's calls.

A Ray actor call costs the driver about 0.4 ms and the worker about 0.6 ms of CPU (see
docs/performance.md), which is more than 64 CartPole steps. For a worker on the driver's own
node, `DriverEnd` and `WorkerEnd` carry the ``step_batch`` calls over two named pipes instead:
the driver writes the pickled actions to the worker's "go" pipe, a thread in the worker steps
its envs and writes the pickled result to the "done" pipe. Both sides block in ``read`` (no
spinning), so a slow env leaves the cores to the other workers. Ray keeps everything else:
creating, placing, resetting, calling, restarting and killing the workers, and detecting a
dead one (a closed pipe is confirmed with a Ray call, which raises Ray's own error).

The pipes are created in a private directory (in ``/dev/shm`` where it exists) and unlinked as
soon as both ends are open, so nothing is left behind if either process dies.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import select
import shutil
import struct
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import ray

__all__ = ["ChannelError", "DriverEnd", "WorkerEnd", "pipes_supported", "wait_readable"]

_HEADER = struct.Struct("<qq")  # sequence number, payload length
_OPEN_TIMEOUT_S = 30.0


def pipes_supported() -> bool:
    """Whether this platform has named pipes (POSIX)."""
    return hasattr(os, "mkfifo")


class ChannelError(Exception):
    """An env failure that came back over a pipe; `cause` holds it, as Ray's errors do."""

    def __init__(self, cause: BaseException, text: str) -> None:
        super().__init__(text)
        self.cause = cause


class WorkerEnd:
    """The worker's side: a thread that runs `step` for each message on the go pipe.

    Args:
        go: Path of the pipe the driver writes actions to.
        done: Path of the pipe the results go back on (the driver already reads it).
        step: Called with the actions; its return value is sent back.
        lock: Held while `step` runs, so Ray's calls to the same envs wait for it.
    """

    def __init__(
        self, go: str, done: str, step: Callable[[Any], Any], lock: threading.RLock
    ) -> None:
        self._done = os.open(done, os.O_WRONLY)
        self._go_path, self._step, self._lock = go, step, lock
        threading.Thread(target=self._serve, name="ray-multiprocess-env-pipe", daemon=True).start()

    def _serve(self) -> None:
        go = os.open(self._go_path, os.O_RDONLY)  # blocks until the driver opens its end
        try:
            while True:
                header = _read_exact(go, _HEADER.size)
                if header is None:  # the driver closed the channel (or died)
                    return
                seq, size = _HEADER.unpack(header)
                payload = _read_exact(go, size)
                if payload is None:
                    return
                reply = self._run(pickle.loads(payload))
                data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
                _write_all(self._done, _HEADER.pack(seq, len(data)) + data)
        except OSError:  # the driver went away mid-message
            return
        finally:
            os.close(go)
            os.close(self._done)

    def _run(self, actions: Any) -> tuple[bool, Any]:
        with self._lock:
            try:
                return True, self._step(actions)
            except Exception as err:
                text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
                try:
                    pickle.dumps(err)
                except Exception:
                    err = RuntimeError(text)
                return False, (err, text)


class DriverEnd:
    """The driver's side of one worker's pipes.

    Creating it asks the worker (over Ray) to open its end, so the worker must be alive.

    Args:
        actor: The `EnvWorker` actor handle.
        timeout: Seconds to wait for the worker to open its end.

    Raises:
        TimeoutError: If the worker does not open its end in time.
    """

    def __init__(self, actor: Any, timeout: float | None = None) -> None:
        wait = _OPEN_TIMEOUT_S if timeout is None else timeout
        directory = tempfile.mkdtemp(prefix="ray-multiprocess-env-", dir=_pipe_dir())
        go, done = os.path.join(directory, "go"), os.path.join(directory, "done")
        try:
            os.mkfifo(go, 0o600)
            os.mkfifo(done, 0o600)
            self._done = os.open(done, os.O_RDONLY | os.O_NONBLOCK)
            try:
                ray.get(actor.open_channel.remote(go, done), timeout=wait)
                self._go = _open_writer(go, time.monotonic() + wait)
            except BaseException:
                os.close(self._done)  # the worker never connected: do not leak the read end
                raise
        finally:
            shutil.rmtree(directory, ignore_errors=True)  # open pipes outlive their names
        os.set_blocking(self._done, True)
        self._seq = 0
        self.outstanding: int | None = None  # the sequence number of the step awaited
        self.stash: tuple[bool, Any] | None = None  # a reply settled before it was gathered

    def fileno(self) -> int:
        """The file descriptor `select` waits on for the reply."""
        return self._done

    def send(self, actions: Any) -> None:
        """Send `actions` for one ``step_batch``; exactly one `receive` must follow."""
        self._seq += 1
        data = pickle.dumps(actions, protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(self._go, _HEADER.pack(self._seq, len(data)) + data)
        self.outstanding = self._seq
        self.stash = None

    def receive(self) -> tuple[bool, Any]:
        """Read the reply to the last `send` (skipping replies to steps given up on).

        Returns:
            ``(True, result)`` or ``(False, (exception, traceback text))``.

        Raises:
            EOFError: If the worker closed its end (it died).
        """
        if self.stash is not None:
            stashed, self.stash = self.stash, None
            return stashed
        while True:
            header = _read_exact(self._done, _HEADER.size)
            if header is None:
                raise EOFError("the worker closed its pipe")
            seq, size = _HEADER.unpack(header)
            payload = _read_exact(self._done, size)
            if payload is None:
                raise EOFError("the worker closed its pipe")
            if seq == self.outstanding:
                self.outstanding = None
                reply: tuple[bool, Any] = pickle.loads(payload)
                return reply

    def close(self) -> None:
        """Close both pipes; the worker's thread sees the end and exits."""
        for fd in (self._go, self._done):
            with contextlib.suppress(OSError):
                os.close(fd)


def wait_readable(ends: Sequence[DriverEnd], timeout: float | None) -> list[DriverEnd]:
    """The `ends` whose reply is ready (or already stashed) within `timeout` seconds."""
    ready = [end for end in ends if end.stash is not None]
    if ready:
        return ready
    readable, _, _ = select.select(list(ends), [], [], timeout)
    return list(readable)


def _pipe_dir() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _open_writer(path: str, deadline: float) -> int:
    """Open `path` for writing once its reader (the worker's thread) has it open."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise
            if time.monotonic() > deadline:
                raise TimeoutError("the worker did not open its end of the pipe") from err
            time.sleep(0.001)
            continue
        os.set_blocking(fd, True)
        return fd


def _read_exact(fd: int, size: int) -> bytes | None:
    """Read exactly `size` bytes, or None at end of file."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
