"""Where the time of one `GymnasiumVectorEnv.step` goes, for each transport.

Run by hand from the repository root (it writes the ``profile`` section of docs/performance.md):

    python -m benchmarks.profile_step

2 workers x 64 CartPole envs. For each transport it measures the wall time of a step, the
driver's CPU time (split into phases with `time.perf_counter` around the adapter's own steps)
and the workers' CPU time (psutil). The env work of one worker call (`EnvWorker` step
run in this process: 64 env steps, autoreset, stacking) is timed separately, so the rest of
the worker's CPU time is the transport's: receiving the actions, sending the result.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import ray
from gymnasium.vector import AutoresetMode

from benchmarks.report import write_section
from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env.batch import join_batches, split_batch
from ray_multiprocess_env.worker import EnvWorker

ROOT = Path(__file__).resolve().parent.parent
WORKERS, K = 2, 64
TRANSPORTS = ("ray", "pipe", "auto")


def _in_process_call(seconds: float) -> float:
    """Seconds of one worker step of 64 CartPoles in this process (no transport)."""
    fns = [functools.partial(gym.make, "CartPole-v1")] * K
    worker = EnvWorker(fns, list(range(K)), AutoresetMode.NEXT_STEP.value)
    worker.handle("reset", ([None] * K, None, None))
    actions = np.zeros(K, dtype=np.int64)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        worker.handle("step", (actions,))
        count += 1
    return (time.perf_counter() - start) / count


def _profile(transport: str, seconds: float) -> dict[str, float]:
    """Per-step seconds of each phase for one transport."""
    envs = GymnasiumVectorEnv(
        [functools.partial(gym.make, "CartPole-v1")] * (WORKERS * K),
        envs_per_worker=K,
        transport=transport,
    )
    engine = envs._engine  # the profile times the private engine's phases
    workers = [psutil.Process(p) for p in engine.run("pid", [()] * WORKERS, "pid")]
    actions = np.zeros(WORKERS * K, dtype=np.int64)
    bounds = engine.bounds
    phases = dict.fromkeys(("split", "submit", "wait", "join"), 0.0)
    envs.reset(seed=0)
    for _ in range(200):
        envs.step(actions)
    cpu = sum(sum(p.cpu_times()[:2]) for p in workers)
    driver, start, count = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        chunks = split_batch(envs.single_action_space, actions, bounds)
        t1 = time.perf_counter()
        launched = engine.launch("step", [(chunk,) for chunk in chunks], "step")
        t2 = time.perf_counter()
        results = engine.wait(launched)
        t3 = time.perf_counter()
        join_batches(envs.single_observation_space, [r[0] for r in results])
        np.concatenate([r[1] for r in results])
        t4 = time.perf_counter()
        for key, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            phases[key] += value
        count += 1
    wall = (time.perf_counter() - start) / count
    phases = {key: value / count for key, value in phases.items()}
    phases["wall"] = wall
    phases["driver_cpu"] = (time.process_time() - driver) / count
    phases["worker_cpu"] = (sum(sum(p.cpu_times()[:2]) for p in workers) - cpu) / count / WORKERS
    envs.close()
    return phases


def main() -> None:
    """Profile both transports and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    time.sleep(10)  # let Ray's start-up (idle worker processes importing) finish first
    rows = {transport: _profile(transport, args.seconds) for transport in TRANSPORTS}
    ray.shutdown()
    env_work = _in_process_call(args.seconds)
    write_section(Path(args.out), "profile", _report(rows, env_work, args.seconds))
    print(f"wrote {args.out}")


def _report(rows: dict[str, dict[str, float]], env_work: float, seconds: float) -> str:
    command = "python -m benchmarks.profile_step" + (
        f" --seconds {seconds:g}" if seconds != 5 else ""
    )
    versions = ", ".join(f"{p} {version(p)}" for p in ("ray", "gymnasium", "numpy"))

    def us(value: float) -> str:
        return f"{value * 1e6:,.0f}"

    def line(name: str, get: Any) -> str:
        return f"| {name} | " + " | ".join(us(get(rows[t])) for t in TRANSPORTS) + " |"

    lines = [
        "## One step of 2 workers x 64 CartPole envs",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; {versions}",
        "",
        "Microseconds per vector step (driver phases are wall time on the driver; the workers "
        "run in parallel with each other):",
        "",
        '| phase | `transport="ray"` (Ray calls) | `"pipe"` (pipes only) '
        '| `"auto"` (pipes and shared memory) |',
        "|---|---:|---:|---:|",
        line("driver: split the actions per worker", lambda r: r["split"]),
        line("driver: submit 2 calls (serialize, send)", lambda r: r["submit"]),
        line("driver: wait for both results (and deserialize)", lambda r: r["wait"]),
        line("driver: join observations and rewards", lambda r: r["join"]),
        line("driver: CPU time of the whole step", lambda r: r["driver_cpu"]),
        line("one worker: CPU time of one call", lambda r: r["worker_cpu"]),
        "| one worker: env work of one call (64 steps, autoreset, stacking; in-process) | "
        + " | ".join(us(env_work) for _ in TRANSPORTS)
        + " |",
        line(
            "one worker: transport overhead (CPU of a call minus env work)",
            lambda r: max(0.0, r["worker_cpu"] - env_work),
        ),
        line("wall time of the step", lambda r: r["wall"]),
        "| env steps/s | "
        + " | ".join(f"{WORKERS * K / rows[t]['wall']:,.0f}" for t in TRANSPORTS)
        + " |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
