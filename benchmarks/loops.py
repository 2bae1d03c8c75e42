"""The loops a trainer runs: lockstep and first-ready, with pre-drawn actions or a policy.

First-ready is envpool's way: ``num_envs = 2 x batch_size``; `recv` the envs that are ready,
act, `send` them back while the others step (ours: `recv(batch_size=...)`/`send`; envpool:
``make(..., batch_size=...)``). `first_ready_rows` (``--suite real``) runs it with pre-drawn
actions.

`policy_rows` (``--suite policy``) is what a trainer feels: every loop gets its actions from a
torch policy in the driver (`make_policy`: the MLP 17 -> 256 -> 256 -> 6 on HalfCheetah, a
small conv net on Pong's frames): gymnasium's `SyncVectorEnv` and `AsyncVectorEnv`, SB3's
`SubprocVecEnv`, envpool (lockstep and first-ready) and ours (lockstep and first-ready), each
with torch's defaults and with one torch thread. Ours with torch's defaults is what a user gets
without tuning: the library fits torch's threads to the cores its workers leave
(`driver_threads`); a row with ``RAY_MULTIPROCESS_ENV_TORCH_THREADS=keep`` shows what that fit
is worth, and rows with the workers reniced to the driver's priority what Ray's worker
niceness costs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
from gymnasium.vector.utils import batch_space

from benchmarks import peers
from benchmarks.envs import action_samples
from benchmarks.report import environment_variable
from benchmarks.targets import ASYNC, SYNC, Row
from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env._engine.driver_threads import TORCH_THREADS_VARIABLE
from ray_multiprocess_env.bench import measure_steps_per_second
from ray_multiprocess_env.bench_policies import make_policy

__all__ = [
    "DEFAULTS",
    "KEPT",
    "ONE_THREAD",
    "RENICED",
    "first_ready",
    "first_ready_name",
    "first_ready_rows",
    "lockstep",
    "policy_rows",
]

#: The suffixes of the rows' names: how torch's threads (and our workers) were set.
DEFAULTS, ONE_THREAD = ", torch defaults", ", torch 1 thread"
KEPT = ", torch defaults kept (TORCH_THREADS=keep)"
RENICED = ", workers reniced to the driver's priority"


def first_ready_name(workers: int, per_worker: int, batch_size: int) -> str:
    """The row name of ours in first-ready."""
    return f"ours first-ready, {workers} workers x {per_worker}, recv({batch_size})"


def first_ready_rows(
    env_name: str,
    env_fn: Callable[[], Any],
    envpool_task: str | None,
    workers: int,
    seconds: float,
    log: Callable[[str], None],
) -> list[Row]:
    """First-ready with pre-drawn actions: ours `workers` x 8 and 2 `workers` x 4, envpool."""
    n, half, cores = workers * 8, workers * 4, os.cpu_count() or 1
    measured: list[Row] = []
    add = functools.partial(_add, measured, env_name, n, log)
    for count, per_worker in ((workers, 8), (2 * workers, 4)):
        ours = functools.partial(
            GymnasiumVectorEnv, [env_fn] * n, envs_per_worker=per_worker
        )  # (bound now: the loop's names change)
        add(
            first_ready_name(count, per_worker, half),
            functools.partial(first_ready, ours, None, half, seconds),
        )
    if envpool_task is not None and peers.importable("envpool"):
        halves = _envpool(envpool_task, n, cores, batch_size=half)
        add(
            f"envpool (C++) first-ready, batch_size={half}",
            functools.partial(first_ready, halves, None, None, seconds),
        )
    return measured


def policy_rows(
    env_name: str,
    env_fn: Callable[[], Any],
    policy: str,
    envpool_task: str | None,
    workers: int,
    seconds: float,
    log: Callable[[str], None],
) -> list[Row]:
    """Every loop on `workers` x 8 envs of one env with `policy` acting; one row each."""
    n, half, cores = workers * 8, workers * 4, os.cpu_count() or 1
    fns = [env_fn] * n
    measured: list[Row] = []
    add = functools.partial(_add, measured, env_name, n, log)

    ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=8)
    ours_name, first_name = f"ours, {workers} workers x 8", first_ready_name(workers, 8, half)

    for tail, threads in ((DEFAULTS, None), (ONE_THREAD, 1)):
        with _torch_threads(threads):
            sync = functools.partial(gym.vector.SyncVectorEnv, fns)
            add(SYNC + tail, functools.partial(lockstep, sync, policy, seconds))
            make_async = functools.partial(
                gym.vector.AsyncVectorEnv, fns, context="fork", shared_memory=True
            )
            add(ASYNC + tail, functools.partial(lockstep, make_async, policy, seconds))
            if peers.importable("stable_baselines3"):
                subproc = _subproc(fns)
                add(
                    "SB3 SubprocVecEnv" + tail,
                    functools.partial(lockstep, subproc, policy, seconds),
                )
            if envpool_task is not None and peers.importable("envpool"):
                pool = _envpool(envpool_task, n, cores)
                add("envpool (C++)" + tail, functools.partial(lockstep, pool, policy, seconds))
                halves = _envpool(envpool_task, n, cores, batch_size=half)
                add(
                    f"envpool (C++) first-ready, batch_size={half}{tail}",
                    functools.partial(first_ready, halves, policy, None, seconds),
                )
            add(ours_name + tail, functools.partial(lockstep, ours, policy, seconds))
            add(first_name + tail, functools.partial(first_ready, ours, policy, half, seconds))
    with environment_variable(TORCH_THREADS_VARIABLE, "keep"):
        add(ours_name + KEPT, functools.partial(lockstep, ours, policy, seconds))
    reniced = functools.partial(_reniced, ours)
    add(ours_name + DEFAULTS + RENICED, functools.partial(lockstep, reniced, policy, seconds))
    add(
        first_name + DEFAULTS + RENICED,
        functools.partial(first_ready, reniced, policy, half, seconds),
    )
    return measured


def _add(
    measured: list[Row],
    env_name: str,
    n: int,
    log: Callable[[str], None],
    name: str,
    measure: Callable[[], float],
) -> None:
    """Measure one row once the machine is idle again; log it."""
    gc.collect()
    peers.settle()  # what the previous one left behind has finished
    measured.append(Row(env_name, name, n, measure()))
    log(f"{env_name}: {name}: {measured[-1].steps_per_second:.0f}/s")


def _envpool(task: str, n: int, threads: int, **kwargs: Any) -> Callable[[], Any]:
    import envpool

    return functools.partial(
        envpool.make, task, env_type="gymnasium", num_envs=n, num_threads=threads, **kwargs
    )


def lockstep(make_vec: Callable[[], Any], policy: str, seconds: float) -> float:
    """``obs = step(policy(obs))[0]`` of every env (gymnasium's API or SB3's); env steps/s."""
    vec = make_vec()
    try:
        act = _policy_of(vec, policy)
        first = vec.reset()
        holder = [first[0] if isinstance(first, tuple) else first]

        def step(_: int) -> None:
            holder[0] = vec.step(act(holder[0]))[0]

        return measure_steps_per_second(step, vec.num_envs, seconds=seconds, warmup_steps=20)
    finally:
        vec.close()


def first_ready(
    make_vec: Callable[[], Any], policy: str | None, batch_size: int | None, seconds: float
) -> float:
    """``recv`` the envs that are ready, act on them, ``send`` them back; env steps/s.

    Ours with ``recv(batch_size=...)``; envpool (`batch_size` None) with its own batch size.
    `policy` None: pre-drawn actions.
    """
    vec = make_vec()
    try:
        act = _policy_of(vec, policy)
        vec.async_reset()
        recv = vec.recv
        if batch_size is not None:
            recv = functools.partial(vec.recv, batch_size=batch_size)

        def step() -> int:
            obs, *_, infos = recv()
            vec.send(act(obs), infos["env_id"])
            return len(obs)

        for _ in range(20):
            step()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            count += step()
        return count / (time.perf_counter() - start)
    finally:
        vec.close()


def recv_send(envs: Any, k: int) -> Callable[[int], int]:
    """Round `t` of first-ready stepping: how many envs ``recv(batch_size=k)`` gave back.

    The envs received are sent pre-drawn actions at once. Call ``envs.async_reset`` first.
    """
    actions = action_samples(envs.action_space)

    def one(t: int) -> int:
        *_, infos = envs.recv(batch_size=k)
        ids = infos["env_id"]
        envs.send(actions[t % len(actions)][: len(ids)], ids)
        return len(ids)

    return one


def _policy_of(vec: Any, policy: str | None) -> Callable[[Any], Any]:
    """`policy` over `vec`'s spaces; None: pre-drawn actions (as many as asked for)."""
    single = getattr(vec, "single_observation_space", None)
    if single is None:  # SB3's VecEnv and envpool name one env's spaces without "single_"
        observations, actions = vec.observation_space, vec.action_space
    else:
        observations, actions = single, vec.single_action_space
    if policy is not None:
        return make_policy(policy, observations, actions)
    samples = action_samples(batch_space(actions, vec.num_envs))
    count = itertools.count()
    return lambda obs: samples[next(count) % len(samples)][: len(obs)]


def _subproc(fns: list[Callable[[], Any]]) -> Callable[[], Any]:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    return functools.partial(SubprocVecEnv, fns, start_method="fork")


def _reniced(make_vec: Callable[[], GymnasiumVectorEnv]) -> GymnasiumVectorEnv:
    """Ours, its worker processes set to the driver's niceness (Ray starts them at 15)."""
    vec = make_vec()
    for pid in vec._engine.run_on_workers("pid"):  # (through the private engine)
        os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0))
    return vec


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run with torch's intra-op threads set to `threads` (None: torch's default)."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
