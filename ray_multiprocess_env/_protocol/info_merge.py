"""The driver's side of the batched infos: the workers' pieces merged into gymnasium's layout.

Each worker sends its envs' infos batched (`infos.InfoBatcher`: one `Piece` per key path, and
numeric keys written into `InfoColumn` s in shared memory); `merge_infos` joins whole pieces
with a few numpy assignments per key, `columns_of` copies the columns a step wrote, and
`unbatch_infos` turns the batch back into one dict per env (pfrl's and SB3's layout).

The result is exactly gymnasium's ``VectorEnv._add_info`` for the same infos in env order:
where pieces of one key disagree (types that differ between envs), the driver rebuilds that key
row by row with gymnasium's own rule, from the original values. Only the order of the keys in
the dict may differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._protocol.infos import SCALARS, InfoColumn, Path, Piece, rows_kept

__all__ = ["columns_of", "merge_infos", "unbatch_infos"]


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
    return rows_kept(piece, keep), rows[keep]


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
    if piece.kind == "typed" and piece.origin in SCALARS:
        return value.item()
    return value


def _new_array(key: str, value: Any, size: int) -> np.ndarray:
    """The array gymnasium makes for `key` from the first value it sees."""
    if key == "final_obs":
        return np.full(size, fill_value=None, dtype=object)
    if type(value) in SCALARS or issubclass(type(value), np.number):
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
