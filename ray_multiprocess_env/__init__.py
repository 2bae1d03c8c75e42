"""Run gym/gymnasium environments as Ray actors and step many of them as one vector env.

Importing this package has no side effects: Ray is started (or joined) only when the first actor
is created, and pfrl, stable-baselines3, Tianshou and torch are never imported here (`SB3VecEnv`
and `make_sb3_vec_env` import stable-baselines3 when first used, `TianshouVectorEnv` and
`make_tianshou_vector_env` Tianshou).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ray_multiprocess_env.errors import (
    ClosedEnvError,
    EnvCrashedError,
    NoPendingCallError,
    PendingCallError,
    RemoteEnvError,
)
from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv
from ray_multiprocess_env.faces.gymnasium_make import make_vector_env, vector_entry_point
from ray_multiprocess_env.faces.pfrl import RayVectorEnv, unzip
from ray_multiprocess_env.faces.pfrl_bridge import GymAPIBridge
from ray_multiprocess_env.faces.remote_env import RemoteEnv
from ray_multiprocess_env.faces.rllib import rllib_env_creator
from ray_multiprocess_env.options import MakeOptions, WorkerOptions
from ray_multiprocess_env.placement import PlacementPlan, plan_placement
from ray_multiprocess_env.remote import REMOTE_ENV_METHODS, make_remote_class
from ray_multiprocess_env.runtime import ensure_runtime, shutdown_runtime, started_runtime

__all__ = [
    "REMOTE_ENV_METHODS",
    "ClosedEnvError",
    "EnvCrashedError",
    "GymAPIBridge",
    "GymnasiumVectorEnv",
    "MakeOptions",
    "NoPendingCallError",
    "PendingCallError",
    "PlacementPlan",
    "RayVectorEnv",
    "RemoteEnv",
    "RemoteEnvError",
    "SB3VecEnv",
    "TianshouVectorEnv",
    "WorkerOptions",
    "ensure_runtime",
    "make_remote_class",
    "make_sb3_vec_env",
    "make_tianshou_vector_env",
    "make_vector_env",
    "plan_placement",
    "rllib_env_creator",
    "shutdown_runtime",
    "started_runtime",
    "unzip",
    "vector_entry_point",
]

try:
    __version__ = version("ray-multiprocess-env")  # the one source: pyproject.toml
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    """Import the stable-baselines3 and Tianshou faces (and so torch) when they are asked for."""
    if name in ("SB3VecEnv", "make_sb3_vec_env"):
        from ray_multiprocess_env.faces import sb3

        return getattr(sb3, name)
    if name == "TianshouVectorEnv":
        from ray_multiprocess_env.faces.tianshou import TianshouVectorEnv

        return TianshouVectorEnv
    if name == "make_tianshou_vector_env":
        from ray_multiprocess_env.faces.tianshou_make import make_tianshou_vector_env

        return make_tianshou_vector_env
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
