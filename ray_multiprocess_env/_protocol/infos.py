"""Infos in gymnasium's batched layout: batched in each worker (`info_merge`: on the driver).

gymnasium's vector envs hand out one dict for all envs: ``infos[key]`` holds a row per env and
``infos["_key"]`` says which envs had the key (a dict value is batched the same way, nested).
Building that dict env by env costs the driver a Python loop per env and key, so each worker
batches the infos of its own envs (`InfoBatcher`) and the driver only joins whole pieces
(`info_merge.merge_infos`): a few numpy assignments per key, whatever the number of envs.

A worker sends, for each key path, one `Piece`: the positions of its envs that had the key and
their values, as a typed array when every value has the same Python type that gymnasium turns
into a numeric array (``int``, ``float``, ``bool``, numpy numbers, arrays of one shape and
dtype), else as an object array of the values themselves. Numeric keys the driver has seen once
get a column in shared memory (`InfoColumn`): the worker writes such values there in place and
they never travel at all.

Both ends import this module; it imports nothing of the driver side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "COLUMN_KINDS",
    "SCALARS",
    "InfoBatcher",
    "InfoColumn",
    "Path",
    "Piece",
    "learnable",
    "rows_kept",
]

Path = tuple[str, ...]

#: What a piece holds: values as one typed array, values as objects, or (``dict``) only which
#: envs had a dict under that path (gymnasium's ``_key`` mask of a nested dict).
COLUMN_KINDS = ("typed", "object", "dict")
#: The Python types gymnasium batches into a numeric array of that type.
SCALARS = (int, float, bool)
#: The largest value (bytes per env) that gets a column in shared memory.
_COLUMN_BYTES = 1024


class Piece(NamedTuple):
    """The values of one key path for some envs: `positions` are rows of the sender's envs.

    `origin` is the Python type every value had (typed pieces only), so the driver can give
    back the original objects where gymnasium would keep them as objects.
    """

    path: Path
    kind: str
    positions: np.ndarray
    values: Any = None
    origin: type | None = None


class InfoColumn:
    """One numeric info key in shared memory: a value row and a mask entry per env.

    Both ends make it from the same `spec` ``(path, dtype, shape, origin)`` over arrays of the
    whole vector env; a worker writes only its own rows.
    """

    __slots__ = ("dtype", "mask", "origin", "path", "shape", "values")

    def __init__(self, spec: tuple[Path, Any, tuple[int, ...], type], values: Any, mask: Any):
        self.path, dtype, self.shape, origin = spec
        self.origin: Any = origin
        self.dtype = np.dtype(dtype)
        self.values, self.mask = values, mask

    def fits(self, value: Any) -> bool:
        """Whether `value` is exactly of this column's type (and shape)."""
        if type(value) is not self.origin:
            return False
        return self.origin is not np.ndarray or (
            value.dtype == self.dtype and value.shape == self.shape
        )


def rows_kept(piece: Piece, keep: np.ndarray) -> Piece:
    """`piece` with only the envs where `keep` (a bool per position) is True."""
    values = piece.values
    if isinstance(values, np.ndarray):
        values = values[keep]
    elif values is not None:
        values = [value for value, kept in zip(values, keep.tolist(), strict=True) if kept]
    return piece._replace(positions=piece.positions[keep], values=values)


def learnable(piece: Piece) -> tuple[Path, Any, tuple[int, ...], type] | None:
    """The column spec a typed `piece` could move to shared memory with, or None."""
    if piece.kind != "typed" or "final_obs" in piece.path or piece.origin is None:
        return None
    values: np.ndarray = piece.values
    shape = tuple(values.shape[1:])
    if values.dtype.kind not in "biufc" or values.dtype.itemsize * int(np.prod(shape)) > (
        _COLUMN_BYTES
    ):
        return None
    return piece.path, values.dtype.str, shape, piece.origin


