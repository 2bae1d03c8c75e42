"""The engine: launch one operation per worker, wait under one deadline, decide once.

`Engine` is all the faces (`RayVectorEnv`, `GymnasiumVectorEnv`, `SB3VecEnv`) use. A call is
launched on the workers it concerns (`launch`), waited for (`wait`: all; `first_ready`: the
first to finish), and its outcomes are judged in one place (`_judge`): a dead or late worker is
restarted there (``on_actor_failure="restart"``) and the same operation sent to its
replacement, whose envs report their lost episodes as truncated; otherwise the error is raised,
naming the env indices and the method, chained to the worker's own error.

The engine also keeps the one call state of its vector env: the pending `step_async`, and the
first-ready operations in flight. An interrupted call is given up (its replies are dropped as
they come), so a ``KeyboardInterrupt`` never leaves the vector env unusable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from ray_multiprocess_env._engine.interrupts import deferred_interrupts
from ray_multiprocess_env._engine.options import Options
from ray_multiprocess_env._engine.pool import Pool
from ray_multiprocess_env._engine.state import Call, CallState
from ray_multiprocess_env._engine.transport import Ticket
from ray_multiprocess_env._engine.wait import deadline_in, wait_tickets
from ray_multiprocess_env.errors import (
    EnvCrashedError,
    NoPendingCallError,
    RemoteEnvError,
    _EnvFailures,
)

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

#: Seconds `close` gives the envs to close before it kills their workers anyway.
_CLOSE_S = 30.0


class Engine(CallState):
    """The workers of one vector env and the calls to them (see the module docstring)."""

    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self.pool = pool
        self.options: Options = pool.options
        self.num_envs = pool.num_envs
        self._has_method: dict[str, list[bool]] = {}
        self._whole: Any = None  # views of the whole shared batch, once asked for

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each worker's envs."""
        return [(slot.start, slot.stop) for slot in self.pool.slots]

    # -- launching and waiting ----------------------------------------------------------------
    def launch(
        self,
        op: str,
        args_per_slot: Sequence[tuple[Any, ...] | None],
        label: str,
        envs_per_slot: Sequence[Sequence[int]] | None = None,
    ) -> Call:
        """Send `op` with ``args_per_slot[w]`` to each worker ``w`` whose args are not None.

        The whole launch happens or none of it: a ``KeyboardInterrupt`` waits until every
        worker has its message.
        """
        self.check_open(label)
        tickets: list[Ticket] = []
        encoded = []
        for w, args in enumerate(args_per_slot):  # first everything that can fail
            if args is None:
                continue
            slot = self.pool.slots[w]
            envs = tuple(slot.envs if envs_per_slot is None else envs_per_slot[w])
            ticket = Ticket(w, slot.generation, op, args, envs)
            try:
                encoded.append(slot.link.encode(ticket))
            except Exception as err:
                raise TypeError(
                    f"the arguments of `{label}` for env(s) {list(envs)} cannot be serialized "
                    f"({type(err).__name__}: {err}); nothing was sent."
                ) from err
            tickets.append(ticket)
        with deferred_interrupts():  # then send to every worker, or (on an error) give up
            try:
                for ticket, data in zip(tickets, encoded, strict=True):
                    self.pool.slots[ticket.slot].link.submit(ticket, data)
            except BaseException:
                self.abandon(Call(op, label, tickets))
                raise
        return Call(op, label, tickets)

    def wait(
        self, call: Call, timeout: float | None = None, *, resumable: bool = False
    ) -> list[Any]:
        """Wait for every ticket of `call`; one result per worker (None where not called).

        Raises:
            TimeoutError: Names the envs that did not answer; with `resumable` the call stays
                waitable (the answers already in are kept), else it is given up.
            RemoteEnvError: An env raised (`EnvCrashedError`: a worker died).
        """
        seconds = self.options.timeout if timeout is None else timeout
        try:
            wait_tickets(call.tickets, deadline_in(seconds), len(call.tickets))
            values = self._judge(call, seconds, resumable, restart_late=timeout is None)
            results: list[Any] = [None] * len(self.pool.slots)
            for ticket, value in zip(call.tickets, values, strict=True):
                results[ticket.slot] = value
            return results
        except TimeoutError:
            if not resumable:
                self.abandon(call)
            raise
        except BaseException:
            self.abandon(call)
            raise

    def wait_pending(self, timeout: float | None = None) -> list[Any]:
        """Collect the pending `step_async`: one result per worker.

        On a `TimeoutError` the step stays pending (the answers already in are kept); on any
        other exception, or once collected, it is no longer pending.
        """
        self.check_open("step_wait")
        if self.pending is None:
            raise NoPendingCallError(
                "`step_wait` was called without a `step_async` before it.", "step_wait"
            )
        try:
            results = self.wait(self.pending, timeout, resumable=True)
        except TimeoutError:
            raise
        except BaseException:
            self.pending = None
            raise
        self.pending = None
        return results

    def run(
        self, op: str, args_per_slot: Sequence[tuple[Any, ...] | None], label: str
    ) -> list[Any]:
        """`launch` and `wait`; the call is given up if anything interrupts it."""
        return self.wait(self.launch(op, args_per_slot, label))

    def apply(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[Mapping[str, Any]] | None = None,
        label: str | None = None,
    ) -> list[Any]:
        """Call env method `method` on each env whose args are not None; a result per env."""
        args_per_slot = self.apply_args(method, args_per_env, kwargs_per_env)
        return self.spread(self.run("apply", args_per_slot, label or method))

    def apply_args(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[tuple[Any, ...] | None]:
        """The arguments of the ``apply`` operation of each worker (None: none of its envs)."""
        kwargs_per_env = kwargs_per_env or [{}] * self.num_envs
        args_per_slot: list[tuple[Any, ...] | None] = []
        for slot in self.pool.slots:
            env_args = [args_per_env[i] for i in slot.envs]
            if all(a is None for a in env_args):
                args_per_slot.append(None)
            else:
                env_kwargs = [dict(kwargs_per_env[i]) for i in slot.envs]
                args_per_slot.append((method, env_args, env_kwargs))
        return args_per_slot

    def spread(self, results: Sequence[Any]) -> list[Any]:
        """Per-worker ``apply`` results as one result per env (None where not called)."""
        out: list[Any] = [None] * self.num_envs
        for slot, result in zip(self.pool.slots, results, strict=True):
            if result is not None:
                out[slot.start : slot.stop] = result
        return out

    def abandon(self, call: Call) -> None:
        """Give `call` up: replies still to come for it are dropped."""
        for ticket in call.tickets:
            if ticket.outcome is None and ticket.link is not None:
                ticket.link.forget(ticket)

    # -- first-ready ------------------------------------------------------------------------
    def send(self, call: Call, kind: str) -> None:
        """Put the tickets of a launched `call` in flight for `first_ready`."""
        self.in_flight.extend((ticket, kind) for ticket in call.tickets)

    def first_ready(self, min_envs: int, timeout: float | None) -> list[tuple[Ticket, str, Any]]:
        """Wait until finished tickets cover `min_envs` envs; ``(ticket, kind, result)`` each.

        Everything already finished is included. On a timeout the tickets stay in flight.
        """
        seconds = self.options.timeout if timeout is None else timeout
        deadline = deadline_in(seconds)
        tickets = [ticket for ticket, _ in self.in_flight]
        while any(t.outcome is None for t in tickets) and (
            sum(len(t.envs) for t in tickets if t.outcome is not None) < min_envs
        ):
            before = sum(t.outcome is not None for t in tickets)
            wait_tickets(tickets, deadline, before + 1)
            if sum(t.outcome is not None for t in tickets) == before:
                late = sorted(i for t in tickets if t.outcome is None for i in t.envs)
                raise TimeoutError(
                    f"`recv` timed out after {seconds} s: env(s) {late} did not answer. They "
                    "stay in flight: call `recv` again to wait longer, or close this vector env."
                )
        done = [(t, kind) for t, kind in self.in_flight if t.outcome is not None]
        self.in_flight = [(t, kind) for t, kind in self.in_flight if t.outcome is None]
        try:
            values = self._judge(Call("step", "recv", [t for t, _ in done]), seconds, False)
        except RemoteEnvError:  # the answers that came back fine wait for the next `recv`
            self.in_flight[:0] = [(t, k) for t, k in done if t.outcome is not None and t.outcome.ok]
            raise
        return [(t, kind, value) for (t, kind), value in zip(done, values, strict=True)]

    # -- judging outcomes (the one place that decides: result, restart or raise) -------------
    def _judge(
        self, call: Call, seconds: float | None, resumable: bool, restart_late: bool = False
    ) -> list[Any]:
        """The values of `call`'s tickets, after restarting lost workers; or the error.

        A worker that died is restarted (with ``on_actor_failure="restart"``); one that is
        late only when `restart_late` (the vector env's own `timeout` ran out, not a shorter
        one given to this wait).
        """
        lost = [
            t
            for t in call.tickets
            if (t.outcome is None and restart_late) or (t.outcome is not None and t.outcome.died)
        ]
        if lost and self.pool.can_restart:
            self._replace(call, lost)
        failures = [t for t in call.tickets if t.outcome is not None and not t.outcome.ok]
        if failures:
            raise self._error(call, failures)
        late = sorted(i for t in call.tickets if t.outcome is None for i in t.envs)
        if late:
            again = (
                " The envs that answered keep their results: call `step_wait` again to wait longer."
                if resumable
                else " Their call is still running: the next call to them waits behind it."
            )
            raise TimeoutError(
                f"`{call.label}` timed out after {seconds} s: env(s) {late} did not answer."
                f"{again} Raise `timeout` if the env is slow, or close this vector env "
                "(`on_actor_failure='restart'` restarts such workers instead)."
            )
        return [t.outcome.value for t in call.tickets if t.outcome is not None]

    def _replace(self, call: Call, lost: list[Ticket]) -> None:
        """Restart the workers of `lost` tickets and give each ticket its replacement's answer."""
        retries = []
        for ticket in lost:
            if ticket.outcome is None:
                ticket.link.forget(ticket)
            why = "did not answer in time" if ticket.outcome is None else "died"
            self.pool.restart(ticket.slot, ticket.generation, call.label, why)
            slot = self.pool.slots[ticket.slot]
            retry = Ticket(ticket.slot, slot.generation, ticket.op, ticket.args, ticket.envs)
            slot.link.submit(retry)
            retries.append(retry)
        wait_tickets(retries, deadline_in(self.options.bound), len(retries))
        for ticket, retry in zip(lost, retries, strict=True):
            if retry.outcome is None or retry.outcome.died:
                error = retry.outcome.error if retry.outcome is not None else None
                raise EnvCrashedError(
                    ticket.envs[0],
                    call.label,
                    error or TimeoutError("the restarted worker did not answer"),
                    env_indices=ticket.envs,
                )
            ticket.outcome = retry.outcome

    def _error(self, call: Call, failures: list[Ticket]) -> RemoteEnvError:
        self.abandon(call)
        named: list[tuple[list[int], BaseException, bool]] = []
        for ticket in failures:
            assert ticket.outcome is not None
            error = ticket.outcome.error or RuntimeError("no error was reported")
            cause = getattr(error, "cause", None)
            envs = cause.env_indices if isinstance(cause, _EnvFailures) else list(ticket.envs)
            named.append((envs, error, ticket.outcome.died))
        first_envs, first_error, _ = named[0]
        kind = EnvCrashedError if any(died for _, _, died in named) else RemoteEnvError
        indices = [i for envs, _, _ in named for i in envs]
        error = kind(first_envs[0], call.label, first_error, env_indices=indices)
        error.__cause__ = first_error
        error.worker_results = {}  # what each worker answered, where it answered
        for ticket in call.tickets:
            outcome = ticket.outcome
            cause = getattr(outcome.error, "cause", None) if outcome is not None else None
            if outcome is not None and outcome.ok:  # copied: the next call reuses shared memory
                error.worker_results[ticket.slot] = ticket.link.detached(ticket.op, outcome.value)
            elif isinstance(cause, _EnvFailures) and cause.partial is not None:
                error.worker_results[ticket.slot] = cause.partial
        return error

    # -- shared memory --------------------------------------------------------------------------
    def share(self, observation_space: Any, action_space: Any) -> None:
        """Put the batched arrays of the workers on this node in shared memory, if covered."""
        self.pool.share(observation_space, action_space)

    def whole_batch(self, worker_observations: Sequence[Any]) -> Any:
        """The shared batched observation of all envs, if `worker_observations` are its rows.

        That is the case when every worker is on shared memory and each entry is what its
        link handed out for the last full step or reset; otherwise None (join them instead).
        """
        shared = self.pool.shared
        if shared is None:
            return None
        for slot, observations in zip(self.pool.slots, worker_observations, strict=True):
            views = getattr(slot.link, "views", None)
            if views is None or observations is not views.observations or not slot.link.idle:
                return None  # (a worker still busy with a call given up on may be writing)
        if self._whole is None:
            self._whole = shared.views(0, self.num_envs)
        return self._whole.observations

    # -- whole-pool operations ----------------------------------------------------------------
    def note_seeds(self, seeds: Sequence[int | None]) -> None:
        """Remember each env's last seed (restarted envs get one derived from it)."""
        for i, seed in enumerate(seeds):
            if seed is not None:
                self.pool.seeds[i] = seed

    def has_method(self, name: str) -> list[bool]:
        """Whether each env has a method `name` (asked once, then cached)."""
        if name not in self._has_method:
            answers = self.run("has_method", [(name,)] * len(self.pool.slots), "has_method")
            self._has_method[name] = [flag for answer in answers for flag in answer]
        return self._has_method[name]

    def node_ids(self) -> tuple[str, ...]:
        """The Ray node id of each env's worker, by env index."""
        nodes = self.run("node_id", [()] * len(self.pool.slots), "node_ids")
        return tuple(
            node for slot, node in zip(self.pool.slots, nodes, strict=True) for _ in slot.envs
        )

    def close(self, *, kill: bool = True) -> None:
        """Close every env, then kill the workers; bounded in time, idempotent.

        An env whose ``close`` fails or does not answer in time is logged and its worker
        killed anyway; with ``kill=False`` (the user keeps the actors) the failure is raised.
        """
        if self.closed:
            return
        self.closed = True
        if self.pending is not None:
            self.abandon(self.pending)
        self.pending, self.in_flight, self._whole = None, [], None
        if not ray.is_initialized():  # Ray is gone (e.g. at interpreter exit), and the actors
            self.pool.close_links()
            return
        try:
            tickets = []
            for w, slot in enumerate(self.pool.slots):
                ticket = Ticket(w, slot.generation, "close", (), tuple(slot.envs))
                slot.link.submit(ticket)
                tickets.append(ticket)
            wait_tickets(tickets, deadline_in(self._close_seconds), len(tickets))
            failed = [t for t in tickets if t.outcome is None or not t.outcome.ok]
            if failed:
                error = self._close_error(Call("close", "close", tickets), failed)
                if not kill:
                    raise error
                logger.warning("Killing the actors after a failed `close`: %s", error)
        finally:
            with deferred_interrupts():  # all or nothing: no worker left running
                if kill:
                    self.pool.kill()
                else:
                    self.pool.close_links()

    def _close_error(self, call: Call, failed: list[Ticket]) -> Exception:
        late = sorted(i for t in failed if t.outcome is None for i in t.envs)
        errors = [t for t in failed if t.outcome is not None]
        if errors:
            return self._error(call, errors)
        seconds = self._close_seconds
        return TimeoutError(f"`close` timed out after {seconds} s: env(s) {late} did not answer.")

    @property
    def _close_seconds(self) -> float:
        return min(self.options.bound, _CLOSE_S)
