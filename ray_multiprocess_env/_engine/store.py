"""`BatchStore`: the current batch of every env, kept on the driver in one place.

Every `reset`, `step` and `recv` updates the rows of the envs it ran, so the batch is always
the latest of every env, whichever verb ran last (a masked reset after first-ready steps hands
out the right rows). Same-node workers write their rows straight into it (it is shared memory,
`SharedBatch`); the replies of the others are copied into their rows (`put`). A full batch is
then handed out as views, with no work per env; the rows of some envs (`recv`) as copies.

Infos: the workers' pieces are merged in gymnasium's layout (`merge_infos`), and numeric keys
seen once get a column in shared memory (`learn`), written by the same-node workers in place.
A call whose every info is in a column (a bit each, as the workers say) hands out a copy of each
column written and of its mask, in `columns_of`'s layout: `plan_copies` works that layout out
once per set of columns written, and `copy_infos` makes the copies of each call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env._engine.results import Batch
from ray_multiprocess_env._protocol.info_merge import columns_of, merge_infos
from ray_multiprocess_env._protocol.infos import InfoColumn, learnable
from ray_multiprocess_env._protocol.shared_layout import (
    ColumnBlock,
    SharedBatch,
    covered,
)
from ray_multiprocess_env._protocol.status import Reply
from ray_multiprocess_env.batch import copy_batch, stack, take, unstack

__all__ = ["BatchStore", "copy_infos", "plan_copies"]

#: At most this many info keys get a column in shared memory.
_MAX_COLUMNS = 64
#: At most this many spans of rows keep their views (`BatchStore._span`).
_MAX_SPANS = 64


class BatchStore:
    """The current batch of `num_envs` envs of these spaces (see the module docstring).

    Args:
        share: Put it in shared memory (for same-node workers), if the spaces have a layout.
        batched_infos: Infos in gymnasium's batched layout (else one dict per env).
    """

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        num_envs: int,
        *,
        share: bool,
        batched_infos: bool,
    ) -> None:
        self.num_envs = num_envs
        self._space = observation_space
        self._action_space = action_space
        self._batched_infos = batched_infos
        self.ready = np.zeros(num_envs, dtype=np.bool_)  # envs reset at least once
        self.columns: list[InfoColumn] = []
        self._blocks: list[ColumnBlock] = []
        self._learned: set[tuple[str, ...]] = set()
        self._spans: dict[tuple[int, int, int], tuple[Any, ...]] = {}  # (`_span`)
        self._plans: dict[int, tuple[Any, ...]] = {}  # (`whole`)
        self.use_columns = share  # some worker writes numeric infos into columns (`learn`)
        self._memory: SharedBatch | None = None
        self._obs_list: list[Any] | None = None
        if covered(observation_space) and covered(action_space):
            self._memory = SharedBatch.create(
                observation_space, action_space, num_envs, share=share
            )
            views = self._memory.views(0, num_envs)
            self.observations: Any = views.observations
            self.rewards, self.terminations = views.rewards, views.terminations
            self.truncations = views.truncations
        else:
            self._obs_list = [None] * num_envs
            self.observations = None
            self.rewards = np.zeros(num_envs, dtype=np.float64)
            self.terminations = np.zeros(num_envs, dtype=np.bool_)
            self.truncations = np.zeros(num_envs, dtype=np.bool_)

    @property
    def shared(self) -> SharedBatch | None:
        """The shared memory, for the workers on this node to map (None if private)."""
        memory = self._memory
        return memory if memory is not None and memory.spec is not None else None

    @property
    def memory(self) -> SharedBatch | None:
        """The batch's arrays, shared or private (None if the spaces have no fixed layout)."""
        return self._memory

    def check_ready(self, mask: np.ndarray) -> None:
        """A `ValueError` unless every env `mask` leaves out was reset once."""
        never = np.flatnonzero(~self.ready & ~mask)
        if len(never):
            first, last = int(never[0]), int(never[-1])
            which = f"{first}..{last}" if last - first + 1 == len(never) else str(never.tolist())
            raise ValueError(
                f"envs {which} were never reset; reset them all first (call `reset()` "
                "without `reset_mask`)."
            )

    def collect(
        self,
        answered: list[tuple[int, Any, Any]],
        envs: np.ndarray | None,
        env_ids: Any,
        every_row: bool = True,
    ) -> tuple[Batch, list[dict[str, Any]]]:
        """The batch of a call from its replies, and the specs of any new info columns.

        Args:
            answered: ``(first env of a worker, its reply, the positions it ran)`` each.
            envs: The envs that ran, if not all.
            env_ids: For the rows of some envs only (`recv`): those envs, ascending.
            every_row: Every env the replies ran is in `env_ids` (False: the rows of envs
                that raised are left out, and their infos must be looked at row by row).
        """
        old_api, parts, pieces = False, [], False
        for start, reply, positions in answered:
            if reply.observations is not None:  # (not in shared memory)
                self.put(start, positions, reply)
            old_api |= reply.old_api
            infos = reply.infos
            parts.append((start, infos))
            pieces |= type(infos) is tuple and infos[0] is not None
        if env_ids is not None and every_row and not pieces:
            batch = self.rows_of(env_ids, parts, old_api)  # (first-ready's hot path)
        else:
            batch = self.batch(parts, old_api, envs, env_ids)
        return batch, (self.learn(parts) if pieces else [])

    def rows_of(self, env_ids: np.ndarray, parts: list[tuple[int, Any]], old_api: bool) -> Batch:
        """The batch of the envs `env_ids` (ascending), all of which ran, with no info pieces.

        Copies of their rows; a run of consecutive envs (a worker's) is one slice, whose views
        of every array are made once (`_span`).
        """
        first, last = int(env_ids[0]), int(env_ids[-1])
        span = None
        if last - first + 1 == len(env_ids) and self._batched_infos:
            span = self._span(first, last + 1)
        if span is not None:
            observations, rewards, terminations, truncations, columns, plans = span
            written = _written(parts)
            plan = plans.get(written)
            if plan is None:
                plan = plans[written] = plan_copies(columns, written)
            return Batch(
                observations.copy(),
                rewards.copy(),
                terminations.copy(),
                truncations.copy(),
                copy_infos(plan),
                env_ids,
                old_api,
                False,
            )
        rows: Any = slice(first, last + 1) if last - first + 1 == len(env_ids) else env_ids
        observations = self.observations
        if type(observations) is np.ndarray:
            observations = observations[rows].copy() if type(rows) is slice else observations[rows]
        elif self._obs_list is None:
            observations = take(self._space, observations, env_ids.tolist())
        else:
            observations = stack(self._space, [self._obs_list[i] for i in env_ids.tolist()])
        arrays = (self.rewards[rows], self.terminations[rows], self.truncations[rows])
        if type(rows) is slice:
            arrays = (arrays[0].copy(), arrays[1].copy(), arrays[2].copy())
        if self._batched_infos:
            infos: Any = columns_of(self.columns, _written(parts), rows)
        else:
            infos = self._infos(parts, len(env_ids), env_ids, _rows_map(env_ids, self.num_envs))
        return Batch(observations, *arrays, infos, env_ids, old_api, False)

    def _span(self, start: int, stop: int) -> tuple[Any, ...] | None:
        """Views of rows ``start..stop-1`` of every array and info column (None: no layout).

        Made once per span (the envs of a worker) and kept until the columns change.
        """
        if type(self.observations) is not np.ndarray:
            return None  # (nested spaces: `take` each leaf)
        key = (start, stop, len(self.columns))
        found = self._spans.get(key)
        if found is None:
            rows = slice(start, stop)
            columns = [
                InfoColumn((c.path, c.dtype, c.shape, c.origin), c.values[rows], c.mask[rows])
                for c in self.columns
            ]
            found = (
                self.observations[rows],
                self.rewards[rows],
                self.terminations[rows],
                self.truncations[rows],
                columns,
                {},  # (`_plan` s of the columns, by the columns written)
            )
            if len(self._spans) >= _MAX_SPANS or any(k[2] != key[2] for k in self._spans):
                self._spans = {}  # (columns added, or many spans: the slow path's `recv`s)
            self._spans[key] = found
        return found

    def kept(self, batch: Batch, spans: Sequence[range]) -> tuple[Batch, dict[int, Any]]:
        """A copy of `batch` that later calls leave alone, and each worker's rows of it.

        `spans`: each worker's envs. The rows are ``(observations, rewards, terminations,
        truncations)`` by worker index (`RemoteEnvError.worker_results`).
        """
        batch.observations = copy_batch(batch.observations)
        batch.rewards, batch.terminations, batch.truncations = (
            np.array(array) for array in batch.arrays()
        )
        batch.shared = False
        rows = {}
        for worker, span in enumerate(spans):
            envs = list(span)
            rows[worker] = (
                take(self._space, batch.observations, envs),
                *(array[envs] for array in batch.arrays()),
            )
        return batch, rows

    # -- in ---------------------------------------------------------------------------------------
    def put(self, start: int, positions: Sequence[int] | None, reply: Reply) -> None:
        """Copy a worker's reply rows (its envs from `start`, at `positions`) into the batch."""
        observations, rewards, terminations, truncations = reply[:4]
        if observations is None:
            return  # written in shared memory already (or nothing ran)
        count = len(rewards)
        rows: Any = (
            slice(start, start + count) if positions is None else [start + p for p in positions]
        )
        self.rewards[rows], self.terminations[rows], self.truncations[rows] = (
            rewards,
            terminations,
            truncations,
        )
        if self._obs_list is None:
            _copy_rows(self._space, self.observations, rows, observations)
        else:
            items = unstack(batch_space(self._space, count), observations)
            indices = range(start, start + count) if positions is None else rows
            for env, item in zip(indices, items, strict=True):
                self._obs_list[env] = item

    # -- out --------------------------------------------------------------------------------------
    def batch(
        self,
        parts: Iterable[tuple[int, Any]],
        old_api: bool,
        envs: np.ndarray | None = None,
        env_ids: np.ndarray | None = None,
    ) -> Batch:
        """The batch of a call: of every env (the store's own arrays), or of `env_ids`.

        Args:
            parts: ``(first env of a worker, its infos)`` for each worker that answered.
            old_api: Whether an env spoke old gym's API.
            envs: The envs that ran, if not all (their info rows only count).
            env_ids: For the rows of some envs only (`recv`): those envs, ascending.
        """
        if env_ids is None:
            size, env_rows = self.num_envs, None
        else:
            size, env_rows = len(env_ids), _rows_map(env_ids, self.num_envs)
        infos = self._infos(list(parts), size, envs, env_rows)
        if env_ids is None:
            return self._every_env(infos, old_api)
        rows = env_ids.tolist()
        if self._obs_list is None:
            observations = take(self._space, self.observations, rows)
        else:
            observations = stack(self._space, [self._obs_list[i] for i in rows])
        arrays = (self.rewards[env_ids], self.terminations[env_ids], self.truncations[env_ids])
        return Batch(observations, *arrays, infos, env_ids, old_api, False)

    def whole(self, written: int, old_api: bool) -> Batch:
        """`batch` of a call of every env whose infos are all in the columns `written`.

        The infos' layout is worked out once per set of columns written (`_plans`); what
        each call costs is a copy of each column written, in `columns_of`'s order.
        """
        plan = self._plans.get(written)
        if plan is None:
            plan = self._plans[written] = plan_copies(self.columns, written)
        return self._every_env(copy_infos(plan), old_api)

    def _every_env(self, infos: Any, old_api: bool) -> Batch:
        """The batch of every env with these `infos`: the store's own arrays (views)."""
        if self._obs_list is None:
            observations, shared = self.observations, True
        else:
            observations, shared = stack(self._space, self._obs_list), False
        arrays = (self.rewards, self.terminations, self.truncations)
        return Batch(observations, *arrays, infos, None, old_api, shared)

    def _infos(
        self,
        parts: list[tuple[int, Any]],
        size: int,
        envs: np.ndarray | None,
        env_rows: np.ndarray | None,
    ) -> Any:
        if not self._batched_infos:
            out: list[Any] = [None] * size
            if env_rows is None:  # (every env's row: a whole batch)
                for start, infos in parts:
                    if infos:
                        for position, info in infos.items():
                            out[start + position] = info
            else:
                for start, infos in parts:
                    for position, info in (infos or {}).items():
                        row = env_rows[start + position]
                        if row >= 0:  # (else an env left out of the batch: one that raised)
                            out[row] = info
            if None in out:  # (an env with no info: a dict of its own, as each env's is)
                out = [{} if info is None else info for info in out]
            return out
        if envs is None and env_rows is not None:
            envs = np.flatnonzero(env_rows >= 0)
        return merge_infos(size, parts, self.columns, envs=envs, env_rows=env_rows)

    def learn(self, parts: Iterable[tuple[int, Any]]) -> list[dict[str, Any]]:
        """Columns for the numeric info keys first seen in `parts`: the specs of new blocks."""
        if not self.use_columns or self._memory is None or not self._batched_infos:
            return []
        new: list[tuple[Any, ...]] = []
        for _, (pieces, _) in parts:
            for piece in pieces or ():
                spec = learnable(piece)
                if spec is not None and spec[0] not in self._learned:
                    self._learned.add(spec[0])
                    new.append(spec)
        new = new[: max(0, _MAX_COLUMNS - len(self.columns))]
        if not new:
            return []
        block = ColumnBlock.create(new, self.num_envs)
        self._blocks.append(block)
        self.columns += block.columns()
        self._plans = {}
        return [block.spec]

    def close(self) -> bool:
        """Release the memory; False while views handed out (``copy=False``) still hold some."""
        self.columns, self._spans, self._plans = [], {}, {}
        self.observations = self.rewards = self.terminations = self.truncations = None  # type: ignore[assignment]
        released = True
        for memory in [self._memory, *self._blocks]:
            if memory is not None:
                released = memory.close() and released
        return released


def _written(parts: Iterable[tuple[int, Any]]) -> int:
    """The info columns any of these workers' replies wrote (a bit each)."""
    written = 0
    for _, (_, bits) in parts:
        written |= bits
    return written


def _copy_rows(space: Any, batch: Any, rows: Any, values: Any) -> None:
    """Copy a batch of `values` into `rows` of `batch` (both of `space`'s layout)."""
    if isinstance(batch, dict):
        for key in batch:
            _copy_rows(space[key], batch[key], rows, values[key])
    elif isinstance(batch, tuple):
        for i, part in enumerate(batch):
            _copy_rows(space[i], part, rows, values[i])
    else:
        batch[rows] = values


def _rows_map(env_ids: np.ndarray, num_envs: int) -> np.ndarray:
    """The row of each env in a batch of the envs `env_ids` (-1: not in it)."""
    env_rows = np.full(num_envs, -1)
    env_rows[env_ids] = np.arange(len(env_ids))
    return env_rows


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
