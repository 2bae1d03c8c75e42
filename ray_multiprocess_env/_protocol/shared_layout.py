"""The batched arrays of a vector env in one block of memory, shared with the same-node workers.

The driver makes one anonymous memory file (``memfd_create``) that holds, for every env, the
actions, the observations (laid out as the vector env's batched observation, so each worker
writes its rows in place and the driver joins nothing), the rewards, the terminations and the
truncations. A worker maps it by opening ``/proc/<driver pid>/fd/<fd>``: the kernel lets only
processes of the driver's user do that (it checks as for ``ptrace``), the file has mode 0600 and
no name in any directory, and the kernel frees it once the driver and every worker have closed
and unmapped it, so nothing is left behind when either side crashes. No ``resource_tracker``
(``multiprocessing.shared_memory``) is involved, so it warns about nothing and leaks nothing.
Numeric info keys get columns in further memory files of the same kind (`ColumnBlock`).

The driver keeps the same layout in private memory (`SharedBatch.private`) when no worker
shares it, so the current batch of every env has one home whatever the transport.

Covered spaces: Box, Discrete, MultiDiscrete, MultiBinary, and Dict and Tuple of them, nested;
for any other space (or a subclass) `covered` is False and the batches travel serialized.

Both ends import this module; it imports nothing of the driver side.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from ray_multiprocess_env._protocol.infos import InfoColumn

__all__ = [
    "BatchViews",
    "ColumnBlock",
    "SharedBatch",
    "covered",
    "read_actions",
    "shared_memory_supported",
    "write_actions",
]

_ALIGN = 64  # every array starts on a cache line
_LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def shared_memory_supported() -> bool:
    """Whether this platform has anonymous memory files reachable through ``/proc`` (Linux)."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


def covered(space: spaces.Space[Any]) -> bool:
    """Whether batches of `space` have a fixed array layout (see the module docstring)."""
    return _leaves(space) is not None


def _leaves(space: spaces.Space[Any]) -> list[tuple[np.dtype[Any], tuple[int, ...]]] | None:
    """The dtype and single-env shape of each array of `space`'s batch, or None if not covered.

    The order is gymnasium's: Dict keys in the space's order, Tuple items in order.
    """
    kind = type(space)
    if isinstance(space, (spaces.Dict, spaces.Tuple)) and kind in (spaces.Dict, spaces.Tuple):
        subspaces = space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces
        out = []
        for sub in subspaces:
            leaves = _leaves(sub)
            if leaves is None:
                return None
            out += leaves
        return out
    if kind not in _LEAF_SPACES or space.dtype is None or space.shape is None:
        return None
    return [(np.dtype(space.dtype), tuple(space.shape))]


def _nest(space: spaces.Space[Any], arrays: Any) -> Any:
    """Arrange the leaf arrays (an iterator, in `_leaves` order) as `space`'s batch is."""
    if isinstance(space, spaces.Dict):
        return {key: _nest(sub, arrays) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_nest(sub, arrays) for sub in space.spaces)
    return next(arrays)


def _flatten(space: spaces.Space[Any], batch: Any) -> list[Any]:
    """The leaf values of a batch of `space`, in `_leaves` order."""
    if isinstance(space, spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in _flatten(sub, batch[key])]
    if isinstance(space, spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in _flatten(sub, batch[i])]
    return [batch]


class BatchViews(NamedTuple):
    """Numpy views of the batched arrays of some envs (rows ``start..stop-1``)."""

    actions: Any
    observations: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    action_leaves: list[np.ndarray]
    observation_leaves: list[np.ndarray]


class _Memory:
    """A block of memory: an anonymous memory file mapped here, or private anonymous memory."""

    def __init__(self, fd: int, buffer: mmap.mmap) -> None:
        self._fd, self._buffer = fd, buffer

    @classmethod
    def create(cls, size: int, share: bool) -> tuple[_Memory, str | None]:
        if not share:
            return cls(-1, mmap.mmap(-1, size)), None
        fd = os.memfd_create("ray-multiprocess-env", os.MFD_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            return cls(fd, mmap.mmap(fd, size)), f"/proc/{os.getpid()}/fd/{fd}"
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, path: str, size: int) -> _Memory:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            return cls(-1, mmap.mmap(fd, size))
        finally:
            os.close(fd)  # the mapping keeps the memory

    def array(self, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape))
        return np.frombuffer(self._buffer, dtype, count, offset).reshape(shape)

    def close(self) -> bool:
        """Release the file and the mapping; False while views handed out still hold it."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._buffer.close()
        except BufferError:
            return False
        return True


def _offsets(
    leaves: Sequence[tuple[np.dtype[Any], tuple[int, ...]]], num_envs: int
) -> tuple[list[tuple[int, np.dtype[Any], tuple[int, ...]]], int]:
    """Offset, dtype and batched shape of every array, and the total size in bytes."""
    offsets, size = [], 0
    for dtype, shape in leaves:
        batched = (num_envs, *shape)
        offsets.append((size, dtype, batched))
        size += -(-int(np.prod(batched)) * dtype.itemsize // _ALIGN) * _ALIGN
    return offsets, max(size, _ALIGN)


class SharedBatch:
    """One vector env's batched arrays in one block of memory (see the module docstring).

    `spec` is what a worker needs to map it (picklable); None for private memory.
    """

    def __init__(self, layout: dict[str, Any], memory: _Memory, spec: dict[str, Any] | None):
        self.spec, self._layout, self._memory = spec, layout, memory

    @classmethod
    def create(
        cls,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int,
        *,
        share: bool = True,
    ) -> SharedBatch:
        """The arrays for `num_envs` envs of these (covered) spaces; `share`: in a memory file."""
        layout = {
            "num_envs": num_envs,
            "observation_space": observation_space,
            "action_space": action_space,
        }
        memory, path = _Memory.create(_layout(layout)[1], share)
        return cls(layout, memory, None if path is None else {**layout, "path": path})

    @classmethod
    def attach(cls, spec: dict[str, Any]) -> SharedBatch:
        """Map the driver's shared arrays in this (worker) process."""
        return cls(spec, _Memory.attach(spec["path"], _layout(spec)[1]), None)

    def views(self, start: int, stop: int) -> BatchViews:
        """Views of rows ``start..stop-1`` of every array."""
        offsets, _ = _layout(self._layout)
        arrays = [self._memory.array(o, d, s)[start:stop] for o, d, s in offsets]
        action_space = self._layout["action_space"]
        action_count = len(_leaves(action_space) or [])
        action_leaves = arrays[:action_count]
        observation_leaves = arrays[action_count:-3]
        observations = _nest(self._layout["observation_space"], iter(observation_leaves))
        rewards, terminations, truncations = arrays[-3:]
        return BatchViews(
            _nest(action_space, iter(action_leaves)),
            observations,
            rewards,
            terminations,
            truncations,
            action_leaves,
            observation_leaves,
        )

    @property
    def observation_space(self) -> spaces.Space[Any]:
        """The observation space whose batch the observations are laid out as."""
        return self._layout["observation_space"]  # type: ignore[no-any-return]

    @property
    def action_space(self) -> spaces.Space[Any]:
        """The action space whose batch the actions are laid out as."""
        return self._layout["action_space"]  # type: ignore[no-any-return]

    def close(self) -> bool:
        """Release the memory (see `_Memory.close`)."""
        return self._memory.close()


