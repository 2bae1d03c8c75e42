"""The infos of a call whose every info is in a column: copies, by a plan made once.

A worker on shared memory (or the TCP stream) writes its numeric infos into the store's info
columns (`InfoColumn`) and says which it wrote (a bit each). The infos handed out are then a
copy of each column written and of its mask, in `columns_of`'s layout; `plan_copies` works that
layout out once per set of columns written, and `copy_infos` makes the copies of each call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._protocol.infos import InfoColumn

__all__ = ["copy_infos", "plan_copies"]


def plan_copies(columns: Sequence[InfoColumn], written: int) -> tuple[Any, ...]:
    """What `copy_infos` copies of the `columns` written (a bit each), in `columns_of`'s order.

    For keys at the top of the infos, those keys (each key, then its mask's) and their
    arrays; where some key is nested, ``(path, values, mask)`` of each column instead.
    """
    chosen = [column for i, column in enumerate(columns) if written >> i & 1]
    if any(len(column.path) > 1 for column in chosen):
        return None, None, [(column.path, column.values, column.mask) for column in chosen]
    keys, arrays = [], []
    for column in chosen:
        keys += [column.path[0], f"_{column.path[0]}"]
        arrays += [column.values, column.mask]
    return keys, arrays, None


def copy_infos(plan: tuple[Any, ...]) -> dict[str, Any]:
    """The infos of a `plan_copies`: each column's values and mask copied, as `columns_of` does."""
    keys, arrays, nested = plan
    if nested is None:  # (every key at the top: the copies made in one go)
        return dict(zip(keys, map(np.ndarray.copy, arrays), strict=True))
    infos: dict[str, Any] = {}
    for path, values, mask in nested:
        node = infos
        for parent in path[:-1]:
            node = node.setdefault(parent, {})
        node[path[-1]] = values.copy()
        node[f"_{path[-1]}"] = mask.copy()
    return infos
