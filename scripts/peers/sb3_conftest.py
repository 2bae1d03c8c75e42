"""conftest.py for stable-baselines3's own tests: `SubprocVecEnv` becomes an `SB3VecEnv`.

`run.py` copies this file into SB3's source distribution (``tests/conftest.py``); pytest loads
it before it imports any test module, so ``from stable_baselines3.common.vec_env import
SubprocVecEnv`` gives our class. Ray workers find the test modules (their env classes) through
``PYTHONPATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray
import stable_baselines3.common.vec_env
import stable_baselines3.common.vec_env.subproc_vec_env

from ray_multiprocess_env import SB3VecEnv

ENVS_PER_WORKER = int(os.environ.get("PEER_ENVS_PER_WORKER", "2"))


class RaySubprocVecEnv(SB3VecEnv):
    """`SubprocVecEnv`'s signature over Ray workers; Ray, not `start_method`, starts them."""

    def __init__(self, env_fns, start_method=None):
        super().__init__(env_fns, envs_per_worker=ENVS_PER_WORKER)


stable_baselines3.common.vec_env.SubprocVecEnv = RaySubprocVecEnv
stable_baselines3.common.vec_env.subproc_vec_env.SubprocVecEnv = RaySubprocVecEnv


def pytest_sessionstart(session):
    """Start a local Ray whose workers can import the test modules."""
    tests = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    ray.init(address="local", include_dashboard=False)