def _layout(layout: dict[str, Any]) -> tuple[list[tuple[int, np.dtype[Any], tuple[int, ...]]], int]:
    leaves = [
        *(_leaves(layout["action_space"]) or []),
        *(_leaves(layout["observation_space"]) or []),
        (np.dtype(np.float64), ()),  # rewards
        (np.dtype(np.bool_), ()),  # terminations
        (np.dtype(np.bool_), ()),  # truncations
    ]
    return _offsets(leaves, layout["num_envs"])


class ColumnBlock:
    """Info columns (`InfoColumn`) for every env in one shared memory file.

    `spec` holds each column's ``(path, dtype, shape, origin)``; a column is a value array and
    a mask array, each with a row per env.
    """

    def __init__(self, spec: dict[str, Any], memory: _Memory) -> None:
        self.spec, self._memory = spec, memory

    @classmethod
    def create(
        cls, columns: Sequence[tuple[Any, ...]], num_envs: int, *, share: bool = True
    ) -> ColumnBlock:
        """A memory file with a column for each spec in `columns` (`share`: else private)."""
        spec = {"num_envs": num_envs, "columns": list(columns)}
        memory, path = _Memory.create(_column_offsets(spec)[1], share)
        return cls({**spec, "path": path}, memory)

    @classmethod
    def attach(cls, spec: dict[str, Any]) -> ColumnBlock:
        """Map the driver's columns in this (worker) process."""
        return cls(spec, _Memory.attach(spec["path"], _column_offsets(spec)[1]))

    def columns(self, start: int = 0, stop: int | None = None) -> list[InfoColumn]:
        """The columns, over rows ``start..stop-1`` (every env by default)."""
        offsets, _ = _column_offsets(self.spec)
        out = []
        for column, (values_at, mask_at) in zip(self.spec["columns"], offsets, strict=True):
            values = self._memory.array(*values_at)[start:stop]
            mask = self._memory.array(*mask_at)[start:stop]
            out.append(InfoColumn(column, values, mask))
        return out

    def close(self) -> bool:
        """Release the memory (see `_Memory.close`)."""
        return self._memory.close()


def _column_offsets(spec: dict[str, Any]) -> tuple[list[tuple[Any, Any]], int]:
    leaves = []
    for _, dtype, shape, _ in spec["columns"]:
        leaves += [(np.dtype(dtype), tuple(shape)), (np.dtype(np.bool_), ())]
    offsets, size = _offsets(leaves, spec["num_envs"])
    return list(zip(offsets[::2], offsets[1::2], strict=True)), size


def write_actions(
    views: BatchViews, action_space: spaces.Space[Any], actions: Any, rows: Any = None
) -> bool:
    """Copy a batch of `actions` into `views` (its `rows` only, if given) if it fits exactly.

    Every part must be an array of the shared dtype and shape; otherwise (a list of actions,
    float actions of a Discrete space) nothing is copied and False returned: those go through
    the pipe serialized, so an env gets exactly what it was given.
    """
    try:
        values = _flatten(action_space, actions)
    except (KeyError, IndexError, TypeError):
        return False
    count = None if rows is None else len(rows)
    for value, view in zip(values, views.action_leaves, strict=True):
        shape = view.shape if count is None else (count, *view.shape[1:])
        if type(value) is not np.ndarray or value.dtype != view.dtype or value.shape != shape:
            return False
    for value, view in zip(values, views.action_leaves, strict=True):
        if rows is None:
            view[...] = value
        else:
            view[rows] = value
    return True


def read_actions(views: BatchViews, action_space: spaces.Space[Any], rows: Any = None) -> Any:
    """A private copy of the actions in `views` (of `rows` only, if given): an env may keep it."""
    if rows is None and len(views.action_leaves) == 1 and type(action_space) in _LEAF_SPACES:
        return views.action_leaves[0].copy()  # (one array: the usual)
    leaves = views.action_leaves if rows is None else [view[rows] for view in views.action_leaves]
    return _nest(action_space, iter([np.array(view) for view in leaves]))
