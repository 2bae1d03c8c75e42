"""Infos batched in the workers and merged on the driver equal gymnasium's `_add_info`.

Random info dicts (keys that come and go, types that change between envs, nested dicts, arrays
of one or several shapes, objects, `final_obs`) are split over workers, batched per worker
(`InfoBatcher`), some keys in shared-memory columns, and merged (`merge_infos`); the result must
equal what gymnasium's `VectorEnv._add_info` builds env by env, dtypes and types of objects
included. No Ray is needed.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from gymnasium.vector import VectorEnv

from ray_multiprocess_env._protocol.info_merge import merge_infos
from ray_multiprocess_env._protocol.infos import InfoBatcher, InfoColumn, learnable


class _Adder(VectorEnv):
    """gymnasium's own `_add_info`, for `num_envs` envs."""

    def __init__(self, num_envs):
        self.num_envs = num_envs


def _gymnasium(infos_per_env, num_envs, rows=None):
    adder, out = _Adder(num_envs), {}
    for env, info in enumerate(infos_per_env):
        if info is not None:
            out = adder._add_info(out, info, env if rows is None else rows[env])
    return out


def _value(rng, kind):
    return {
        "int": lambda: int(rng.integers(-5, 5)),
        "float": lambda: float(rng.normal()),
        "bool": lambda: bool(rng.integers(2)),
        "np.float32": lambda: np.float32(rng.normal()),
        "np.int64": lambda: np.int64(rng.integers(100)),
        "np.bool_": lambda: np.bool_(rng.integers(2)),
        "array": lambda: rng.normal(size=3),
        "array2": lambda: rng.integers(0, 9, size=(2, 2)),
        "text": lambda: "t" + str(rng.integers(9)),
        "none": lambda: None,
        "tuple": lambda: (1, "a"),
    }[kind]()


_KINDS = ["int", "float", "bool", "np.float32", "np.int64", "np.bool_", "array", "array2"]
_OBJECTS = ["text", "none", "tuple"]


def _random_info(rng, keys):
    info = {}
    for key, kinds in keys.items():
        if rng.random() < 0.7:
            info[key] = _value(rng, kinds[int(rng.integers(len(kinds)))])
    if rng.random() < 0.5:
        info["nested"] = {"deep": _value(rng, "float")} if rng.random() < 0.8 else {}
    if rng.random() < 0.2:
        info["final_obs"] = rng.normal(size=2)
        info["final_info"] = {"x": _value(rng, "int")}
    return info


def _assert_same(got, want, where=""):
    assert set(got) == set(want), where
    for key, value in want.items():
        mine = got[key]
        if isinstance(value, dict):
            _assert_same(mine, value, f"{where}.{key}")
            continue
        assert mine.dtype == value.dtype, (where, key)
        assert mine.shape == value.shape, (where, key)
        if value.dtype == object:
            for a, b in zip(mine, value, strict=True):
                assert type(a) is type(b), (where, key, a, b)
                np.testing.assert_equal(a, b)
        else:
            np.testing.assert_array_equal(mine, value, err_msg=f"{where}.{key}")


def _columns(pieces_seen, num_envs):
    """Shared-memory columns (here plain arrays) for the typed keys seen, as the driver learns."""
    columns = []
    for piece in pieces_seen:
        spec = learnable(piece)
        if spec is not None and all(c.path != spec[0] for c in columns):
            _, dtype, shape, _ = spec
            values = np.zeros((num_envs, *shape), dtype=dtype)
            columns.append(InfoColumn(spec, values, np.zeros(num_envs, dtype=np.bool_)))
    return columns


def _batched(infos_per_env, bounds, columns, envs=None, env_rows=None, size=None):
    """Batch `infos_per_env` in workers of `bounds` (the envs `envs` only) and merge them."""
    parts = []
    for start, stop in bounds:
        local = [  # the worker's rows of each column
            InfoColumn(
                (c.path, c.dtype.str, c.shape, c.origin), c.values[start:stop], c.mask[start:stop]
            )
            for c in columns
        ]
        batcher = InfoBatcher(local)
        positions = [k for k in range(stop - start) if envs is None or start + k in envs]
        batcher.start(positions)
        for k in positions:
            info = infos_per_env[start + k]
            if info:
                batcher.add(k, info)
        parts.append((start, batcher.finish()))
    n = len(infos_per_env) if size is None else size
    return merge_infos(n, parts, columns, envs=envs, env_rows=env_rows), parts


