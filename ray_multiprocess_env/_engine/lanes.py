"""The workers' lanes: a step with no outcome object or pickle while all is well.

A lane (`Lane`) is one worker on a hot transport (shared memory, or a TCP stream whose rows follow
the messages), with its pipe's own poller; a `LaneSet` is every worker's lane, made once all are
hot, with pollers of the sets of their pipes that first-ready calls wait on. Every step verb
sends its step one way (`Engine._send_step`): a step of every env, or of whole workers' envs, is
rung on the lanes, `rung` finding each lane's rows of the actions, and each lane's `Lane.ring`
writing them into its rows and ringing its worker's doorbell, with its ticket waiting for the
reply, as a pickled call's message has (`Calls.launch`, where the lanes cannot take it).
`Lanes.read` reads each answer, a 16-byte header and a 16-byte record (`status.code_of`: the info
columns written, whether old gym's API; or `INFOS`, with the info dicts per env after it), which
settles the ticket with a shared outcome of that code, and `batch` hands a step's results out of
the store. The same read serves first-ready's `recv` (`first_ready.py`) and a synchronous reset
(`Engine.reset`): a reset is sent as a pickled call (it is rare, its arguments differ every
time), and its answers are records, as a step's. Lockstep is first-ready with the whole batch. A
step holds interrupts back from its sending to its last answer, and lets them through only
while ``poll`` blocks, where nothing is half read.

Anything but an answer of everything in place (an env error, a death, infos off the columns),
a timeout, a message the socket took only part of (TCP's, with its action rows), or a close
leaves the call to the failures branch (`Calls.wait`, then `Failures.judge`): its tickets
are settled by their replies, read already or still to come, as if it had sent them. A step
is read here however it was sent, rung or as a pickled call (`Engine._read`). A worker that
keeps an info dict per env (SB3's and Tianshou's layout) answers with a record too, with the
pickle of those dicts after it (`INFOS`, `status.answer_infos`): its only pickle.
"""

from __future__ import annotations

import select
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.pool import Pool, Worker
from ray_multiprocess_env._engine.results import Batch
from ray_multiprocess_env._engine.splits import whole_worker_runs
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports.base import (
    Ticket,
    all_hot,
    timeout_ms,
)
from ray_multiprocess_env._engine.transports.channel import NOTHING, OTHER, ChannelTransport

__all__ = [
    "Lane",
    "LaneSet",
    "Lanes",
    "Polled",
    "StepPlan",
]

#: A poller of some workers' pipes, with each descriptor's worker.
Polled = tuple[Any, dict[int, int]]

#: The most pollers a `LaneSet` keeps (one per set of workers waited on; then it starts over).
_POLLERS = 256


class Lane:
    """One worker's lane: its transport, what a step of all its envs needs, its pipe's poller."""

    __slots__ = ("envs", "generation", "poller", "start", "stop", "transport", "worker")

    def __init__(self, worker: Any) -> None:
        self.worker, self.generation, self.envs = worker.index, worker.generation, worker.envs
        self.transport: ChannelTransport = worker.transport  # (hot: see `Lanes.now`)
        self.start, self.stop = worker.envs.start, worker.envs.stop
        self.poller = select.poll()  # (`Lanes.read` of every answer)
        self.poller.register(self.transport.fileno(), select.POLLIN)

    def ring(self, actions: np.ndarray) -> Ticket:
        """Ring a step of all of its worker's envs with `actions`: the ticket waiting for it.

        Call it with interrupts held back, after `ChannelTransport.can_ring`, with actions in
        the layout of its rows (`LaneSet.actions`).
        """
        ticket = Ticket(self.worker, self.generation, "step", (actions, None), self.envs, True)
        self.transport.ring(actions, ticket)
        return ticket


