"""What builds gymnasium-facing envs: `make_vector_env`, `vector_entry_point`, `RemoteEnv`."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env._engine.options import check_positive_int
from ray_multiprocess_env.integrations.gymnasium import GymnasiumVectorEnv
from ray_multiprocess_env.vector import RayVectorEnv

__all__ = ["RemoteEnv", "make_vector_env", "vector_entry_point"]


def make_vector_env(
    make_env: Callable[[int], gym.Env[Any, Any]],
    num_workers: int,
    envs_per_worker: int,
    *,
    seed: int | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    actor_options: Mapping[str, Any] | None = None,
    placement: Any = None,
    timeout: float | None = None,
    on_actor_failure: str = "raise",
    transport: str | None = None,
    check_actions: bool = False,
    copy: bool = True,
) -> GymnasiumVectorEnv:
    """Make ``num_workers * envs_per_worker`` envs in Ray workers, as one gymnasium vector env.

    Args:
        make_env: Called as ``make_env(index)`` inside a worker, with the env's global index
            ``0..num_envs-1``; returns a gymnasium env. Must be picklable.
        num_workers: How many worker actors (Ray processes).
        envs_per_worker: How many envs each worker steps per call.
        seed: If given, env ``i`` is seeded ``seed + i`` at the first `reset` (no two envs
            share a seed).
        autoreset_mode: ``"next_step"``, ``"same_step"`` or ``"disabled"``.
        actor_options: Options for `ray.remote` of each worker (``num_cpus``, ...).
        placement: As for `GymnasiumVectorEnv`, e.g. ``"SPREAD"`` over a cluster's nodes.
        timeout: Seconds to wait for any one call, or None.
        on_actor_failure: ``"raise"`` or ``"restart"``, as for `GymnasiumVectorEnv`.
        transport: ``"auto"``, ``"pipe"`` or ``"ray"``, as for `GymnasiumVectorEnv`.
        check_actions: As for `GymnasiumVectorEnv`.
        copy: As for `GymnasiumVectorEnv` (False: observations are a view of shared memory).

    Example:
        >>> import gymnasium as gym
        >>> def make_env(index):
        ...     return gym.make("CartPole-v1")
        >>> envs = make_vector_env(make_env, num_workers=2, envs_per_worker=3, seed=0)
        >>> obs, infos = envs.reset()
        >>> obs.shape, envs.num_envs
        ((6, 4), 6)
        >>> envs.close()
    """
    if not callable(make_env):
        raise TypeError(
            f"`make_env` must be a callable taking the env index, got {make_env!r}; e.g. "
            "`make_vector_env(lambda i: gymnasium.make('CartPole-v1'), 2, 8)`."
        )
    num_workers = check_positive_int("num_workers", num_workers)
    envs_per_worker = check_positive_int("envs_per_worker", envs_per_worker)
    env_fns = [functools.partial(make_env, i) for i in range(num_workers * envs_per_worker)]
    return GymnasiumVectorEnv(
        env_fns,
        envs_per_worker=envs_per_worker,
        autoreset_mode=autoreset_mode,
        actor_options=actor_options,
        placement=placement,
        timeout=timeout,
        seed=seed,
        on_actor_failure=on_actor_failure,
        transport=transport,
        check_actions=check_actions,
        copy=copy,
    )


def vector_entry_point(
    num_envs: int,
    *,
    env_id: str,
    envs_per_worker: int | None = None,
    num_workers: int | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    actor_options: Mapping[str, Any] | None = None,
    placement: Any = None,
    timeout: float | None = None,
    on_actor_failure: str = "raise",
    transport: str | None = None,
    seed: int | None = None,
    copy: bool = True,
    **env_kwargs: Any,
) -> GymnasiumVectorEnv:
    """Gymnasium's ``vector_entry_point`` for Ray vector envs of a registered env id.

    Register an id with it and `gymnasium.make_vec` returns a `GymnasiumVectorEnv`::

        gymnasium.register(
            "RayCartPole-v1",
            vector_entry_point="ray_multiprocess_env:vector_entry_point",
            kwargs={"env_id": "CartPole-v1", "envs_per_worker": 4},
        )
        envs = gymnasium.make_vec("RayCartPole-v1", num_envs=8,
                                  vectorization_mode="vector_entry_point")

    Args:
        num_envs: The number of envs (given by `gymnasium.make_vec`).
        env_id: The id of the single env, made with ``gymnasium.make(env_id, **env_kwargs)``.
        envs_per_worker: Envs per worker actor; by default ``num_envs / num_workers``.
        num_workers: Worker actors, used when `envs_per_worker` is not given (default 2).
        autoreset_mode: As for `GymnasiumVectorEnv`.
        actor_options: As for `GymnasiumVectorEnv`.
        placement: As for `GymnasiumVectorEnv`.
        timeout: As for `GymnasiumVectorEnv`.
        on_actor_failure: As for `GymnasiumVectorEnv`.
        transport: As for `GymnasiumVectorEnv`.
        seed: As for `GymnasiumVectorEnv`.
        copy: As for `GymnasiumVectorEnv`.
        **env_kwargs: Keyword arguments of ``gymnasium.make`` for each env.
    """
    if envs_per_worker is None:
        envs_per_worker = max(1, math.ceil(num_envs / (num_workers or 2)))
    env_fn = functools.partial(gym.make, env_id, **env_kwargs)
    return GymnasiumVectorEnv(
        [env_fn] * num_envs,
        envs_per_worker=envs_per_worker,
        autoreset_mode=autoreset_mode,
        actor_options=actor_options,
        placement=placement,
        timeout=timeout,
        on_actor_failure=on_actor_failure,
        transport=transport,
        seed=seed,
        copy=copy,
    )


class RemoteEnv(gym.Env[Any, Any]):
    """One env in a Ray actor, seen as a plain `gymnasium.Env` (e.g. for gymnasium's checker).

    Args:
        env_fn: A picklable factory of the env, called inside the actor.
        actor_options: Options for `ray.remote` of the actor.
        timeout: Seconds to wait for any one call, or None.
        transport: As for `GymnasiumVectorEnv`.

    Example:
        >>> import gymnasium as gym
        >>> env = RemoteEnv(lambda: gym.make("CartPole-v1"))
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(0)
        >>> env.close()
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env[Any, Any]],
        *,
        actor_options: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        transport: str | None = None,
    ) -> None:
        self._vec = RayVectorEnv.from_env_fns(
            [env_fn], actor_options=actor_options, timeout=timeout, transport=transport
        )
        self.observation_space = self._vec.observation_space
        self.action_space = self._vec.action_space
        self.metadata = self._vec.get_attr("metadata")[0]
        self.render_mode = self._vec.get_attr("render_mode")[0]
        self.spec = self._vec.spec

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the remote env."""
        super().reset(seed=seed)
        result: tuple[Any, dict[str, Any]] = self._vec.call_each(
            "reset", [()], seed=seed, options=options
        )[0]
        return result

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the remote env."""
        result: tuple[Any, SupportsFloat, bool, bool, dict[str, Any]] = self._vec.call_each(
            "step", [(action,)]
        )[0]
        return result

    def render(self) -> Any:
        """Render the remote env."""
        return self._vec.call("render")[0]

    def close(self) -> None:
        """Close the remote env and kill its actor."""
        self._vec.close()
