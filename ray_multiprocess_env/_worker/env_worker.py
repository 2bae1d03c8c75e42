"""`EnvWorker`: the actor that holds K envs and steps them all in one call.

One call to a worker costs far more than a cheap env step, so a worker steps its K envs per call
and answers with complete rows: it writes each env's observation, reward and flags into its rows
of the batch (the vector env's shared memory when the driver is on the same node, else rows of
its own sent as raw bytes after its reply) and batches its envs' infos itself (`InfoBatcher`,
gymnasium's layout, numeric keys in columns), so the driver joins nothing env by env. Seeds,
autoreset (gymnasium's three modes) and per-env exception capture happen here too, so an
autoreset costs no extra round trip and a failure still names the global env index.

Every env method runs on one thread: the actor's main thread, which built the envs. Ray runs
the calls of a plain (non-threaded) actor there, and the same-node pipe transport is served
there too (`serve` holds the main thread and dispatches each message exactly as a Ray call
would be), so envs bound to their thread (OpenGL/EGL contexts, pygame, ``signal.alarm``) work
with every transport; so is the TCP stream of a worker on another node (`serve_stream`). Ray
calls of `message` carry the stream's bytes (``transport="ray"``). This module imports nothing
of the driver side.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env._protocol import pipes, space_match, stream
from ray_multiprocess_env._protocol.infos import InfoBatcher
from ray_multiprocess_env._protocol.status import Reply
from ray_multiprocess_env._worker import serve_loop
from ray_multiprocess_env._worker.batch import Rebuild, WorkerBatch
from ray_multiprocess_env._worker.rows import WorkerRows
from ray_multiprocess_env.compat import (
    crashed_step,
    env_call,
    env_get_attr,
    env_has_attr,
    env_is_wrapped,
    env_set_attr,
)
from ray_multiprocess_env.errors import _EnvFailures

__all__ = ["INFO_LAYOUTS", "WORKER_ENV_METHODS", "EnvWorker"]

#: The names `apply` runs as functions of the env (through gymnasium's wrapper-aware access).
_ATTRIBUTE_METHODS: dict[str, Callable[..., Any]] = {
    "call": env_call,
    "get_attr": env_get_attr,
    "has_attr": env_has_attr,
    "set_attr": env_set_attr,
    "is_wrapped": env_is_wrapped,
}
#: Those `RayVectorEnv.call_each` runs as such; SB3's ``has_attr`` is only for `SB3VecEnv`.
WORKER_ENV_METHODS = tuple(name for name in _ATTRIBUTE_METHODS if name != "has_attr")
#: How a worker hands out its envs' infos: gymnasium's batched dict, or one dict per env.
INFO_LAYOUTS = ("batched", "per_env")


class EnvWorker:
    """Holds the envs ``env_indices`` (built by `env_fns`) inside one Ray actor.

    Args:
        env_fns: One factory per env; each is called once, on the actor's main thread.
        env_indices: The global index of each env, used in error messages.
        autoreset_mode: gymnasium's autoreset mode (its value) for the batched ``step``.
        restart_seeds: Given when this worker replaces one that was lost: every env is reset
            at once with its seed, and its next ``step`` reports the lost episode as truncated
            with ``info["env_crashed"] = True`` instead of stepping.
        info_layout: ``"batched"`` (gymnasium's dict) or ``"per_env"`` (a dict per env).
        on_env_error: ``"raise"``, or ``"restart"``: an env that raises is built again from
            its factory (at most `max_restarts` times each; None: no limit).
        max_restarts: See `on_env_error`.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        env_indices: Sequence[int],
        autoreset_mode: str = AutoresetMode.NEXT_STEP.value,
        restart_seeds: Sequence[int | None] | None = None,
        info_layout: str = "batched",
        on_env_error: str = "raise",
        max_restarts: int | None = None,
    ) -> None:
        self._thread = threading.get_ident()
        self.env_indices = list(env_indices)
        self.envs = []
        #: Why the envs could not be built (a factory raised), or None. Every call raises it:
        #: an actor whose ``__init__`` raised would have Ray print its traceback on the
        #: driver's console before the driver's own error says the same.
        self.start_error: RuntimeError | None = None
        for index, env_fn in zip(self.env_indices, env_fns, strict=True):
            try:
                self.envs.append(env_fn())
            except Exception as err:
                self.start_error = RuntimeError(
                    f"env {index}: its factory raised {type(err).__name__}: {err}"
                )
                self.start_error.__cause__ = err
                for env in self.envs:  # (those built before it)
                    with contextlib.suppress(Exception):
                        env.close()
                return
        self._observation_space: Any = getattr(self.envs[0], "observation_space", None)
        self._action_space: Any = getattr(self.envs[0], "action_space", None)
        # (one row layout if only the observations' bounds differ; `describe` reports it)
        self._layout_mismatch = self._mismatch(False)
        self._rows = WorkerRows(
            self._observation_space, self._action_space, len(self.envs), not self._layout_mismatch
        )
        self._batch = WorkerBatch(
            self.envs,
            self.env_indices,
            self._rows,
            AutoresetMode(autoreset_mode),
            info_layout == "batched",
            Rebuild(env_fns, max_restarts) if on_env_error == "restart" else None,
        )
        if restart_seeds is not None:
            self._batch.restarted(restart_seeds)
        self._plain = _plain_handle(self)  # what the pipes' and the stream's messages run
        self._acceptor: stream.Acceptor | None = None  # `listen`'s, for `serve_stream`

    # -- the ways in: a Ray call (`handle`, or `message`), the pipes, the TCP stream -----------
    def handle(self, op: str, args: tuple[Any, ...]) -> Any:
        """Run operation `op` (``step``, ``reset``, ``apply``, ...) with `args`."""
        if threading.get_ident() != self._thread:  # pragma: no cover - Ray's plain actors
            raise RuntimeError("EnvWorker was called off the thread that built its envs")
        if self.start_error is not None:
            raise self.start_error
        method: Callable[..., Any] = getattr(self, f"_op_{op}")
        return method(*_writable(args))

    def serve(self, go: str, done: str, spin_us: int = 0, rows: bool = False) -> None:
        """Serve operations from the named pipe `go`, replies to `done`, until the driver leaves.

        Holds the main thread, so the envs stay on the thread that built them; every
        operation must then come over the pipe (Ray calls would wait behind this one).
        `spin_us`: how long, at least, to poll for the next message before sleeping
        (`serve_loop.serve_fds`); `rows`: the messages are the TCP stream's, rows after them
        (else the shared memory's, or everything pickled).
        """
        if rows:
            respond = self._stream_respond()
        else:
            handle, indices = self._plain, self.env_indices

            def respond(seq: int, payload: bytes) -> list[pipes.Buffer]:
                return [pipes.answer(handle, indices, seq, payload)]

        try:
            serve_loop.serve(go, done, respond, spin_us)
        finally:
            self._unshare()  # Ray calls answer with arrays again

    def listen(
        self, secret: bytes, ports: tuple[int, int] | None, accept_s: float
    ) -> tuple[str, int]:
        """Listen on this node's address for the driver that holds `secret`: the address.

        `ports`: the range to listen in (None: a port the kernel picks). A thread of its own
        waits `accept_s` seconds at most for the driver to connect and prove it holds the
        secret, so Ray calls go on meanwhile; once it is in, `serve_stream` serves it.
        """
        host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        listener = stream.listen(host, ports)
        self._acceptor = stream.Acceptor(listener, secret, accept_s)
        return host, int(listener.getsockname()[1])

    def serve_stream(self, spin_us: int = 0) -> None:
        """Serve the driver `listen` let in, on the thread that built the envs, until it leaves.

        Every operation must then come over the stream (Ray calls would wait behind this one).
        `spin_us`: how long, at least, to poll for the next message before sleeping
        (`serve_loop.serve_fds`).
        """
        acceptor, self._acceptor = self._acceptor, None
        sock = None if acceptor is None else acceptor.driver(stream.HANDSHAKE_S)
        if sock is None:
            return  # no driver got in: it uses Ray calls
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stream.keep_alive(sock)
            fd = sock.fileno()
            serve_loop.serve_fds(fd, fd, self._stream_respond(), spin_us)
        finally:
            sock.close()
            self._unshare()

    def _stream_respond(self) -> Callable[[int, bytes], list[pipes.Buffer]]:
        """How a channel of the stream's messages answers one: a header, `_answer`'s parts.

        `serve_stream`'s, and `serve`'s with `rows` (pipes alone).
        """
        answer = self._answer

        def respond(seq: int, payload: bytes) -> list[pipes.Buffer]:
            parts = answer(payload)
            return [pipes.HEADER.pack(seq, sum(len(part) for part in parts)), *parts]

        return respond

    def message(self, payload: bytes) -> bytes:
        """Answer one message of the stream's kind as a Ray call (``transport="ray"``).

        The same bytes as a TCP stream's reply less its frame's header: a step's or reset's
        record, or a pickle, then the rows the call wrote.
        """
        if threading.get_ident() != self._thread:  # pragma: no cover - Ray's plain actors
            raise RuntimeError("EnvWorker was called off the thread that built its envs")
        if self.start_error is not None:
            raise self.start_error
        return b"".join(self._answer(payload))

    def _answer(self, payload: bytes) -> list[pipes.Buffer]:
        """A stream's message answered: actions in, the reply and the rows written out."""
        rows = self._rows
        tail = stream.split_tail(payload)
        try:
            if len(tail):
                rows.take_actions(tail)
        except Exception as err:  # (not from this library's driver)
            op, ok, value = "step", False, (pipes.error_value(err), repr(err))
        else:
            op, ok, value = pipes.run(self._plain, payload)
        data = pipes.encode_result(ok, value, self.env_indices, op)
        rows_out = rows.written_tail()
        size = sum(len(part) for part in rows_out)
        return [data, *rows_out, stream.trailer(size)]

    # -- the batch ------------------------------------------------------------------------------
    def _op_reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None,
        mask: Sequence[bool] | None,
    ) -> Reply:
        """Reset the envs (those with a True `mask` entry only, if given), like gymnasium."""
        return self._batch.reset(seeds, options, mask)

    def _op_step(self, actions: Any, positions: Sequence[int] | None = None) -> Reply:
        """Step the envs (those at `positions` only, if given) with gymnasium's autoreset."""
        return self._batch.step(actions, positions)

    def _op_rearm(self, positions: Sequence[int]) -> None:
        """Report again the lost episodes of the envs at `positions` (`WorkerBatch.rearm`)."""
        self._batch.rearm(positions)

    def _op_share(self, spec: dict[str, Any], start: int, stop: int) -> None:
        """Use rows ``start..stop-1`` of the driver's shared arrays (`shared_layout`).

        From now on the actions of a ``step`` sent as None are read from them, and steps and
        resets write their rows there and answer None in their place.
        """
        self._rows.share(spec, start, stop)

    def _op_mirror(self, observation_space: Any, action_space: Any) -> None:
        """Keep the rows here in the driver's layout, sent after each reply (`WorkerRows.mirror`).

        `observation_space` and `action_space` are the driver's (a Dict's keys in its order). From
        now on the actions of a ``step`` sent as None arrive as raw rows after the message.
        """
        self._rows.mirror(observation_space, action_space)

    def _op_share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Write numeric info keys that have a column in shared memory there (`ColumnBlock`)."""
        self._batch.batcher = InfoBatcher(self._rows.share_infos(specs))

    def _unshare(self) -> None:
        self._rows.unshare()
        self._batch.batcher = InfoBatcher()

    # -- calls on envs --------------------------------------------------------------------------
    def _op_apply(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[dict[str, Any]],
    ) -> list[Any]:
        """Call `method` on each env whose args are not None; None marks a skipped env.

        ``call``, ``get_attr``, ``has_attr``, ``set_attr`` and ``is_wrapped`` look through
        gymnasium's wrappers (`compat`; ``set_attr`` with ``outermost`` sets on the env given);
        any other name is the env's own method.
        """
        results: list[Any] = [None] * len(self.envs)
        failures = []
        for k, (env, args, kwargs) in enumerate(
            zip(self.envs, args_per_env, kwargs_per_env, strict=True)
        ):
            if args is None:
                continue
            if method == "step":
                if self._batch.lost[k] is not None:
                    obs, info, old_api, _ = self._batch.take_lost(k)
                    results[k] = crashed_step(obs if old_api else (obs, info))
                    continue
                if self._batch.any_reported:
                    self._batch.forget_reports((k,))
            try:
                function = _ATTRIBUTE_METHODS.get(method)
                if function is not None:
                    results[k] = function(env, *args, **kwargs)
                else:
                    results[k] = getattr(env, method)(*args, **kwargs)
            except Exception as err:
                failures.append(self._batch.failure(k, err))
                continue
            if method == "reset":
                self._batch.lost[k] = self._batch.reported[k] = None
            elif method == "seed":
                self._batch.note_seed(k, args[0] if args else kwargs.get("seed"))
        if failures:  # a step's or reset's other results: first-ready `recv` returns them
            partial = results if method in ("step", "reset") else None
            raise _EnvFailures(method, failures, partial=partial)
        return results

    def _op_describe(self) -> dict[str, Any]:
        """The spaces, metadata and render mode of the first env, and how the others differ.

        `mismatch` names an env whose spaces differ from the first's, `layout_mismatch` one
        whose observations differ in shape or dtype too (`space_match`); `observation_spaces`
        holds each env's observation space where it differs from the first's (else None).
        """
        first = self.envs[0]
        return {
            "observation_space": self._observation_space,
            "action_space": self._action_space,
            "metadata": dict(getattr(first, "metadata", {}) or {}),
            "render_mode": getattr(first, "render_mode", None),
            "mismatch": self._mismatch(True),
            "layout_mismatch": self._layout_mismatch,
            "observation_spaces": [
                None if space == self._observation_space else space
                for space in (getattr(env, "observation_space", None) for env in self.envs)
            ],
        }

    def _mismatch(self, same: bool) -> str | None:
        """`space_match.mismatch` of these envs against the first (`same`: equal spaces)."""
        envs = [
            (index, getattr(env, "observation_space", None), getattr(env, "action_space", None))
            for index, env in zip(self.env_indices, self.envs, strict=True)
        ]
        first, observations, actions = envs[0]
        whose = f"env {first}"
        return space_match.mismatch(envs[1:], (whose, observations), (whose, actions), same)

    def _op_has_method(self, name: str) -> list[bool]:
        """Whether each env has a callable attribute `name` (e.g. old gym's ``seed``)."""
        return [callable(getattr(env, name, None)) for env in self.envs]

    def _op_node_id(self) -> str:
        """The id of the Ray node this worker runs on (hex)."""
        return str(ray.get_runtime_context().get_node_id())

    def _op_pid(self) -> int:
        """The worker's process id (for monitoring, and for tests that kill it)."""
        return os.getpid()

    def _op_close(self) -> None:
        """Close every env; the failures are raised together after all were tried."""
        failures = []
        for k, env in enumerate(self.envs):
            try:
                env.close()
            except Exception as err:
                failures.append(self._batch.failure(k, err))
        if failures:
            raise _EnvFailures("close", failures)


def _plain_handle(worker: EnvWorker) -> Callable[[str, tuple[Any, ...]], Any]:
    """`EnvWorker.handle` as a plain function, for the pipe's loop.

    Ray wraps every method of an actor class for tracing, a few microseconds per call; a
    step whose actions are in shared memory (nothing to copy) goes straight to the batch.
    """
    step, handle = worker._batch.step, worker.handle

    def plain_handle(op: str, args: tuple[Any, ...]) -> Any:
        if op == "step" and args[0] is None:
            return step(None, args[1])
        return handle(op, args)

    return plain_handle


def _writable(value: Any, depth: int = 0) -> Any:
    """`value` with copies of the read-only arrays in it (Ray hands arguments out read-only).

    An env gets what it would get in-process: an array it may change (``np.clip(a, out=a)``)
    and keep. Arrays are looked for a few containers deep (actions, `call`'s arguments).
    """
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if depth > 3:
        return value
    if type(value) in (tuple, list):
        items = [_writable(item, depth + 1) for item in value]
        return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value  # noqa: B905
    if type(value) is dict:
        pairs = {key: _writable(item, depth + 1) for key, item in value.items()}
        return pairs if any(pairs[key] is not value[key] for key in value) else value
    return value
