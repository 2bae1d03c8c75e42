"""The shared-memory transport: the batch in memory shared with a same-node worker.

The driver's batch (`SharedBatch`: actions, observations, rewards, terminations, truncations)
and its numeric info columns (`ColumnBlock`) are in anonymous memory files that the worker maps
too (see `_protocol/shared_layout.py`). A full or first-ready step then writes the actions into
that memory and sends a message of a few bytes on the worker's pipe (a doorbell); the worker
reads its actions there, writes its rows of the results there, and its reply carries only the
infos that have no column. Everything else travels on the pipe as with `PipeTransport`.

An operation given up on (an interrupted step) may still wait in the pipe when the next one is
sent; its actions must not be overwritten, so actions go through the memory only while the
worker has answered everything sent to it (otherwise they travel in the message).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.transports.base import Ticket
from ray_multiprocess_env._engine.transports.pipes import (
    PipeTransport,
    outcome_of_code,
    outcome_of_infos,
)
from ray_multiprocess_env._protocol.pipes import dumps, infos_answer
from ray_multiprocess_env._protocol.shared_layout import SharedBatch, write_actions
from ray_multiprocess_env._protocol.status import (
    ANSWERS,
    DOORBELL,
    FRAMED_RECORD,
    RECORD,
)

#: What `SharedMemoryTransport.read_lane` returns when no whole reply is in yet.
NOTHING = -2
#: What it returns when a reply that is not a record of everything in place came.
OTHER = -1
#: What it returns for a record with an info dict per env after it (`status.answer_infos`):
#: the dicts and old gym's API are in the transport's `infos`.
INFOS = -3

__all__ = ["INFOS", "NOTHING", "OTHER", "SharedMemoryTransport"]


class SharedMemoryTransport(PipeTransport):
    """Pipes to a same-node worker that uses rows ``start..stop-1`` of `batch`.

    Raises:
        TimeoutError: If the worker does not open its pipes, or map the memory, by `deadline`.
        RemoteFailure: If it cannot map the memory (it goes on without: the replies carry
            its rows, as over `PipeTransport`).
    """

    kind = "shared_memory"
    hot = True
    #: The info dicts and API of the last answer `read_lane` read as `INFOS`.
    infos: tuple[dict[int, Any], bool] | None = None

    def __init__(
        self,
        actor: Any,
        deadline: float | None,
        grace: float,
        batch: SharedBatch,
        span: tuple[int, int],
        columns: Sequence[dict[str, Any]] = (),
        spin_us: int = 0,
    ) -> None:
        super().__init__(actor, deadline, grace, spin_us)
        share = Ticket(-1, -1, "share", (batch.spec, *span), tuple(range(*span)))
        self._use_rows(batch, span, share, deadline)
        if columns:
            self.share_infos(columns)

    def _use_rows(
        self, batch: SharedBatch, span: tuple[int, int], share: Ticket, deadline: float | None
    ) -> None:
        """Views of rows `span` of `batch`; `share` has the worker use them (waited for)."""
        self._views = batch.views(*span)
        self._action_space: Any = batch.action_space
        leaves = self._views.action_leaves
        self._leaf = leaves[0] if len(leaves) == 1 else None  # (the common case, fast)
        self._actions_shared = False  # the worker uses the rows: actions may go through them
        try:
            self.submit(share)
            self.waiter.wait([share], deadline, 1)
            if share.outcome is None:
                self.forget(share)
                raise TimeoutError("the worker did not map the shared memory in time")
            if not share.outcome.ok:
                raise share.outcome.error or RuntimeError("the worker could not map the memory")
            self._actions_shared = True
        except BaseException:  # half made: its pipes closed, so the worker's `serve` ends
            self.close()
            raise

    def encode(self, ticket: Ticket) -> bytes:
        """The operation; a step's actions go into shared memory when they fit (a doorbell)."""
        if ticket.shared_args and self._actions_shared and self.idle:
            actions, positions = ticket.args
            if self._place(actions, positions):
                return DOORBELL if positions is None else dumps((ticket.op, (None, positions)))
        return self.encode_op(ticket.op, ticket.args)

    def _place(self, actions: Any, positions: Any) -> bool:
        """Write a step's `actions` into the rows (at `positions`) if they fit their layout."""
        leaf = self._leaf
        if (
            positions is None
            and leaf is not None
            and type(actions) is np.ndarray
            and actions.dtype == leaf.dtype
            and actions.shape == leaf.shape
        ):
            leaf[...] = actions
            return True
        return write_actions(self._views, self._action_space, actions, positions)

    def can_ring(self, actions: Any) -> bool:
        """Whether `ring` can send a step of all of this worker's envs with these `actions`.

        Only while the worker maps the memory, has answered every message and nothing waits
        to be written, and only for actions in the memory's layout (one array).
        """
        leaf = self._leaf
        return (
            leaf is not None
            and not self.broken
            and self._actions_shared
            and self._answered == self._seq
            and not self._outbox.pending
            and type(actions) is np.ndarray
            and actions.dtype == leaf.dtype
            and actions.shape == leaf.shape
        )

    def ring(self, actions: np.ndarray) -> int:
        """Send a step of all of this worker's envs as a doorbell: its sequence number.

        The lanes'; call it with interrupts held back, after `can_ring`. The actions go
        into the shared memory, the fixed doorbell message onto the pipe. No ticket waits
        for the reply: `read_lane` reads it, or a ticket made later does (`adopt`).
        """
        self._leaf[...] = actions  # type: ignore[index]  # (not None: see `can_ring`)
        return self.post(self._doorbell())

    def can_post(self) -> bool:
        """Whether `post` can send a message now: the worker answered all, nothing waits."""
        return not self.broken and self._answered == self._seq and not self._outbox.pending

    def post(self, data: bytes) -> int:
        """Send the message `data` (`encode_op`'s, or `ring`'s doorbell): its sequence number.

        The lanes'; call it with interrupts held back, after `can_post`. No ticket waits for
        the reply: `read_lane` reads it, or a ticket made later does (`adopt`).
        """
        self._seq = seq = self._seq + 1
        if not self._outbox.send(self._go, seq, data):
            self._break()  # the worker closed its end: it is gone (as in `submit`)
        return seq

    def read_lane(self) -> int:
        """Read the reply to the last `ring` or `post`: a code, `INFOS`, `NOTHING` or `OTHER`.

        The code (`status.code_of`) if the reply is a record of everything in place (the
        usual); `INFOS` if it is a record with an info dict per env after it (SB3's and
        Tianshou's layout: the dicts are in `infos` then); a ticket that stands for the step,
        `adopt` ed, is settled with either. `NOTHING` if no whole message is in yet; `OTHER` if
        anything else came, or the pipe ended: that waits for `settle`, which the caller runs
        once a ticket stands for the step. Call it with interrupts held back, when ``poll``
        says the pipe is readable.
        """
        inbox = self._inbox
        scratch = inbox.scratch
        try:
            count = os.readv(self._done, [scratch])
        except BlockingIOError:
            return NOTHING
        except OSError:  # (as its end)
            count = 0
        if count == FRAMED_RECORD.size and inbox.empty and self._unsettled is None:
            seq, size, head, columns = FRAMED_RECORD.unpack_from(scratch)
            old_api = ANSWERS.get(head)
            if old_api is not None and seq == self._seq and size == RECORD.size:
                self._answered = seq
                code: int = columns << 1 | old_api  # (`status.code_of`)
                if self._waiting:  # (a ticket stands for the step: first-ready's)
                    self._settle_lane(seq, code)
                return code
        messages = inbox.feed(memoryview(scratch)[:count])
        if not messages and count:
            return NOTHING  # (part of a message)
        if len(messages) == 1 and count and self._unsettled is None:
            seq, payload = messages[0]
            if seq == self._seq and self._take_infos(seq, payload):
                return INFOS
        self._leave(messages, not count)
        return OTHER

    def _take_infos(self, seq: int, payload: bytes) -> bool:
        """Whether `payload`, the reply to `seq`, is an `answer_infos` (kept in `infos` then).

        A ticket that stands for it is settled with it. Call it with interrupts held back.
        """
        try:
            answer = infos_answer(payload)
        except Exception:  # (`settle` has `decode_reply` say what is wrong)
            return False
        if answer is None:
            return False
        self._answered, self.infos = seq, answer
        ticket = self._waiting.pop(seq, None)
        if ticket is not None:
            ticket.outcome = outcome_of_infos(answer)
        return True

    def _leave(self, messages: list[tuple[int, bytes]], ended: bool) -> None:
        """Keep what `read_lane` read but does not take for `settle` (after what waits already)."""
        left = self._unsettled
        if left is not None:  # (from a lane step given up before its tickets were made)
            messages, ended = left[0] + messages, left[1] or ended
        self._unsettled = (messages, ended)

    def _settle_lane(self, seq: int, code: int) -> None:
        """Give the ticket of `seq` (if one waits) the outcome of the answer `code`."""
        ticket = self._waiting.pop(seq, None)
        if ticket is not None:
            ticket.outcome = outcome_of_code(code)

    def _doorbell(self) -> bytes:
        """The message of a step of every env whose actions are in the rows."""
        return DOORBELL

    def close(self) -> None:
        """Close the pipes and let go of the shared memory."""
        super().close()
        self._views = self._leaf = None  # type: ignore[assignment]
        self._actions_shared = False  # (a step sent now is refused as to a lost worker)

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Have the worker write numeric infos into these columns; nothing waits for it."""
        ticket = Ticket(-1, -1, "share_infos", (list(specs),), ())
        self.submit(ticket)
        self.forget(ticket)
