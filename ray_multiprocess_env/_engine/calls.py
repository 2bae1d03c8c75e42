"""Calls to workers: launch one operation per worker, wait under one deadline, judge once.

A call is launched on the workers it concerns (`Calls.launch`: all or nothing, even under
Ctrl-C), waited for (`Calls.wait`), and its outcomes are judged in one place (`Calls.judge`):
a dead or late worker is restarted there (``on_actor_failure="restart"``) and the same
operation sent to its replacement, whose envs report their lost episodes as truncated;
otherwise the error is raised, naming the env indices and the method, chained to the worker's
own error. Failures arrive as values (`Outcome`), never as exceptions thrown across the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray_multiprocess_env._engine.call_state import Call
from ray_multiprocess_env._engine.interrupts import deferred_interrupts
from ray_multiprocess_env._engine.pool import RETRIED, Pool
from ray_multiprocess_env._engine.results import EngineSpec
from ray_multiprocess_env._engine.transports.base import Ticket, deadline_in
from ray_multiprocess_env._engine.transports.waiting import wait_tickets
from ray_multiprocess_env._protocol import space_match
from ray_multiprocess_env.errors import (
    EnvCrashedError,
    RemoteEnvError,
    SpacesMismatchError,
    _EnvFailures,
    env_list,
    process_ended,
)

__all__ = [
    "Calls",
    "partial_replies",
]


class Calls:
    """Launching, waiting on and judging the calls to one pool's workers."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def launch(
        self,
        op: str,
        args_per_worker: Sequence[tuple[Any, ...] | None],
        label: str,
        envs_per_worker: Sequence[Sequence[int] | None] | None = None,
        *,
        shared_args: bool = False,
    ) -> Call:
        """Send `op` with ``args_per_worker[w]`` to each worker ``w`` whose args are not None.

        ``envs_per_worker[w]`` are the envs that concern it (None, or no list: all of its envs).

        The whole launch happens or none of it: arguments that cannot be serialized are a
        `TypeError` before anything is sent, and a ``KeyboardInterrupt`` waits until every
        worker has its message.
        """
        tickets: list[Ticket] = []
        encoded = []
        for worker, args in zip(self.pool.workers, args_per_worker, strict=True):
            if args is None:
                continue
            envs = None if envs_per_worker is None else envs_per_worker[worker.index]
            envs = worker.envs if envs is None else envs
            ticket = Ticket(worker.index, worker.generation, op, args, tuple(envs), shared_args)
            try:
                encoded.append(worker.transport.encode(ticket))
            except Exception as err:
                raise TypeError(
                    f"the arguments of `{label}` for env(s) {env_list(envs)} cannot be serialized "
                    f"({type(err).__name__}: {err}); nothing was sent."
                ) from err
            tickets.append(ticket)
        call = Call(op, label, tickets)
        lost_episodes, workers = self.pool.lost_episodes, self.pool.workers
        with deferred_interrupts():  # then send to every worker, or (on an error) give up
            try:
                for ticket, data in zip(tickets, encoded, strict=True):
                    worker = workers[ticket.worker]
                    lost_episodes.rearm(worker.transport, ticket, worker.envs.start)
                    worker.transport.submit(ticket, data)
            except BaseException:
                self.abandon(call)
                raise
        return call

    def wait(
        self,
        call: Call,
        timeout: float | None = None,
        *,
        resumable: bool = False,
        deadline: float | None = None,
    ) -> list[Any]:
        """Wait for every ticket of `call`; one result per worker (None where not called).

        `deadline`: the call's (from its `timeout`) if it began before, unless a first call of
        the user's own actors gives it longer.

        Raises:
            TimeoutError: Names the envs that did not answer; with `resumable` the call stays
                waitable (the answers already in are kept), else it is given up.
            RemoteEnvError: An env raised (`EnvCrashedError`: a worker died).
        """
        try:  # (from its first line: a Ctrl-C there gives the call up too)
            seconds = self.pool.options.timeout if timeout is None else timeout
            seconds, deadline = self.pool.deadline_for(call.tickets, seconds, deadline)
            wait_tickets(call.tickets, deadline, len(call.tickets))
            ends = deadline if timeout is None else None  # (a shorter wait: the options' bound)
            values = self.judge(call, seconds, resumable, timeout is None, ends)
        except TimeoutError:
            if not resumable:
                self.abandon(call)
            raise
        except BaseException:
            self.abandon(call)
            raise
        results: list[Any] = [None] * len(self.pool.workers)
        for ticket, value in zip(call.tickets, values, strict=True):
            results[ticket.worker] = value
        return results

    def run(
        self, op: str, args_per_worker: Sequence[tuple[Any, ...] | None], label: str
    ) -> list[Any]:
        """`launch` and `wait`; the call is given up if anything interrupts it."""
        return self.wait(self.launch(op, args_per_worker, label))

    def apply(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[Mapping[str, Any]] | None,
        label: str,
    ) -> list[Any]:
        """Call env method `method` on each env whose args are not None; a result per env."""
        return self.spread(
            self.wait(self.launch_apply(method, args_per_env, kwargs_per_env, label))
        )

    def launch_apply(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[Mapping[str, Any]] | None,
        label: str,
    ) -> Call:
        """Launch `method` on each env whose args are not None (the ``apply`` operation)."""
        kwargs_per_env = kwargs_per_env or [{}] * self.pool.num_envs
        args: list[tuple[Any, ...] | None] = []
        envs: list[list[int]] = []
        for worker in self.pool.workers:
            env_args = [args_per_env[i] for i in worker.envs]
            envs.append([i for i in worker.envs if args_per_env[i] is not None])
            if all(a is None for a in env_args):
                args.append(None)
            else:
                env_kwargs = [dict(kwargs_per_env[i]) for i in worker.envs]
                args.append((method, env_args, env_kwargs))
        return self.launch("apply", args, label, envs)

    def spread(self, results: Sequence[Any]) -> list[Any]:
        """Per-worker ``apply`` results as one result per env (None where not called)."""
        out: list[Any] = [None] * self.pool.num_envs
        for worker, result in zip(self.pool.workers, results, strict=True):
            if result is not None:
                out[worker.envs.start : worker.envs.stop] = result
        return out

    def describe(self, require: bool, observation_mode: Any = None) -> EngineSpec:
        """The envs' spaces, metadata and render mode, asked of every worker.

        `observation_mode`: gymnasium's ``"same"`` or ``"different"``, or the single
        observation space of a given ``(batched, single)`` pair (`space_match`); None: "same",
        for a face that has no such option (its errors do not suggest one).

        Raises:
            SpacesMismatchError: If `require` and an env's spaces do not fit (the env is
                named): a `ValueError` and a `RuntimeError`.
        """
        descriptions = self.run("describe", [()] * len(self.pool.workers), "describe")
        first: dict[str, Any] = descriptions[0]
        given = observation_mode is not None and not isinstance(observation_mode, str)
        same = not given and observation_mode != "different"
        observations = (
            ("the given single observation space", observation_mode)
            if given
            else ("env 0", first["observation_space"])
        )
        actions = ("env 0", first["action_space"])
        envs = [
            (worker.envs.start, d["observation_space"], d["action_space"])
            for worker, d in zip(self.pool.workers, descriptions, strict=True)
        ]

        def found(same: bool) -> str | None:
            key = "mismatch" if same else "layout_mismatch"
            within = next((d[key] for d in descriptions if d[key]), None)
            return within or space_match.mismatch(
                envs if given else envs[1:], observations, actions, same
            )

        problem = found(same)
        if problem is not None and require:
            if same and observation_mode == "same" and found(False) is None:
                problem += (
                    ' (only their bounds differ: pass `observation_mode="different"` to batch '
                    "them as gymnasium does)"
                )
            raise SpacesMismatchError(f"{problem}.")
        spaces = [
            d["observation_space"] if space is None else space
            for d in descriptions
            for space in d["observation_spaces"]
        ]
        return EngineSpec(
            self.pool.num_envs,
            observations[1],
            first["action_space"],
            first["metadata"],
            first["render_mode"],
            problem is None and observations[1] is not None,
            tuple(spaces),
        )

    def close_envs(self, seconds: float) -> Exception | None:
        """Ask every worker to close its envs within `seconds`: the error, if one failed."""
        failed = self.pool.close_envs(seconds)
        if not failed:
            return None
        errors = [t for t in failed if t.outcome is not None]
        if errors:
            return self.error(Call("close", "close", failed), errors)
        late = env_list(sorted(i for t in failed for i in t.envs))
        return TimeoutError(f"`close` timed out after {seconds} s: env(s) {late} did not answer.")

    def abandon(self, call: Call) -> None:
        """Give `call` up: replies still to come for it are dropped.

        The reports its steps carried are owed (`LostEpisodes.owe_tickets`): it did not
        reach the user.
        """
        for ticket in call.tickets:
            if ticket.outcome is None and ticket.transport is not None:
                ticket.transport.forget(ticket)
        self.pool.lost_episodes.owe_tickets(call.tickets)

    # -- judging outcomes (the one place that decides: result, restart or raise) -------------
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
        if lost and self.pool.can_restart:
            if deadline is None or any(t.outcome is None for t in lost):
                deadline = deadline_in(self.pool.options.bound)
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
        pool = self.pool
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
                self.pool.give_up(self.pool.workers[ticket.worker])
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
            worker = self.pool.workers[ticket.worker]
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
            num_envs=self.pool.num_envs,
            next_step=_RESTART_HINT
            if self.pool.has_factories and not self.pool.can_restart
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
