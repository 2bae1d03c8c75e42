"""The same-node channel: two named pipes to a worker on the driver's node.

A Ray actor call costs the driver about 0.4 ms and the worker about 0.6 ms of CPU (see
docs/performance.md), more than 64 CartPole steps. For a worker on the driver's node the driver
writes each operation to the worker's "go" pipe; the worker's `EnvWorker.serve`, which holds the
actor's main thread (the env thread), runs it and writes the reply to the "done" pipe (the
driver's end is a `channel.ChannelTransport`). Both sides block in the kernel (``poll``), so a
slow env leaves the cores to the others; a worker with a core of its own polls for its next
message a while first (`worker_spin`). `pipe_transport` is a worker's transport over pipes alone
(its rows as raw bytes after the messages, as over the TCP stream);
`shared_memory.shared_memory_transport` puts the batch's rows in memory shared with it.

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
from typing import Any

import ray

from ray_multiprocess_env._engine.transports.base import Rows
from ray_multiprocess_env._engine.transports.channel import ChannelTransport, Link
from ray_multiprocess_env._protocol.pipes import PIPE_SIZE

__all__ = ["open_pipes", "pipe_transport", "pipes_supported"]

_PREFIX = "ray-multiprocess-env-"
_F_SETPIPE_SZ = 1031


def pipes_supported() -> bool:
    """Whether this platform has named pipes and ``poll`` (POSIX)."""
    return hasattr(os, "mkfifo") and hasattr(select, "poll")


def pipe_transport(
    actor: Any,
    deadline: float | None,
    grace: float,
    spin_us: int = 0,
    rows: Rows | None = None,
    columns: Sequence[dict[str, Any]] = (),
) -> ChannelTransport:
    """The transport of a worker (`actor`) on this node over pipes alone (see `open_pipes`).

    `rows`: the worker's rows of the batch, sent after the messages as over the TCP stream
    (`tcp.StreamRows`), with the info `columns` made so far; None (spaces with no layout):
    everything is pickled. `grace`: seconds to wait for Ray's word on a worker whose pipe
    closed.

    Raises:
        TimeoutError: If the worker does not open its pipes, or take its rows, by `deadline`.
        RemoteFailure: If it cannot keep its rows (the rows and pipes are closed then).
    """
    return ChannelTransport.open(
        "pipe",
        lambda: open_pipes(actor, deadline, spin_us, rows is not None),
        grace,
        spin_us,
        rows,
        deadline,
        columns,
    )


def open_pipes(actor: Any, deadline: float | None, spin_us: int, rows: bool = False) -> Link:
    """Start the worker's `serve` over new pipes: their "go" and "done" ends, and the call.

    Every later operation of that worker must come through them. `spin_us`: how long the
    worker polls for its next message before it sleeps (`worker_spin`); `rows`: the messages
    carry rows after them (`EnvWorker.serve`).

    Raises:
        TimeoutError: If the worker does not open its end before `deadline`.
    """
    _remove_orphans()
    directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_pipe_dir())
    go, done = os.path.join(directory, "go"), os.path.join(directory, "done")
    try:
        os.mkfifo(go, 0o600)
        os.mkfifo(done, 0o600)
        done_fd = os.open(done, os.O_RDONLY | os.O_NONBLOCK)
        try:
            serve_ref = actor.serve.remote(go, done, spin_us, rows)
            go_fd = _open_writer(go, serve_ref, deadline)
        except BaseException:
            _release(go)  # a `serve` waiting to open `go` returns, so Ray calls work again
            os.close(done_fd)
            raise
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # open pipes outlive their names
    for fd in (go_fd, done_fd):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
    return Link(go_fd, done_fd, serve_ref)


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
