"""Batching per-env values into numpy batches and back, for any gymnasium space.

Workers stack the observations of their own envs with gymnasium's `concatenate`; the driver then
joins the workers' batches with `join_batches` and splits batched actions per worker with
`split_batch`. Dict and Tuple spaces are handled key by key, as gymnasium batches them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array, iterate

__all__ = [
    "batch_length",
    "check_rows",
    "copy_batch",
    "join_batches",
    "split_batch",
    "stack",
    "take",
    "unstack",
    "unzip",
    "write_row",
]


_NESTED = (spaces.Dict, spaces.Tuple)
#: The spaces whose every value has the space's own shape: a batch of n is an array (n, *shape).
_SHAPED = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
#: Of those, the spaces whose envs take only values of that shape (a Box env is given its row
#: as it is, the shape of a gymnasium vector env's: RLlib and CleanRL-style loops send a Box of
#: shape () as (n, 1), which such envs take; only its size is checked).
_STRICT = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def stack(space: spaces.Space[Any], items: Sequence[Any], out: Any = None) -> Any:
    """Stack one value per env into a batch of `space` (``out`` is reused when given)."""
    if out is None:
        out = create_empty_array(space, n=len(items), fn=np.zeros)
    return concatenate(space, items, out)


def write_row(space: spaces.Space[Any], batch: Any, row: Any, value: Any) -> None:
    """Write one env's `value` into `row` of `batch`, a batch of `space` with a fixed layout."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            write_row(sub, batch[key], row, value[key])
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            write_row(sub, batch[i], row, value[i])
    else:
        batch[row] = value


#: Batched spaces whose batch is one array, split along its first axis.
_ARRAY_SPACES = (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)


def unstack(batched_space: spaces.Space[Any], batch: Any) -> list[Any]:
    """Split a batch of `batched_space` into one value per env."""
    if type(batch) is np.ndarray and type(batched_space) in _ARRAY_SPACES:
        return list(batch)  # (what `iterate` gives for them, without its dispatch)
    return list(iterate(batched_space, batch))


