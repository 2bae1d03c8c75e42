"""Infos in gymnasium's batched layout: batched in each worker, merged on the driver.

gymnasium's vector envs hand out one dict for all envs: ``infos[key]`` holds a row per env and
``infos["_key"]`` says which envs had the key (a dict value is batched the same way, nested).
Building that dict env by env costs the driver a Python loop per env and key, so each worker
batches the infos of its own envs (`InfoBatcher`) and the driver only joins whole pieces
(`merge_infos`): a few numpy assignments per key, whatever the number of envs.

A worker sends, for each key path, one `Piece`: the positions of its envs that had the key and
their values, as a typed array when every value has the same Python type that gymnasium turns
into a numeric array (``int``, ``float``, ``bool``, numpy numbers, arrays of one shape and
dtype), else as an object array of the values themselves. Numeric keys the driver has seen once
get a column in shared memory (`InfoColumn`): the worker writes such values there in place and
they never travel at all.

The result is exactly gymnasium's ``VectorEnv._add_info`` for the same infos in env order:
where pieces of one key disagree (types that differ between envs), the driver rebuilds that key
row by row with gymnasium's own rule, from the original values. Only the order of the keys in
the dict may differ.

Both ends import this module; it imports nothing of the driver side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "COLUMN_KINDS",
    "InfoBatcher",
    "InfoColumn",
    "Piece",
    "columns_of",
    "learnable",
    "merge_infos",
    "unbatch_infos",
]

Path = tuple[str, ...]

#: What a piece holds: values as one typed array, values as objects, or (``dict``) only which
#: envs had a dict under that path (gymnasium's ``_key`` mask of a nested dict).
COLUMN_KINDS = ("typed", "object", "dict")
#: The Python types gymnasium batches into a numeric array of that type.
_SCALARS = (int, float, bool)
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
                hit[0][position] = value
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
                if column is not None and column.fits(value):
                    column.values[position] = value
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
        if origin in _SCALARS or issubclass(origin, np.number):
            return np.array(values, dtype=np.dtype(origin))
        if origin is np.ndarray:
            first = values[0]
            if all(v.dtype == first.dtype and v.shape == first.shape for v in values):
                return np.stack(values)
    except (OverflowError, TypeError, ValueError):  # e.g. an int beyond int64
        return None
    return None


# -- the driver's side -------------------------------------------------------------------------
def merge_infos(
    size: int,
    parts: Sequence[tuple[int, tuple[Sequence[Piece] | None, int]]],
    columns: Sequence[InfoColumn] = (),
    envs: np.ndarray | None = None,
    env_rows: np.ndarray | None = None,
) -> dict[str, Any]:
    """The batched info dict of a call (gymnasium's layout) from the pieces and the columns.

    Args:
        size: Rows of the batch (the number of envs, or of envs a `recv` returns).
        parts: ``(first env index of the worker, (its pieces, the columns it wrote))`` for
            every worker that answered (what `InfoBatcher.finish` gives).
        columns: The columns in shared memory, over every env.
        envs: The envs that ran in this call (None: all); only their column rows count.
        env_rows: For a batch of some envs only: the row of each env index (-1: not in it).
    """
    written, any_pieces = 0, False
    for _, (some, bits) in parts:
        written |= bits
        any_pieces |= some is not None
    if not any_pieces and envs is None and env_rows is None:  # (the hot path)
        return columns_of(columns, written, None)
    by_path: dict[Path, list[tuple[Piece, np.ndarray]]] = {}
    whole: dict[Path, InfoColumn] = {}
    for i, column in enumerate(columns):
        if envs is None and env_rows is None:
            if written >> i & 1:  # a worker wrote it (every row of it is this call's)
                whole[column.path] = column
                by_path[column.path] = []
            continue
        rows_of_envs = envs if envs is not None else np.arange(len(column.mask))
        present = rows_of_envs[column.mask[rows_of_envs]]
        if len(present):
            piece = Piece(column.path, "typed", present, column.values[present], column.origin)
            by_path.setdefault(column.path, []).append(
                (piece, present if env_rows is None else env_rows[present])
            )
    for offset, (pieces, _) in parts:
        for piece in pieces or ():
            rows = piece.positions + offset
            if env_rows is not None:
                piece, rows = _kept(piece, env_rows[rows])
                if not len(rows):
                    continue
            by_path.setdefault(piece.path, []).append((piece, rows))
    infos: dict[str, Any] = {}
    for path, found in by_path.items():
        shared = whole.get(path)
        if shared is not None and not found:  # the fast path: one column, every env
            values, mask = shared.values.copy(), shared.mask.copy()
        else:
            if shared is not None:
                rows = np.flatnonzero(shared.mask)
                found.insert(
                    0, (Piece(path, "typed", rows, shared.values[rows], shared.origin), rows)
                )
            values, mask = _merge(path, size, found)
        node = infos
        for key in path[:-1]:
            node = node.setdefault(key, {})
        if values is not None:
            node[path[-1]] = values
        else:
            node.setdefault(path[-1], {})
        node[f"_{path[-1]}"] = mask
    return infos


def _kept(piece: Piece, rows: np.ndarray) -> tuple[Piece, np.ndarray]:
    """`piece` without the envs left out of the batch (row -1: an env that raised in `recv`)."""
    keep = rows >= 0
    if keep.all():
        return piece, rows
    values = piece.values
    if isinstance(values, np.ndarray):
        values = values[keep]
    elif values is not None:
        values = [value for value, kept in zip(values, keep.tolist(), strict=True) if kept]
    return piece._replace(positions=piece.positions[keep], values=values), rows[keep]


def columns_of(columns: Sequence[InfoColumn], written: int, rows: Any) -> dict[str, Any]:
    """The infos of the envs `rows`, all in the columns (None: every row of the columns).

    `rows` is a slice or an index array. Every env of those rows ran in the call and none had
    an info outside the columns; the columns written (`written`, a bit each) hold this call's
    values, the others none.
    """
    infos: dict[str, Any] = {}
    copy = type(rows) is not np.ndarray  # (an index array copies already)
    for i, column in enumerate(columns):
        if written >> i & 1:
            path = column.path
            node = infos
            for key in path[:-1]:
                node = node.setdefault(key, {})
            if rows is None:
                values, mask = column.values, column.mask
            else:
                values, mask = column.values[rows], column.mask[rows]
            node[path[-1]] = values.copy() if copy else values
            node[f"_{path[-1]}"] = mask.copy() if copy else mask
    return infos


def _merge(path: Path, size: int, found: list[tuple[Piece, np.ndarray]]) -> tuple[Any, np.ndarray]:
    """The batched values (None for a nested dict) and mask of one key path."""
    mask = np.zeros(size, dtype=np.bool_)
    for _, rows in found:
        mask[rows] = True
    if any(piece.kind == "dict" for piece, _ in found):
        return None, mask
    first = found[0][0]
    if first.kind == "typed" and all(
        p.kind == "typed"
        and p.values.dtype == first.values.dtype
        and p.values.shape[1:] == first.values.shape[1:]
        for p, _ in found
    ):
        values = np.zeros((size, *first.values.shape[1:]), dtype=first.values.dtype)
        for piece, rows in found:
            values[rows] = piece.values
        return values, mask
    return _merge_exactly(path, size, found), mask


def _merge_exactly(path: Path, size: int, found: list[tuple[Piece, np.ndarray]]) -> np.ndarray:
    """One key whose pieces disagree, row by row in env order, as gymnasium builds it."""
    items = sorted(
        ((int(row), piece, i) for piece, rows in found for i, row in enumerate(rows.tolist())),
        key=lambda item: item[0],  # stable: an env's values in the order they were added
    )
    values: np.ndarray | None = None
    for row, piece, i in items:
        value = _original(piece, i)
        if values is None:
            values = _new_array(path[-1], value, size)
        values[row] = value
    assert values is not None
    return values


def _original(piece: Piece, i: int) -> Any:
    """Value `i` of `piece` as the env gave it (typed pieces lost only the Python type)."""
    value = piece.values[i]
    if piece.kind == "typed" and piece.origin in _SCALARS:
        return value.item()
    return value


def _new_array(key: str, value: Any, size: int) -> np.ndarray:
    """The array gymnasium makes for `key` from the first value it sees."""
    if key == "final_obs":
        return np.full(size, fill_value=None, dtype=object)
    if type(value) in _SCALARS or issubclass(type(value), np.number):
        return np.zeros(size, dtype=type(value))
    if isinstance(value, np.ndarray):
        return np.zeros((size, *value.shape), dtype=value.dtype)
    return np.full(size, fill_value=None, dtype=object)


def unbatch_infos(infos: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """One info dict per row from a batched info dict (the values of rows whose mask is set).

    Numbers come back as Python numbers, arrays as rows of the batch, objects as they were.
    """
    keys: list[str] = []
    columns: list[list[Any]] = []
    masks: list[list[bool]] = []
    full = True  # every row has every key (the usual case: one dict per row at once)
    for key, value in infos.items():
        if key[:1] == "_" and key[1:] in infos:
            continue
        mask = infos.get("_" + key)
        if mask is None:
            continue
        if isinstance(value, dict):
            columns.append(unbatch_infos(value, size))
        elif value.dtype != object and value.ndim == 1:
            columns.append(value.tolist())
        else:
            columns.append(list(value))
        keys.append(key)
        present = mask.tolist()
        masks.append(present)
        if full and not all(present):
            full = False
    if full and keys:  # (every column has `size` rows; zip's `strict` costs time here)
        return [dict(zip(keys, row)) for row in zip(*columns)]  # noqa: B905
    out: list[dict[str, Any]] = [{} for _ in range(size)]
    for key, values, present in zip(keys, columns, masks, strict=True):
        for row, has in enumerate(present):
            if has:
                out[row][key] = values[row]
    return out
