"""conftest.py for gymnasium's own tests: `AsyncVectorEnv` becomes a `GymnasiumVectorEnv`.

`run.py` copies this file into a checkout of gymnasium's repository (``tests/conftest.py``);
pytest loads it before it imports any test module, so ``from gymnasium.vector import
AsyncVectorEnv`` and ``gym.make_vec(..., vectorization_mode="async")`` give our class. Ray
workers find the test modules (their env classes) through ``PYTHONPATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium
import gymnasium.vector
import gymnasium.vector.async_vector_env
import pytest
import ray
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env import GymnasiumVectorEnv

ENVS_PER_WORKER = int(os.environ.get("PEER_ENVS_PER_WORKER", "2"))


class RayAsyncVectorEnv(GymnasiumVectorEnv):
    """`AsyncVectorEnv`'s signature over Ray workers; its process options do not apply."""

    def __init__(
        self,
        env_fns,
        shared_memory=True,
        copy=True,
        context=None,
        daemon=True,
        worker=None,
        observation_mode="same",
        autoreset_mode=AutoresetMode.NEXT_STEP,
    ):
        if worker is not None:
            pytest.skip("custom worker functions are AsyncVectorEnv's own")
        super().__init__(
            env_fns,
            envs_per_worker=ENVS_PER_WORKER,
            copy=copy,
            observation_mode=observation_mode,
            autoreset_mode=autoreset_mode,
        )


gymnasium.vector.AsyncVectorEnv = RayAsyncVectorEnv
gymnasium.vector.async_vector_env.AsyncVectorEnv = RayAsyncVectorEnv


def pytest_sessionstart(session):
    """Start a local Ray whose workers can import the test modules (``tests.testing_env``)."""
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    ray.init(address="local", include_dashboard=False)
