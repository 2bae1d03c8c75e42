"""The fan-out engine: one remote call per actor, one wait, results back in env order.

`FanOut` is how `RayVectorEnv` (and through it every adapter) talks to its actors. An actor
holds one env (a plain actor, called directly) or several (an `EnvWorker`, called through its
``apply`` method); either way callers speak in env indices ``0..num_envs-1``. Every wait has the
vector env's timeout, and every failure is raised as the project's error naming the env indices
and the method, chained to Ray's error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, NoReturn

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from ray_multiprocess_env.channel import ChannelError, DriverEnd, pipes_supported, wait_readable
from ray_multiprocess_env.errors import EnvCrashedError, RemoteEnvError, _EnvFailures

__all__ = ["TRANSPORTS", "ActorGroup", "Call", "FanOut", "user_name"]

logger = logging.getLogger(__name__)

#: The values of the vector envs' `transport` argument.
TRANSPORTS = ("auto", "ray")

#: Seconds a failed call waits for its other actors before raising (bounded by ``timeout``).
_ERROR_GRACE_S = 10.0


def user_name(method: str) -> str:
    """The name users know a worker method by, for messages (``step_batch`` is ``step``)."""
    return method.removesuffix("_batch")


class ActorGroup(NamedTuple):
    """One actor and the envs ``start..stop-1`` it holds.

    A plain actor (``batched=False``) holds one env and is called directly; an `EnvWorker`
    (``batched=True``) holds several and is called through its ``apply`` method.
    """

    actor: ActorHandle[Any]
    start: int
    stop: int
    batched: bool


class Call(NamedTuple):
    """One remote call: ``groups[group].actor.<method>.remote(*args, **kwargs)``."""

    group: int
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = MappingProxyType({})


class _Piped(NamedTuple):
    """Stands in for a Ray object ref: a ``step_batch`` sent over group `group`'s pipe."""

    group: int


