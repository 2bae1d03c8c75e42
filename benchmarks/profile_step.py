"""Where the time of one `GymnasiumVectorEnv.step` (and first-ready `recv` + `send`) goes.

Run by hand from the repository root (it writes the ``profile`` section of docs/performance.md):

    python -m benchmarks.profile_step

Two workloads: HalfCheetah-v5 in 2 workers x 8 (issue #22's driver target: at most 100 µs of
driver CPU per step) and CartPole in 2 workers x 64. For each transport it measures the wall
time of a step, the CPU time the driver's main thread spends on it (``time.thread_time``: the
faces, the engine, the syscalls), the whole driver process's (Ray's threads included), and each
worker's (psutil). The env work of one worker call (`EnvWorker` run in this process, no
transport) is measured apart, so the rest of a worker's CPU time is the transport's and the
cost of stepping in lockstep with the driver.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gymnasium as gym
import psutil
import ray
from gymnasium.vector import AutoresetMode

from benchmarks.envs import action_samples
from benchmarks.report import write_section
from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env.worker import EnvWorker

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2
TRANSPORTS = ("ray", "pipe", "auto")
WORKLOADS: dict[str, tuple[Callable[[], Any], int]] = {
    "HalfCheetah-v5": (functools.partial(gym.make, "HalfCheetah-v5"), 8),
    "CartPole-v1": (functools.partial(gym.make, "CartPole-v1"), 64),
}


def _in_process_call(env_fn: Callable[[], Any], k: int, seconds: float) -> float:
    """Seconds of one worker's step of `k` envs in this process (no transport)."""
    worker = EnvWorker([env_fn] * k, list(range(k)), AutoresetMode.NEXT_STEP.value)
    worker.handle("reset", ([None] * k, None, None))
    space = gym.vector.utils.batch_space(worker.envs[0].action_space, k)
    actions = action_samples(space)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        worker.handle("step", (actions[count % len(actions)], None))
        count += 1
    return (time.perf_counter() - start) / count


def _profile(env_fn: Callable[[], Any], k: int, transport: str, seconds: float) -> dict[str, float]:
    """Per-step seconds: wall, driver main thread, driver process, each worker (mean)."""
    envs = GymnasiumVectorEnv([env_fn] * (WORKERS * k), envs_per_worker=k, transport=transport)
    pids = envs._engine.run_on_workers("pid")  # the profile reads the workers' CPU time
    workers = [psutil.Process(pid) for pid in pids]
    actions = action_samples(envs.action_space)
    envs.reset(seed=0)
    for t in range(200):
        envs.step(actions[t % len(actions)])
    cpu = sum(sum(p.cpu_times()[:2]) for p in workers)
    thread, process = time.thread_time(), time.process_time()
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        envs.step(actions[count % len(actions)])
        count += 1
    result = {
        "wall": (time.perf_counter() - start) / count,
        "driver_thread": (time.thread_time() - thread) / count,
        "driver_process": (time.process_time() - process) / count,
        "worker": (sum(sum(p.cpu_times()[:2]) for p in workers) - cpu) / count / WORKERS,
    }
    envs.close()
    return result


def _profile_first_ready(
    env_fn: Callable[[], Any], k: int, transport: str, seconds: float
) -> dict[str, float]:
    """Per `recv(k)` + `send` of one worker's envs: the same measures as `_profile`."""
    envs = GymnasiumVectorEnv([env_fn] * (WORKERS * k), envs_per_worker=k, transport=transport)
    pids = envs._engine.run_on_workers("pid")
    workers = [psutil.Process(pid) for pid in pids]
    actions = action_samples(envs.action_space)
    envs.async_reset(seed=0)

    def one(t: int) -> None:
        *_, infos = envs.recv(batch_size=k)
        ids = infos["env_id"]
        envs.send(actions[t % len(actions)][: len(ids)], ids)

    for t in range(200):
        one(t)
    cpu = sum(sum(p.cpu_times()[:2]) for p in workers)
    thread, process = time.thread_time(), time.process_time()
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        one(count)
        count += 1
    result = {
        "wall": (time.perf_counter() - start) / count,
        "driver_thread": (time.thread_time() - thread) / count,
        "driver_process": (time.process_time() - process) / count,
        "worker": (sum(sum(p.cpu_times()[:2]) for p in workers) - cpu) / count,
    }
    envs.recv()
    envs.close()
    return result


