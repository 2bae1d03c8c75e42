"""The demo job: random-policy rollouts of gymnasium envs in a `RayVectorEnv` on local Ray."""

from __future__ import annotations

import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from tqdm import tqdm

from ray_multiprocess_env.remote import make_remote_class
from ray_multiprocess_env.runtime import ensure_runtime, shutdown_runtime
from ray_multiprocess_env.vector import RayVectorEnv

__all__ = ["DemoResult", "GymnasiumEnvHolder", "run_demo"]


class GymnasiumEnvHolder:
    """Builds one gymnasium env by id into ``self.env`` (the class the demo makes remote)."""

    def __init__(self, env_id: str) -> None:
        self.env = gym.make(env_id)


@dataclass(frozen=True)
class DemoResult:
    """What one demo run measured."""

    env_steps: int
    seconds: float
    episodes: int
    mean_return: float

    @property
    def steps_per_second(self) -> float:
        """Env steps per second of wall time."""
        return self.env_steps / self.seconds if self.seconds > 0 else float("nan")


def run_demo(
    env_id: str = "CartPole-v1",
    num_envs: int = 8,
    steps: int = 500,
    seed: int = 0,
    progress: bool = True,
) -> DemoResult:
    """Step `num_envs` remote envs with random actions for `steps` vector steps.

    Starts a local Ray runtime if none is running (and shuts down only that one).

    Args:
        env_id: A registered gymnasium env id.
        num_envs: How many envs (one actor each).
        steps: How many vector steps (each steps every env once).
        seed: Env ``i`` is seeded ``seed + i``; the actions are drawn from a space seeded ``seed``.
        progress: Show a progress bar on stderr.

    Returns:
        The number of env steps, the wall time, the episodes finished and their mean return.
    """
    if num_envs < 1:
        raise ValueError(f"`num_envs` must be at least 1, got {num_envs}.")
    if steps < 1:
        raise ValueError(f"`steps` must be at least 1, got {steps}.")
    ensure_runtime()
    try:
        remote_env = make_remote_class(GymnasiumEnvHolder, "env", gym.Env)
        with RayVectorEnv([remote_env.remote(env_id) for _ in range(num_envs)]) as vec:
            action_space = vec.action_space
            action_space.seed(seed)
            vec.seed(seed)
            vec.reset()
            returns = np.zeros(num_envs)
            finished: list[float] = []
            start = time.perf_counter()
            for _ in tqdm(range(steps), desc="vector steps", disable=not progress):
                actions = [action_space.sample() for _ in range(num_envs)]
                _, rewards, terminated, truncated, _ = vec.step(actions)
                returns += rewards
                done = np.logical_or(terminated, truncated)
                finished.extend(returns[done].tolist())
                returns[done] = 0.0
                if done.any():
                    vec.reset(np.logical_not(done))
            seconds = time.perf_counter() - start
    finally:
        shutdown_runtime()
    mean_return = float(np.mean(finished)) if finished else float("nan")
    return DemoResult(num_envs * steps, seconds, len(finished), mean_return)
