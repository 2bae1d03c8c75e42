"""First-ready calls on the workers' lanes: no ticket or outcome while all is well.

`FirstReadyLanes.send` writes the actions of whole workers' envs into their rows and rings
each worker's doorbell (`lanes.Lane`), keeping a `lanes.Sent` per worker in the call state
(`CallState.sent`): the lane, the actions, the sequence number, the answer once read.
`FirstReadyLanes.reset` (``async_reset``) posts each worker's reset as `Lanes.launch_reset`
does and keeps a `Sent` of it, whose answer is handed out as a step's. `recv` reads the answers of
those workers (`read_lane`: a status record; or a reply with its rows in place and one info
dict per env, SB3's layout) until enough envs are in, and hands their rows out of the store,
all or nothing under a Ctrl-C: one that lands before the results are made leaves them in
flight, answered, for the next `recv`.

Anything else hands the calls to the slow path (`FirstReadyVerbs`), none taken out of flight
(`NotHot`): a reply that is not an answer in place (an env error, a death, infos off the columns),
the deadline, a worker replaced or its pipe broken, a doorbell the socket took only part of, owed
lost-episode reports, a reset the slow path sent. Reading `CallState.in_flight` makes a ticket of
each `Sent` (`Sent.ticket`), settled by its answer read already or still to come, so the
slow path finds the calls as if it had sent them (a `recv` that gives up after reading makes them at
once, before a Ctrl-C can land). So does every verb that reads the workers' pipes while they are out
(`CallState.check_idle` with `in_flight_ok`, `Engine._beside_pending`): a reply read with no ticket
waiting for it would be dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ray_multiprocess_env._engine.call_state import CallState, State, T
from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.lanes import Lanes, Sent
from ray_multiprocess_env._engine.pool import Pool
from ray_multiprocess_env._engine.results import Batch
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports.base import Ticket, timeout_ms
from ray_multiprocess_env._engine.transports.channel import NOTHING, OTHER
from ray_multiprocess_env._protocol.status import Reply

__all__ = ["FirstReadyLanes", "NotHot"]


class NotHot(Exception):
    """A first-ready `recv` is the slow path's to do (nothing was taken out of flight)."""


