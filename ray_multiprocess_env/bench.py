"""Measure vector-env throughput: the timing loop and the ``bench`` command's settings sweep.

Used by ``python -m ray_multiprocess_env bench ENV_ID`` (which settings of workers and envs per
worker suit one env on this machine) and by ``benchmarks/throughput.py`` (comparisons with
gymnasium, stable-baselines3 and pfrl).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from tqdm import tqdm

__all__ = ["BenchResult", "env_factory", "measure_steps_per_second", "sweep"]


def measure_steps_per_second(
    step: Callable[[int], object],
    num_envs: int,
    *,
    seconds: float = 2.0,
    warmup_steps: int = 3,
    min_steps: int = 5,
) -> float:
    """Call ``step(t)`` for t = 0, 1, ... for about `seconds` and return env steps per second.

    Each call is one vector step of `num_envs` envs. The first `warmup_steps` calls are not
    timed; at least `min_steps` calls are.
    """
    for t in range(warmup_steps):
        step(t)
    count = 0
    start = time.perf_counter()
    elapsed = 0.0
    while count < min_steps or elapsed < seconds:
        step(warmup_steps + count)
        count += 1
        elapsed = time.perf_counter() - start
    return num_envs * count / elapsed


def env_factory(spec: str) -> Callable[[], gym.Env[Any, Any]]:
    """An env factory from a registered gymnasium id or ``"package.module:factory"``.

    ``"package.module:factory"`` names a callable with no arguments that returns an env; any
    other string is passed to `gymnasium.make` (which also accepts ``"module:EnvId-v0"``).

    Raises:
        ValueError: If the spec names neither a registered id nor a factory.
    """
    module_name, _, attribute = spec.partition(":")
    if attribute:
        try:
            factory = getattr(importlib.import_module(module_name), attribute, None)
        except ImportError as err:
            raise ValueError(
                f"`{spec}`: cannot import `{module_name}` ({err}); give a gymnasium id such as "
                "'CartPole-v1' or 'package.module:factory'."
            ) from err
        if callable(factory):
            return factory  # type: ignore[no-any-return]
    try:
        gym.spec(spec)
    except gym.error.Error as err:
        raise ValueError(
            f"`{spec}` is neither a registered gymnasium id nor 'package.module:factory': {err}"
        ) from err
    return _GymMake(spec)


class _GymMake:
    """A picklable ``lambda: gymnasium.make(env_id)``."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def __call__(self) -> gym.Env[Any, Any]:
        return gym.make(self.env_id)


@dataclass(frozen=True)
class BenchResult:
    """Throughput of one (num_workers, envs_per_worker) setting."""

    num_workers: int
    envs_per_worker: int
    steps_per_second: float

    @property
    def num_envs(self) -> int:
        """Envs in the vector env."""
        return self.num_workers * self.envs_per_worker


def sweep(
    env_fn: Callable[[], gym.Env[Any, Any]],
    settings: Iterable[tuple[int, int]],
    *,
    seconds: float = 2.0,
    progress: bool = True,
) -> list[BenchResult]:
    """Measure `GymnasiumVectorEnv` with random actions for each (workers, envs per worker)."""
    from ray_multiprocess_env.integrations.gymnasium import GymnasiumVectorEnv

    results = []
    settings = list(settings)
    for num_workers, per_worker in tqdm(settings, desc="settings", disable=not progress):
        envs = GymnasiumVectorEnv([env_fn] * (num_workers * per_worker), envs_per_worker=per_worker)
        try:
            envs.reset(seed=0)
            envs.action_space.seed(0)
            actions = [envs.action_space.sample() for _ in range(16)]

            def step(t: int, envs: GymnasiumVectorEnv = envs, actions: list[Any] = actions) -> None:
                envs.step(actions[t % len(actions)])

            rate = measure_steps_per_second(step, envs.num_envs, seconds=seconds)
        finally:
            envs.close()
        results.append(BenchResult(num_workers, per_worker, rate))
    return results


def format_table(results: Sequence[BenchResult]) -> str:
    """A plain-text table of `results` with the best setting marked."""
    best = max(results, key=lambda r: r.steps_per_second)
    lines = [f"{'workers':>8} {'envs/worker':>12} {'envs':>6} {'env steps/s':>12}"]
    for r in results:
        mark = "  <- recommended" if r is best else ""
        lines.append(
            f"{r.num_workers:>8} {r.envs_per_worker:>12} {r.num_envs:>6} "
            f"{r.steps_per_second:>12.0f}{mark}"
        )
    return "\n".join(lines)


def default_settings(cpus: int) -> list[tuple[int, int]]:
    """Workers in {1, cpus} times envs per worker in {1, 8, 32}."""
    workers = sorted({1, max(1, cpus)})
    return [(w, k) for w in workers for k in (1, 8, 32)]
