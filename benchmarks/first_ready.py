"""First-ready stepping (`send`/`recv`) against synchronous `step` when step costs vary.

Run by hand from the repository root (it updates its section of docs/benchmarks.md):

    python -m benchmarks.first_ready

Each env step costs 0.2 to 2 ms of CPU work, drawn per step. Synchronous `step` waits for the
slowest worker every step; first-ready `recv(batch_size=half)` hands back whichever worker is
done and sends it new actions at once, so no worker waits for another.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import ray

from benchmarks.envs import VariableCostEnv, calibrate
from benchmarks.report import write_section
from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env.bench import measure_steps_per_second

ROOT = Path(__file__).resolve().parent.parent


def synchronous(envs: GymnasiumVectorEnv, seconds: float) -> float:
    """Env steps/s of `step` with all envs every time."""
    envs.reset(seed=0)
    actions = np.zeros(envs.num_envs, dtype=np.int64)
    return measure_steps_per_second(lambda t: envs.step(actions), envs.num_envs, seconds=seconds)


def first_ready(envs: GymnasiumVectorEnv, batch_size: int, seconds: float) -> float:
    """Env steps/s of `recv(batch_size)` followed by `send` to the envs received."""
    envs.async_reset(seed=0)
    envs.recv()
    envs.send(np.zeros(envs.num_envs, dtype=np.int64), list(range(envs.num_envs)))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        *_, infos = envs.recv(batch_size=batch_size)
        ids = infos["env_id"].tolist()
        steps += len(ids)
        envs.send(np.zeros(len(ids), dtype=np.int64), ids)
    rate = steps / (time.perf_counter() - start)
    envs.recv()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    env_fn = functools.partial(VariableCostEnv, calibrate(1.0))
    rows = []
    for workers, per_worker in ((2, 8), (16, 1)):
        n = workers * per_worker
        envs = GymnasiumVectorEnv([env_fn] * n, envs_per_worker=per_worker)
        sync = synchronous(envs, args.seconds)
        ready = first_ready(envs, n // 2, args.seconds)
        envs.close()
        rows.append((workers, per_worker, sync, ready))
        print(
            f"{workers} x {per_worker}: sync {sync:.0f}/s, first-ready {ready:.0f}/s",
            file=sys.stderr,
        )
    ray.shutdown()
    command = "python -m benchmarks.first_ready" + (
        f" --seconds {args.seconds:g}" if args.seconds != 10.0 else ""
    )
    versions = ", ".join(f"{p} {version(p)}" for p in ("ray", "gymnasium", "numpy"))
    lines = [
        "## First-ready `recv` against synchronous `step`",
        "",
        "Each step of `benchmarks/envs.py:VariableCostEnv` costs 0.2 to 2 ms of CPU work (drawn",
        "per step). Synchronous: `step` on all envs. First-ready: `recv(batch_size=num_envs / 2)`,",
        f"then `send` to the envs received. About {args.seconds:g} s each, in one run.",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; {versions}",
        "",
        "| workers x envs per worker | synchronous env steps/s | first-ready env steps/s "
        "| first-ready / synchronous |",
        "|---|---:|---:|---:|",
    ]
    for workers, per_worker, sync, ready in rows:
        lines.append(
            f"| {workers} x {per_worker} | {sync:,.0f} | {ready:,.0f} | {ready / sync:.2f} |"
        )
    target = rows[0][3] / rows[0][2]
    verdict = "met" if target >= 1.3 else "not met"
    lines += [
        "",
        f"Target (2 workers x 8 envs, first-ready >= 1.3x synchronous): **{verdict}**, "
        f"{target:.2f}x.",
    ]
    write_section(Path(args.out), "first-ready", "\n".join(lines))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