class LaneSet:
    """Every worker's lane, as made once all were hot, and pollers of sets of their pipes.

    `actions`: the dtype and shape of a batch of every env's actions that each lane can ring
    its slice of (`ChannelTransport.ring`); None if one cannot (its layout has no one array).
    """

    __slots__ = ("actions", "lanes", "pollers")

    def __init__(self, lanes: list[Lane], num_envs: int) -> None:
        self.lanes = lanes
        self.pollers: dict[int, Polled] = {}
        self.actions: tuple[np.dtype[Any], tuple[int, ...]] | None = None
        rows = [lane.transport.action_rows for lane in lanes]
        first = rows[0] if rows else None
        if first is not None and all(
            r is not None
            and r.dtype == first.dtype
            and r.shape == (lane.stop - lane.start, *first.shape[1:])
            for lane, r in zip(lanes, rows, strict=True)
        ):
            self.actions = first.dtype, (num_envs, *first.shape[1:])

    def polled(self, key: int) -> Polled:
        """A poller of the pipes of the workers in `key` (a bit each), with each pipe's worker."""
        polled = self.pollers.get(key)
        if polled is None:
            poller = select.poll()
            worker_of: dict[int, int] = {}
            for lane in self.lanes:
                if key >> lane.worker & 1:
                    fd = lane.transport.fileno()
                    poller.register(fd, select.POLLIN)
                    worker_of[fd] = lane.worker
            if len(self.pollers) >= _POLLERS:  # (sets of workers seen: bounded)
                self.pollers = {}
            polled = self.pollers[key] = (poller, worker_of)
        return polled


#: A step `Lanes.rung` made: ``(lane, its rows of actions)`` of each lane to ring.
StepPlan = list[tuple[Lane, Any]]


