"""Calls to workers: launch one operation per worker as a pickled message, wait for them all.

A call is launched on the workers it concerns (`Calls.launch`: all or nothing, even under
Ctrl-C) and waited for under one deadline (`Calls.wait`), which hands its outcomes to the one
place that judges them (`Failures.judge`, `failures.py`): the values, or a restart of a dead or
late worker, or one error. Every reset and every call that is not a step (`apply` of an env
method, `describe`, closing the envs) is launched here; a step only where the lanes cannot ring
it (`lanes.py`). Where the lanes read the answers (a step's or a reset's, while all is well),
they hand a step out without `Calls.wait`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray_multiprocess_env._engine.call_state import Call
from ray_multiprocess_env._engine.failures import Failures
from ray_multiprocess_env._engine.interrupts import deferred_interrupts
from ray_multiprocess_env._engine.pool import Pool
from ray_multiprocess_env._engine.results import EngineSpec
from ray_multiprocess_env._engine.transports.base import Ticket
from ray_multiprocess_env._engine.transports.waiting import wait_tickets
from ray_multiprocess_env._protocol import space_match
from ray_multiprocess_env.errors import SpacesMismatchError, env_list

__all__ = ["Calls"]


class Calls:
    """Launching and waiting on the calls to one pool's workers (judged by `failures`)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.failures = Failures(pool)

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
                self.failures.abandon(call)
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
            values = self.failures.judge(call, seconds, resumable, timeout is None, ends)
        except TimeoutError:
            if not resumable:
                self.failures.abandon(call)
            raise
        except BaseException:
            self.failures.abandon(call)
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
            return self.failures.error(Call("close", "close", failed), errors)
        late = env_list(sorted(i for t in failed for i in t.envs))
        return TimeoutError(f"`close` timed out after {seconds} s: env(s) {late} did not answer.")
