"""The demo: gymnasium envs through `make_vector_env`, sized for the machine, beside gymnasium's.

``python -m ray_multiprocess_env demo`` steps CartPole (64 envs per CPU) with a random policy
for a few seconds, then measures gymnasium's vector envs in the same run, each as one would run
it: `SyncVectorEnv` on the same envs in this process, and `AsyncVectorEnv` with
`ASYNC_ENVS_PER_WORKER` envs per worker of ours (it runs a process per env, and a process for
each of 64 envs per CPU is a set-up nobody runs). So the first number a user sees comes with its
yardstick.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from ray_multiprocess_env.bench import measure_steps_per_second
from ray_multiprocess_env.faces.gymnasium_make import make_vector_env
from ray_multiprocess_env.runtime import ensure_runtime, ray_cpus, shutdown_runtime

__all__ = ["ASYNC_ENVS_PER_WORKER", "ENVS_PER_CPU", "MAX_ASYNC_PROCESSES", "DemoResult", "run_demo"]

#: Envs per worker (one worker per CPU) when `num_envs` is not given: cheap envs want 64 or more.
ENVS_PER_CPU = 64
#: `AsyncVectorEnv` runs one process per env; beyond this many it is not measured.
MAX_ASYNC_PROCESSES = 256
#: `AsyncVectorEnv`'s envs (processes) per worker of ours. On 2 cores (2026-12-02) its CartPole
#: rate was nearly flat in the number of envs: 12k env steps/s with 2, 15k with 8, 16.5k with
#: 32 (its best), 14k with 128; 16 per worker is about its best there.
ASYNC_ENVS_PER_WORKER = 16
#: Random action batches drawn before the timing (as for gymnasium's), reused in turn.
_ACTION_BATCHES = 16


@dataclass(frozen=True)
class DemoResult:
    """What one demo run measured.

    `peers` maps a peer's name to its env steps/s (None: not measured), `peer_envs` to the
    envs it stepped.
    """

    num_envs: int
    num_workers: int
    env_steps: int
    seconds: float
    episodes: int
    mean_return: float
    peers: dict[str, float | None] = field(default_factory=dict)
    peer_envs: dict[str, int] = field(default_factory=dict)

    @property
    def steps_per_second(self) -> float:
        """Env steps per second of wall time."""
        return self.env_steps / self.seconds if self.seconds > 0 else float("nan")


def run_demo(
    env_id: str = "CartPole-v1",
    num_envs: int | None = None,
    steps: int = 3000,
    seed: int = 0,
    progress: bool = True,
    peer_seconds: float = 2.0,
) -> DemoResult:
    """Step `num_envs` envs in Ray workers with random actions, then gymnasium's vector envs.

    Starts a local Ray runtime if none is running (and shuts down only that one).

    Args:
        env_id: A registered gymnasium env id.
        num_envs: How many envs; None: `ENVS_PER_CPU` for each CPU Ray offers (one worker each).
        steps: How many vector steps (each steps every env once).
        seed: Env ``i`` is seeded ``seed + i``; the random actions (16 batches, drawn before the
            timing and reused in turn, as for gymnasium's) come from a space seeded ``seed``.
        progress: Show a progress bar (on a terminal or in a notebook: never in a log).
        peer_seconds: How long each of gymnasium's vector envs is measured (0: not at all):
            `SyncVectorEnv` on the same envs, `AsyncVectorEnv` on `ASYNC_ENVS_PER_WORKER` per
            worker of ours (at most as many as ours).

    Returns:
        The envs and workers, the env steps and wall time, the episodes finished and their mean
        return, and the peers' env steps/s.
    """
    if num_envs is not None and num_envs < 1:
        raise ValueError(f"`num_envs` must be at least 1, got {num_envs}.")
    if steps < 1:
        raise ValueError(f"`steps` must be at least 1, got {steps}.")
    ensure_runtime()
    try:
        count = num_envs if num_envs is not None else ENVS_PER_CPU * ray_cpus()
        with contextlib.closing(make_vector_env(env_id, count, seed=seed)) as envs:
            workers = len(envs.remote_envs)
            envs.action_space.seed(seed)
            actions = [envs.action_space.sample() for _ in range(_ACTION_BATCHES)]
            envs.reset()
            returns, finished = np.zeros(count), []
            start = time.perf_counter()
            # (disable=None: tqdm draws the bar on a terminal or in a notebook, not in a log)
            bar = tqdm(range(steps), desc="vector steps", disable=None if progress else True)
            for t in bar:
                _, rewards, terminated, truncated, _ = envs.step(actions[t % _ACTION_BATCHES])
                returns += rewards
                done = np.logical_or(terminated, truncated)
                finished.extend(returns[done].tolist())
                returns[done] = 0.0  # (the next step resets those envs, with reward 0)
            seconds = time.perf_counter() - start
    finally:
        shutdown_runtime()
    peers: dict[str, float | None] = {}
    async_envs = min(count, ASYNC_ENVS_PER_WORKER * workers)
    sizes = {"SyncVectorEnv": count, "AsyncVectorEnv": async_envs}
    if peer_seconds > 0:
        make = functools.partial(gym.make, env_id)
        peers["SyncVectorEnv"] = _rate(gym.vector.SyncVectorEnv, make, count, peer_seconds)
        peers["AsyncVectorEnv"] = (
            _rate(_async_vector_env, make, async_envs, peer_seconds)
            if async_envs <= MAX_ASYNC_PROCESSES
            else None
        )
    mean_return = float(np.mean(finished)) if finished else float("nan")
    return DemoResult(
        count, workers, count * steps, seconds, len(finished), mean_return, peers, sizes
    )


def _async_vector_env(env_fns: list[Callable[[], gym.Env[Any, Any]]]) -> Any:
    """Gymnasium's `AsyncVectorEnv`, its processes forked where the platform can (fast start)."""
    context = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    return gym.vector.AsyncVectorEnv(env_fns, context=context)


def _rate(
    vector_env: Callable[[list[Callable[[], gym.Env[Any, Any]]]], Any],
    make: Callable[[], gym.Env[Any, Any]],
    count: int,
    seconds: float,
) -> float:
    """Env steps/s of `vector_env` over `count` envs of `make`, random actions."""
    with contextlib.closing(vector_env([make] * count)) as envs:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(_ACTION_BATCHES)]
        return measure_steps_per_second(
            lambda t: envs.step(actions[t % len(actions)]), count, seconds=seconds
        )
