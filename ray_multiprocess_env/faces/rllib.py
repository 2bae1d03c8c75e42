"""RLlib: this library's vector env inside RLlib's env runners, remote ones included.

RLlib's (new API stack) ``SingleAgentEnvRunner`` turns an env name registered with
``ray.tune.registry.register_env`` into a gymnasium id of its own whose ``vector_entry_point``
calls the registered creator with ``env_config | {"num_envs": N}``. It does so in every env
runner process, local or remote, because the creator travels through Ray's registry. With
``gym_env_vectorize_mode="vector_entry_point"`` it then builds the env runner's envs with
``gymnasium.make_vec``, so `rllib_env_creator` makes them one `GymnasiumVectorEnv` whose envs
live in Ray worker actors nested in the env runner. Importing this module imports no RLlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv
from ray_multiprocess_env.faces.gymnasium_make import vector_entry_point

__all__ = ["rllib_env_creator"]


def rllib_env_creator(env_config: Mapping[str, Any]) -> GymnasiumVectorEnv:
    """An env creator for ``tune.register_env``: `vector_entry_point` with RLlib's `env_config`.

    ``env_config`` holds `vector_entry_point`'s keywords (``env_id``, ``env_kwargs``,
    ``envs_per_worker``, ``actor_options``, ...); RLlib adds ``num_envs``
    (``num_envs_per_env_runner``)::

        from ray.tune.registry import register_env
        from ray_multiprocess_env import rllib_env_creator

        register_env("ray-cartpole", rllib_env_creator)
        config = (
            PPOConfig()
            .environment("ray-cartpole", env_config={"env_id": "CartPole-v1",
                                                     "envs_per_worker": 4})
            .env_runners(num_env_runners=2, num_envs_per_env_runner=8,
                         gym_env_vectorize_mode="vector_entry_point")
        )

    Raises:
        ValueError: Without ``num_envs`` in `env_config`: RLlib then builds one env per
            call, which happens unless ``gym_env_vectorize_mode="vector_entry_point"``.
        TypeError: For a key `vector_entry_point` does not know, naming it.
    """
    config = dict(env_config)
    if "num_envs" not in config:
        raise ValueError(
            "`rllib_env_creator` builds a whole vector env and needs `num_envs`, which RLlib "
            "passes only with `config.env_runners(gym_env_vectorize_mode='vector_entry_point')`"
            f"; got env_config {config!r}."
        )
    return vector_entry_point(config.pop("num_envs"), **config)
