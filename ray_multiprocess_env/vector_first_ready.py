"""First-ready stepping of `RayVectorEnv`: envpool's ``send``/``recv``, RLlib's ``try_reset``.

An env is busy from `send` (or `async_reset`) until `recv` hands its result back; `recv`
returns as soon as at least ``batch_size`` envs are done. The engine keeps what is in flight;
this face hands out pfrl's per-env results.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._engine import Batch, Engine
from ray_multiprocess_env._engine.options import check_env_ids

__all__ = ["FirstReady"]


class FirstReady:
    """The first-ready methods of `RayVectorEnv` (which provides the attributes used here)."""

    _engine: Engine
    _last_obs: list[Any]
    _has_obs: np.ndarray

    @property
    def num_envs(self) -> int:
        """The number of envs."""
        return self._engine.spec.num_envs

    def _check_in_space(self, actions: Sequence[Any], env_ids: Iterable[int]) -> None:
        raise NotImplementedError  # pragma: no cover - `RayVectorEnv` defines it

    def _fields(self, batch: Batch, reset: bool = False) -> tuple[Any, ...]:
        raise NotImplementedError  # pragma: no cover - `RayVectorEnv` defines it

    def _action_batch(self, actions: Sequence[Any]) -> Any:
        raise NotImplementedError  # pragma: no cover - `RayVectorEnv` defines it

    @staticmethod
    def _observations(batch: Batch, fields: tuple[Any, ...]) -> tuple[Any, ...]:
        raise NotImplementedError  # pragma: no cover - `RayVectorEnv` defines it

    def async_reset(self) -> None:
        """Reset every env without waiting; `recv` then returns them as they finish."""
        self._engine.async_reset()

    def send(self, actions: Sequence[Any], env_ids: Sequence[int]) -> None:
        """Step the envs `env_ids` with `actions` (one each) without waiting for them.

        Raises:
            ValueError: If an env id is out of range, repeated, or has a call in flight
                (`recv` its result first), or `actions` and `env_ids` differ in length.
        """
        env_ids = check_env_ids(env_ids, self.num_envs)
        if len(actions) != len(env_ids):
            raise ValueError(
                f"`actions` has {len(actions)} entries but `env_ids` has {len(env_ids)}; "
                "pass one action per env id."
            )
        self._check_in_space(actions, env_ids)
        self._engine.send(self._action_batch(actions), env_ids)

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
        batch = self._engine.recv(batch_size, timeout)
        assert batch.env_ids is not None
        env_ids = batch.env_ids.tolist()
        fields = self._fields(batch)
        for env, obs in zip(env_ids, self._observations(batch, fields), strict=True):
            self._last_obs[env] = obs
        self._has_obs[env_ids] = True
        return env_ids, fields

    def reset_env(self, env_id: int, **kwargs: Any) -> Any:
        """Reset one env now, while others may be in flight (RLlib's ``try_reset``).

        Args:
            env_id: The env to reset; it must not have a call in flight.
            **kwargs: The env's ``reset`` arguments: ``seed=`` and ``options=``.

        Returns:
            What the env's ``reset`` returns.
        """
        (env,) = check_env_ids([env_id], self.num_envs, argument="env_id")
        mask = np.zeros(self.num_envs, dtype=np.bool_)
        mask[env] = True
        seeds: list[Any] = [None] * self.num_envs
        seeds[env] = kwargs.pop("seed", None)
        options = kwargs.pop("options", None)
        if kwargs:
            raise TypeError(
                f"`reset_env` got {sorted(kwargs)}; it passes only `seed` and `options` to the "
                "env's `reset`."
            )
        per_env = None if options is None else [options] * self.num_envs
        batch = self._engine.reset(seeds, per_env, mask, label="reset_env", in_flight_ok=True)
        if batch.rows is not None:
            result = batch.rows[env]
        else:
            observations, infos = self._fields(batch, reset=True)
            result = observations[env] if batch.old_api else (observations[env], infos[env])
        self._last_obs[env] = result[0] if isinstance(result, tuple) else result
        self._has_obs[env] = True
        return result
