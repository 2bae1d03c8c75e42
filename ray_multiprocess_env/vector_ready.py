"""First-ready stepping of `RayVectorEnv`: envpool's ``send``/``recv``, RLlib's ``try_reset``.

An env is busy from `send` (or `async_reset`) until `recv` hands its result back; `recv`
returns as soon as at least ``batch_size`` envs are done. The tickets in flight are the engine's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ray_multiprocess_env._engine import Engine
from ray_multiprocess_env._engine.options import check_env_ids
from ray_multiprocess_env.batch import unzip
from ray_multiprocess_env.compat import is_obs_and_info, reset_obs

__all__ = ["FirstReady"]


class FirstReady:
    """The first-ready methods of `RayVectorEnv` (which provides the attributes used here)."""

    _engine: Engine
    _last_obs: list[Any]
    _next_seeds: list[int | None]

    @property
    def num_envs(self) -> int:
        """The number of envs."""
        return self._engine.num_envs

    def _check_in_space(self, actions: Sequence[Any], env_ids: Iterable[int]) -> None:
        raise NotImplementedError  # pragma: no cover - `RayVectorEnv` defines it

    def async_reset(self) -> None:
        """Reset every env without waiting; `recv` then returns them as they finish."""
        self._engine.check_idle("async_reset")
        seeds = self._next_seeds
        kwargs = [{} if s is None else {"seed": s} for s in seeds]
        args = self._engine.apply_args("reset", [()] * self.num_envs, kwargs)
        self._engine.send(self._engine.launch("apply", args, "async_reset"), "reset")
        self._next_seeds = [None] * self.num_envs
        self._engine.note_seeds(seeds)

    def send(self, actions: Sequence[Any], env_ids: Sequence[int]) -> None:
        """Step the envs `env_ids` with `actions` (one each) without waiting for them.

        Raises:
            ValueError: If an env id is out of range, repeated, or has a call in flight
                (`recv` its result first), or `actions` and `env_ids` differ in length.
        """
        engine = self._engine
        engine.check_idle("send", in_flight_ok=True)
        env_ids = check_env_ids(env_ids, self.num_envs)
        if len(actions) != len(env_ids):
            raise ValueError(
                f"`actions` has {len(actions)} entries but `env_ids` has {len(env_ids)}; "
                "pass one action per env id."
            )
        engine.check_not_busy(env_ids, "sending it another action")
        self._check_in_space(actions, env_ids)
        per_env: list[tuple[Any, ...] | None] = [None] * self.num_envs
        for env, action in zip(env_ids, actions, strict=True):
            per_env[env] = (action,)
        envs = [[i for i in range(a, b) if per_env[i] is not None] for a, b in engine.bounds]
        engine.send(
            engine.launch("apply", engine.apply_args("step", per_env), "send", envs), "step"
        )

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[list[int], tuple[Any, ...]]:
        """Receive the results of the first envs to finish what `send`/`async_reset` started.

        Args:
            batch_size: Wait until at least this many envs have finished (all envs of an actor
                finish together, so more may come back); None waits for every env in flight.
            timeout: Seconds to wait; None uses the vector env's `timeout`. On expiry a
                `TimeoutError` names the envs that did not answer; they stay in flight.

        Returns:
            ``(env_ids, results)``: the env ids in ascending order and their results unzipped as
            `step` returns them. An env coming back from `async_reset` looks like a step with
            reward 0 and not done: ``(obs, 0.0, False, False, info)`` for gymnasium envs,
            ``(obs, 0.0, False, {})`` for old-gym envs.
        """
        received = []
        for ticket, kind, values in self._engine.first_ready(
            self._engine.recv_size(batch_size), timeout
        ):
            start = self._engine.pool.slots[ticket.slot].start
            for env in ticket.envs:
                result = values[env - start]
                received.append((env, _reset_as_step(result) if kind == "reset" else result))
        received.sort(key=lambda item: item[0])
        for env, result in received:
            self._last_obs[env] = result[0] if isinstance(result, tuple) else result
        return [env for env, _ in received], unzip([result for _, result in received])

    def reset_env(self, env_id: int, **kwargs: Any) -> Any:
        """Reset one env now, while others may be in flight (RLlib's ``try_reset``).

        Args:
            env_id: The env to reset; it must not have a call in flight.
            **kwargs: Passed to the env's ``reset`` (e.g. ``seed=``, ``options=``).

        Returns:
            What the env's ``reset`` returns.
        """
        engine = self._engine
        engine.check_idle("reset_env", in_flight_ok=True)
        (env,) = check_env_ids([env_id], self.num_envs, argument="env_id")
        engine.check_not_busy([env], "resetting it")
        args: list[tuple[Any, ...] | None] = [None] * self.num_envs
        args[env] = ()
        kwargs_per_env = [dict(kwargs)] * self.num_envs
        if self._next_seeds[env] is not None and "seed" not in kwargs:
            kwargs_per_env[env] = {**kwargs, "seed": self._next_seeds[env]}
        result = engine.apply("reset", args, kwargs_per_env)[env]
        self._next_seeds[env] = None
        self._last_obs[env] = reset_obs(result)
        return result


def _reset_as_step(result: Any) -> tuple[Any, ...]:
    if is_obs_and_info(result):
        return (result[0], 0.0, False, False, result[1])
    return (result, 0.0, False, {})
