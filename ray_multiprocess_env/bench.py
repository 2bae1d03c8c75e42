"""Measure vector-env throughput: the timing loop and the ``bench`` command's settings sweep.

Used by ``python -m ray_multiprocess_env bench ENV_ID`` (which settings of workers and envs per
worker suit one env on this machine) and by ``benchmarks/throughput.py`` (comparisons with
gymnasium, stable-baselines3 and pfrl).
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from tqdm.auto import tqdm

__all__ = [
    "DEFAULT_ENVS_PER_WORKER",
    "BenchResult",
    "as_json",
    "env_factory",
    "measure_steps_per_second",
    "recommended_code",
    "sweep",
]


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


def env_factory(spec: str) -> str | Callable[..., gym.Env[Any, Any]]:
    """What ``make_vector_env`` takes as `env` for a command-line ENV.

    ``"package.module:factory"`` names a callable that returns an env (taking no argument or
    the env index, as for `make_vector_env`); any other string must be a registered gymnasium
    id (``"module:EnvId-v0"`` imports the module first, as `gymnasium.make` does).

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
    return spec


def recommended_code(spec: str, env: str | Callable[..., Any], best: BenchResult) -> str:
    """Python that builds the vector env of `best` for `spec`, runnable as printed."""
    counts = f"num_workers={best.num_workers}, envs_per_worker={best.envs_per_worker}"
    if isinstance(env, str):
        return (
            "from ray_multiprocess_env import make_vector_env\n"
            f"envs = make_vector_env({env!r}, {counts})"
        )
    module_name, _, attribute = spec.partition(":")
    return (
        "from ray_multiprocess_env import make_vector_env\n"
        f"from {module_name} import {attribute}\n"
        f"envs = make_vector_env({attribute}, {counts})"
    )


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
    env: str | Callable[..., gym.Env[Any, Any]],
    settings: Iterable[tuple[int, int]],
    *,
    seconds: float = 2.0,
    progress: bool = True,
    policy: str | None = None,
) -> list[BenchResult]:
    """Measure `make_vector_env` for each (workers, envs per worker) setting.

    The actions are random, or with `policy` (one of `bench_policies.POLICIES`) what a torch
    policy in the loop makes of each step's observations, as in training.
    """
    from ray_multiprocess_env.faces.gymnasium_make import make_vector_env

    if policy is not None:
        import torch  # noqa: F401  (as a trainer does, before its envs: see `driver_threads`)
    results = []
    settings = list(settings)
    for num_workers, per_worker in tqdm(
        settings, desc="settings", disable=None if progress else True
    ):
        envs = make_vector_env(env, num_workers=num_workers, envs_per_worker=per_worker)
        try:
            envs.action_space.seed(0)
            step = _stepper(envs, policy)
            rate = measure_steps_per_second(step, envs.num_envs, seconds=seconds)
        finally:
            envs.close()
        results.append(BenchResult(num_workers, per_worker, rate))
    return results


def _stepper(envs: Any, policy: str | None) -> Callable[[int], None]:
    """One vector step of `envs` per call: random actions, or the `policy`'s (see `sweep`)."""
    from ray_multiprocess_env.bench_policies import make_policy

    observations = [envs.reset(seed=0)[0]]
    if policy is None:
        actions = [envs.action_space.sample() for _ in range(16)]

        def step(t: int) -> None:
            envs.step(actions[t % len(actions)])

        return step
    act = make_policy(policy, envs.single_observation_space, envs.single_action_space)

    def step_with_policy(t: int) -> None:
        observations[0] = envs.step(act(observations[0]))[0]

    return step_with_policy


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


#: The envs per worker `bench` tries by default: cheap envs want 64 or more (docs/usage.md).
DEFAULT_ENVS_PER_WORKER = (1, 16, 64, 256)


def default_settings(cpus: int) -> list[tuple[int, int]]:
    """Workers in {1, cpus} times envs per worker in `DEFAULT_ENVS_PER_WORKER`."""
    workers = sorted({1, max(1, cpus)})
    return [(w, k) for w in workers for k in DEFAULT_ENVS_PER_WORKER]


def as_json(
    spec: str,
    cpus: int,
    seconds: float,
    results: Sequence[BenchResult],
    policy: str | None = None,
) -> str:
    """`results` as JSON: the env, the CPUs, the policy, each setting's steps/s, the best one."""
    best = max(results, key=lambda r: r.steps_per_second)
    settings = [
        {
            "num_workers": r.num_workers,
            "envs_per_worker": r.envs_per_worker,
            "num_envs": r.num_envs,
            "steps_per_second": r.steps_per_second,
            "recommended": r is best,
        }
        for r in results
    ]
    document = {
        "env": spec,
        "cpus": cpus,
        "seconds_per_setting": seconds,
        "policy": policy,
        "settings": settings,
    }
    return json.dumps(document, indent=2)