class Lanes:
    """The steps of one engine's workers on their lanes, and the read of any call's records.

    (Module docstring.)
    """

    def __init__(self, pool: Pool, store: BatchStore) -> None:
        self._pool, self._store = pool, store
        workers = pool.workers
        self._owner = [w.index for w in workers for _ in w.envs]  # each env's worker
        self._lists = [w.env_list for w in workers]
        self._lanes = LaneSet([], 0)  # every worker's lane while all are hot
        self._made = -1  # `Worker.transports_set` when they were made

    def now(self) -> LaneSet | None:
        """Every worker's lane (and pollers of their pipes), if each is on a hot transport.

        None also while a lost-episode report is owed: a pickled call sends the worker its
        ``rearm`` before the step (`LostEpisodes.rearm`). Looked at again once a worker's
        transport was set, in any pool (`Worker`), and made again if one of this pool's was
        replaced (a restart, or a fallback).
        """
        if self._pool.lost_episodes.any:
            return None
        made = Worker.transports_set
        if made == self._made:
            return self._lanes
        transports = [worker.transport for worker in self._pool.workers]
        if [lane.transport for lane in self._lanes.lanes] != transports:  # (by identity)
            if not all_hot(transports):
                return None  # (looked at again at the next call)
            lanes = [Lane(worker) for worker in self._pool.workers]
            self._lanes = LaneSet(lanes, self._pool.num_envs)
        self._made = made
        return self._lanes

    def rung(self, actions: Any, env_ids: Any) -> StepPlan | None:
        """``(lane, its rows of actions)`` for each worker of `env_ids`, by worker.

        Row i of `actions` is for env ``env_ids[i]`` (`env_ids` None: every env, row i for
        env i). None (not the lanes') unless `actions` is an array of the lanes' layout, every
        worker is on its lane (`now`), `env_ids` are whole workers' envs, each worker's in
        order, and each lane can ring its rows now.
        """
        found = None if type(actions) is not np.ndarray else self.now()
        if found is None:
            return None
        layout = found.actions  # (each lane's rows take its slice: checked once)
        if layout is None or actions.dtype != layout[0]:
            return None
        out = []
        if env_ids is None:  # (every env: lockstep's, kept lean)
            if actions.shape != layout[1]:
                return None
            for lane in found.lanes:
                if not lane.transport.can_ring():
                    return None
                out.append((lane, actions[lane.start : lane.stop]))
            return out
        if actions.shape[1:] != layout[1][1:]:
            return None
        runs = whole_worker_runs(self._lists, self._owner, env_ids)
        if runs is None:
            return None
        rows = 0
        for worker, row in runs:
            lane = found.lanes[worker]
            if not lane.transport.can_ring():
                return None
            count = lane.stop - lane.start
            rows += count
            out.append((lane, actions[row : row + count]))
        return out if len(actions) == rows else None

    def read(self, tickets: list[Ticket], wanted: int | None, deadline: float | None) -> bool:
        """Read answers to `tickets` until they cover `wanted` envs (None: every ticket's).

        Whether they did, each an answer in place (`Ticket.code`); the reads settle the
        tickets. False (the slow path's to wait for and judge) when the wait reaches
        `deadline`, when a reply is anything else, when a ticket's worker was replaced or its
        channel broke, or when part of a message still waits to be written. Call it in the
        caller's block that holds interrupts back (the outermost one): a Ctrl-C held back
        before the wait, or arriving in it, comes through in ``poll``, where nothing is half
        read (`_DeferredInterrupts.poll`).

        Lockstep is first-ready with the whole batch: it reads the same way, only waiting for
        every ticket (`wanted` None: a call just rung or pending, whose tickets are looked at
        one by one as their turn comes). Then it waits for one worker at a time, polling only
        its pipe, from the last rung to the first: a wait that woke at each answer (a poll of
        every pipe) slept and woke about once per worker, the driver's largest cost per
        worker (`benchmarks.driver_cost`). The workers run in about the order they were rung,
        so while it waits for the last, the others answer, and it reads them without sleeping
        again (the last is polled before it is read: a read that finds nothing costs more than
        a ``poll`` that finds its answer in). First-ready's `recv` gives `wanted`, and every
        ticket is looked at first, answered or not; if `wanted` is fewer than the tickets'
        envs, it polls the pipes of every ticket's worker at once and reads those that
        answered, until enough envs are in (or every ticket is answered), else it waits for
        every ticket.
        """
        lanes = self._lanes.lanes
        if wanted is not None:  # (first-ready: every ticket looked at first)
            envs_in = total = key = 0
            left = len(tickets)  # (not answered yet)
            for ticket in tickets:
                transport = lanes[ticket.worker].transport
                if transport is not ticket.transport or transport.broken or transport.wants_write:
                    return False  # (a worker replaced or lost, a message not all written)
                key |= 1 << ticket.worker
                count = len(ticket.envs)
                total += count
                if ticket.outcome is not None:
                    if ticket.code == OTHER:  # (settled by the slow path's read, or lost)
                        return False
                    envs_in += count
                    left -= 1
            if wanted < total:  # (the first answers to come: every pipe polled at once)
                poller, by_fd = self._lanes.polled(key)
                while envs_in < wanted and left:
                    timeout = None if deadline is None else timeout_ms(deadline)
                    ready = DEFERRED.poll(poller, timeout)
                    if not ready:
                        return False  # (at `deadline`: the slow path's wait says so)
                    for fd, _ in ready:
                        if lanes[by_fd[fd]].transport.read_lane() == OTHER:
                            return False  # (settled as the slow path's read would, or ended)
                    envs_in, left = 0, len(tickets)
                    for ticket in tickets:
                        if ticket.outcome is not None:
                            envs_in += len(ticket.envs)
                            left -= 1
                return True
        code = NOTHING  # (the last rung is waited for before it is read: it is rarely in)
        for ticket in reversed(tickets):  # (every answer: one worker at a time)
            if ticket.outcome is None:
                lane = lanes[ticket.worker]
                transport = lane.transport
                if transport is not ticket.transport or transport.wants_write:
                    return False  # (a worker replaced, or a message not all written)
                if code != NOTHING:  # (an earlier one's: read now, its answer is most likely in)
                    code = transport.read_lane()
                while code == NOTHING:
                    timeout = None if deadline is None else timeout_ms(deadline)
                    if not DEFERRED.poll(lane.poller, timeout):
                        return False  # (at `deadline`: the slow path's wait says so)
                    code = transport.read_lane()
                if code == OTHER or ticket.outcome is None:  # (settled by what came, or the
                    return False  # end found again by the slow path's read; or an answer to
                    # a later message of its worker's: the slow path would know)
            elif ticket.code == OTHER:  # (settled by the slow path's read, or lost)
                return False
        return True

    def batch(self, tickets: list[Ticket], env_ids: np.ndarray | None = None) -> Batch:
        """The batch of the answers to `tickets`, each in place (`read`): every env's, or some.

        `env_ids`: the envs to hand out (a step of some envs; first-ready's `recv`). The infos
        are in columns (gymnasium's layout), or `INFOS` (an info dict per env).
        """
        if env_ids is None:
            written = 0
            for ticket in tickets:
                written |= ticket.code
            if written >= 0:  # (every one a record's code)
                return self._store.whole(written >> 1, bool(written & 1))
        parts, old_api = [], False
        lanes = self._lanes.lanes
        for ticket in tickets:
            reply = ticket.outcome.value  # type: ignore[union-attr]  # (answered: `read`)
            parts.append((lanes[ticket.worker].start, reply.infos))  # (its worker's first env)
            old_api |= reply.old_api
        if env_ids is None:
            return self._store.batch(parts, old_api)
        return self._store.rows_of(env_ids, parts, old_api)
