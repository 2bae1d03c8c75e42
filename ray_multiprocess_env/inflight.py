"""Calls in flight for the first-ready API (`send`/`recv`) of `RayVectorEnv`.

Each launched call carries the envs whose results it will return and what it is (a step or a
reset). `recv` waits for the first calls to finish, takes them out of flight, and hands back
one result per env; an env is busy from `send` until its result is received.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ray_multiprocess_env.fanout import Call, FanOut

__all__ = ["InFlight"]


class _Entry(NamedTuple):
    call: Call
    ref: Any
    envs: tuple[int, ...]
    op: str


class InFlight:
    """The launched, not yet received calls of one vector env."""

    def __init__(self, fanout: FanOut) -> None:
        self._fanout = fanout
        self._entries: list[_Entry] = []
        self._busy: set[int] = set()

    def __len__(self) -> int:
        """The number of envs with a result still to receive."""
        return len(self._busy)

    def busy(self, env: int) -> bool:
        """Whether `env` has a call in flight."""
        return env in self._busy

    @property
    def envs(self) -> list[int]:
        """The envs with a call in flight, sorted."""
        return sorted(self._busy)

    def launch(
        self,
        op: str,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Launch `method` on the envs whose args are not None, without waiting."""
        calls = self._fanout.per_env_calls(method, args_per_env, kwargs_per_env)
        envs = [
            tuple(i for i in self._fanout.envs_of(call) if args_per_env[i] is not None)
            for call in calls
        ]
        self.launch_calls(op, calls, envs)

    def launch_calls(self, op: str, calls: Sequence[Call], envs: Sequence[Sequence[int]]) -> None:
        """Launch prepared `calls` without waiting; ``envs[i]`` are the envs call i answers for."""
        for call, ref, call_envs in zip(calls, self._fanout.launch(calls), envs, strict=True):
            self._entries.append(_Entry(call, ref, tuple(call_envs), op))
            self._busy.update(call_envs)

    def receive(
        self, label: str, min_envs: int, timeout: float | None
    ) -> list[tuple[int, str, Any]]:
        """Wait for calls covering at least `min_envs` envs; ``(env, op, result)`` by env."""
        out: list[tuple[int, str, Any]] = []
        for call, envs, op, result in self.receive_calls(label, min_envs, timeout):
            per_env = self._fanout.per_env_results([call], [result])
            out.extend((env, op, per_env[env]) for env in envs)
        return sorted(out, key=lambda item: item[0])

    def receive_calls(
        self, label: str, min_envs: int, timeout: float | None
    ) -> list[tuple[Call, tuple[int, ...], str, Any]]:
        """Wait for calls covering at least `min_envs` envs; ``(call, envs, op, result)`` each.

        The finished calls leave flight even if one of them failed (the error then names the
        env and is raised).
        """
        positions = self._fanout.first_ready(
            label,
            [e.ref for e in self._entries],
            [e.envs for e in self._entries],
            min_envs,
            timeout if timeout is not None else self._fanout.timeout,
        )
        ready = [self._entries[i] for i in positions]
        self._entries = [e for i, e in enumerate(self._entries) if i not in set(positions)]
        for entry in ready:
            self._busy.difference_update(entry.envs)
        results = self._fanout.gather(label, [e.call for e in ready], [e.ref for e in ready])
        return [(e.call, e.envs, e.op, r) for e, r in zip(ready, results, strict=True)]
