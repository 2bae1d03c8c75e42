"""The shared-memory rows: the batch in memory shared with a same-node worker.

The driver's batch (`SharedBatch`: actions, observations, rewards, terminations, truncations)
and its numeric info columns (`ColumnBlock`) are in anonymous memory files that the worker maps
too (see `_protocol/shared_layout.py`). A full or first-ready step then writes the actions into
that memory and sends a message of a few bytes on the worker's pipe (a doorbell); the worker
reads its actions there, writes its rows of the results there, and its reply carries only the
infos that have no column. Everything else travels on the pipes (`pipes.py`) as without them.

An operation given up on (an interrupted step) may still wait in the pipe when the next one is
sent; its actions must not be overwritten, so actions go through the memory only while the
worker has answered everything sent to it (otherwise they travel in the message: `shared`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.transports.base import Ticket
from ray_multiprocess_env._engine.transports.channel import ChannelTransport
from ray_multiprocess_env._engine.transports.pipes import open_pipes
from ray_multiprocess_env._protocol.shared_layout import SharedBatch, write_actions

__all__ = ["SharedRows", "shared_memory_transport"]


class SharedRows:
    """Rows ``span`` of `batch`, in memory the worker maps too (a `base.Rows`)."""

    shared = True

    def __init__(self, batch: SharedBatch, span: tuple[int, int]) -> None:
        self._spec, self._span = batch.spec, span
        self.views: Any = batch.views(*span)  # (`SharedBatch.views`)
        self._action_space: Any = batch.action_space
        leaves = self.views.action_leaves
        self.leaf = leaves[0] if len(leaves) == 1 else None  # (the common case, fast)

    def handshake(self) -> Ticket:
        """The worker maps the memory and uses these rows."""
        return Ticket(-1, -1, "share", (self._spec, *self._span), tuple(range(*self._span)))

    def place(self, actions: Any, positions: Any) -> bool:
        """Write a step's `actions` into the rows (at `positions`) if they fit their layout."""
        leaf = self.leaf
        if (
            positions is None
            and leaf is not None
            and type(actions) is np.ndarray
            and actions.dtype == leaf.dtype
            and actions.shape == leaf.shape
        ):
            leaf[...] = actions
            return True
        return write_actions(self.views, self._action_space, actions, positions)

    def message(self, head: bytes, positions: Any) -> bytes:
        """`head` alone: the actions are in the memory."""
        return head

    def plain(self, data: bytes) -> bytes:
        """`data` as it is."""
        return data

    def take(self, payload: bytes) -> None:
        """Nothing: the worker wrote its rows in place."""

    def add_columns(self, specs: Sequence[dict[str, Any]]) -> bool:
        """The worker maps the columns itself."""
        return True

    def close(self) -> None:
        """Let go of the views."""
        self.views = self.leaf = None


def shared_memory_transport(
    actor: Any,
    deadline: float | None,
    grace: float,
    batch: SharedBatch,
    span: tuple[int, int],
    columns: Sequence[dict[str, Any]] = (),
    spin_us: int = 0,
) -> ChannelTransport:
    """Pipes to a same-node worker that uses rows ``start..stop-1`` (`span`) of `batch`.

    `columns`: the info columns made so far; `grace` and `spin_us` as `pipes.pipe_transport`.

    Raises:
        TimeoutError: If the worker does not open its pipes, or map the memory, by `deadline`.
        RemoteFailure: If it cannot map the memory (the caller goes on without: the replies
            carry its rows, as over pipes alone).
    """
    rows = SharedRows(batch, span)
    return ChannelTransport.open(
        "shared_memory",
        lambda: open_pipes(actor, deadline, spin_us),
        grace,
        spin_us,
        rows,
        deadline,
        columns,
    )
