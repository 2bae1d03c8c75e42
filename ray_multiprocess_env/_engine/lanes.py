"""The full step on the workers' lanes: no ticket, outcome or pickle while all is well.

A lane (`Lane`) is one worker on a hot transport (shared memory, or a TCP stream whose rows
follow the messages). `Lanes.launch` writes the actions into the rows and rings each worker's
doorbell, keeping only the sequence numbers (`LaneStep`); `Lanes.wait` reads each answer, a
16-byte header and a 16-byte record (`status.code_of`: the info columns written, whether old
gym's API), and hands the batch out of the store. Interrupts are held back from the first
doorbell to the last answer, and let through only while ``poll`` blocks, where nothing is
half read.

Nothing needs undoing when a step is given up (a Ctrl-C): its replies come with no ticket
waiting for them and are dropped. Anything but an answer of everything in place (an env
error, a death, infos off the columns), a timeout, a doorbell the socket took only part of
(TCP's, with its action rows), or a close hands the step to the slow path (`Calls`): its
`Call.tickets` are made then (`LaneStep.tickets`), each settled by its reply, read already or
still to come, so the slow path finds the step as if it had sent it. A verb that reads the
pipes while a step is pending (`Engine.run_on_workers`, say) makes them first. The only reply
taken on the lanes that is not a record is one with its rows in place and an info dict per
env (SB3's layout), which has no columns (`REPLY`).
"""

from __future__ import annotations

import select
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.call_state import Call
from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.pool import Pool, Worker
from ray_multiprocess_env._engine.records import Batch
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports.base import Outcome, Ticket, all_hot, timeout_ms
from ray_multiprocess_env._engine.transports.pipes import outcome_of_code
from ray_multiprocess_env._engine.transports.shared_memory import NOTHING, OTHER
from ray_multiprocess_env._protocol.status import reply_of_code

__all__ = ["REPLY", "Lane", "LaneStep", "Lanes", "lane_ticket", "took_reply"]

#: A `LaneStep` code: the worker's reply, not a record, is in `LaneStep.outcomes`.
REPLY = -3


class Lane:
    """One worker's lane: its transport, and what a step of all of its envs needs."""

    __slots__ = ("envs", "generation", "start", "stop", "transport", "worker")

    def __init__(self, worker: Any) -> None:
        self.worker, self.generation, self.envs = worker.index, worker.generation, worker.envs
        self.transport: Any = worker.transport
        self.start, self.stop = worker.envs.start, worker.envs.stop


class LaneStep:
    """A step of every env rung on the `lanes` with no ticket (see the module docstring).

    `codes` holds each worker's answer as read (`status.code_of`; `NOTHING` until then,
    `OTHER` for a reply left to its transport's `settle`, `REPLY` for one in `outcomes`);
    `left` counts those not in.
    """

    __slots__ = ("_made", "by_fd", "chunks", "codes", "lanes", "left", "outcomes", "poller", "seqs")

    def __init__(
        self, found: tuple[list[Lane], Any, dict[int, int]], chunks: list[Any], seqs: list[int]
    ) -> None:
        self.lanes, self.poller, self.by_fd = found
        self.chunks, self.seqs = chunks, seqs
        count = len(seqs)
        self.codes = [NOTHING] * count
        self.outcomes: list[Outcome | None] = [None] * count
        self.left = count
        self._made: list[Ticket] | None = None

    @property
    def made(self) -> bool:
        """Whether the tickets were made: the step is the slow path's from then on."""
        return self._made is not None

    def tickets(self) -> list[Ticket]:
        """A ticket per worker, each settled by its answer (read already, left, or to come)."""
        made = self._made
        if made is None:
            with DEFERRED:  # (adopted by their transports and kept, or neither)
                made = [
                    lane_ticket(lane, chunk, seq, code, outcome)
                    for lane, chunk, seq, code, outcome in zip(
                        self.lanes, self.chunks, self.seqs, self.codes, self.outcomes, strict=True
                    )
                ]
                for lane, code in zip(self.lanes, self.codes, strict=True):
                    if code == OTHER:  # (read and left: now that a ticket stands for it)
                        lane.transport.settle()
                self._made = made
        return made


def lane_ticket(lane: Lane, chunk: Any, seq: int, code: int, outcome: Outcome | None) -> Ticket:
    """The ticket of the step `seq` rung on `lane` with `chunk`, settled by its answer.

    `code` and `outcome` are what was read of the answer (`LaneStep.codes`): settled here if
    it was read as the lane's; else its transport adopts it, and the answer settles it when
    it comes, or when the transport settles what it read and left (`OTHER`: the caller runs
    `settle` once every ticket is made). Call it with interrupts held back.
    """
    ticket = Ticket(lane.worker, lane.generation, "step", (chunk, None), lane.envs, True)
    if code >= 0 or code == REPLY:  # (read as the lane's: settled here)
        ticket.transport, ticket.handle = lane.transport, seq
        ticket.outcome = outcome if code == REPLY else outcome_of_code(code)
    else:
        lane.transport.adopt(ticket, seq)
    return ticket


