"""A call's failures: judged in one place, after its tickets are read or waited for.

The failures branch of every call. A step that the lanes read in place never comes here; every
call that `Calls.wait` waits for (a reset, an env method, a step off the lanes) and every
first-ready `recv` that the lanes leave does, and passes at once when every answer is OK. Else
(an env that raised, a worker that died or did not answer by the deadline) `Failures.judge`
decides once per call: a dead or late worker is restarted (``on_actor_failure="restart"``) and
the same operation sent to its replacement, whose envs report their lost episodes as
truncated; otherwise one error is raised, naming the env indices and the method, chained to
the worker's own error (its traceback kept). Failures arrive as values (`Outcome`), never as
exceptions thrown across the engine. A call given up (an error, a timeout, a Ctrl-C, a close)
is `Failures.abandon`'s: replies still to come for it are dropped, and the lost-episode reports
it carried are owed again.
"""

from __future__ import annotations

from typing import Any

from ray_multiprocess_env._engine.call_state import Call
from ray_multiprocess_env._engine.interrupts import deferred_interrupts
from ray_multiprocess_env._engine.pool import RETRIED, Pool
from ray_multiprocess_env._engine.transports.base import Ticket, deadline_in
from ray_multiprocess_env._engine.transports.waiting import wait_tickets
from ray_multiprocess_env.errors import (
    EnvCrashedError,
    RemoteEnvError,
    _EnvFailures,
    env_list,
    process_ended,
)

__all__ = ["Failures", "partial_replies"]


