"""The loops a trainer runs on real envs: first-ready (envpool's way) and with a policy in it.

First-ready: ``num_envs = 2 x batch_size``; `recv` the envs that are ready, act, `send` them
back while the others step. Ours (`GymnasiumVectorEnv.recv`/`send`) and envpool's own async
API (``make(..., batch_size=...)``). With a policy: a small torch MLP (two hidden layers of 64,
tanh, CPU) maps each batch of observations to actions, in the lockstep `step` loop and in the
first-ready loop, so the envs' work and the policy's overlap (or not) as in training.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from benchmarks.envs import action_samples
from benchmarks.targets import Row
from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env.bench import measure_steps_per_second

__all__ = [
    "POLICY",
    "envpool_loop",
    "first_ready_name",
    "mlp_policy",
    "ours_first_ready",
    "ours_lockstep",
    "rows",
]

#: The suffix of the rows whose actions come from the MLP.
POLICY = ", MLP policy"

Act = Callable[[Any, int], Any]  # (observations of the rows received, step count) -> actions


def mlp_policy(observation_dim: int, action_dim: int) -> Callable[[Any], np.ndarray]:
    """A torch MLP (two hidden layers of 64, tanh) from observations to actions in [-1, 1]."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(observation_dim, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, action_dim),
        torch.nn.Tanh(),
    )

    def act(observations: Any) -> np.ndarray:
        with torch.no_grad():
            out = net(torch.as_tensor(np.asarray(observations), dtype=torch.float32))
        return out.numpy()

    return act


def _actor(space: Any, observation_space: Any, num_envs: int, policy: bool) -> Act:
    """Pre-drawn random actions, or the MLP on the observations (single-env spaces)."""
    if policy:
        mlp = mlp_policy(int(np.prod(observation_space.shape)), space.shape[0])
        return lambda obs, t: mlp(obs.reshape(len(obs), -1))
    samples = action_samples(batch_space(space, num_envs))
    return lambda obs, t: samples[t % len(samples)][: len(obs)]


def ours_first_ready(
    env_fn: Callable[[], Any],
    workers: int,
    per_worker: int,
    batch_size: int,
    seconds: float,
    *,
    policy: bool = False,
) -> float:
    """Ours: `recv(batch_size)`, act on what came back, `send` it; env steps/s."""
    vec = GymnasiumVectorEnv([env_fn] * (workers * per_worker), envs_per_worker=per_worker)
    try:
        act = _actor(vec.single_action_space, vec.single_observation_space, vec.num_envs, policy)
        vec.async_reset(seed=0)
        state = {"t": 0}

        def step(_: int) -> int:
            obs, *_, infos = vec.recv(batch_size=batch_size)
            ids = infos["env_id"]
            vec.send(act(obs, state["t"]), ids)
            state["t"] += 1
            return len(ids)

        return _rate(step, seconds)
    finally:
        vec.close()


def ours_lockstep(
    env_fn: Callable[[], Any], workers: int, per_worker: int, seconds: float, *, policy: bool
) -> float:
    """Ours: `step` of every env, the actions from the policy (or pre-drawn); env steps/s."""
    vec = GymnasiumVectorEnv([env_fn] * (workers * per_worker), envs_per_worker=per_worker)
    try:
        act = _actor(vec.single_action_space, vec.single_observation_space, vec.num_envs, policy)
        obs, _ = vec.reset(seed=0)
        holder = [obs]

        def step(t: int) -> None:
            holder[0] = vec.step(act(holder[0], t))[0]

        return measure_steps_per_second(step, vec.num_envs, seconds=seconds)
    finally:
        vec.close()


def envpool_loop(
    task: str,
    num_envs: int,
    batch_size: int | None,
    threads: int,
    seconds: float,
    *,
    policy: bool = False,
) -> float:
    """envpool: lockstep `step` (`batch_size` None), or its async `recv`/`send`; env steps/s."""
    import envpool

    size = num_envs if batch_size is None else batch_size
    vec = envpool.make(
        task, env_type="gymnasium", num_envs=num_envs, batch_size=size, num_threads=threads
    )
    try:
        act = _actor(vec.action_space, vec.observation_space, num_envs, policy)
        if batch_size is None:
            holder = [vec.reset()[0]]

            def lockstep(t: int) -> None:
                holder[0] = vec.step(act(holder[0], t))[0]

            return measure_steps_per_second(lockstep, num_envs, seconds=seconds)
        vec.async_reset()

        def first_ready(t: int) -> int:
            obs, *_, info = vec.recv()
            vec.send(act(obs, t), info["env_id"])
            return len(obs)

        return _rate(first_ready, seconds)
    finally:
        vec.close()


def _rate(step: Callable[[int], int], seconds: float, warmup: int = 20) -> float:
    """Env steps/s of a loop whose ``step(t)`` returns how many env steps it received."""
    for t in range(warmup):
        step(t)
    count, t, start = 0, warmup, time.perf_counter()
    while time.perf_counter() - start < seconds:
        count += step(t)
        t += 1
    return count / (time.perf_counter() - start)


def rows(
    env_name: str,
    env_fn: Callable[[], Any],
    envpool_task: str | None,
    workers: int,
    seconds: float,
    log: Callable[[str], None],
) -> list[Row]:
    """The first-ready and policy rows of one env: ours and envpool's, `workers` x 8 envs.

    The policy rows run with torch's default number of threads, and again with one thread
    (``torch.set_num_threads(1)``), since torch's threads compete with the env workers.
    """
    import gc
    import os

    from benchmarks import peers

    n, half, cores = workers * 8, workers * 4, os.cpu_count() or 1
    measured: list[Row] = []

    def add(name: str, measure: Callable[[], float], threads: int | None = None) -> None:
        gc.collect()
        peers.settle()
        with _torch_threads(threads):
            measured.append(Row(env_name, name, n, measure()))
        log(f"{env_name}: {name}: {measured[-1].steps_per_second:.0f}/s")

    add(
        first_ready_name(workers, 8, half),
        lambda: ours_first_ready(env_fn, workers, 8, half, seconds),
    )
    add(
        first_ready_name(2 * workers, 4, half),
        lambda: ours_first_ready(env_fn, 2 * workers, 4, half, seconds),
    )
    if envpool_task is not None and peers.importable("envpool"):
        add(
            f"envpool (C++) first-ready, batch_size={half}",
            lambda: envpool_loop(envpool_task, n, half, cores, seconds),
        )
    for threads in (None, 1):
        tail = POLICY + ("" if threads is None else f", torch {threads} thread")
        add(
            f"ours, {workers} workers x 8{tail}",
            lambda: ours_lockstep(env_fn, workers, 8, seconds, policy=True),
            threads,
        )
        add(
            first_ready_name(workers, 8, half) + tail,
            lambda: ours_first_ready(env_fn, workers, 8, half, seconds, policy=True),
            threads,
        )
        if envpool_task is not None and peers.importable("envpool"):
            add(
                f"envpool (C++){tail}",
                lambda: envpool_loop(envpool_task, n, None, cores, seconds, policy=True),
                threads,
            )
            add(
                f"envpool (C++) first-ready, batch_size={half}{tail}",
                lambda: envpool_loop(envpool_task, n, half, cores, seconds, policy=True),
                threads,
            )
    return measured


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run with torch's intra-op threads set to `threads` (None: left as they are)."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def first_ready_name(workers: int, per_worker: int, batch_size: int) -> str:
    """The row name of ours in first-ready."""
    return f"ours first-ready, {workers} workers x {per_worker}, recv({batch_size})"