def took_reply(transport: Any, seq: int) -> tuple[int, Outcome | None, bool]:
    """What became of the answer to `seq` `read_lane` left (`OTHER`), if not a record.

    ``(code, outcome, taken)``: `REPLY` and the outcome if that answer was all it left, else
    `OTHER` (left for `settle`); `taken` if it is still the hot path's: a reply that went well
    with its rows in place and one info dict per env (SB3's layout, whose infos have no
    columns). Call it with interrupts held back.
    """
    outcome = transport.take_reply(seq)
    if outcome is None:
        return OTHER, None, False
    reply = outcome.value if outcome.ok else None
    taken = type(reply) is tuple and reply[0] is None and type(reply[4]) is dict
    return REPLY, outcome, taken


class Lanes:
    """The full step of one engine's workers on their lanes (see the module docstring)."""

    def __init__(self, pool: Pool, store: BatchStore) -> None:
        self._pool, self._store = pool, store
        # every worker's lane while all are hot, a poller of their pipes, and fd -> lane
        self._lanes: tuple[list[Lane], Any, dict[int, int]] = ([], None, {})
        self._made = -1  # `Worker.transports_set` when they were made

    def now(self) -> tuple[list[Lane], Any, dict[int, int]] | None:
        """Every worker's lane and their poller, if each worker is on a hot transport.

        Looked at again once a worker's transport was set, in any pool (`Worker`), and made
        again if one of this pool's was replaced (a restart, or a fallback).
        """
        made = Worker.transports_set
        if made == self._made:
            return self._lanes
        transports = [worker.transport for worker in self._pool.workers]
        if [lane.transport for lane in self._lanes[0]] != transports:  # (by identity)
            if not all_hot(transports):
                return None  # (looked at again at the next call)
            lanes = [Lane(worker) for worker in self._pool.workers]
            poller, by_fd = select.poll(), {}
            for i, lane in enumerate(lanes):
                by_fd[lane.transport.fileno()] = i
                poller.register(lane.transport.fileno(), select.POLLIN)
            self._lanes = (lanes, poller, by_fd)  # (one attribute: all or nothing)
        self._made = made
        return self._lanes

    def launch(self, actions: Any, label: str) -> Call | None:
        """`Engine`'s step of every env, rung on every lane (None: nothing was sent).

        A Ctrl-C while it rings gives the step up: nothing waits for its replies.
        """
        if type(actions) is not np.ndarray or self._pool.lost_episodes.any:
            return None  # (owed reports: the slow path has them sent again first)
        found = self.now()
        if found is None:
            return None
        lanes, chunks = found[0], []
        for lane in lanes:
            chunk = actions[lane.start : lane.stop]
            if not lane.transport.can_ring(chunk):
                return None
            chunks.append(chunk)
        with DEFERRED:  # every lane rung, or the step given up
            seqs = [lane.transport.ring(chunk) for lane, chunk in zip(lanes, chunks, strict=True)]
            step = LaneStep(found, chunks, seqs)
            for lane in lanes:
                if lane.transport.wants_write:  # (a doorbell not all written: TCP's rows)
                    step.tickets()  # (the slow path's wait writes the rest)
            return Call("step", label, None, step)

    def wait(self, call: Call, deadline: float | None) -> Batch | None:
        """The batch of `call` (a step of every env) once every lane answered in place.

        None when the wait reaches `deadline`, when a reply is anything else, or when `call`
        is not a lane step the slow path has not taken over: the slow path's to wait for and
        judge (its tickets are made then). A Ctrl-C while it waits gives the step up.
        """
        step = call.lanes
        if type(step) is not LaneStep or step._made is not None:
            return None
        lanes, codes, poller, by_fd = step.lanes, step.codes, step.poller, step.by_fd
        with DEFERRED:  # (let through while `poll` blocks: nothing is half read then)
            while step.left:
                ready = DEFERRED.poll(poller, None if deadline is None else timeout_ms(deadline))
                if not ready:
                    return None  # (at `deadline`: the slow path's wait says so)
                for fd, _ in ready:
                    i = by_fd[fd]
                    if codes[i] != NOTHING:  # (answered, and readable again: its end, most
                        return None  # likely; left to the slow path's read, which finds it)
                    code = lanes[i].transport.read_lane()
                    if code >= 0:
                        codes[i] = code
                        step.left -= 1
                    elif code == OTHER and not self._took_reply(step, i):
                        return None
        return self._batch(step)

    @staticmethod
    def _took_reply(step: LaneStep, i: int) -> bool:
        """Whether lane `i`'s reply, not a record, is still the hot path's (`took_reply`)."""
        step.codes[i], step.outcomes[i], taken = took_reply(step.lanes[i].transport, step.seqs[i])
        if taken:
            step.left -= 1
        return taken

    def _batch(self, step: LaneStep) -> Batch:
        """The batch of a lane step every worker answered (in `codes`, or `outcomes`).

        Records (batched infos, all in columns) or else `REPLY` s (one info dict per env):
        a worker sends a record only for infos in gymnasium's layout.
        """
        written = 0
        for code in step.codes:
            written |= code
        if written >= 0:  # (every one a record's code)
            return self._store.whole(written >> 1, bool(written & 1))
        parts, old_api = [], False
        for lane, code, outcome in zip(step.lanes, step.codes, step.outcomes, strict=True):
            reply = reply_of_code(code) if code >= 0 else outcome.value  # type: ignore[union-attr]
            old_api |= reply[5]
            parts.append((lane.start, reply[4]))
        return self._store.batch(parts, old_api)
