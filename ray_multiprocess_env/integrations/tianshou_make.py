"""`make_tianshou_vector_env`: a Tianshou vector env of envs made in Ray workers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from ray_multiprocess_env._engine.options import DEFAULT_MAX_RESTARTS
from ray_multiprocess_env.env_factories import env_factories
from ray_multiprocess_env.integrations.tianshou import TianshouVectorEnv
from ray_multiprocess_env.runtime import ray_cpus

__all__ = ["make_tianshou_vector_env"]


def make_tianshou_vector_env(
    env: str | Callable[..., gym.Env[Any, Any]],
    num_envs: int | None = None,
    *,
    num_workers: int | None = None,
    envs_per_worker: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]] | None = None,
    seed: int | np.random.SeedSequence | None = None,
    wait_num: int | None = None,
    wait_timeout: float | None = None,
    actor_options: Mapping[str, Any] | None = None,
    placement: Any = None,
    timeout: float | None = None,
    on_actor_failure: str = "raise",
    transport: str | None = None,
    on_env_error: str = "raise",
    max_restarts: int | None = DEFAULT_MAX_RESTARTS,
) -> TianshouVectorEnv:
    """Envs in Ray workers as one Tianshou vector env: ``make_tianshou_vector_env("Ant-v5", 8)``.

    `env`, the counts, `env_kwargs` and `wrappers` are as for `make_vector_env`; with `seed`,
    env ``i`` is seeded (and reset) with ``seed + i`` at once, as Tianshou's ``envs.seed(seed)``
    does (a `numpy.random.SeedSequence`: independent seeds). `wait_num`, `wait_timeout` and the
    other options are as for `TianshouVectorEnv`.

    Example:
        >>> envs = make_tianshou_vector_env("CartPole-v1", 4, num_workers=2, seed=0)
        >>> obs, infos = envs.reset()
        >>> obs.shape
        (4, 4)
        >>> envs.close()
    """
    env_fns, per_worker = env_factories(
        env, num_envs, num_workers, envs_per_worker, env_kwargs, wrappers, cpus=ray_cpus
    )
    return TianshouVectorEnv(
        env_fns,
        envs_per_worker=per_worker,
        wait_num=wait_num,
        wait_timeout=wait_timeout,
        actor_options=actor_options,
        placement=placement,
        timeout=timeout,
        on_actor_failure=on_actor_failure,
        transport=transport,
        seed=seed,
        on_env_error=on_env_error,
        max_restarts=max_restarts,
    )
