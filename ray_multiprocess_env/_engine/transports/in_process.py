"""The in-process transport: each worker on a thread of the driver's process, no Ray.

A worker's thread builds its envs and serves its end of a socket pair with the worker's own loop
(`_worker/serve_loop.py`); the driver's end is a `channel.ChannelTransport`, as a worker's pipes
are: messages and replies are framed and serialized exactly as there, so a reply is the driver's
own copy and serialization errors surface as they would. A worker can be killed
(`InProcessWorker.kill`): its end of the pair is shut, the driver reads the end and its tickets
settle as lost, as after a real death; its thread finishes what it was doing and drops the
reply. The engine's logic (restart decisions, late against dead workers, resumable timeouts,
first-ready bookkeeping) is tested on it without starting Ray; it is not offered to users.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from ray_multiprocess_env._engine.pool import Worker
from ray_multiprocess_env._engine.transports.base import remaining
from ray_multiprocess_env._engine.transports.channel import ChannelTransport, Link
from ray_multiprocess_env._protocol.pipes import answer
from ray_multiprocess_env._worker.env_worker import EnvWorker
from ray_multiprocess_env._worker.serve_loop import serve_fds
from ray_multiprocess_env.errors import EnvCrashedError

__all__ = ["InProcessLauncher", "InProcessWorker"]


class InProcessWorker:
    """An `EnvWorker` on a thread of its own, built there and serving its end of a socket pair.

    `driver_fd` is the driver's end (for its transport, which closes it).
    """

    def __init__(self, make: Callable[[], EnvWorker], env_indices: list[int]) -> None:
        self.env_indices = env_indices
        self.dead = False
        self.error: BaseException | None = None
        self.started = threading.Event()
        driver_end, self._end = socket.socketpair()
        driver_end.setblocking(False)
        self.driver_fd = driver_end.detach()
        self._thread = threading.Thread(target=self._run, args=(make,), daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], EnvWorker]) -> None:
        try:
            worker = make()
        except BaseException as err:
            self.error = err
            self._end.close()
            os.close(self.driver_fd)  # (no transport takes it: the start failed)
            return
        finally:
            self.started.set()
        fd, indices = self._end.fileno(), self.env_indices
        try:
            serve_fds(fd, fd, lambda seq, payload: [answer(worker.handle, indices, seq, payload)])
        finally:
            self._end.close()

    def link(self) -> Link:
        """The driver's end of the pair, as a channel's link."""
        return Link(self.driver_fd, self.driver_fd, None, _killed)

    def kill(self) -> None:
        """Die: the driver reads the end at once (the message being run finishes on its own)."""
        self.dead = True
        with contextlib.suppress(OSError):  # (closed already: the thread ended)
            self._end.shutdown(socket.SHUT_RDWR)


def _killed() -> BaseException:
    return RuntimeError("the in-process worker was killed")


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
            worker.node_id = "in-process"
            worker.transport = ChannelTransport("in_process", thread.link(), 0.0)

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