class Failures:
    """Judging the outcomes of the calls to one pool's workers, and giving calls up."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    def abandon(self, call: Call) -> None:
        """Give `call` up: replies still to come for it are dropped.

        The reports its steps carried are owed (`LostEpisodes.owe_tickets`): it did not
        reach the user.
        """
        for ticket in call.tickets:
            if ticket.outcome is None and ticket.transport is not None:
                ticket.transport.forget(ticket)
        self._pool.lost_episodes.owe_tickets(call.tickets)

    def judge(
        self,
        call: Call,
        seconds: float | None,
        resumable: bool,
        restart_late: bool = False,
        deadline: float | None = None,
    ) -> list[Any]:
        """The values of `call`'s tickets, after restarting lost workers; or the error.

        A worker that died is restarted (with ``on_actor_failure="restart"``) by the call's
        `deadline`; one that is late only when `restart_late` (the vector env's own `timeout`
        ran out, not a shorter one given to this wait). Without a `deadline` (a wait given a
        shorter timeout of its own), and for a late worker (the call's time is spent), the
        replacement gets the options' `bound`.
        """
        tickets = call.tickets
        if all(t.outcome is not None and t.outcome.ok for t in tickets):  # the usual case
            return [t.outcome.value for t in tickets]  # type: ignore[union-attr]
        lost = [
            t
            for t in call.tickets
            if (t.outcome is None and restart_late) or (t.outcome is not None and t.outcome.died)
        ]
        if lost and self._pool.can_restart:
            if deadline is None or any(t.outcome is None for t in lost):
                deadline = deadline_in(self._pool.options.bound)
            self._replace(call, lost, deadline)
        failures = [t for t in call.tickets if t.outcome is not None and not t.outcome.ok]
        if failures:
            raise self.error(call, failures)
        late = sorted(i for t in call.tickets if t.outcome is None for i in t.envs)
        if late:
            again = (
                " The envs that answered keep their results: call `step_wait` again to wait longer."
                if resumable
                else " Their call is still running: the next call to them waits behind it."
            )
            raise TimeoutError(
                f"`{call.label}` timed out after {seconds} s: env(s) {env_list(late)} did not "
                "answer."
                f"{again} Raise `timeout` if the env is slow, or close this vector env "
                "(`on_actor_failure='restart'` restarts such workers instead)."
            )
        return [t.outcome.value for t in call.tickets if t.outcome is not None]

    def _replace(self, call: Call, lost: list[Ticket], deadline: float | None) -> None:
        """Restart the workers of `lost` tickets and give each ticket its replacement's answer.

        Each replacement is placed, started and connected within `restart_bound` of its
        restart (`timeout`, at least 30 s: a process start takes seconds on a busy machine,
        whatever the call's `timeout`), or by `deadline` if that is later; the replacements'
        answers by `deadline`, or `bound` after the restarts.
        """
        retries: list[Ticket] = []
        pool = self._pool
        try:
            for ticket in lost:
                if ticket.outcome is None and ticket.transport is not None:
                    ticket.transport.forget(ticket)
                why = "did not answer in time" if ticket.outcome is None else "died"
                cause = ticket.outcome.error if ticket.outcome is not None else None
                start_by = _later(deadline, deadline_in(pool.options.restart_bound))
                pool.restart(ticket.worker, ticket.generation, call.label, why, cause, start_by)
                worker = pool.workers[ticket.worker]
                retry = Ticket(
                    ticket.worker,
                    worker.generation,
                    ticket.op,
                    ticket.args,
                    ticket.envs,
                    ticket.shared_args,
                )
                with deferred_interrupts():  # (a report sent but not read: sent again later)
                    pool.lost_episodes.rearm(worker.transport, retry, worker.envs.start)
                    worker.transport.submit(retry)
                    retries.append(retry)
            answer_by = _later(deadline, deadline_in(pool.options.bound))
            wait_tickets(retries, answer_by, len(retries))
        except BaseException:  # (interrupted, or a restart failed: the reports stay owed)
            for ticket, retry in zip(lost, retries, strict=False):  # the answers already in
                if retry.outcome is not None and not retry.outcome.died:
                    ticket.outcome, ticket.generation = retry.outcome, retry.generation
            self.abandon(Call(call.op, call.label, retries))
            raise
        failed: list[Ticket] = []
        for ticket, retry in zip(lost, retries, strict=True):
            if retry.outcome is None or retry.outcome.died:
                if retry.outcome is None and retry.transport is not None:
                    retry.transport.forget(retry)
                # given up: its lost episode is reported by the next replacement, not lost
                self._pool.give_up(self._pool.workers[ticket.worker])
                failed.append(retry)
            else:
                ticket.outcome, ticket.generation = retry.outcome, retry.generation
        if failed:
            first = failed[0].outcome
            raise EnvCrashedError(
                failed[0].envs[0],
                call.label,
                (first.error if first is not None else None)
                or TimeoutError("the restarted worker did not answer"),
                env_indices=[env for retry in failed for env in retry.envs],
                next_step=RETRIED,
            )

    def error(self, call: Call, failures: list[Ticket]) -> RemoteEnvError:
        """The error of `call` naming every env of the `failures` (the call is given up)."""
        self.abandon(call)
        named: list[tuple[list[int], BaseException, bool]] = []
        for ticket in failures:
            assert ticket.outcome is not None
            error = ticket.outcome.error or RuntimeError("no error was reported")
            cause = getattr(error, "cause", None)
            envs = cause.env_indices if isinstance(cause, _EnvFailures) else list(ticket.envs)
            named.append((envs, error, ticket.outcome.died))
            worker = self._pool.workers[ticket.worker]
            if worker.generation == ticket.generation and process_ended(error):
                worker.gone = True  # (`close` does not ask it to close its envs)
        first_envs, first_error, _ = named[0]
        kind = EnvCrashedError if any(died for _, _, died in named) else RemoteEnvError
        indices = [i for envs, _, _ in named for i in envs]
        error = kind(
            first_envs[0],
            call.label,
            first_error,
            env_indices=indices,
            num_envs=self._pool.num_envs,
            next_step=_RESTART_HINT
            if self._pool.has_factories and not self._pool.can_restart
            else None,
        )
        error.__cause__ = first_error
        return error


#: What the error of a worker the library made, found dead with no restart, says to do next.
_RESTART_HINT = (
    'pass `on_actor_failure="restart"` to have a lost worker restarted with its envs reset '
    "(docs/failures.md), or make the vector env again."
)


def _later(deadline: float | None, other: float | None) -> float | None:
    """The later of two deadlines (None: no deadline, the latest of all)."""
    return None if deadline is None or other is None else max(deadline, other)


def partial_replies(call: Call) -> dict[int, Any] | None:
    """What each worker of a failed `call` answered (its reply, or its envs' partial reply).

    None unless every worker of the call answered: a worker that died or is late has none.
    """
    replies: dict[int, Any] = {}
    for ticket in call.tickets:
        outcome = ticket.outcome
        if outcome is None or outcome.died:
            return None
        cause = getattr(outcome.error, "cause", None)
        if outcome.ok:
            replies[ticket.worker] = outcome.value
        elif isinstance(cause, _EnvFailures) and cause.partial is not None:
            replies[ticket.worker] = cause.partial
        else:
            return None
    return replies
