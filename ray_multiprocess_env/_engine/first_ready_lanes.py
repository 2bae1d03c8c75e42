"""First-ready calls on the workers' lanes: no outcome object or pickle while all is well.

`FirstReadyLanes.send` writes the actions of whole workers' envs into their rows and rings
each worker's doorbell (`lanes.Lane`), its ticket waiting for the answer, in flight in the call
state (`CallState.in_flight`) as every first-ready call is. `FirstReadyLanes.reset`
(``async_reset``) posts each worker's reset as `Lanes.launch_reset` does; its answer is handed
out as a step's. `recv` reads the answers of the workers with calls in flight with the read a
lockstep step uses (`Lanes.read`: a status record; or a reply with its rows in place and one
info dict per env, SB3's layout, each settling its ticket) until enough envs are in, and hands
their rows out of the store, all or nothing under a Ctrl-C: one that lands before the results
are made leaves them in flight, answered, for the next `recv`.

Anything else leaves the calls to the slow path (`FirstReadyVerbs`), none taken out of flight
(`NotHot`): a reply that is not an answer in place (an env error, a death, infos off the
columns: `read_lane` settles its ticket as the slow path's read would), the deadline, a worker
replaced or its pipe broken, a doorbell the socket took only part of, owed lost-episode
reports, a ticket the slow path settled. The slow path finds every call as a ticket, settled
already or still to come, whichever road sent it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ray_multiprocess_env._engine.call_state import CallState, State, T
from ray_multiprocess_env._engine.interrupts import DEFERRED
from ray_multiprocess_env._engine.lanes import Lane, Lanes
from ray_multiprocess_env._engine.pool import Pool
from ray_multiprocess_env._engine.results import Batch
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports.base import Ticket

__all__ = ["FirstReadyLanes", "NotHot"]


class NotHot(Exception):
    """A first-ready `recv` is the slow path's to do (nothing was taken out of flight)."""


class FirstReadyLanes:
    """First-ready `send`, `async_reset` and `recv` on an engine's lanes (module docstring)."""

    def __init__(self, pool: Pool, state: CallState, store: BatchStore, lanes: Lanes) -> None:
        self._pool, self._state, self._store, self._lanes = pool, state, store, lanes

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
            state.put_in_flight([(lane.ring(chunk), "step") for lane, chunk in rung])
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
            self._state.put_in_flight(
                [
                    (lane.post(message, worker_args), "reset")
                    for lane, message, worker_args in zip(called, messages, kept, strict=True)
                ]
            )
            self._store.ready[:] = True
        return True

    def recv(self, min_envs: int, deadline: float | None, finish: Callable[[Batch], T]) -> T:
        """`FirstReadyVerbs.recv` once `min_envs` envs are in; `NotHot`: the slow path's to do.

        What `finish` makes of the batch. The calls in flight are tickets on the workers'
        lanes of now, whichever road sent them; `NotHot` (nothing taken out of flight) when
        the wait reaches `deadline`, or when anything in flight or in what came back is not
        the lanes'. A Ctrl-C in the wait, or while the results are handed out, leaves them in
        flight.
        """
        state = self._state
        found = None if self._pool.lost_episodes.any else self._lanes.now()
        if found is None:
            raise NotHot
        tickets = [ticket for ticket, _ in state.in_flight]
        put: list[tuple[Ticket, str]] = []
        taken = False
        try:
            # Waited for and handed out in one block. A Ctrl-C held back, or coming while it
            # waits, comes through in `poll` with nothing taken out of flight; one after the
            # last `poll` is raised at the block's end (after `finish`, unless the slow path
            # takes over), and the results taken out go back in flight first (`_put_back`,
            # registered to run then).
            with DEFERRED:
                if not self._lanes.read(tickets, min_envs, deadline):
                    raise NotHot  # (the slow path's wait and judging: `Lanes.read`)
                answered = [ticket for ticket in tickets if ticket.outcome is not None]
                env_ids, parts, old_api = _parts(answered, found.lanes)
                put = state.take(answered)
                taken = True
                DEFERRED.undo_on_interrupt(_put_back, state, put)
                return finish(self._store.rows_of(env_ids, parts, old_api))
        except KeyboardInterrupt:  # (one that landed as the guard let go: undone here)
            if taken:  # (done already, as a rule: then nothing)
                _put_back(state, put)
            raise
        except BaseException:  # (the face refused what came back: the call's error) the
            if taken:  # reports these results carried stay owed, as `hand_out`'s do
                self._pool.lost_episodes.owe_again(env_ids)
            raise


def _parts(
    answered: list[Ticket], lanes: list[Lane]
) -> tuple[np.ndarray, list[tuple[int, Any]], bool]:
    """The envs, infos and API of the batch of these answers (`BatchStore.rows_of`'s).

    `lanes`: every worker's lane, by worker.

    ``(env ids ascending, (first env of its worker, infos) per answer, whether an env
    spoke old gym's API)``. Each answer is in place (`Lanes.read` said so).
    """
    if len(answered) == 1:  # (one worker's envs: the usual)
        ticket = answered[0]
        reply = ticket.outcome.value  # type: ignore[union-attr]  # (answered)
        envs = ticket.envs
        start = lanes[ticket.worker].start
        if type(envs) is range:
            env_ids = np.arange(envs.start, envs.stop, dtype=np.int64)
        else:  # (some of a worker's envs, sent by the slow path)
            env_ids = np.array(sorted(envs), dtype=np.int64)
        return env_ids, [(start, reply.infos)], reply.old_api
    parts: list[tuple[int, Any]] = []
    old_api, ids, whole = False, [], True
    for ticket in answered:
        reply = ticket.outcome.value  # type: ignore[union-attr]  # (answered)
        parts.append((lanes[ticket.worker].start, reply.infos))
        old_api |= reply.old_api
        ids.append(ticket.envs)
        whole = whole and type(ticket.envs) is range
    if whole:  # (whole workers' envs: ranges that do not overlap)
        ranges = cast("list[range]", ids)
        ranges.sort(key=_first)
        env_ids = np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges])
    else:
        env_ids = np.array(sorted(env for envs in ids for env in envs), dtype=np.int64)
    return env_ids, parts, old_api


def _first(envs: range) -> int:
    """The first env of a worker's run (what `_parts` sorts by)."""
    return envs.start


def _put_back(state: CallState, put: list[tuple[Ticket, str]]) -> None:
    """Undo a hand-out a Ctrl-C cut: answered, in flight again for the next `recv`.

    All or nothing, and once: a second run finds the list emptied.
    """
    with DEFERRED:
        state.put_in_flight(put)
        put.clear()