@pytest.mark.parametrize("seed", range(40))
def test_merged_infos_equal_gymnasiums_add_info(seed):
    """Any mix of keys and types gives gymnasium's dict, with and without columns."""
    rng = np.random.default_rng(seed)
    num_envs = int(rng.integers(1, 9))
    cut = sorted(set(rng.integers(0, num_envs + 1, size=2).tolist()) | {0, num_envs})
    bounds = list(itertools.pairwise(cut))
    names = ["a", "b", "c", "d"]
    keys = {
        name: [_KINDS[int(rng.integers(len(_KINDS)))]]
        + ([] if rng.random() < 0.6 else [(_KINDS + _OBJECTS)[int(rng.integers(11))]])
        for name in names
    }
    columns = []
    for _ in range(4):  # several calls: columns learned from the pieces of the first ones
        infos = [_random_info(rng, keys) for _ in range(num_envs)]
        try:
            want = _gymnasium(infos, num_envs)
        except (TypeError, ValueError) as err:  # a value gymnasium cannot cast: so do we fail
            with pytest.raises(type(err)):
                _batched(infos, bounds, columns)
            continue
        got, parts = _batched(infos, bounds, columns)
        _assert_same(got, want)
        columns = columns + [
            c
            for c in _columns([p for _, (ps, _) in parts for p in ps or ()], num_envs)
            if all(c.path != old.path for old in columns)
        ]


@pytest.mark.parametrize("seed", range(10))
def test_infos_of_some_envs_equal_gymnasiums(seed):
    """A masked reset (all rows, some envs) and a first-ready recv (some rows) merge exactly."""
    rng = np.random.default_rng(100 + seed)
    num_envs = 6
    bounds = [(0, 3), (3, 6)]
    keys = {"a": ["float"], "b": ["int", "np.float32"], "c": ["array"], "e": ["text", "none"]}
    warm = [_random_info(rng, keys) for _ in range(num_envs)]
    _, parts = _batched(warm, bounds, [])
    columns = _columns([p for _, (ps, _) in parts for p in ps or ()], num_envs)
    _batched(warm, bounds, columns)  # every column row written once
    envs = np.array(sorted(rng.choice(num_envs, size=3, replace=False).tolist()))
    infos = [_random_info(rng, keys) if env in envs else None for env in range(num_envs)]
    got, _ = _batched(infos, bounds, columns, envs=envs)
    _assert_same(got, _gymnasium(infos, num_envs))
    env_rows = np.full(num_envs, -1)
    env_rows[envs] = np.arange(len(envs))
    got, _ = _batched(infos, bounds, columns, envs=envs, env_rows=env_rows, size=len(envs))
    compact = [infos[env] for env in envs]
    _assert_same(got, _gymnasium(compact, len(envs)))


def test_a_repeated_key_for_one_env_keeps_the_last_value():
    """SAME_STEP adds the final infos, then the reset's: a key in both keeps the reset's."""
    batcher = InfoBatcher()
    batcher.start(slice(None))
    batcher.add(0, {"x": 1, "final_obs": np.zeros(2)})
    batcher.add(0, {"x": 2.5})
    got = merge_infos(1, [(0, batcher.finish())])
    adder = _Adder(1)
    want = adder._add_info(
        adder._add_info({}, {"x": 1, "final_obs": np.zeros(2)}, 0), {"x": 2.5}, 0
    )
    _assert_same(got, want)


def test_infos_of_an_env_left_out_of_the_batch_are_dropped():
    """`recv` after an env error: its siblings' rows only, none of the failed env's infos."""
    batcher = InfoBatcher()
    batcher.start(slice(None))
    batcher.add(0, {"x": 1.5, "note": "kept"})
    batcher.add(1, {"x": 9.0, "final_obs": "FAILED", "note": "dropped"})  # env 1 raised
    parts = [(0, batcher.finish())]
    infos = merge_infos(1, parts, [], env_rows=np.array([0, -1]))
    assert set(infos) == {"x", "_x", "note", "_note"}
    assert infos["x"].tolist() == [1.5]
    assert infos["note"].tolist() == ["kept"]
    assert infos["_x"].tolist() == infos["_note"].tolist() == [True]


