"""conftest.py for Tianshou's own tests: its subprocess and Ray vector envs become ours.

`run.py` copies this file into a checkout of Tianshou's repository (``test/conftest.py``);
pytest loads it before it imports any test module, so ``from tianshou.env import
SubprocVectorEnv`` (and ``ShmemVectorEnv``, ``RayVectorEnv``) gives `TianshouVectorEnv`. Ray
workers find the test modules (their env classes, ``test.base.env``) through ``PYTHONPATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray
import tianshou.env
import tianshou.env.venvs

from ray_multiprocess_env import TianshouVectorEnv

ENVS_PER_WORKER = int(os.environ.get("PEER_ENVS_PER_WORKER", "2"))


class RaySubprocVectorEnv(TianshouVectorEnv):
    """Tianshou's vector env signature over Ray workers; its process options do not apply.

    Tianshou's ``timeout`` (return what finished by then) is our `wait_timeout`.
    """

    def __init__(self, env_fns, wait_num=None, timeout=None, share_memory=False, context=None):
        super().__init__(
            env_fns, envs_per_worker=ENVS_PER_WORKER, wait_num=wait_num, wait_timeout=timeout
        )


for name in ("SubprocVectorEnv", "ShmemVectorEnv", "RayVectorEnv"):
    setattr(tianshou.env, name, RaySubprocVectorEnv)
    setattr(tianshou.env.venvs, name, RaySubprocVectorEnv)


def pytest_sessionstart(session):
    """Start a local Ray whose workers can import the test modules (``test.base.env``)."""
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    ray.init(address="local", include_dashboard=False)
