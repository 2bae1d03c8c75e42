"""The hot path of `step_envs` and of a reset's wait, while all is well.

The common case of these verbs (same-node workers on shared memory, whole workers stepped,
every answer fine, no info pieces to merge) costs the driver what the bare design of
``tools/sol_probe.py`` does: the actions written into the shared memory and one doorbell per
worker, one ``poll`` on the workers' pipes, the rows of the workers that answered handed out.
Anything else (an env error, a dead or late worker, an interrupt, actions or infos off the
shared layout, some of a worker's envs) goes to the slow path (`Calls`), which finds the hot
path's calls as its own: the hot path skips layers, never bookkeeping.

The full step goes on the workers' lanes (`lanes.py`), and so do first-ready `send`/`recv`
(`first_ready_lanes.py`), with no tickets. The verbs here send a `Ticket` per worker, so a
timeout, a Ctrl-C, `close` or the next call of any verb sees it; they read the answers as the
lanes do (`read_lane`), and each method here either does all of its work or hands the call to
the slow path untouched (None).
"""

from __future__ import annotations

import select
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.call_state import Call
from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.pool import Pool
from ray_multiprocess_env._engine.records import Batch
from ray_multiprocess_env._engine.splits import whole_worker_runs
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports.base import (
    HotTransport,
    Ticket,
    all_hot,
    timeout_ms,
)
from ray_multiprocess_env._engine.transports.shared_memory import OTHER

__all__ = ["HotPath", "ticket_parts"]