class InfoBatcher:
    """Batches the infos of one call of a worker's envs (see the module docstring).

    Args:
        columns: The key paths that have a column in shared memory (rows of this worker only),
            in the driver's order: column ``i`` is bit ``1 << i`` of `finish`'s second value.
    """

    def __init__(self, columns: Sequence[InfoColumn] = ()) -> None:
        self._columns = {column.path: column for column in columns}
        self._bits = {column.path: 1 << i for i, column in enumerate(columns)}
        # the top-level keys with a column of scalars (most keys: the hot path of `add`):
        # ``(values, mask, bit, type)`` each
        self._scalars = {
            column.path[0]: (column.values, column.mask, 1 << i, column.origin)
            for i, column in enumerate(columns)
            if len(column.path) == 1 and column.origin is not np.ndarray
        }
        self._entries: dict[Path, tuple[str, list[int], list[Any]]] = {}
        self._written = 0

    def start(self, positions: slice | Sequence[int]) -> None:
        """Begin a call of the envs at `positions`: their column rows are cleared."""
        self._entries, self._written = {}, 0
        for column in self._columns.values():
            column.values[positions] = 0
            column.mask[positions] = False

    def add(self, position: int, info: dict[str, Any], prefix: Path = ()) -> None:
        """Add the info dict of the env at `position` (as gymnasium's ``_add_info``)."""
        entries, columns = self._entries, self._columns
        scalars = self._scalars if not prefix else {}
        written = self._written
        for key, value in info.items():
            hit = scalars.get(key)
            if hit is not None and type(value) is hit[3]:  # (`InfoColumn.fits`, for scalars)
                try:
                    hit[0][position] = value
                except (OverflowError, ValueError):  # (an int beyond the column's: a piece)
                    hit = None
                else:
                    hit[1][position] = True
                    written |= hit[2]
                    continue
            path = (*prefix, key)
            if key == "final_obs":
                kind = "object"
            elif isinstance(value, dict):
                kind = "dict"
            else:
                column = columns.get(path)
                if (
                    column is not None
                    and column.fits(value)
                    and _written_in(column, position, value)
                ):
                    column.mask[position] = True
                    written |= self._bits[path]
                    continue
                kind = "value"
            entry = entries.get(path)
            if entry is None:
                entry = entries[path] = (kind, [], [])
            entry[1].append(position)
            entry[2].append(value)
            if kind == "dict":
                self._written = written
                self.add(position, value, path)
                written = self._written
        self._written = written

    def finish(self) -> tuple[list[Piece] | None, int]:
        """What was added since `start`: the pieces not in columns, and the columns written.

        The pieces are None if there are none; the columns written are a bit per column.
        """
        pieces = [_piece(path, *entry) for path, entry in self._entries.items()] or None
        self._entries = {}
        return pieces, self._written


def _written_in(column: InfoColumn, position: int, value: Any) -> bool:
    """Whether `value` (of the column's type) was written into its row; not one it overflows."""
    try:
        column.values[position] = value
    except (OverflowError, ValueError):  # (an int beyond the column's dtype: goes as a piece)
        return False
    return True


def _piece(path: Path, kind: str, positions: list[int], values: list[Any]) -> Piece:
    rows = np.asarray(positions, dtype=np.int64)
    if kind == "dict":
        return Piece(path, "dict", rows)
    if kind == "value":
        origin = type(values[0])
        if all(type(v) is origin for v in values):
            typed = _typed(values, origin)
            if typed is not None:
                return Piece(path, "typed", rows, typed, origin)
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return Piece(path, "object", rows, array)


def _typed(values: list[Any], origin: type) -> np.ndarray | None:
    """`values` (all of type `origin`) as one array of gymnasium's dtype, or None."""
    try:
        if origin in SCALARS or issubclass(origin, np.number):
            return np.array(values, dtype=np.dtype(origin))
        if origin is np.ndarray:
            first = values[0]
            if all(v.dtype == first.dtype and v.shape == first.shape for v in values):
                return np.stack(values)
    except (OverflowError, TypeError, ValueError):  # e.g. an int beyond int64
        return None
    return None
