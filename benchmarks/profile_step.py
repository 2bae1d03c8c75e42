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

from benchmarks import loops
from benchmarks.envs import action_samples
from benchmarks.report import start_ray_settled, write_section
from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env._worker.env_worker import EnvWorker

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
    """Per step: seconds of wall time, of the driver's main thread and process, of a worker."""
    envs = GymnasiumVectorEnv([env_fn] * (WORKERS * k), envs_per_worker=k, transport=transport)
    actions = action_samples(envs.action_space)
    envs.reset(seed=0)
    result = _measure(envs, lambda t: envs.step(actions[t % len(actions)]), seconds, WORKERS)
    envs.close()
    return result


def _profile_first_ready(
    env_fn: Callable[[], Any], k: int, transport: str, seconds: float
) -> dict[str, float]:
    """Per `recv(k)` + `send` of one worker's envs: the same measures as `_profile`."""
    envs = GymnasiumVectorEnv([env_fn] * (WORKERS * k), envs_per_worker=k, transport=transport)
    envs.async_reset(seed=0)
    one = loops.recv_send(envs, k)

    result = _measure(envs, one, seconds, 1)
    envs.recv()
    envs.close()
    return result


def _measure(
    envs: GymnasiumVectorEnv, one: Callable[[int], Any], seconds: float, workers_per_call: int
) -> dict[str, float]:
    """Run `one(t)` for `seconds` after a warm-up: seconds per call, a worker's CPU per call."""
    pids = envs._engine.run_on_workers("pid")  # the profile reads the workers' CPU time
    workers = [psutil.Process(pid) for pid in pids]
    for t in range(200):
        one(t)
    cpu = sum(sum(p.cpu_times()[:2]) for p in workers)
    thread, process = time.thread_time(), time.process_time()
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        one(count)
        count += 1
    return {
        "wall": (time.perf_counter() - start) / count,
        "driver_thread": (time.thread_time() - thread) / count,
        "driver_process": (time.process_time() - process) / count,
        "worker": (sum(sum(p.cpu_times()[:2]) for p in workers) - cpu) / count / workers_per_call,
    }


def main() -> None:
    """Profile every transport on both workloads and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args()
    start_ray_settled()
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
    return "\n".join(lines + _tables(rows, env_work, first_ready=False))


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
    return "\n".join(lines + _tables(rows, env_work, first_ready=True))


def _tables(
    rows: dict[str, dict[str, dict[str, float]]], env_work: dict[str, float], first_ready: bool
) -> list[str]:
    """One table per workload: microseconds per step (or per `recv` + `send`), by transport."""
    lines = []
    for name, by_transport in rows.items():
        k = WORKLOADS[name][1]
        lines += [
            "",
            f"### {name}, {WORKERS} workers x {k}" + (f", `recv({k})`" if first_ready else ""),
            "",
            '| | `transport="ray"` (Ray calls) | `"pipe"` (pipes, rows after the messages) '
            '| `"auto"` (pipes and shared memory) |',
            "|---|---:|---:|---:|",
            *_table(by_transport, env_work[name] * 1e6, k, first_ready),
        ]
    return lines


def _table(
    by_transport: dict[str, dict[str, float]], work: float, k: int, first_ready: bool
) -> list[str]:
    """The rows of one table; `work`: the µs of env work of a worker's call of `k` envs."""

    def line(label: str, get: Callable[[dict[str, float]], float]) -> str:
        values = " | ".join(f"{get(by_transport[t]):,.0f}" for t in TRANSPORTS)
        return f"| {label} | {values} |"

    call, idle = ("`recv` + `send`", "waiting") if first_ready else ("the step", "lockstep")
    steps = k if first_ready else WORKERS * k  # env steps per measured call
    return [
        line(f"wall time of {call}", lambda r: r["wall"] * 1e6),
        line("driver, main thread: CPU time", lambda r: r["driver_thread"] * 1e6),
        line("driver, whole process: CPU time", lambda r: r["driver_process"] * 1e6),
        line("one worker: CPU time of one call", lambda r: r["worker"] * 1e6),
        line(f"one worker: env work of one call ({k} env steps, in-process)", lambda r: work),
        line(
            f"one worker: the rest (transport, {idle})",
            lambda r: max(0.0, r["worker"] * 1e6 - work),
        ),
        line("env steps/s", lambda r: steps / r["wall"]),
    ]


if __name__ == "__main__":
    main()