class HotPath:
    """The hot path of one engine's verbs (see the module docstring)."""

    def __init__(self, pool: Pool, store: BatchStore) -> None:
        self._pool, self._store = pool, store
        workers = pool.workers
        self._owner = [w.index for w in workers for _ in w.envs]  # each env's worker
        self._lists = [w.env_list for w in workers]
        self._ranges = [w.envs for w in workers]
        self._transports: list[Any] = []
        # a poller of the pipes of each set of workers waited on (a bit per worker)
        self._pollers: dict[int, tuple[Any, dict[int, HotTransport]]] = {}

    def _hot_transports(self) -> list[HotTransport] | None:
        """The workers' transports if every one is hot (and was working when last replaced)."""
        transports: list[Any] = [w.transport for w in self._pool.workers]
        if transports != self._transports:  # (by identity: a worker was replaced)
            if not all_hot(transports):
                return None
            self._transports, self._pollers = transports, {}
        return self._transports

    def _poller(self, tickets: list[Ticket]) -> tuple[Any, dict[int, HotTransport]]:
        """A poller of the pipes of the `tickets`' workers, and their transports by descriptor.

        Only theirs: a worker outside the call is none of its business (as for the slow
        path's waiter), even if it dies meanwhile.
        """
        key = 0
        for ticket in tickets:
            key |= 1 << ticket.worker
        found = self._pollers.get(key)
        if found is None:
            poller, by_fd = select.poll(), {}
            for ticket in tickets:
                transport: Any = ticket.transport
                fd = transport.fileno()
                if fd not in by_fd:
                    poller.register(fd, select.POLLIN)
                    by_fd[fd] = transport
            found = self._pollers[key] = (poller, by_fd)
        return found

    def _ring(self, actions: Any, runs: list[tuple[int, int]]) -> list[Ticket] | None:
        """Step the workers of `runs` (all or none): their tickets, or None if one cannot.

        Call it with interrupts held back (``with DEFERRED``): a Ctrl-C meanwhile is raised
        after, before the caller keeps the tickets: the call is given up, as `Calls.launch`'s.
        """
        transports = self._hot_transports()
        if transports is None or type(actions) is not np.ndarray or self._pool.lost_episodes.any:
            return None  # (owed reports: the slow path has them sent again first)
        chunks = []
        for worker, row in runs:
            chunk = actions[row : row + len(self._lists[worker])]
            if not transports[worker].can_ring(chunk):
                return None
            chunks.append(chunk)
        workers, tickets = self._pool.workers, []
        try:  # every worker rung, or none
            for (worker, _), chunk in zip(runs, chunks, strict=True):
                ticket = Ticket(
                    worker, workers[worker].generation, "step", (chunk, None),
                    self._ranges[worker], True,
                )  # fmt: skip
                transport = transports[worker]
                transport.adopt(ticket, transport.ring(chunk))
                tickets.append(ticket)
        except BaseException:
            _give_up(tickets)
            raise
        return tickets

    def _answers(
        self, tickets: list[Ticket], deadline: float | None
    ) -> tuple[list[tuple[int, Any]], bool] | None:
        """Wait for every ticket; if all answered well, what the store needs of their replies.

        That is ``(first env, infos)`` per worker and whether an env spoke old gym's API; None
        (nothing given up) hands the call to the slow path. A Ctrl-C gives the call up (its
        replies are dropped when they come) and is raised.
        """
        try:
            if not self._waited(tickets, deadline):
                return None
        except BaseException:
            _give_up(tickets)
            raise
        return ticket_parts(tickets, self._lists)

    def replies(self, call: Call, deadline: float | None) -> list[Any] | None:
        """One reply per worker (None where not called) once `call` (a reset) answered well.

        None when the wait reaches `deadline`, or when anything about the call or its answers
        is not the hot path's: `call` is then the slow path's to wait for and judge. A Ctrl-C
        gives it up.
        """
        if self._pool.lost_episodes.any or self._answers(call.tickets, deadline) is None:
            return None
        out: list[Any] = [None] * len(self._lists)
        for ticket in call.tickets:
            out[ticket.worker] = ticket.outcome.value  # type: ignore[union-attr]  # (answered)
        return out

    # -- a step of some workers' envs --------------------------------------------------------
    def launch_envs(self, actions: Any, env_ids: Any, label: str) -> Call | None:
        """`Engine.step_envs`'s call, if its envs are whole workers' (None: not sent)."""
        runs = whole_worker_runs(self._lists, self._owner, env_ids)
        if runs is None:
            return None
        with DEFERRED:
            tickets = self._ring(actions, runs)
        return None if tickets is None else Call("step", label, tickets)

    def step_envs(self, call: Call, env_ids: np.ndarray, deadline: float | None) -> Batch | None:
        """The batch of the envs `env_ids` (ascending) that `call` stepped, all answered well.

        None if not by `deadline`, or if anything is not the hot path's: `call` is then the
        slow path's to wait for and judge.
        """
        answers = self._answers(call.tickets, deadline)
        return None if answers is None else self._store.rows_of(env_ids, *answers)

    def _waited(self, tickets: list[Ticket], deadline: float | None) -> bool:
        """Read the `tickets`' pipes until every one of them is settled.

        False (the slow path's to wait) unless every ticket is on its worker's hot transport
        of now; at `deadline`; or if one of their pipes broke or has a message to write.
        """
        transports = self._hot_transports()
        if transports is None:
            return False
        for ticket in tickets:
            transport = transports[ticket.worker]
            if ticket.transport is not transport or transport.broken:  # (a lost worker's)
                return False
        poller, by_fd = self._poller(tickets)
        for transport in by_fd.values():
            if transport.wants_write or transport.broken:  # (reading does not write: once)
                return False
        count = len(tickets)
        with DEFERRED:  # (let through while `poll` blocks: nothing is half read then)
            while True:
                settled = 0
                for ticket in tickets:
                    if ticket.outcome is not None:
                        settled += 1
                if settled == count:
                    return True
                ready = DEFERRED.poll(poller, None if deadline is None else timeout_ms(deadline))
                if not ready:
                    return False  # (at `deadline`)
                for fd, _ in ready:
                    transport = by_fd[fd]
                    if transport.read_lane() == OTHER and not transport.settle():
                        return False  # (its end: the slow path's read finds it again)


def _give_up(tickets: list[Ticket]) -> None:
    """Drop interest in the `tickets` without an outcome (as `Calls.abandon`)."""
    for ticket in tickets:
        if ticket.outcome is None and ticket.transport is not None:
            ticket.transport.forget(ticket)


def ticket_parts(
    tickets: list[Ticket], env_lists: list[list[int]]
) -> tuple[list[tuple[int, Any]], bool] | None:
    """``(first env of its worker, infos)`` per ticket and whether an env spoke old gym's API.

    None unless every ticket answered well with a reply the hot path takes: its rows in
    shared memory, and no info pieces to merge (batched infos all in their columns, or one
    dict per env, SB3's layout). `env_lists`: each worker's envs.
    """
    parts, old_api = [], False
    for ticket in tickets:
        outcome = ticket.outcome
        reply = outcome.value if outcome is not None and outcome.ok else None
        if type(reply) is not tuple or reply[0] is not None:
            return None
        infos = reply[4]
        if type(infos) is not dict and (
            type(infos) is not tuple or len(infos) != 2 or infos[0] is not None
        ):
            return None
        parts.append((env_lists[ticket.worker][0], infos))
        old_api |= reply[5]
    return parts, old_api
