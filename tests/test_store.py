"""The infos copied by a plan made once (`store.plan_copies`) are exactly `columns_of`'s.

The same keys in the same order, the same values, and copies the next call cannot change.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from ray_multiprocess_env._engine.store import copy_infos, plan_copies
from ray_multiprocess_env._protocol.info_merge import columns_of
from ray_multiprocess_env._protocol.infos import InfoColumn


def _column(path: tuple[str, ...], dtype: Any, seed: int) -> InfoColumn:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=4).astype(dtype)
    return InfoColumn((path, dtype, (), float), values, rng.random(4) < 0.5)


def _layout(infos: dict[str, Any]) -> list[Any]:
    """Keys in order, nested dicts as lists, arrays as (dtype, values)."""
    out: list[Any] = []
    for key, value in infos.items():
        if isinstance(value, dict):
            out.append((key, _layout(value)))
        else:
            out.append((key, str(value.dtype), value.tolist()))
    return out


FLAT = [(("x_position",), np.float64), (("reward_ctrl",), np.float32), (("count",), np.int64)]
NESTED = [*FLAT[:1], (("episode", "r"), np.float64), *FLAT[1:], (("episode", "l"), np.int64)]


@pytest.mark.parametrize("specs", [FLAT, NESTED], ids=["flat", "nested"])
def test_copies_by_plan_are_columns_of_for_every_set_of_columns_written(specs):
    columns = [_column(path, dtype, seed) for seed, (path, dtype) in enumerate(specs)]
    for bits in itertools.product([0, 1], repeat=len(columns)):
        written = sum(bit << i for i, bit in enumerate(bits))
        copied = copy_infos(plan_copies(columns, written))
        assert _layout(copied) == _layout(columns_of(columns, written, None)), written


def test_copies_by_plan_are_the_callers_own():
    columns = [_column(path, dtype, seed) for seed, (path, dtype) in enumerate(FLAT)]
    plan = plan_copies(columns, 0b101)
    first = copy_infos(plan)
    kept = _layout(first)
    for column in columns:  # the next call writes the columns again
        column.values[:] = 7
        column.mask[:] = True
    assert _layout(first) == kept
    assert copy_infos(plan)["x_position"].tolist() == [7.0] * 4  # (the plan reads them anew)