class FirstReadyLanes:
    """First-ready `send`, `async_reset` and `recv` on an engine's lanes (module docstring)."""

    def __init__(self, pool: Pool, state: CallState, store: BatchStore, lanes: Lanes) -> None:
        self._pool, self._state, self._store, self._lanes = pool, state, store, lanes
        self._lists = [w.env_list for w in pool.workers]

    def send(self, actions: Any, env_ids: Any) -> bool:
        """`FirstReadyVerbs.send` of whole workers' envs; False: the slow path's to do."""
        state = self._state
        if state.state is not State.IDLE and state.state is not State.IN_FLIGHT:
            return False
        if type(actions) is not np.ndarray or self._pool.lost_episodes.any:
            return False  # (owed reports: the slow path has them sent again first)
        found = self._lanes.now()
        rung = None if found is None else self._lanes.rung(found, actions, env_ids)
        if rung is None:
            return False
        for lane, _ in rung:
            if state.has_call_to(lane.worker):
                return False  # (the slow path says why, or sends it with the others)
        with DEFERRED:  # rung and in flight, or neither
            sent = [Sent("step", lane, c, lane.transport.ring(c)) for lane, c in rung]
            state.put_sent(sent)
        return True

    def reset(self, args: Sequence[tuple[Any, ...] | None]) -> bool:
        """`FirstReadyVerbs.async_reset` (`args`: each worker's); False: the slow path's to do.

        Sent unless `Lanes.posts` says not; the call state must be idle (as it checked).
        """
        posts = self._lanes.posts(args)
        if posts is None:
            return False
        called, messages, kept = posts
        with DEFERRED:  # posted and in flight, or neither
            sent = [
                Sent("reset", lane, worker_args, lane.transport.post(message))
                for lane, message, worker_args in zip(called, messages, kept, strict=True)
            ]
            self._state.put_sent(sent)
            self._store.ready[:] = True
        return True

    def recv(self, min_envs: int, deadline: float | None, finish: Callable[[Batch], T]) -> T:
        """`FirstReadyVerbs.recv` once `min_envs` envs are in; `NotHot`: the slow path's to do.

        What `finish` makes of the batch. The calls in flight are the lanes' sends (steps or
        resets), and step tickets of the workers' lanes of now (sent by the slow path, read here as
        its wait would). `NotHot` (nothing taken out of flight) when the wait reaches `deadline`, or
        when anything in flight or in what came back is not the lanes'. A Ctrl-C in the wait, or
        while the results are handed out, leaves them in flight.
        """
        state = self._state
        sent, tickets = cast("list[Sent]", state.sent), state.ticketed
        found = None if self._pool.lost_episodes.any else self._lanes.now()
        if found is None:
            raise NotHot
        lanes, key, envs_in = found.lanes, 0, 0
        for item in sent:
            lane = item.lane
            transport = lane.transport
            if lane is not lanes[item.worker] or transport.broken or transport.wants_write:
                raise NotHot  # (a worker replaced or lost, or a doorbell not all written)
            key |= 1 << item.worker
            if item.code != NOTHING:
                envs_in += len(item.envs)
        for ticket, kind in tickets:
            transport = lanes[ticket.worker].transport
            if transport.broken or transport.wants_write:
                raise NotHot  # (lost, or a message not all written)
            if kind != "step" or ticket.transport is not transport:
                raise NotHot  # (a reset, a worker replaced, a partial reply's rest)
            key |= 1 << ticket.worker
        poller, by_fd, _ = found.polled(key)
        done: list[Sent] = []
        put: list[tuple[Ticket, str]] = []
        taken = False
        try:
            # Waited for and handed out in one block. A Ctrl-C held back, or coming while it
            # waits, comes through in `poll` with nothing taken out of flight; one after the
            # last `poll` is raised at the block's end (after `finish`, unless the slow path
            # takes over), and the results taken out go back in flight first (`_put_back`,
            # registered to run then).
            with DEFERRED:
                try:
                    if tickets:
                        envs_in = _envs_in(sent, tickets)
                    while envs_in < min_envs:
                        if envs_in and _all_in(sent, tickets):
                            break
                        timeout = None if deadline is None else timeout_ms(deadline)
                        ready = DEFERRED.poll(poller, timeout)
                        if not ready:
                            raise NotHot  # (at `deadline`: the slow path's wait says so)
                        for fd, _ in ready:
                            worker = by_fd[fd]
                            envs_in += self._read(sent, worker, lanes[worker].transport)
                        if tickets:
                            envs_in = _envs_in(sent, tickets)
                    done = [item for item in sent if item.code != NOTHING]
                    answered = [ticket for ticket, _ in tickets if ticket.outcome is not None]
                    env_ids, parts, old_api = self._parts(done, answered)
                except NotHot:  # (what was read goes to tickets before a Ctrl-C can land)
                    state.make_tickets()
                    raise
                put = state.take(answered) if answered else []
                state.take_sent(done)
                taken = True
                DEFERRED.undo_on_interrupt(_put_back, state, put, done)
                return finish(self._store.rows_of(env_ids, parts, old_api))
        except KeyboardInterrupt:  # (one that landed as the guard let go: undone here)
            if taken:  # (done already, as a rule: then nothing)
                _put_back(state, put, done)
            raise
        except BaseException:  # (the face refused what came back: the call's error) the
            if taken:  # reports these results carried stay owed, as `hand_out`'s do
                self._pool.lost_episodes.owe_again(env_ids)
            raise

    @staticmethod
    def _read(sent: list[Sent], worker: int, transport: Any) -> int:
        """Read what came from `worker` on `transport`, readable (interrupts held back).

        The answer to its `Sent` if it has one (its `code`: then how many envs it
        answered for, else 0), else the replies of its tickets (settled by `read_lane`, or by
        `settle`, as the slow path's read would; 0: the caller counts those). `NotHot` if the
        answer is not the lanes' (left for the slow path, which finds it), or if the pipe
        ended.
        """
        for item in sent:
            if item.worker == worker:
                break
        else:  # (a worker with tickets in flight)
            if transport.read_lane() == OTHER and not transport.settle():
                raise NotHot  # (its end: the slow path's read finds it again)
            return 0
        if item.code != NOTHING:  # (answered, and readable again: its end, most likely;
            raise NotHot  # left to the slow path's read, which finds it)
        code = item.read()
        if code == NOTHING:
            return 0  # (part of a message)
        if code == OTHER:
            raise NotHot
        return len(item.envs)

    def _parts(
        self, sent: list[Sent], tickets: list[Ticket]
    ) -> tuple[np.ndarray, list[tuple[int, Any]], bool]:
        """The envs, infos and API of the batch of these answers (`BatchStore.rows_of`'s).

        ``(env ids ascending, (first env of its worker, infos) per answer, whether an env
        spoke old gym's API)``. `NotHot` if a ticket's reply is not in place.
        """
        if len(sent) == 1 and not tickets:  # (one worker's envs: the usual)
            item = sent[0]
            infos, old_api = item.part()
            lane = item.lane
            env_ids = np.arange(lane.start, lane.stop, dtype=np.int64)
            return env_ids, [(lane.start, infos)], old_api
        parts: list[tuple[int, Any]] = []
        old_api, ids = False, []
        for item in sent:
            infos, old = item.part()
            parts.append((item.lane.start, infos))
            old_api |= old
            ids.append(item.envs)
        if not tickets:  # (whole workers' envs: ranges that do not overlap)
            ids.sort(key=_first)
            env_ids = np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ids])
            return env_ids, parts, old_api
        found = ticket_parts(tickets, self._lists)  # (the slow path's, read here: their
        if found is None:  # replies must be in place too)
            raise NotHot
        parts += found[0]
        old_api |= found[1]
        ids += [ticket.envs for ticket in tickets]
        env_ids = np.array(sorted(env for envs in ids for env in envs), dtype=np.int64)
        return env_ids, parts, old_api


