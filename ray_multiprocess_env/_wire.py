"""The bytes on a same-node pipe: framing and serialization, shared by the worker and the driver.

A message is a header (sequence number, payload length) and a payload serialized with
cloudpickle, the serializer Ray itself uses, so whatever a Ray call can carry (classes defined
in ``__main__`` or a notebook cell, lambdas) a pipe carries too. A reply is ``(True, result)`` or
``(False, exception)``; a result that cannot be serialized becomes an exception that names the
env and the cause, so the stream never loses its framing.
"""

from __future__ import annotations

import os
import pickle
import struct
import traceback
from typing import Any

import numpy as np
from ray import cloudpickle

from ray_multiprocess_env.errors import _EnvFailures, _WorkerError

__all__ = ["HEADER", "dumps", "encode_reply", "loads", "read_exact", "write_all"]

#: Sequence number and payload length of one message.
HEADER = struct.Struct("<qq")


def dumps(value: Any) -> bytes:
    """Serialize `value` as Ray would: cloudpickle, or stdlib pickle for plain data.

    Plain data (numbers, strings, numpy arrays of numbers, and tuples, lists and dicts of them)
    pickles the same either way, and stdlib pickle is several times faster for it; anything
    else (classes from ``__main__`` or a notebook cell, lambdas, ...) goes through cloudpickle.
    """
    if _plain(value, 0):
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return bytes(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[no-untyped-call]


_PLAIN_TYPES = (int, float, bool, str, bytes, type(None))


def _plain(value: Any, depth: int) -> bool:
    """Whether `value` is plain data (see `dumps`), looking at most a few containers deep.

    Exact types only: a subclass (an `IntEnum` from a notebook cell, say) needs cloudpickle.
    """
    kind = type(value)
    if kind in _PLAIN_TYPES or (isinstance(value, np.generic) and kind.__module__ == "numpy"):
        return True
    if kind is np.ndarray:
        return bool(value.dtype != object)
    if depth > 4:
        return False
    if type(value) in (tuple, list):
        return all(_plain(item, depth + 1) for item in value)
    if type(value) is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def loads(data: bytes) -> Any:
    """Deserialize what `dumps` wrote."""
    return pickle.loads(data)


def encode_reply(seq: int, ok: bool, value: Any, env_indices: list[int], op: str) -> bytes:
    """One framed reply; a value that cannot be serialized is replaced by an error naming why."""
    try:
        data = dumps((ok, value))
    except Exception as err:
        culprits = _unserializable_envs(value, env_indices)
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        message = f"the result of `{op}` cannot be serialized: {type(err).__name__}: {err}"
        failures = [(i, type(err).__name__, message, text) for i in culprits]
        error = _EnvFailures(op, failures)
        data = dumps((False, (error, str(error))))
    return HEADER.pack(seq, len(data)) + data


def error_value(err: BaseException) -> BaseException:
    """`err` if it pickles, else a stand-in that keeps its type name, message and traceback."""
    try:
        dumps(err)
        return err
    except Exception:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return _WorkerError(type(err).__name__, str(err), text)


def _unserializable_envs(value: Any, env_indices: list[int]) -> list[int]:
    """The envs whose part of a worker's reply cannot be serialized (all if none stands out)."""
    parts: list[tuple[int, Any]] = []
    if isinstance(value, list) and len(value) == len(env_indices):  # per-env results
        parts = list(zip(env_indices, value, strict=True))
    elif isinstance(value, tuple) and value and isinstance(value[-1], dict):  # batched + infos
        parts = [(env_indices[k], info) for k, info in value[-1].items()]
        if len(value) > 1:
            parts.append((-1, value[0]))  # the stacked observations
    bad = []
    for index, part in parts:
        try:
            dumps(part)
        except Exception:
            bad.append(index)
    named = [i for i in bad if i >= 0]
    return named or list(env_indices)


def read_exact(fd: int, size: int) -> bytes | None:
    """Read exactly `size` bytes from a blocking `fd`, or None at end of file."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to a blocking `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
