"""`WorkerRows`: a worker's rows of the vector env's batch, in shared memory or its own.

A worker writes each env's observation, reward and flags into its rows as the env answers. The
rows live in the driver's shared memory once the driver has shared it (`share`, same node only:
then a reply carries none of them), else in memory of the worker's own with the same layout,
sent in each reply. Over a TCP stream (`mirror`) they stay in the worker's own memory and the
stream carries the rows each call wrote as raw bytes after the reply (`written_tail`), and the
actions the other way (`take_actions`). Spaces with no fixed layout (Text, Graph, ...) keep a
list of observations that is stacked for each reply. This module imports nothing of the driver
side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from ray_multiprocess_env._protocol.infos import InfoColumn
from ray_multiprocess_env._protocol.pipes import Buffer
from ray_multiprocess_env._protocol.shared_layout import (
    BatchViews,
    ColumnBlock,
    SharedBatch,
    covered,
    read_actions,
)
from ray_multiprocess_env._protocol.status import Reply
from ray_multiprocess_env._protocol.stream import RowTarget, pack_rows, unpack_rows
from ray_multiprocess_env.batch import stack, take, write_row

__all__ = ["WorkerRows"]

_NOTHING: Any = object()  # no rows written since the last tail (None stands for every row)


class WorkerRows:
    """The rows of `count` envs with these spaces (`uniform`: every env has them).

    Attributes:
        observations: The batch of observations (None for spaces with no layout).
        rewards: One float64 per env.
        terminations: One bool per env.
        truncations: One bool per env.
        shared: The views of the driver's shared memory, once shared (else None).
        columns: The info columns in shared memory, this worker's rows of them.
    """

    def __init__(
        self, observation_space: Any, action_space: Any, count: int, uniform: bool
    ) -> None:
        self._spaces = (observation_space, action_space)
        self._flat = not isinstance(observation_space, (spaces.Dict, spaces.Tuple))
        self._count = count
        self._obs_list: list[Any] | None = None
        self.observations: Any = None
        self.rewards = np.zeros(count, dtype=np.float64)
        self.terminations = np.zeros(count, dtype=np.bool_)
        self.truncations = np.zeros(count, dtype=np.bool_)
        self.shared: BatchViews | None = None
        self.columns: list[InfoColumn] = []
        self._blocks: dict[str, ColumnBlock] = {}
        self._span = (0, count)
        self._mirrored = False  # `mirror`: the rows travel after each reply
        self._written: Any = _NOTHING  # the positions written since the last tail
        self._action_targets: list[RowTarget] = []  # where actions after a message go (`mirror`)
        self._private: SharedBatch | None = None
        self._shared_actions: Any = action_space  # the action space the shared rows are laid out by
        if uniform and all(s is not None and covered(s) for s in self._spaces):
            self._private = SharedBatch.create(*self._spaces, count, share=False)
            self._use(self._private.views(0, count))
        else:
            self._obs_list = [None] * count

    def write_obs(self, k: int, obs: Any) -> None:
        """Env `k`'s observation."""
        if self._obs_list is not None:
            self._obs_list[k] = obs
        elif self._flat:
            self.observations[k] = obs
        else:
            write_row(self._spaces[0], self.observations, k, obs)

    def actions(self, positions: Sequence[int] | None) -> Any:
        """A copy of the actions the driver put in shared memory (of `positions` only)."""
        assert self.shared is not None
        return read_actions(self.shared, self._shared_actions, positions)

    def reply(self, positions: Sequence[int] | None, infos: Any, old_api: bool) -> Reply:
        """The reply to a ``reset`` or ``step`` of the envs at `positions` (all if None)."""
        if self._mirrored:
            self._written = positions
        if self.shared is not None:
            return Reply(None, None, None, None, infos, old_api)
        space = self._spaces[0]
        if self._obs_list is not None:
            items = self._obs_list if positions is None else [self._obs_list[k] for k in positions]
            observations = stack(space, items)
        elif positions is None:
            observations = self.observations
        else:
            observations = take(space, self.observations, positions)
        if positions is None:
            arrays = (self.rewards, self.terminations, self.truncations)
        else:
            rows = list(positions)
            arrays = (self.rewards[rows], self.terminations[rows], self.truncations[rows])
        return Reply(observations, *arrays, infos, old_api)

    def share(self, spec: dict[str, Any], start: int, stop: int) -> None:
        """Move to rows ``start..stop-1`` of the driver's shared memory (`SharedBatch`).

        What the rows hold is left as it is: the driver has every row it was answered (a first-
        ready answer of another env may wait there to be read when a replacement maps them),
        and each env writes its whole row at its next step or reset.
        """
        if self._private is None:
            raise ValueError("these envs' spaces have no shared layout")
        views = SharedBatch.attach(spec).views(start, stop)
        self._use(views)
        self.shared, self._span = views, (start, stop)
        self._shared_actions = spec["action_space"]  # (the layout's: a Dict's keys in its order)

    def mirror(self, observation_space: Any, action_space: Any) -> None:
        """Keep the rows here and send those a call wrote after its reply (a TCP stream).

        The rows take the layout of the driver's spaces (equal to this worker's, but a Dict's
        keys may come in another order), so that their bytes mean the same on both ends.
        """
        if self._private is None:
            raise ValueError("these envs' spaces have no shared layout")
        batch = SharedBatch.create(observation_space, action_space, self._count, share=False)
        views = batch.views(0, self._count)
        _copy_rows(views, self._private.views(0, self._count))  # (by key: a restart's resets)
        self._private, self._shared_actions = batch, action_space
        self._use(views)
        self.shared, self._span = views, (0, self._count)  # (its own rows: from 0)
        self._action_targets = [RowTarget(leaf) for leaf in views.action_leaves]
        self._mirrored, self._written = True, _NOTHING

    def take_actions(self, tail: memoryview) -> None:
        """Write the actions that arrived as raw rows (`stream.pack_rows`) into the rows."""
        unpack_rows(tail, self._action_targets)

    def written_tail(self) -> list[Buffer]:
        """The rows (and info columns) written since the last tail, as raw bytes; [] if none."""
        if not self._mirrored or self._written is _NOTHING:
            return []
        assert self.shared is not None
        views, positions, self._written = self.shared, self._written, _NOTHING
        arrays = [*views.observation_leaves, views.rewards, views.terminations, views.truncations]
        for column in self.columns:
            arrays += [column.values, column.mask]
        return pack_rows(arrays, positions)

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> list[InfoColumn]:
        """Map the info columns of `specs` not mapped yet; every column, this worker's rows.

        Mirrored rows get columns of their own with the same layout, sent with the rows.
        """
        if self.shared is not None:
            start, stop = self._span
            for spec in specs:
                if spec["path"] not in self._blocks:
                    if self._mirrored:
                        block = ColumnBlock.create(spec["columns"], self._count, share=False)
                    else:
                        block = ColumnBlock.attach(spec)
                    self._blocks[spec["path"]] = block
                    self.columns += block.columns(start, stop)
        return self.columns

    def unshare(self) -> None:
        """Move back to memory of this worker's own (the driver stopped sharing)."""
        if self.shared is not None and self._private is not None and not self._mirrored:
            mine = self._private.views(0, self._count)
            _copy_rows(mine, self.shared)
            self._use(mine)
        self.shared, self._blocks, self.columns, self._span = None, {}, [], (0, self._count)
        self._mirrored, self._written, self._action_targets = False, _NOTHING, []

    def _use(self, views: BatchViews) -> None:
        self.observations = views.observations
        self.rewards, self.terminations = views.rewards, views.terminations
        self.truncations = views.truncations


def _copy_rows(target: BatchViews, source: BatchViews) -> None:
    _copy_into(target.observations, source.observations)
    for theirs, ours in zip(target[2:5], source[2:5], strict=True):
        theirs[...] = ours


def _copy_into(target: Any, source: Any) -> None:
    """Copy a batch (arrays nested in dicts and tuples) into another of the same layout."""
    if isinstance(target, dict):
        for key in target:
            _copy_into(target[key], source[key])
    elif isinstance(target, tuple):
        for t, s in zip(target, source, strict=True):
            _copy_into(t, s)
    else:
        target[...] = source