def _first(envs: range) -> int:
    """The first env of a worker's run (what `FirstReadyLanes._parts` sorts by)."""
    return envs.start


def _envs_in(sent: list[Sent], tickets: list[tuple[Ticket, str]]) -> int:
    """How many envs the answers read so far cover: the lanes' and the tickets'."""
    envs_in = 0
    for item in sent:
        if item.code != NOTHING:
            envs_in += len(item.envs)
    for ticket, _ in tickets:
        if ticket.outcome is not None:
            envs_in += len(ticket.envs)
    return envs_in


def _all_in(sent: list[Sent], tickets: list[tuple[Ticket, str]]) -> bool:
    """Whether every call in flight was answered (then `recv` takes what there is)."""
    for item in sent:
        if item.code == NOTHING:
            return False
    return all(ticket.outcome is not None for ticket, _ in tickets)


def _put_back(state: CallState, put: list[tuple[Ticket, str]], sent: list[Sent]) -> None:
    """Undo a hand-out a Ctrl-C cut: answered, in flight again for the next `recv`.

    All or nothing, and once: a second run finds both lists emptied.
    """
    with DEFERRED:
        state.put_in_flight(put)
        state.put_sent(sent)
        put.clear()
        sent.clear()


def ticket_parts(
    tickets: list[Ticket], env_lists: list[list[int]]
) -> tuple[list[tuple[int, Any]], bool] | None:
    """``(first env of its worker, infos)`` per ticket and whether an env spoke old gym's API.

    None unless every ticket answered well with a reply the lanes take: its rows in shared
    memory, and no info pieces to merge (batched infos all in their columns, or one dict per
    env, SB3's layout). `env_lists`: each worker's envs.
    """
    parts, old_api = [], False
    for ticket in tickets:
        outcome = ticket.outcome
        reply = outcome.value if outcome is not None and outcome.ok else None
        if type(reply) is not Reply or reply.observations is not None:
            return None
        infos = reply.infos
        if type(infos) is not dict and (
            type(infos) is not tuple or len(infos) != 2 or infos[0] is not None
        ):
            return None
        parts.append((env_lists[ticket.worker][0], infos))
        old_api |= reply.old_api
    return parts, old_api
