"""The batched arrays of a vector env in shared memory, for the workers on the driver's node.

The driver makes one anonymous memory file (``memfd_create``) that holds, for every env, the
actions, the observations (laid out as the vector env's batched observation, so each worker
writes its rows in place and the driver joins nothing), the rewards, the terminations and the
truncations. A worker maps it by opening ``/proc/<driver pid>/fd/<fd>``: the kernel lets only
processes of the driver's user do that (it checks as for ``ptrace``), the file has mode 0600 and
no name in any directory, and the kernel frees it once the driver and every worker have closed
and unmapped it, so nothing is left behind when either side crashes. No ``resource_tracker``
(``multiprocessing.shared_memory``) is involved, so it warns about nothing and leaks nothing.

Covered spaces: Box, Discrete, MultiDiscrete, MultiBinary, and Dict and Tuple of them, nested;
for any other space (or a subclass) `SharedBatch.create` returns None and the pipes carry
everything serialized. The pipe still carries each operation and its reply: with shared memory a
step's message is a few bytes (a doorbell), and the reply carries only the infos.

This module is used by both ends (driver and worker) and imports nothing of the driver side.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

__all__ = ["BatchViews", "SharedBatch", "shared_memory_supported"]

_ALIGN = 64  # every array starts on a cache line
_LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def shared_memory_supported() -> bool:
    """Whether this platform has anonymous memory files reachable through ``/proc`` (Linux)."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


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
    """Numpy views of the shared arrays of some envs (rows ``start..stop-1``)."""

    actions: Any
    observations: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    action_leaves: list[np.ndarray]


class SharedBatch:
    """One vector env's batched arrays in one shared memory file (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], fd: int, buffer: mmap.mmap) -> None:
        self.spec = spec  # what a worker needs to map it (picklable)
        self._fd, self._buffer = fd, buffer

    @classmethod
    def create(
        cls,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int,
    ) -> SharedBatch | None:
        """Shared arrays for `num_envs` envs of these spaces; None if a space is not covered."""
        obs_leaves, action_leaves = _leaves(observation_space), _leaves(action_space)
        if obs_leaves is None or action_leaves is None or not shared_memory_supported():
            return None
        fd = os.memfd_create("ray-multiprocess-env", os.MFD_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)
            spec = {
                "path": f"/proc/{os.getpid()}/fd/{fd}",
                "num_envs": num_envs,
                "observation_space": observation_space,
                "action_space": action_space,
            }
            size = _layout(spec)[1]
            os.ftruncate(fd, size)
            return cls(spec, fd, mmap.mmap(fd, size))
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, spec: dict[str, Any]) -> SharedBatch:
        """Map the driver's shared arrays in this (worker) process."""
        fd = os.open(spec["path"], os.O_RDWR | os.O_CLOEXEC)
        try:
            buffer = mmap.mmap(fd, _layout(spec)[1])
        finally:
            os.close(fd)  # the mapping keeps the memory
        return cls(spec, -1, buffer)

    def views(self, start: int, stop: int) -> BatchViews:
        """Views of rows ``start..stop-1`` of every shared array."""
        offsets, _ = _layout(self.spec)
        arrays = []
        for offset, dtype, shape in offsets:
            count = int(np.prod(shape))
            whole = np.frombuffer(self._buffer, dtype, count, offset).reshape(shape)
            arrays.append(whole[start:stop])
        action_count = len(_leaves(self.spec["action_space"]) or [])
        obs_count = len(arrays) - action_count - 3
        action_leaves = arrays[:action_count]
        observations = _nest(
            self.spec["observation_space"], iter(arrays[action_count : action_count + obs_count])
        )
        rewards, terminations, truncations = arrays[-3:]
        return BatchViews(
            _nest(self.spec["action_space"], iter(action_leaves)),
            observations,
            rewards,
            terminations,
            truncations,
            action_leaves,
        )

    def close(self) -> None:
        """Release the memory file (the memory itself once nothing maps it any more)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(BufferError):  # views handed out keep it mapped until dropped
            self._buffer.close()


def write_actions(views: BatchViews, action_space: spaces.Space[Any], actions: Any) -> bool:
    """Copy a batch of `actions` into `views` if every part is an array of the shared dtype.

    Returns False (nothing copied) otherwise, e.g. for a list of actions or float actions of a
    Discrete space: those go through the pipe serialized, so an env gets exactly what it was given.
    """
    try:
        values = _flatten(action_space, actions)
    except (KeyError, IndexError, TypeError):
        return False
    for value, view in zip(values, views.action_leaves, strict=True):
        if type(value) is not np.ndarray or value.dtype != view.dtype or value.shape != view.shape:
            return False
    for value, view in zip(values, views.action_leaves, strict=True):
        view[...] = value
    return True


def read_actions(views: BatchViews, action_space: spaces.Space[Any]) -> Any:
    """A private copy of the actions in `views` (an env may keep the action it was given)."""
    return _nest(action_space, iter([np.array(view) for view in views.action_leaves]))


def _layout(spec: dict[str, Any]) -> tuple[list[tuple[int, np.dtype[Any], tuple[int, ...]]], int]:
    """Offset, dtype and batched shape of every array, and the total size in bytes."""
    n = spec["num_envs"]
    leaves = [
        *(_leaves(spec["action_space"]) or []),
        *(_leaves(spec["observation_space"]) or []),
        (np.dtype(np.float64), ()),  # rewards
        (np.dtype(np.bool_), ()),  # terminations
        (np.dtype(np.bool_), ()),  # truncations
    ]
    offsets, size = [], 0
    for dtype, shape in leaves:
        batched = (n, *shape)
        offsets.append((size, dtype, batched))
        size += -(-int(np.prod(batched)) * dtype.itemsize // _ALIGN) * _ALIGN
    return offsets, max(size, _ALIGN)