class FanOut:
    """Launches calls on a fixed list of actor groups and gathers their results.

    Full ``step_batch`` calls to workers on the driver's node go over pipes once
    `use_pipes` has opened them (see `channel.py`); every other call is a Ray actor call.

    Args:
        groups: The actors, in env order; their env ranges tile ``0..num_envs-1``.
        timeout: Seconds to wait for all results of one call, or None.
        recover: If given, called as ``recover(label, call)`` for each call whose actor died;
            it restarts the actor and returns the call's result (the restart policy). Env
            exceptions are raised all the same. With it, `replace` (set by the vector env)
            restarts the actors that outlive a timeout.
    """

    def __init__(
        self,
        groups: list[ActorGroup],
        timeout: float | None,
        recover: Callable[[str, Call], Any] | None = None,
    ) -> None:
        self.groups = groups  # shared with the vector env: a restarted actor replaces its entry
        self.num_envs = self.groups[-1].stop
        self.timeout = timeout
        self.recover = recover
        self.replace: Callable[[int], None] | None = None
        self._has_method: dict[str, list[bool]] = {}
        self._pipes: dict[int, DriverEnd] = {}
        self._piped = False
        self._tried: set[int] = set()  # groups whose pipes were opened (or found impossible)

    # -- the pipe transport -------------------------------------------------------------------
    def use_pipes(self) -> None:
        """Send full steps over pipes to workers on the driver's node, where there are pipes.

        Each worker's pipes are opened at its first full step, so vector envs that never step
        a whole worker at once (the pfrl-style per-env calls, `RemoteEnv`) never open any.
        """
        self._piped = pipes_supported()

    def reopen(self, g: int) -> None:
        """Forget group `g`'s pipes after its worker was restarted; its next step opens new ones."""
        self.close_pipe(g)
        self._tried.discard(g)

    def _open_pipe(self, g: int) -> None:
        self._tried.add(g)
        group = self.groups[g]
        if not group.batched:
            return
        here = ray.get_runtime_context().get_node_id()
        try:
            if ray.get(group.actor.node_id.remote(), timeout=self.timeout) == here:
                self._pipes[g] = DriverEnd(group.actor, self.timeout)
        except (OSError, RayError, TimeoutError) as err:
            logger.warning(
                "Envs %s use Ray calls: their pipes could not be opened (%s).",
                list(range(group.start, group.stop)),
                err,
            )

    def close_pipe(self, g: int) -> None:
        """Close group `g`'s pipes, if any; its calls go over Ray from now on."""
        end = self._pipes.pop(g, None)
        if end is not None:
            end.close()

    def close_pipes(self) -> None:
        """Close every pipe (the vector env is closing)."""
        self._piped = False
        for g in list(self._pipes):
            self.close_pipe(g)

    @property
    def piped_groups(self) -> list[int]:
        """The groups whose full steps go over pipes (opened at each worker's first step)."""
        return sorted(self._pipes)

    def per_env(
        self,
        label: str,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[Mapping[str, Any]] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[Any]:
        """Call `method` on each env whose args are not None; one result per env (None if not)."""
        calls = self.per_env_calls(method, args_per_env, kwargs_per_env)
        return self.per_env_results(calls, self.run(label, calls, timeout=timeout))

    def per_env_calls(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Call]:
        """The calls that run `method` on each env whose args are not None (one per actor)."""
        kwargs_per_env = kwargs_per_env or [{}] * self.num_envs
        calls = []
        for g, group in enumerate(self.groups):
            envs = range(group.start, group.stop)
            if all(args_per_env[i] is None for i in envs):
                continue
            if group.batched:
                env_args = [args_per_env[i] for i in envs]
                env_kwargs = [kwargs_per_env[i] for i in envs]
                calls.append(self.apply_call(g, method, env_args, env_kwargs))
            else:
                args = args_per_env[group.start]
                assert args is not None
                calls.append(Call(g, method, args, kwargs_per_env[group.start]))
        return calls

    def per_actor(self, method: str, args_per_actor: Sequence[tuple[Any, ...] | None]) -> list[Any]:
        """Call `method` once per actor whose args are not None; one result per actor."""
        calls = [Call(g, method, a) for g, a in enumerate(args_per_actor) if a is not None]
        results: list[Any] = [None] * len(self.groups)
        for call, result in zip(calls, self.run(user_name(method), calls), strict=True):
            results[call.group] = result
        return results

    @staticmethod
    def apply_call(
        group: int,
        method: str,
        args: Sequence[tuple[Any, ...] | None],
        kwargs: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    ) -> Call:
        """The call that runs `method` on each env of a worker (`EnvWorker.apply`)."""
        if isinstance(kwargs, Mapping):
            kwargs = [kwargs] * len(args)
        return Call(group, "apply", (method, list(args), [dict(k) for k in kwargs]))

    def per_env_results(self, calls: Sequence[Call], results: Sequence[Any]) -> list[Any]:
        """Spread the results of per-env `calls` to one entry per env (None where not called)."""
        out: list[Any] = [None] * self.num_envs
        for call, result in zip(calls, results, strict=True):
            group = self.groups[call.group]
            if group.batched:
                out[group.start : group.stop] = result
            else:
                out[group.start] = result
        return out

    def env_has_method(self, name: str) -> list[bool]:
        """Whether each env has a method `name` (asked of the workers once, then cached)."""
        if name not in self._has_method:
            calls = [
                Call(g, "has_method", (name,))
                for g, group in enumerate(self.groups)
                if group.batched
            ]
            answers = iter(self.run("has_method", calls))
            has: list[bool] = []
            for group in self.groups:
                has.extend(next(answers) if group.batched else [hasattr(group.actor, name)])
            self._has_method[name] = has
        return self._has_method[name]

    def run(self, label: str, calls: Sequence[Call], *, timeout: float | None = None) -> list[Any]:
        """Launch every call, wait once, and return the results in call order.

        Raises:
            TimeoutError: If the results are not all in after the timeout; names the envs.
            RemoteEnvError: If an env raised; `EnvCrashedError` if an actor died.
        """
        return self.gather(label, calls, self.launch(calls), timeout=timeout)

    def launch(self, calls: Sequence[Call]) -> list[Any]:
        """Submit every call without waiting; one Ray object ref per call."""
        return [self._submit(call) for call in calls]

    def gather(
        self, label: str, calls: Sequence[Call], refs: list[Any], *, timeout: float | None = None
    ) -> list[Any]:
        """Wait for the `refs` of launched `calls` and return their results, as `run` does."""
        timeout = self.timeout if timeout is None else timeout
        piped = [i for i, ref in enumerate(refs) if isinstance(ref, _Piped)]
        if not piped:
            return self._gather_ray(label, calls, refs, timeout)
        results: list[Any] = [None] * len(refs)
        replies = self._gather_pipes(label, [calls[i] for i in piped], timeout)
        for i, result in zip(piped, replies, strict=True):
            results[i] = result
        rest = [i for i in range(len(refs)) if not isinstance(refs[i], _Piped)]
        gathered = self._gather_ray(
            label, [calls[i] for i in rest], [refs[i] for i in rest], timeout
        )
        for i, result in zip(rest, gathered, strict=True):
            results[i] = result
        return results

    def _gather_pipes(self, label: str, calls: Sequence[Call], timeout: float | None) -> list[Any]:
        """The replies to steps sent over pipes; errors and timeouts as for Ray calls."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = {call.group: k for k, call in enumerate(calls)}
        replies: list[Any] = [None] * len(calls)
        for g in [g for g in waiting if g not in self._pipes]:  # closed since (worker died)
            replies[waiting.pop(g)] = (False, self._death(g))
        while waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait_readable([self._pipes[g] for g in waiting], left)
            if not ready:
                late = sorted(g for g in waiting)
                self._time_out(
                    label, timeout, [i for g in late for i in self.envs_of(calls[waiting[g]])], late
                )
            for end in ready:
                g = next(g for g in waiting if self._pipes[g] is end)
                k = waiting.pop(g)
                try:
                    replies[k] = end.receive()
                except EOFError:
                    self.close_pipe(g)
                    replies[k] = (False, self._death(g))
        results: list[Any] = [None] * len(calls)
        failures: list[tuple[int, list[int], BaseException]] = []
        for k, (call, (ok, value)) in enumerate(zip(calls, replies, strict=True)):
            if ok:
                results[k] = value
            elif isinstance(value, BaseException):  # from `_death`
                failures.append((k, list(self.envs_of(call)), value))
            else:
                error, text = value
                envs = (
                    error.env_indices
                    if isinstance(error, _EnvFailures)
                    else list(self.envs_of(call))
                )
                failures.append((k, envs, ChannelError(error, text)))
        if failures:
            crashed = {k for k, _, error in failures if isinstance(error, RayActorError)}
            if self.recover is None or len(crashed) < len(failures):
                first = failures[0][2]
                raise self._remote_error(label, calls, failures, first) from first
            recover = self.recover
            for k in sorted(crashed):
                results[k] = recover(label, calls[k])
        return results

    def _death(self, g: int) -> BaseException:
        """Ray's error for group `g`'s worker, whose pipe closed (Ray confirms it died)."""
        grace = _ERROR_GRACE_S if self.timeout is None else min(self.timeout, _ERROR_GRACE_S)
        try:
            ray.get(self.groups[g].actor.pid.remote(), timeout=grace)
        except RayError as err:
            return err
        return RuntimeError("the worker closed its pipe but still answers Ray calls")

    def _settle(self, g: int) -> None:
        """Wait for the reply to group `g`'s step in flight and keep it for its `gather`."""
        end = self._pipes[g]
        if not wait_readable([end], self.timeout):
            self._time_out("step", self.timeout, list(self.envs_of(Call(g, "step_batch"))), [g])
        try:
            end.stash = end.receive()
        except EOFError:
            self.close_pipe(g)  # the call about to be made finds the dead worker

    def _time_out(
        self, label: str, timeout: float | None, late: list[int], groups: Sequence[int]
    ) -> NoReturn:
        if self.replace is None:
            raise TimeoutError(
                f"`{label}` timed out after {timeout} s: env(s) {late} did not answer. "
                "Raise `timeout` if the env is slow, or close this vector env."
            )
        for group in sorted(groups):
            self.replace(group)
        raise TimeoutError(
            f"`{label}` timed out after {timeout} s: env(s) {late} did not answer. Their "
            "worker(s) were restarted and those envs reset (on_actor_failure='restart'): "
            "treat their episodes as truncated; the vector env can be used again."
        )

    def _gather_ray(
        self, label: str, calls: Sequence[Call], refs: list[Any], timeout: float | None
    ) -> list[Any]:
        if not refs:
            return []
        try:
            return list(ray.get(refs, timeout=timeout))
        except GetTimeoutError as err:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            late = [
                i
                for call, ref in zip(calls, refs, strict=True)
                if ref not in ready
                for i in self.envs_of(call)
            ]
            groups = {c.group for c, r in zip(calls, refs, strict=True) if r not in ready}
            try:
                self._time_out(label, timeout, late, sorted(groups))
            except TimeoutError as timed_out:
                raise timed_out from err
        except RayError as err:
            failures = self._failures(calls, refs)
            crashed = {i for i, _, error in failures if isinstance(error, RayActorError)}
            if self.recover is None or not crashed or len(crashed) < len(failures):
                raise self._remote_error(label, calls, failures, err) from err
        results = []
        for i, (call, ref) in enumerate(zip(calls, refs, strict=True)):
            results.append(
                self.recover(label, call) if i in crashed else ray.get(ref, timeout=timeout)
            )
        return results

    def _submit(self, call: Call) -> Any:
        group = self.groups[call.group]
        full_step = call.method == "step_batch" and len(call.args) == 1 and not call.kwargs
        if full_step and self._piped and call.group not in self._tried:
            self._open_pipe(call.group)
        end = self._pipes.get(call.group)
        if end is not None:
            if end.outstanding is not None:
                self._settle(call.group)  # keep the order: that step runs before this call
            if full_step:
                try:
                    end.send(call.args[0])
                    return _Piped(call.group)
                except OSError:  # the worker is gone: the Ray call below finds out how
                    self.close_pipe(call.group)
        try:
            return getattr(group.actor, call.method).remote(*call.args, **call.kwargs)
        except TypeError as err:  # Ray checks the arguments against the method's signature
            hint = (
                " Its actor has no `seed` method and its `reset` takes no `seed`: add a "
                "`seed(seed)` method or a `reset(seed=None)` to the actor class, or do not seed."
                if call.method == "reset" and "seed" in call.kwargs
                else ""
            )
            raise TypeError(
                f"env {group.start}: `{call.method}` does not accept these arguments ({err}).{hint}"
            ) from err

    def first_ready(
        self,
        label: str,
        refs: Sequence[Any],
        envs: Sequence[Sequence[int]],
        min_envs: int,
        timeout: float | None,
    ) -> list[int]:
        """Wait until the finished `refs` cover at least `min_envs` envs; their positions.

        `envs[i]` are the env indices whose results `refs[i]` carries. Everything already
        finished is included, so more than `min_envs` envs may come back.

        Raises:
            TimeoutError: If `min_envs` are not covered within `timeout` seconds; names the
                envs still out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(range(len(refs)))
        done: list[int] = []
        covered = 0
        while pending and covered < min_envs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait([refs[i] for i in pending], num_returns=1, timeout=left)
            if not ready:
                late = sorted(e for i in pending for e in envs[i])
                raise TimeoutError(
                    f"`{label}` timed out after {timeout} s: env(s) {late} did not answer. "
                    "Raise `timeout` if the env is slow, or close this vector env."
                )
            finished, _ = ray.wait([refs[i] for i in pending], num_returns=len(pending), timeout=0)
            finished_refs = {*ready, *finished}
            for i in [i for i in pending if refs[i] in finished_refs]:
                pending.remove(i)
                done.append(i)
                covered += len(envs[i])
        return done

    def envs_of(self, call: Call) -> range:
        """The env indices held by the actor `call` goes to."""
        group = self.groups[call.group]
        return range(group.start, group.stop)

    def _failures(
        self, calls: Sequence[Call], refs: list[Any]
    ) -> list[tuple[int, list[int], BaseException]]:
        """``(call position, env indices, error)`` for each call of a failed wait that raised."""
        # Give the other calls a bounded moment to finish, so every failure of this call is
        # named and no env is still busy with it when the error reaches the user.
        grace = _ERROR_GRACE_S if self.timeout is None else min(self.timeout, _ERROR_GRACE_S)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=grace)
        failed: list[tuple[int, list[int], BaseException]] = []
        for i, (call, ref) in enumerate(zip(calls, refs, strict=True)):
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except RayError as error:
                    cause = getattr(error, "cause", None)
                    envs = (
                        cause.env_indices
                        if isinstance(cause, _EnvFailures)
                        else list(self.envs_of(call))
                    )
                    failed.append((i, envs, error))
        return failed

    def _remote_error(
        self,
        label: str,
        calls: Sequence[Call],
        failures: list[tuple[int, list[int], BaseException]],
        err: BaseException,
    ) -> RemoteEnvError:
        failed = [(envs, error) for _, envs, error in failures]
        if not failed:  # pragma: no cover - the failure that raised is always among them
            failed = [(list(self.envs_of(calls[0])), err)]
        first_envs, first_error = failed[0]
        kind = EnvCrashedError if isinstance(first_error, RayActorError) else RemoteEnvError
        indices = [i for envs, _ in failed for i in envs]
        return kind(first_envs[0], label, first_error, env_indices=indices)
