"""How each implementation is measured: the same envs, the same pre-drawn actions, env steps/s.

The machine's limit (P raw single-env loops at once, one process each), gymnasium's vector
envs, SB3's and pfrl's subprocess vector envs, Tianshou's subprocess, shared-memory and Ray
vector envs, envpool (compiled) and ours, through the gymnasium face, the pfrl face
(`RayVectorEnv.from_env_fns`) and the Tianshou face (`TianshouVectorEnv`).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.envs import action_samples, raw_loop_count
from benchmarks.report import cpu_times, idle_and_stolen
from ray_multiprocess_env import GymAPIBridge, RayVectorEnv
from ray_multiprocess_env.bench import measure_steps_per_second

EnvFn = Callable[[], gym.Env[Any, Any]]


def raw(env_fn: EnvFn, seconds: float) -> float:
    """One env stepped in a plain loop in this process."""
    env = env_fn()
    env.reset(seed=0)
    actions = action_samples(env.action_space)

    def step(t: int) -> None:
        _, _, terminated, truncated, _ = env.step(actions[t % len(actions)])
        if terminated or truncated:
            env.reset()

    rate = measure_steps_per_second(step, 1, seconds=seconds)
    env.close()
    return rate


def limit(env_fn: EnvFn, processes: int, seconds: float) -> float:
    """The machine's limit: `processes` independent raw single-env loops at once, summed."""
    context = multiprocessing.get_context("spawn")
    start, counts = context.Event(), context.Queue()
    children = [
        context.Process(target=raw_loop_count, args=(env_fn, seconds, start, counts))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    time.sleep(3.0)  # every child imported and warmed up (they wait for `start`)
    start.set()
    rates = [counts.get(timeout=300) for _ in children]
    for child in children:
        child.join()
    return float(sum(rates))


def vector(make_vec: Callable[[], Any], seconds: float) -> float:
    """A gymnasium-style vector env (ours or gymnasium's): ``step(batch)``, autoreset inside."""
    vec = make_vec()
    vec.reset(seed=0)
    actions = action_samples(vec.action_space)
    try:
        return measure_steps_per_second(
            lambda t: vec.step(actions[t % len(actions)]), vec.num_envs, seconds=seconds
        )
    finally:
        vec.close()


def sb3_subproc(env_fns: list[EnvFn], seconds: float) -> float:
    """stable-baselines3's `SubprocVecEnv` (a process per env)."""
    from stable_baselines3.common.vec_env import SubprocVecEnv

    vec = SubprocVecEnv(env_fns, start_method="fork")
    vec.reset()
    actions = action_samples(gym.vector.utils.batch_space(vec.action_space, len(env_fns)))
    try:
        return measure_steps_per_second(
            lambda t: vec.step(actions[t % len(actions)]), len(env_fns), seconds=seconds
        )
    finally:
        vec.close()


def _pfrl_loop(vec: Any, num_envs: int, seconds: float) -> float:
    """The training loop of pfrl: step, then reset the envs that are done (its mask: keep)."""
    vec.reset()
    actions = action_samples(gym.vector.utils.batch_space(vec.action_space, num_envs))

    def step(t: int) -> None:
        _, _, dones, infos = vec.step(actions[t % len(actions)])
        ended = [d or info.get("needs_reset", False) for d, info in zip(dones, infos, strict=True)]
        vec.reset(np.logical_not(ended))

    try:
        return measure_steps_per_second(step, num_envs, seconds=seconds)
    finally:
        vec.close()


def bridged(env_fn: EnvFn) -> GymAPIBridge:
    """`env_fn`'s env behind the old gym API that pfrl speaks."""
    return GymAPIBridge(env_fn())


def pfrl_multiprocess(env_fn: EnvFn, num_envs: int, seconds: float) -> float:
    """The own `MultiprocessVectorEnv` of pfrl (a process per env)."""
    from pfrl.envs import MultiprocessVectorEnv

    vec = MultiprocessVectorEnv([functools.partial(bridged, env_fn)] * num_envs)
    return _pfrl_loop(vec, num_envs, seconds)


def ours_pfrl(env_fn: EnvFn, workers: int, per_worker: int, seconds: float) -> float:
    """Ours through the pfrl face: `RayVectorEnv.from_env_fns`, the same pfrl loop."""
    num_envs = workers * per_worker
    fns = [functools.partial(bridged, env_fn)] * num_envs
    vec = RayVectorEnv.from_env_fns(fns, envs_per_worker=per_worker)
    return _pfrl_loop(vec, num_envs, seconds)


def _tianshou_loop(vec: Any, num_envs: int, seconds: float) -> float:
    """Tianshou's collector loop: step every env, then reset the envs that are done."""
    vec.reset()
    space = vec.get_env_attr("action_space", 0)[0]
    actions = action_samples(gym.vector.utils.batch_space(space, num_envs))

    def step(t: int) -> None:
        _, _, terminated, truncated, _ = vec.step(actions[t % len(actions)])
        done = np.flatnonzero(terminated | truncated)
        if len(done):
            vec.reset(done)

    try:
        return measure_steps_per_second(step, num_envs, seconds=seconds)
    finally:
        vec.close()


def tianshou(kind: str, env_fns: list[EnvFn], seconds: float) -> float:
    """Tianshou's own vector env `kind`, a process or (``RayVectorEnv``) a Ray actor per env."""
    import tianshou.env

    vec = getattr(tianshou.env, kind)(env_fns)
    return _tianshou_loop(vec, len(env_fns), seconds)


def ours_tianshou(env_fn: EnvFn, workers: int, per_worker: int, seconds: float) -> float:
    """Ours through the Tianshou face: `TianshouVectorEnv`, the same loop."""
    from ray_multiprocess_env import TianshouVectorEnv

    vec = TianshouVectorEnv([env_fn] * (workers * per_worker), envs_per_worker=per_worker)
    return _tianshou_loop(vec, workers * per_worker, seconds)


def envpool(task: str, num_envs: int, threads: int, seconds: float) -> float:
    """The compiled envpool (C++ envs, its own thread pool): ``step`` of every env."""
    import envpool as envpool_module

    vec = envpool_module.make(task, env_type="gymnasium", num_envs=num_envs, num_threads=threads)
    vec.reset()
    space = gym.vector.utils.batch_space(vec.action_space, num_envs)
    actions = action_samples(space)
    try:
        return measure_steps_per_second(
            lambda t: vec.step(actions[t % len(actions)]), num_envs, seconds=seconds
        )
    finally:
        vec.close()


def settle(most_seconds: float = 30.0) -> None:
    """Wait until the machine is idle (less than 1/4 of a core busy over half a second).

    What a peer leaves behind as it closes (Tianshou's `RayVectorEnv` tears down an actor per
    env) would otherwise slow down the next measurement. Off Linux it returns at once.
    """
    deadline = time.monotonic() + most_seconds
    while time.monotonic() < deadline:
        before = cpu_times()
        time.sleep(0.5)
        shares = idle_and_stolen(before, cpu_times())
        if shares is None:
            return
        if (100 - shares[0]) / 100 * (os.cpu_count() or 1) < 0.25:
            return


def importable(module: str) -> bool:
    """Whether `module` can be imported here (a peer that is not installed is left out)."""
    try:
        __import__(module)
    except ImportError:
        return False
    return True
