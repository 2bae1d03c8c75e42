"""First-ready calls: envpool's ``send``/``recv`` and ``async_reset``, verbs of the `Engine`.

An env is busy from `send` (or `async_reset`) until `recv` hands its result back; `recv` returns as
soon as at least ``batch_size`` envs are done. Every call in flight is a `Ticket` in the call
state (`CallState.in_flight`), whichever way it was sent.

While every worker is on its lane and no lost-episode report is owed (`Lanes.now`), `send`
rings the doorbells of whole workers' envs (`_send_step`, the one launch of every step verb),
and `recv` reads the answers (an `async_reset`'s too: it sends each worker its reset as a
pickled call, `Calls.launch`, and the answer is a record) with the read a lockstep step uses
(`Lanes.read`) until enough envs are in, then hands their rows out of the store in the same
guarded block (`take_out`, as `hand_out` does: all or nothing under a Ctrl-C, which leaves
them in flight, answered, for the next `recv`).
Anything else is sent as a pickled call (`Calls.launch`), and a `recv` that the read leaves
(an env error, a death, infos off the columns, the deadline, a worker replaced, a transport
with no lanes) takes the failures branch after it (`_first`): it waits on the same tickets,
settled already or still to come, and judges those that finished as `Failures.judge` does for a
whole call: a dead worker is restarted there, an env error raised while the envs that
answered fine wait for the next `recv`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ray_multiprocess_env._engine import driver_threads
from ray_multiprocess_env._engine.call_state import (
    Call,
    CallState,
    T,
    as_is,
    hand_out,
    put_back,
    refused,
    take_out,
)
from ray_multiprocess_env._engine.calls import Calls
from ray_multiprocess_env._engine.failures import Failures
from ray_multiprocess_env._engine.interrupts import DEFERRED, deferred_interrupts
from ray_multiprocess_env._engine.lanes import Lanes
from ray_multiprocess_env._engine.options import check_wait
from ray_multiprocess_env._engine.pool import Pool
from ray_multiprocess_env._engine.results import Batch, EngineSpec
from ray_multiprocess_env._engine.splits import (
    Split,
    env_kwargs,
    split_per_worker,
    ticket_positions,
    worker_args,
)
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports.base import Outcome, Ticket, deadline_in, method_of
from ray_multiprocess_env._engine.transports.waiting import wait_tickets
from ray_multiprocess_env.compat import reset_as_step
from ray_multiprocess_env.errors import _EnvFailures, env_list

__all__ = ["FirstReadyVerbs"]


#: The handle of a ticket made of the envs that did not raise in a worker's failed call: the
#: reply it holds also has the rows of the envs that raised (`recv` must leave them out).
_PARTIAL = object()


class FirstReadyVerbs:
    """The first-ready verbs of `Engine` (which provides the attributes below)."""

    spec: EngineSpec
    _pool: Pool
    _calls: Calls
    _failures: Failures  # (`_calls`'s: the failures branch of every call)
    _state: CallState
    _store: BatchStore | None
    _owner: list[int]  # each env's worker
    _lanes: Lanes | None  # the road of steps and resets while all is well
    _workers_here: int  # worker processes on the driver's node (`driver_threads`)

    def _collect(
        self, answered: list[Any], envs: np.ndarray | None, ids: Any, every_row: bool = True
    ) -> Batch:
        """The batch after these answers (`BatchStore.collect`); new info columns shared."""
        assert self._store is not None
        batch, specs = self._store.collect(answered, envs, ids, every_row)
        self._pool.share_infos(specs)  # (numeric info keys seen for the first time)
        return batch

    def _split(self, actions: Any, env_ids: Sequence[int] | None) -> Split:
        """`actions` of the envs `env_ids` (None: all), split per worker (`split_per_worker`)."""
        owner = self._owner
        return split_per_worker(self._pool.workers, owner, self.spec.action_space, actions, env_ids)

    def async_reset(
        self,
        seeds: Sequence[Any] | None = None,
        options: Any = None,
        noted: Callable[[], None] = lambda: None,
    ) -> None:
        """Reset every env without waiting; `recv` returns them as they finish.

        `noted`: the face's note of the reset, made in the block that sends it (all or none).
        """
        self._state.check_idle("async_reset")
        if self._workers_here:
            driver_threads.fit_torch()  # (as `Engine.reset`)
        every = range(self.spec.num_envs)
        seeds = self._pool.seeds.for_reset(seeds, every)
        with deferred_interrupts():  # sent, in flight and the seeds used up, or none
            call = self._send_reset(seeds, options, None, "async_reset")
            if self._store is not None:
                self._store.ready[:] = True
            self._state.put_in_flight(call.tickets)
            self._pool.seeds.sent(seeds, every)
            noted()

    def _send_reset(
        self, seeds: Sequence[Any], options: Any, mask: Any, label: str, in_flight_ok: bool = False
    ) -> Call:
        """Send a reset of every env, or of those where `mask` (a bool array) is True.

        One seed per env, options for every env or one per env (`worker_args`). The one launch
        of every reset verb: a pickled call (`Calls.launch`; a reset is rare, its arguments
        differ every time), whose answers are records where the lanes read them, as a step's.
        Envs with no batch layout are reset one by one (`env_kwargs`). Nothing is sent if it
        raises; call it with interrupts held back. `in_flight_ok`: a worker none of whose envs
        `mask` resets gets nothing (else it would answer once its calls in flight are done).
        """
        if self._store is None:
            every = range(len(seeds))
            kwargs = env_kwargs(seeds, options)
            args_per_env = [None if mask is not None and not mask[env] else () for env in every]
            return self._calls.launch_apply("reset", args_per_env, kwargs, label)
        args: list[tuple[Any, ...] | None] = []
        for part in worker_args(self._pool.workers, seeds, options, mask):
            worker_mask = part[2]
            skipped = worker_mask is not None and in_flight_ok and not any(worker_mask)
            args.append(None if skipped else part)
        return self._calls.launch("reset", args, label)

    def send(self, actions: Any, env_ids: Sequence[int]) -> None:
        """Step the envs `env_ids` (row i of `actions` for env ``env_ids[i]``); don't wait.

        Its errors speak the face's words (`InFlightWords`: `send`, `busy_send`).
        """
        state = self._state
        label = state.words.send
        state.check_idle(label, in_flight_ok=True)
        with DEFERRED:  # sent and in flight, or neither
            state.put_in_flight(self._send_step(actions, env_ids, label, first_ready=True).tickets)

    def _send_step(
        self, actions: Any, env_ids: Sequence[int] | None, label: str, first_ready: bool = False
    ) -> Call:
        """Send a step of the envs `env_ids` (row i of `actions` for env ``env_ids[i]``).

        `env_ids` None: every env, row i for env i. The one launch of every step verb: rung on
        the lanes while they take it (`Lanes.rung`: whole workers' envs), else sent as a
        pickled call (`Calls.launch`). Nothing is sent if it raises. Call it with interrupts
        held back. `first_ready`: a `send`, refused (a ValueError) for an env with a call in
        flight.
        """
        lanes, state = self._lanes, self._state
        rung = None if lanes is None else lanes.rung(actions, env_ids)
        if rung is not None and first_ready and state.in_flight:
            for lane, _ in rung:
                if state.has_call_to(lane.worker):  # (then some env is busy: said below)
                    rung = None
                    break
        if rung is not None:  # (every lane rung, or none: interrupts are held back)
            return Call("step", label, [lane.ring(chunk) for lane, chunk in rung])
        if first_ready and env_ids is not None:
            state.check_not_busy(env_ids, reset=False)
        if self._store is not None:
            args, envs = self._split(actions, env_ids)
            return self._calls.launch("step", args, label, envs, shared_args=True)
        per_env: list[tuple[Any, ...] | None] = [None] * self.spec.num_envs
        ids = range(len(per_env)) if env_ids is None else env_ids
        for env, action in zip(ids, actions, strict=True):
            per_env[env] = (action,)
        return self._calls.launch_apply("step", per_env, None, label)

    def recv(
        self,
        batch_size: int | None = None,
        timeout: float | None = None,
        finish: Callable[[Batch], T] = as_is,
    ) -> T:
        """The results of the first envs to finish what `send`/`async_reset` started.

        `finish` turns the batch into what the face returns, inside the hand-out: a Ctrl-C
        before it returns leaves the results in flight for the next `recv` (`take_out`). Its
        errors and timeouts speak the face's words (`InFlightWords`: `recv`, `nothing`, `again`).

        A Ctrl-C in the wait or in a restart leaves every call in flight: the next `recv`
        restarts a worker still lost and returns its envs with their lost-episode reports.

        Raises:
            TimeoutError: Names the envs still out; they stay in flight.
            RemoteEnvError: An env raised (or a worker died and is not restarted).
        """
        min_envs = self._state.recv_size(batch_size)
        if timeout is not None:  # (checked only when given: `recv` is the first-ready hot path)
            timeout = check_wait(timeout)
        seconds = self._pool.options.timeout if timeout is None else timeout
        deadline = deadline_in(seconds)
        lanes = self._lanes
        if lanes is not None and lanes.now() is not None:
            tickets = self._state.in_flight  # (the state replaces its list, never changes it)
            # Read and handed out in one block, as `hand_out` does. A Ctrl-C held back, or
            # coming while it waits, comes through in `poll` (`Lanes.read`), with nothing taken
            # out of flight: the answers read stay on their tickets for the next `recv`. Once
            # taken out (`take_out`), the guard puts them back if a Ctrl-C ends the block, and
            # the ``except`` after one that lands just as the guard lets go.
            state, lost_episodes = self._state, self._pool.lost_episodes
            in_place: list[Ticket] = []
            taken: list[Ticket] = []
            owed = env_ids = None
            try:
                with DEFERRED:
                    if lanes.read(tickets, min_envs, deadline):
                        in_place = [ticket for ticket in tickets if ticket.outcome is not None]
                        env_ids = _env_ids(in_place)
                        taken, owed = take_out(state, lost_episodes, in_place, env_ids)
                        return finish(lanes.batch(in_place, env_ids))
            except KeyboardInterrupt:
                if taken:  # (else nothing was taken, or the guard put it back: `put_back`)
                    put_back(state, lost_episodes, taken, owed, env_ids, in_place)
                raise
            except BaseException:
                if taken:  # (the face refused the batch: raised with them taken, reports owed)
                    refused(lost_episodes, owed, env_ids)
                raise
        # the failures branch (and the transports with no lanes): the same tickets waited on
        # and judged
        done = self._first(min_envs, timeout, deadline)
        tickets = [ticket for ticket, _ in done]
        if self._store is None:  # each env's own result; a reset's looks like a step
            received = []
            for ticket, values in done:
                start = self._pool.workers[ticket.worker].envs.start
                reset = method_of(ticket) == "reset"
                for env in ticket.envs:
                    value = values[env - start]
                    received.append((env, reset_as_step(value) if reset else value))
            received.sort(key=lambda item: item[0])
            ids = np.array([env for env, _ in received], dtype=np.int64)
            rows = [r for _, r in received]
            make = lambda: finish(Batch(None, None, None, None, None, ids, rows=rows))  # noqa: E731
            return hand_out(self._state, self._pool.lost_episodes, tickets, ids, make)
        workers = self._pool.workers
        ids = np.array(sorted(e for ticket in tickets for e in ticket.envs), dtype=np.int64)
        answered = [(workers[t.worker].envs.start, value, ticket_positions(t)) for t, value in done]
        every_row = all(t.handle is not _PARTIAL for t in tickets)
        return hand_out(
            self._state,
            self._pool.lost_episodes,
            tickets,
            ids,
            lambda: finish(self._collect(answered, ids, ids, every_row)),
        )

    def _first(
        self,
        min_envs: int,
        timeout: float | None,
        deadline: float | None,
    ) -> list[tuple[Ticket, Any]]:
        """Wait until finished tickets cover `min_envs` envs; ``(ticket, result)`` each.

        Everything already finished is included; the tickets stay in flight (`recv` takes
        them out as it hands their results out). `deadline`: the call's, unless a first call
        of the user's own actors gives it longer. A lost worker is restarted here.
        """
        tickets = self._state.in_flight  # (replaced, never changed in place)
        seconds = self._pool.options.timeout if timeout is None else timeout
        seconds, deadline = self._pool.deadline_for(tickets, seconds, deadline)
        progress, words = -1, self._state.words
        while True:
            settled = envs_in = 0
            for ticket in tickets:
                if ticket.outcome is not None:
                    settled, envs_in = settled + 1, envs_in + len(ticket.envs)
            if settled == len(tickets) or envs_in >= min_envs:
                break
            if settled == progress:  # the last wait ended at the deadline with nothing new
                late = sorted(i for t in tickets if t.outcome is None for i in t.envs)
                raise TimeoutError(
                    f"`{words.recv}` timed out after {seconds} s: env(s) {env_list(late)} did not "
                    f"answer. They stay in flight: {words.again}, or close this vector env."
                )
            progress = settled
            wait_tickets(tickets, deadline, settled + 1)
        done = [ticket for ticket in tickets if ticket.outcome is not None]
        call = Call("step", words.recv, done)
        ends = deadline if timeout is None else None  # (a shorter wait: the options' bound)
        try:
            values = self._failures.judge(call, seconds, False, deadline=ends)
        except KeyboardInterrupt:  # (in a restart) every call stays in flight: the next
            raise  # `recv` restarts what is still lost, and returns every env
        except BaseException as error:  # (an env error, or a restart that failed) the envs
            # that raised or were lost, and that the error names, leave flight (a lost worker's
            # report stays owed); the others' answers wait for the next `recv`, and so do the
            # failures it does not name: a restart that failed raises at once, naming only its
            # own worker's envs, and the next `recv` judges the rest again (a worker restarted
            # before it is sent the step once more; an env error is raised then)
            failed = [t for t in done if t.outcome is None or not t.outcome.ok]
            named = set(getattr(error, "env_indices", None) or ())
            failed = [t for t in failed if not named.isdisjoint(t.envs)] or failed
            with deferred_interrupts():
                self._state.take(failed)
                self._state.put_in_flight(_siblings(failed))
            raise
        return list(zip(done, values, strict=True))


def _env_ids(answered: list[Ticket]) -> np.ndarray:
    """The envs of these answers, ascending (what `Lanes.batch` hands out the rows of)."""
    if len(answered) == 1:  # (one worker's envs: the usual)
        envs = answered[0].envs
        if type(envs) is range:
            return np.arange(envs.start, envs.stop, dtype=np.int64)
        return np.array(sorted(envs), dtype=np.int64)  # (some of a worker's: a pickled call)
    runs, whole = [], True
    for ticket in answered:
        envs = ticket.envs
        runs.append(envs)
        whole = whole and type(envs) is range
    if whole:  # (whole workers' envs: ranges apart)
        ranges = cast("list[range]", runs)
        ranges.sort(key=_first_env)
        return np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges])
    return np.array(sorted(env for envs in runs for env in envs), dtype=np.int64)


def _first_env(envs: range) -> int:
    """The first env of a worker's run (what `_env_ids` sorts by)."""
    return envs.start


def _siblings(done: list[Ticket]) -> list[Ticket]:
    """For each ticket where some envs raised: the others' results, as a ticket of their own.

    The worker's partial reply holds the rows of every env it ran; the new ticket names only
    the envs that did not raise, so the next `recv` returns them and not the failed ones.
    """
    out = []
    for ticket in done:
        outcome = ticket.outcome
        if outcome is None or outcome.ok or outcome.died:
            continue
        cause = getattr(outcome.error, "cause", None)
        if not isinstance(cause, _EnvFailures) or cause.partial is None:
            continue
        failed = set(cause.env_indices)
        keep = tuple(env for env in ticket.envs if env not in failed)
        if keep:
            sibling = Ticket(
                ticket.worker, ticket.generation, ticket.op, ticket.args, keep, ticket.shared_args
            )
            sibling.outcome, sibling.handle = Outcome(True, cause.partial), _PARTIAL
            out.append(sibling)
    return out