def join_batches(space: spaces.Space[Any], batches: Sequence[Any]) -> Any:
    """Join batches of the single-env `space` (one per worker) into one batch, in order."""
    if isinstance(space, spaces.Dict):
        return {key: join_batches(sub, [b[key] for b in batches]) for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(
            join_batches(sub, [b[i] for b in batches]) for i, sub in enumerate(space.spaces)
        )
    if len(batches) == 1 and isinstance(batches[0], np.ndarray):
        return np.array(batches[0])  # a writable copy; Ray hands out read-only arrays
    if isinstance(batches[0], np.ndarray):
        return np.concatenate(batches, axis=0)
    return tuple(item for batch in batches for item in batch)


def copy_batch(batch: Any) -> Any:
    """A copy of a batch of arrays, nested in dicts and tuples as gymnasium batches are."""
    if isinstance(batch, dict):
        return {key: copy_batch(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(copy_batch(value) for value in batch)
    return np.array(batch)


def read_only(batch: Any) -> Any:
    """Views of a batch of arrays (nested as gymnasium batches are) that cannot be written.

    What ``copy=False`` hands out: the engine's own arrays, valid until its next call, which a
    user must not change in place (they are the workers' rows in shared memory).
    """
    if isinstance(batch, dict):
        return {key: read_only(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(read_only(value) for value in batch)
    view = batch.view()
    view.flags.writeable = False
    return view


def split_batch(
    space: spaces.Space[Any], batch: Any, bounds: Sequence[tuple[int, int]]
) -> list[Any]:
    """Cut a batch of the single-env `space` into ``batch[start:stop]`` for each bound."""
    if type(batch) is np.ndarray and type(space) not in _NESTED:  # the usual
        return [batch[start:stop] for start, stop in bounds]
    if isinstance(space, spaces.Dict):
        parts = {key: split_batch(sub, batch[key], bounds) for key, sub in space.items()}
        return [{key: parts[key][i] for key in space} for i in range(len(bounds))]
    if isinstance(space, spaces.Tuple):
        parts_t = [split_batch(sub, batch[j], bounds) for j, sub in enumerate(space.spaces)]
        return [tuple(p[i] for p in parts_t) for i in range(len(bounds))]
    if isinstance(batch, np.ndarray):
        return [batch[start:stop] for start, stop in bounds]
    items = list(batch)
    return [tuple(items[start:stop]) for start, stop in bounds]


def take(space: spaces.Space[Any], batch: Any, rows: Sequence[int]) -> Any:
    """The `rows` of a batch of the single-env `space`, in that order."""
    if isinstance(space, spaces.Dict):
        return {key: take(sub, batch[key], rows) for key, sub in space.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(take(sub, batch[i], rows) for i, sub in enumerate(space.spaces))
    if isinstance(batch, np.ndarray):
        return batch[list(rows)]
    items = list(batch)
    return tuple(items[row] for row in rows)


def batch_length(space: spaces.Space[Any] | None, batch: Any) -> int | None:
    """How many rows a batch of the single-env `space` holds (None if its parts disagree).

    With `space` None, `batch` is a sequence of single values.
    """
    if type(batch) is np.ndarray and batch.ndim and type(space) not in _NESTED:  # the usual
        return len(batch)
    if isinstance(space, spaces.Dict):
        lengths = {batch_length(sub, batch[key]) for key, sub in space.items()}
    elif isinstance(space, spaces.Tuple):
        lengths = {batch_length(sub, batch[i]) for i, sub in enumerate(space.spaces)}
    else:
        if isinstance(batch, (list, tuple)):  # also a batch of Graph, Text, Sequence, ...
            return len(batch)
        return len(batch) if np.ndim(batch) > 0 else None
    return lengths.pop() if len(lengths) == 1 else None


def check_rows(
    space: spaces.Space[Any] | None,
    argument: str,
    batch: Any,
    rows: int,
    each: str,
    *,
    also: str = "",
) -> None:
    """Check that `batch` (of the single-env `space`) has `rows` rows, one per `each`.

    With `space` None, `batch` is a sequence of single values (SB3's form of actions). An
    array for a Discrete, MultiDiscrete or MultiBinary space must have the shape
    ``(rows, *space.shape)``, one for a Box space that many values. `also` ends the message of an
    error (a sentence on the face's own check).

    Raises:
        TypeError: `batch` is a single value, not a batch (as ``step(0)`` passes).
        ValueError: It holds another number of rows (or its parts disagree), or an array of
            another shape.
    """
    length = batch_length(space, batch)
    if length == rows:
        if type(batch) is np.ndarray and isinstance(space, _SHAPED):
            expected = (rows, *(space.shape or ()))
            if batch.shape != expected and (
                isinstance(space, _STRICT) or batch.size != int(np.prod(expected))
            ):
                raise ValueError(_wrong_shape(space, argument, batch, expected, each) + also)
        return
    if length is None and not isinstance(batch, (Mapping, list, tuple)) and np.ndim(batch) == 0:
        raise TypeError(
            f"`{argument}` must be a batch of {rows} actions (one per {each}), got the single "
            f"value {batch!r}; nothing was sent."
        )
    held = f"holds {length} actions" if length is not None else "has parts of different lengths"
    shaped = (
        f": an array of shape {(rows, *(space.shape or ()))} for {space}"
        if isinstance(space, _SHAPED)
        else ""
    )
    raise ValueError(
        f"`{argument}` {held} but {rows} are needed (one per {each}{shaped}); nothing was sent."
        + also
    )


def _wrong_shape(
    space: spaces.Space[Any], argument: str, batch: np.ndarray, expected: tuple[int, ...], each: str
) -> str:
    """The message for an array of actions whose rows do not have the shape of `space`."""
    fix = (
        f" `{argument}.reshape({expected})` makes it one;"
        if batch.size == int(np.prod(expected))
        else ""
    )
    return (
        f"`{argument}` has shape {batch.shape}, but {expected[0]} actions of {space} (one per "
        f"{each}, each of shape {space.shape}) make an array of shape {expected};{fix} "
        "nothing was sent."
    )


def unzip(results: Sequence[Any]) -> tuple[Any, ...]:
    """Turn per-env results into per-field tuples when every result is a tuple of one length.

    Example:
        >>> unzip([(1, "a"), (2, "b")])
        ((1, 2), ('a', 'b'))
        >>> unzip([1, 2])
        (1, 2)
    """
    lengths = {len(r) for r in results if isinstance(r, tuple)}
    if results and len(lengths) == 1 and all(isinstance(r, tuple) for r in results):
        return tuple(zip(*results, strict=True))
    return tuple(results)