def _column(path, dtype, origin, num_envs):
    values = np.zeros(num_envs, dtype=dtype)
    return InfoColumn((path, np.dtype(dtype).str, (), origin), values, np.zeros(num_envs, np.bool_))


def test_each_call_over_the_same_columns_equals_gymnasiums():
    """Each call of a sequence over the same columns equals gymnasium's dict.

    Infos with exactly the columns' keys (the usual step), mixed with other keys, empty infos,
    a value of another type and nested keys; no row of an earlier call may leak into a later one.
    """
    num_envs, bounds = 5, [(0, 3), (3, 5)]
    columns = [
        _column(("a",), np.float64, float, num_envs),
        _column(("b",), np.float32, np.float32, num_envs),
        _column(("c",), np.int64, int, num_envs),
        _column(("n", "d"), np.float64, float, num_envs),
    ]

    def usual(i):
        return {"c": 3 * i, "a": i + 0.5, "b": np.float32(i)}  # (another order than the columns')

    calls = [
        [usual(i) for i in range(num_envs)],  # every env the columns' keys
        [usual(0), None, {**usual(2), "x": "t"}, usual(3), {}],  # none, an extra key, empty
        [usual(0), {**usual(1), "a": 7}, usual(2), {"a": 1.5}, usual(4)],  # an int for a float
        [{"n": {"d": 2.0}}, usual(1), {"a": 0.25, "n": {"d": 1.0}}, None, usual(4)],  # nested
        [usual(i) for i in range(num_envs)],  # the usual again after all of that
        [None] * num_envs,  # nothing at all
    ]
    for n, infos in enumerate(calls):
        got, _ = _batched(infos, bounds, columns)
        _assert_same(got, _gymnasium(infos, num_envs), f"call {n}")
    envs = np.array([1, 3, 4])  # some envs: the others' rows are not the call's
    infos = [usual(i) if i in envs else None for i in range(num_envs)]
    got, _ = _batched(infos, bounds, columns, envs=envs)
    _assert_same(got, _gymnasium(infos, num_envs))


_USUAL = {"x": 2.5}
_OTHER = {"final_obs": np.zeros(2), "n": {"d": 1.0}}


@pytest.mark.parametrize(
    "adds",
    [
        [_USUAL, _OTHER],
        [_OTHER, _USUAL],
        [_USUAL, {**_OTHER, "x": 1.0}],
        [{**_OTHER, "x": 1.0}, _USUAL],
    ],
)
def test_two_infos_of_one_env_in_one_call_keep_what_each_wrote(adds):
    """Two infos of one env in one call: neither loses what the other wrote.

    SAME_STEP adds an env's final infos and then its reset's; either may have exactly the
    columns' keys.
    """
    columns = [_column(("x",), np.float64, float, 1), _column(("n", "d"), np.float64, float, 1)]
    batcher = InfoBatcher(columns)
    batcher.start(slice(None))
    for info in adds:
        batcher.add(0, info)
    got = merge_infos(1, [(0, batcher.finish())], columns)
    adder, want = _Adder(1), {}
    for info in adds:
        want = adder._add_info(want, info, 0)
    _assert_same(got, want)


def test_an_int_beyond_int64_beside_a_float_is_batched_as_gymnasium_batches_it():
    """A key with an int column, and in one call a float and an int beyond int64's range.

    gymnasium batches them as float64 (the first value's type). Writing the big int into the
    column overflows: the worker must not raise (an env error for a healthy env); the value
    goes with the pieces, and the merge gives gymnasium's dict.
    """
    _, parts = _batched([{"n": 1}, {"n": 2}], [(0, 2)], [])
    columns = _columns(parts[0][1][0], 2)  # (an int column for "n", as the driver learns it)
    assert [column.origin for column in columns] == [int]
    infos = [{"n": 1.5}, {"n": 2**70}]
    got, _ = _batched(infos, [(0, 2)], columns)
    _assert_same(got, _gymnasium(infos, 2))
