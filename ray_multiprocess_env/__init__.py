"""Run gym/gymnasium environments as Ray actors and step many of them as one vector env.

Importing this package has no side effects: Ray is started (or joined) only when the first actor
is created, and pfrl/torch are never imported here.
"""

from __future__ import annotations

from ray_multiprocess_env.errors import ClosedEnvError, EnvCrashedError, RemoteEnvError
from ray_multiprocess_env.integrations.gymnasium import (
    GymnasiumVectorEnv,
    make_vector_env,
    vector_entry_point,
)
from ray_multiprocess_env.integrations.pfrl import GymAPIBridge
from ray_multiprocess_env.remote import REMOTE_ENV_METHODS, make_remote_class
from ray_multiprocess_env.runtime import ensure_runtime, shutdown_runtime, started_runtime
from ray_multiprocess_env.vector import RayVectorEnv, unzip

__all__ = [
    "REMOTE_ENV_METHODS",
    "ClosedEnvError",
    "EnvCrashedError",
    "GymAPIBridge",
    "GymnasiumVectorEnv",
    "RayVectorEnv",
    "RemoteEnvError",
    "ensure_runtime",
    "make_remote_class",
    "make_vector_env",
    "shutdown_runtime",
    "started_runtime",
    "unzip",
    "vector_entry_point",
]

__version__ = "0.1.0"
