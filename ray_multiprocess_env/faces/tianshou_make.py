"""`make_tianshou_vector_env`: a Tianshou vector env of envs made in Ray workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from ray_multiprocess_env.env_factories import made_from
from ray_multiprocess_env.faces.tianshou import TianshouVectorEnv
from ray_multiprocess_env.runtime import ray_cpus

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ray_multiprocess_env.options import MakeOptions

__all__ = ["make_tianshou_vector_env"]


def make_tianshou_vector_env(
    env: str | Callable[..., gym.Env[Any, Any]],
    num_envs: int | None = None,
    *,
    seed: int | np.random.SeedSequence | None = None,
    wait_num: int | None = None,
    wait_timeout: float | None = None,
    **options: Unpack[MakeOptions],
) -> TianshouVectorEnv:
    """Envs in Ray workers as one Tianshou vector env: ``make_tianshou_vector_env("Ant-v5", 8)``.

    `env`, `num_envs` and the `MakeOptions` (the counts, ``env_kwargs``, ``wrappers`` and the
    `WorkerOptions`) are as for `make_vector_env`; with `seed`, env ``i`` is seeded (and reset)
    with ``seed + i`` at once, as Tianshou's ``envs.seed(seed)`` does (a
    `numpy.random.SeedSequence`: independent seeds). `wait_num` and `wait_timeout` are as for
    `TianshouVectorEnv`.

    Example:
        >>> envs = make_tianshou_vector_env("CartPole-v1", 4, num_workers=2, seed=0)
        >>> obs, infos = envs.reset()
        >>> obs.shape
        (4, 4)
        >>> envs.close()
    """
    env_fns, layout, worker = made_from(
        make_tianshou_vector_env, env, num_envs, options, cpus=ray_cpus
    )
    return TianshouVectorEnv(
        env_fns,
        envs_per_worker=layout,
        wait_num=wait_num,
        wait_timeout=wait_timeout,
        seed=seed,
        **worker,
    )
