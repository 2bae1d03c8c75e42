"""Run gym/gymnasium environments as Ray actors and step many of them as one vector env.

Importing this package has no side effects: Ray is started (or joined) only when the first actor
is created, and pfrl, stable-baselines3, Tianshou and torch are never imported here (`SB3VecEnv`
and `make_sb3_vec_env` import stable-baselines3 when first used, `TianshouVectorEnv` and
`make_tianshou_vector_env` Tianshou).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_multiprocess_env.errors import (
        ClosedEnvError,
        EnvCrashedError,
        NoPendingCallError,
        PendingCallError,
        RemoteEnvError,
        SpacesMismatchError,
    )
    from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv
    from ray_multiprocess_env.faces.gymnasium_make import make_vector_env, vector_entry_point
    from ray_multiprocess_env.faces.pfrl import RayVectorEnv, unzip
    from ray_multiprocess_env.faces.pfrl_bridge import GymAPIBridge
    from ray_multiprocess_env.faces.remote_env import RemoteEnv
    from ray_multiprocess_env.faces.rllib import rllib_env_creator
    from ray_multiprocess_env.faces.sb3 import SB3VecEnv, make_sb3_vec_env
    from ray_multiprocess_env.faces.tianshou import TianshouVectorEnv
    from ray_multiprocess_env.faces.tianshou_make import make_tianshou_vector_env
    from ray_multiprocess_env.options import MakeOptions, WorkerOptions
    from ray_multiprocess_env.placement import PlacementPlan, plan_placement
    from ray_multiprocess_env.remote import REMOTE_ENV_METHODS, make_remote_class
    from ray_multiprocess_env.runtime import ensure_runtime, shutdown_runtime, started_runtime

#: Where each public name lives; imported when first asked for (PEP 562), so that a worker
#: process, which imports this package to reach `_worker/`, does not import every face and the
#: engine, and ``import ray_multiprocess_env`` never imports stable-baselines3, Tianshou or torch.
_HOMES = {
    "ClosedEnvError": "errors",
    "EnvCrashedError": "errors",
    "NoPendingCallError": "errors",
    "PendingCallError": "errors",
    "RemoteEnvError": "errors",
    "SpacesMismatchError": "errors",
    "GymnasiumVectorEnv": "faces.gymnasium",
    "make_vector_env": "faces.gymnasium_make",
    "vector_entry_point": "faces.gymnasium_make",
    "RayVectorEnv": "faces.pfrl",
    "unzip": "faces.pfrl",
    "GymAPIBridge": "faces.pfrl_bridge",
    "RemoteEnv": "faces.remote_env",
    "rllib_env_creator": "faces.rllib",
    "SB3VecEnv": "faces.sb3",
    "make_sb3_vec_env": "faces.sb3",
    "TianshouVectorEnv": "faces.tianshou",
    "make_tianshou_vector_env": "faces.tianshou_make",
    "MakeOptions": "options",
    "WorkerOptions": "options",
    "PlacementPlan": "placement",
    "plan_placement": "placement",
    "REMOTE_ENV_METHODS": "remote",
    "make_remote_class": "remote",
    "ensure_runtime": "runtime",
    "shutdown_runtime": "runtime",
    "started_runtime": "runtime",
}

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
    "SpacesMismatchError",
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
    """Import the module of a public name when it is first asked for (see `_HOMES`)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # (asked once)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