def main() -> None:
    """Profile every transport on both workloads and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    time.sleep(10)  # let Ray's start-up (idle worker processes importing) finish first
    rows = {
        name: {t: _profile(env_fn, k, t, args.seconds) for t in TRANSPORTS}
        for name, (env_fn, k) in WORKLOADS.items()
    }
    first_ready = {
        name: {t: _profile_first_ready(env_fn, k, t, args.seconds) for t in TRANSPORTS}
        for name, (env_fn, k) in WORKLOADS.items()
    }
    ray.shutdown()
    env_work = {
        name: _in_process_call(env_fn, k, args.seconds) for name, (env_fn, k) in WORKLOADS.items()
    }
    report = _report(rows, env_work, args.seconds) + _report_first_ready(first_ready, env_work)
    write_section(Path(args.out), "profile", report)
    print(f"wrote {args.out}")


def _report(
    rows: dict[str, dict[str, dict[str, float]]], env_work: dict[str, float], seconds: float
) -> str:
    command = "python -m benchmarks.profile_step" + (
        f" --seconds {seconds:g}" if seconds != 5 else ""
    )
    versions = ", ".join(f"{p} {version(p)}" for p in ("ray", "gymnasium", "numpy", "mujoco"))
    lines = [
        "## One step, by transport",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; {versions}",
        "",
        "Microseconds per vector step; the workers run in parallel with each other, and the "
        "driver's main thread works while they wait (lockstep).",
    ]
    for name, by_transport in rows.items():
        k = WORKLOADS[name][1]

        def line(label: str, get: Any, rows_: dict[str, dict[str, float]] = by_transport) -> str:
            return f"| {label} | " + " | ".join(f"{get(rows_[t]):,.0f}" for t in TRANSPORTS) + " |"

        work = env_work[name] * 1e6
        lines += [
            "",
            f"### {name}, {WORKERS} workers x {k}",
            "",
            '| | `transport="ray"` (Ray calls) | `"pipe"` (pipes only) '
            '| `"auto"` (pipes and shared memory) |',
            "|---|---:|---:|---:|",
            line("wall time of the step", lambda r: r["wall"] * 1e6),
            line("driver, main thread: CPU time", lambda r: r["driver_thread"] * 1e6),
            line("driver, whole process: CPU time", lambda r: r["driver_process"] * 1e6),
            line("one worker: CPU time of one call", lambda r: r["worker"] * 1e6),
            f"| one worker: env work of one call ({k} env steps, in-process) | "
            + " | ".join(f"{work:,.0f}" for _ in TRANSPORTS)
            + " |",
            line(
                "one worker: the rest (transport, lockstep)",
                lambda r, work=work: max(0.0, r["worker"] * 1e6 - work),
            ),
            line("env steps/s", lambda r, k=k: WORKERS * k / r["wall"]),
        ]
    return "\n".join(lines)


def _report_first_ready(
    rows: dict[str, dict[str, dict[str, float]]], env_work: dict[str, float]
) -> str:
    """The first-ready tables: per `recv(k)` + `send` of one worker's k envs."""
    lines = [
        "",
        "",
        "## First-ready: one `recv` + `send` of one worker's envs, by transport",
        "",
        f"`recv(batch_size=k)` then `send` of the k envs received, {WORKERS} workers x k "
        "(while the driver handles one worker, the other steps); microseconds per `recv` + "
        "`send`, the worker's CPU time per call of its k envs.",
    ]
    for name, by_transport in rows.items():
        k = WORKLOADS[name][1]

        def line(label: str, get: Any, rows_: dict[str, dict[str, float]] = by_transport) -> str:
            return f"| {label} | " + " | ".join(f"{get(rows_[t]):,.0f}" for t in TRANSPORTS) + " |"

        work = env_work[name] * 1e6
        lines += [
            "",
            f"### {name}, {WORKERS} workers x {k}, `recv({k})`",
            "",
            '| | `transport="ray"` | `"pipe"` | `"auto"` |',
            "|---|---:|---:|---:|",
            line("wall time per `recv` + `send`", lambda r: r["wall"] * 1e6),
            line("driver, main thread: CPU time", lambda r: r["driver_thread"] * 1e6),
            line("driver, whole process: CPU time", lambda r: r["driver_process"] * 1e6),
            line("one worker: CPU time of one call", lambda r: r["worker"] * 1e6),
            line(
                "one worker: the rest (transport, waiting)",
                lambda r, work=work: max(0.0, r["worker"] * 1e6 - work),
            ),
            line("env steps/s", lambda r, k=k: k / r["wall"]),
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
