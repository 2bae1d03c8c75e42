"""Closing vector envs frees what they took: actors, worker processes and CPU reservations."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time

import gymnasium as gym
import psutil
import pytest
import ray

from ray_multiprocess_env import GymnasiumVectorEnv, RayVectorEnv
from tests.helpers import worker_pids

pytestmark = pytest.mark.slow


def _alive_actors() -> int:
    # Ray's state API needs the dashboard, which the test session runs without; the GCS actor
    # table is what it reads.
    table = ray._private.state.state.actor_table(None)
    return sum(1 for actor in table.values() if actor["State"] == "ALIVE")


def _env_worker_pids() -> set[int]:
    """The worker processes of this test session's Ray (its raylet's children).

    Not the machine's: another Ray on it (another test run, say) has workers of its own.
    """
    raylets = [p for p in psutil.Process().children() if p.name() == "raylet"]
    assert len(raylets) == 1, raylets  # (the session's Ray, started by this process)
    pids = set()
    for process in raylets[0].children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if " ".join(process.cmdline()).startswith("ray::EnvWorker"):
                pids.add(process.pid)
    return pids


def _env_worker_processes() -> int:
    return len(_env_worker_pids())


def _wait_for(predicate, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def _open_reset_close(i: int) -> None:
    """Vector env `i`: every other one a RayVectorEnv, every fifth of two workers, else one."""
    make = [lambda: gym.make("CartPole-v1")] * 2
    options = {"num_cpus": 0.25}
    per_worker = 1 if i % 5 == 0 else 2
    if i % 2:
        vec = RayVectorEnv.from_env_fns(make, envs_per_worker=per_worker, actor_options=options)
        vec.reset()
        vec.close()
    else:
        with contextlib.closing(
            GymnasiumVectorEnv(make, envs_per_worker=per_worker, actor_options=options)
        ) as envs:
            envs.reset(seed=i)
            if i == 0:  # (the count of processes sees this session's workers)
                assert set(worker_pids(envs)) <= _env_worker_pids()


def test_fifty_vector_envs_leave_nothing_behind():
    """Creating and closing 50 vector envs returns actors, processes and CPUs to baseline.

    Three are open at a time, from three threads: a worker takes about 0.47 s to start, on one
    core, so with lifetimes that overlap both cores work (25 s one after the other, 15 s so).
    """
    actors, processes = _alive_actors(), _env_worker_processes()
    cpus = ray.available_resources().get("CPU", 0.0)
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(_open_reset_close, range(50)))
    assert _wait_for(lambda: _alive_actors() <= actors), _alive_actors()
    assert _wait_for(lambda: _env_worker_processes() <= processes), _env_worker_processes()
    assert _wait_for(lambda: ray.available_resources().get("CPU", 0.0) >= cpus)
