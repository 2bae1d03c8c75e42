"""The same-node pipe protocol, both ends: framing, running a message, the driver's buffers.

A message is a header (sequence number, payload length) and a payload serialized with
cloudpickle, the serializer Ray itself uses, so whatever a Ray call can carry (classes defined
in ``__main__`` or a notebook cell, lambdas) a pipe carries too. The driver writes
``(op, args)`` to a worker's "go" pipe; the worker (its loop is `_worker.serve_loop`, on the
thread that built its envs) runs it (`run`) and writes ``(True, result)`` or ``(False,
(exception, traceback text))`` to its "done" pipe under the same sequence number. A result that
cannot be serialized becomes an exception that names the env and the cause, so the stream never
loses its framing.

The driver never blocks on a pipe: it keeps what it could not write yet in an `Outbox` and what
it has read in an `Inbox`, and takes out whole messages only; the statements that move bytes
between the kernel and those buffers run under a guard that holds interrupts back (the driver's
``deferred_interrupts``), so a ``KeyboardInterrupt`` never leaves half a message behind.

This module imports nothing of the driver side.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import struct
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
from ray import cloudpickle

from ray_multiprocess_env._protocol import status
from ray_multiprocess_env._protocol.infos import Piece, rows_kept
from ray_multiprocess_env.errors import _EnvFailures, _WorkerError

__all__ = [
    "HEADER",
    "Inbox",
    "Outbox",
    "answer",
    "dumps",
    "encode_result",
    "error_value",
    "infos_answer",
    "loads",
    "run",
]

#: What a message is written from: bytes, or a view of them.
Buffer = bytes | bytearray | memoryview
#: Sequence number and payload length of one message.
HEADER = struct.Struct("<qq")


def dumps(value: Any) -> bytes:
    """Serialize `value` as Ray would: cloudpickle, or stdlib pickle for plain data.

    Plain data (numbers, strings, numpy arrays of numbers, and tuples, lists and dicts of them)
    pickles the same either way, and stdlib pickle is several times faster for it; anything
    else (classes from ``__main__`` or a notebook cell, lambdas, ...) goes through cloudpickle.
    Numpy's common scalars (an env's infos are full of them) are pickled as their type called
    on the Python number they hold (`_SCALARS`): the same value and type back, at a quarter of
    numpy's own reduction's cost (about 1.2 µs a scalar).
    """
    if _plain(value, 0):
        buffer = io.BytesIO()
        _ScalarPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        return buffer.getvalue()
    return bytes(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[no-untyped-call]


def _by_value(kind: type, as_python: type) -> Callable[[Any], tuple[Any, tuple[Any]]]:
    """A reduction of a numpy scalar of `kind`: `kind` called on its value as `as_python`.

    Exact both ways: a float32 or float64 is a Python float exactly, an integer of up to 64
    bits a Python int, a bool a bool.
    """
    return lambda scalar: (kind, (as_python(scalar),))


#: The numpy scalars `dumps` pickles by value (`_by_value`), with the Python type each holds.
_SCALARS: dict[type, type] = {
    **dict.fromkeys((np.float64, np.float32, np.float16), float),
    **dict.fromkeys((np.int64, np.int32, np.int16, np.int8), int),
    **dict.fromkeys((np.uint64, np.uint32, np.uint16, np.uint8), int),
    np.bool_: bool,
}


class _ScalarPickler(pickle.Pickler):
    """Stdlib's pickler, with numpy's common scalars reduced by value (`dumps`)."""

    dispatch_table = {**copyreg.dispatch_table} | {
        kind: _by_value(kind, python) for kind, python in _SCALARS.items()
    }


_PLAIN_TYPES = frozenset((int, float, bool, str, bytes, type(None), *_SCALARS))
_CONTAINERS = frozenset((tuple, list, Piece, status.Reply))


def _plain(value: Any, depth: int) -> bool:
    """Whether `value` is plain data (see `dumps`), looking at most a few containers deep.

    Exact types only: a subclass (an `IntEnum` from a notebook cell, say) needs cloudpickle.
    The items of a container that are plain scalars are told at once (the usual infos: a
    dict of numbers per env), with no call each.
    """
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return True
    if kind in _CONTAINERS:
        if depth > 4:
            return False
        for item in value:
            if type(item) not in _PLAIN_TYPES and not _plain(item, depth + 1):
                return False
        return True
    if kind is np.ndarray:
        return bool(value.dtype != object)
    if isinstance(value, np.generic) and kind.__module__ == "numpy":
        return True
    if kind is type:  # the Python type of a batched info key: a builtin or numpy type
        return value.__module__ in ("builtins", "numpy")
    if kind is dict and depth <= 4:
        for key, item in value.items():
            if type(key) not in _PLAIN_TYPES and not _plain(key, depth + 1):
                return False
            if type(item) not in _PLAIN_TYPES and not _plain(item, depth + 1):
                return False
        return True
    return False


def loads(data: bytes) -> Any:
    """Deserialize what `dumps` wrote."""
    return pickle.loads(data)


def encode_reply(seq: int, ok: bool, value: Any, env_indices: list[int], op: str) -> bytes:
    """One framed reply; a value that cannot be serialized is replaced by an error naming why."""
    data = encode_result(ok, value, env_indices, op)
    return HEADER.pack(seq, len(data)) + data


def encode_result(ok: bool, value: Any, env_indices: list[int], op: str) -> bytes:
    """A reply's payload; a value that cannot be serialized becomes an error naming why.

    The error names the envs whose part of it cannot be (all, if none stands out), and carries
    the reply of the others where it is a step's or a reset's (`_without_infos_of`).
    """
    if ok and status.in_place(value):  # (a step or reset with everything in place)
        return status.answer(value.infos[1], value.old_api)
    if ok and status.infos_in_place(value):  # (rows in place, an info dict per env)
        try:
            return status.answer_infos(dumps(value.infos), value.old_api)
        except Exception:
            pass  # (as any reply that cannot be serialized: below)
    try:
        return dumps((ok, value))
    except Exception as err:
        culprits = _unserializable_envs(value, env_indices)
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        message = f"the result of `{op}` cannot be serialized: {type(err).__name__}: {err}"
        failures = [(i, type(err).__name__, message, text) for i in culprits]
        partial = _without_infos_of(value, culprits, env_indices) if ok else None
        try:  # (the others' results ride along, as an env error's do: `_EnvFailures.partial`)
            error = _EnvFailures(op, failures, partial=partial)
            return dumps((False, (error, str(error))))
        except Exception:
            error = _EnvFailures(op, failures)
            return dumps((False, (error, str(error))))


def infos_answer(payload: Any) -> tuple[dict[int, Any], bool] | None:
    """The info dicts (by position) and old gym's API of an `answer_infos` reply.

    None if `payload` is not such a reply. Raises what unpickling the dicts raises (a class
    the driver cannot import, say).
    """
    found = status.infos_length(payload)
    if found is None:
        return None
    length, old_api = found
    start = status.RECORD.size
    infos: dict[int, Any] = loads(payload[start : start + length])
    return infos, old_api


def error_value(err: BaseException) -> BaseException:
    """`err` if it pickles, else a stand-in that keeps its type name, message and traceback."""
    try:
        dumps(err)
        return err
    except Exception:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return _WorkerError(type(err).__name__, str(err), text)


def _unserializable_envs(value: Any, env_indices: list[int]) -> list[int]:
    """The envs whose part of a worker's reply cannot be serialized (all if none stands out).

    A reply is per-env results (a list), or a batch (`status.Reply`) whose infos are per-env
    dicts by position, or batched `Piece` s whose rows are positions.
    """
    parts: list[tuple[int, Any]] = []
    if isinstance(value, list) and len(value) == len(env_indices):  # per-env results
        parts = list(zip(env_indices, value, strict=True))
    elif type(value) is status.Reply:
        infos = value.infos
        if isinstance(infos, tuple):  # batched: (pieces, the columns written)
            infos = infos[0] or []
        if isinstance(infos, dict):
            parts = [(env_indices[k], info) for k, info in infos.items()]
        elif isinstance(infos, list):
            for piece in infos:
                if piece.kind == "object":
                    positions = piece.positions.tolist()
                    parts += [
                        (env_indices[p], v) for p, v in zip(positions, piece.values, strict=True)
                    ]
        parts.append((-1, value.observations))  # the stacked observations
    bad = []
    for index, part in parts:
        try:
            dumps(part)
        except Exception:
            bad.append(index)
    named = [i for i in bad if i >= 0]
    return named or list(env_indices)


def _without_infos_of(value: Any, culprits: list[int], env_indices: list[int]) -> Any:
    """A step's or reset's `value` without the infos of the envs `culprits`; None if it cannot be.

    The reply of the other envs, which a first-ready `recv` hands out after the error names the
    culprits (and a step's error carries): None unless `value` is a `status.Reply` and some env
    is not a culprit (an observation that cannot be serialized names every env).
    """
    if type(value) is not status.Reply:
        return None
    bad = [k for k, env in enumerate(env_indices) if env in culprits]
    if len(bad) == len(env_indices):
        return None
    infos = value.infos
    if isinstance(infos, tuple):  # batched: (pieces, the columns written)
        pieces: list[Piece] = []
        for piece in infos[0] or []:
            keep = ~np.isin(piece.positions, bad)
            if keep.all():
                pieces.append(piece)
            elif keep.any():
                pieces.append(rows_kept(piece, keep))
        infos = (pieces or None, infos[1])
    elif isinstance(infos, dict):  # an info dict per env, by position
        infos = {k: info for k, info in infos.items() if k not in bad}
    return value._replace(infos=infos)


# -- the worker's end ----------------------------------------------------------------------------
def answer(
    handle: Callable[[str, tuple[Any, ...]], Any], env_indices: list[int], seq: int, payload: bytes
) -> bytes:
    """Run the operation in `payload` with `handle`: the framed reply (errors included)."""
    op, ok, value = run(handle, payload)
    return encode_reply(seq, ok, value, env_indices, op)


def run(handle: Callable[[str, tuple[Any, ...]], Any], payload: bytes) -> tuple[str, bool, Any]:
    """The operation in `payload` run with `handle`: its name, whether it went well, its value.

    The value of an operation that raised is ``(the exception or a stand-in, its traceback)``.
    """
    op = "?"
    try:
        op, args = status.operation(payload) if status.is_record(payload) else loads(payload)
        return op, True, handle(op, args)
    except Exception as err:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return op, False, (error_value(err), text)


# -- the driver's end ----------------------------------------------------------------------------
Guard = Callable[[], AbstractContextManager[Any]]
#: The size the driver asks the kernel to give its pipes.
PIPE_SIZE = 1 << 20
#: How much the driver reads at once (more is read in turn).
_READ_SIZE = 1 << 16


class Outbox:
    """Messages waiting to be written to a pipe that does not block (see the module docstring)."""

    def __init__(self, guard: Guard) -> None:
        #: The bytes queued and not yet written (empty: nothing waits). Read it, never write
        #: it: a plain attribute, since a transport looks at it on every step.
        self.pending = bytearray()
        self._guard = guard

    def send(self, fd: int, seq: int, data: bytes) -> bool:
        """Write the message `data` (`seq`), queueing what the pipe does not take now.

        Call it with interrupts held back. False if the reader is gone.
        """
        message = HEADER.pack(seq, len(data)) + data
        if self.pending:  # behind what waits already
            self.pending += message
            return self.flush(fd)
        try:
            written = os.write(fd, message)
        except BlockingIOError:
            written = 0
        except OSError:
            return False
        if written < len(message):
            self.pending += message[written:]
        return True

    def flush(self, fd: int) -> bool:
        """Write what the pipe takes now; False if the reader is gone (nothing more is written)."""
        while self.pending:
            with self._guard():
                try:
                    del self.pending[: os.write(fd, self.pending)]
                except BlockingIOError:
                    return True
                except OSError:
                    self.pending.clear()
                    return False
        return True

    def clear(self) -> None:
        """Drop what is queued."""
        self.pending.clear()


class Inbox:
    """Bytes read from a pipe that does not block, taken out as whole messages."""

    def __init__(self, guard: Guard) -> None:
        self._data = bytearray()
        self._guard = guard
        self.scratch = bytearray(_READ_SIZE)  # what one read fills (a caller may read into it)

    def pump(self, fd: int) -> tuple[list[tuple[int, bytes]], bool]:
        """Read what has arrived: the whole messages ``(seq, payload)``, and whether it ended.

        Reads go into a buffer made once: ``os.read`` of a large size allocates (and maps)
        that much memory on every call, which costs more than the read of a small reply.
        """
        with self._guard():
            return self.read(fd)

    def read(self, fd: int) -> tuple[list[tuple[int, bytes]], bool]:
        """`pump` for a caller that holds interrupts back around it already."""
        scratch, ended = self.scratch, False
        while True:
            try:
                count = os.readv(fd, [scratch])
            except BlockingIOError:
                break
            except OSError:  # a socket reset by the worker's end: as its end
                count = 0
            if not count:
                ended = True
                break
            if not self._data and HEADER.size <= count < _READ_SIZE:  # usually one message
                seq, size = HEADER.unpack_from(scratch)
                if count == HEADER.size + size:
                    return [(seq, bytes(scratch[HEADER.size : count]))], False
            self._data += memoryview(scratch)[:count]
            if count < _READ_SIZE:
                break  # all there was, most likely: `poll` tells when more comes
        return self._take(), ended

    def feed(self, data: Buffer) -> list[tuple[int, bytes]]:
        """Add bytes read elsewhere (into `scratch`, say): the whole messages now in."""
        self._data += data
        return self._take()

    @property
    def empty(self) -> bool:
        """Whether no part of a message waits in the buffer."""
        return not self._data

    def _take(self) -> list[tuple[int, bytes]]:
        data = self._data
        if len(data) >= HEADER.size:  # one whole message, the usual case
            seq, size = HEADER.unpack_from(data)
            if len(data) == HEADER.size + size:
                payload = bytes(data[HEADER.size :])
                data.clear()
                return [(seq, payload)]
        messages = []
        view, start = memoryview(self._data), 0
        while len(view) - start >= HEADER.size:
            seq, size = HEADER.unpack_from(view, start)
            if len(view) - start - HEADER.size < size:
                break
            messages.append((seq, bytes(view[start + HEADER.size : start + HEADER.size + size])))
            start += HEADER.size + size
        view.release()
        del self._data[:start]
        return messages
