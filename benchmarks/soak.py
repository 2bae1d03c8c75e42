"""Soak: step CartPole one million times and check that memory does not grow.

Run by hand from the repository root (it updates its section of docs/benchmarks.md):

    python -m benchmarks.soak

Reports the driver's resident memory and the Ray object store's use after a warm-up and at the
end; growth under 10% is the target.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import ray

from benchmarks.report import write_section
from ray_multiprocess_env import GymnasiumVectorEnv

ROOT = Path(__file__).resolve().parent.parent


def _memory() -> tuple[float, float]:
    """Driver RSS and object store bytes in use, in MiB."""
    gc.collect()
    rss = psutil.Process().memory_info().rss / 2**20
    total = ray.cluster_resources().get("object_store_memory", 0.0)
    free = ray.available_resources().get("object_store_memory", 0.0)
    return rss, (total - free) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    envs = GymnasiumVectorEnv(
        [functools.partial(gym.make, "CartPole-v1")] * 128, envs_per_worker=64
    )
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):  # warm-up: caches, pools and allocator arenas fill here
        envs.step(rng.integers(0, 2, size=128))
    rss0, store0 = _memory()
    steps, start = 0, time.perf_counter()
    while steps < args.steps:
        envs.step(rng.integers(0, 2, size=128))
        steps += 128
    seconds = time.perf_counter() - start
    rss1, store1 = _memory()
    envs.close()
    ray.shutdown()
    growth = (rss1 - rss0) / rss0
    verdict = "met" if growth < 0.10 else "not met"
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = "\n".join(
        [
            "## Soak: one million CartPole steps",
            "",
            f"`GymnasiumVectorEnv`, 2 workers x 64 envs, {steps:,} env steps in {seconds:.0f} s "
            f"({steps / seconds:,.0f} steps/s). Memory after a 200-step warm-up and at the end:",
            "",
            f"- Command: `python -m benchmarks.soak`; date: {date}",
            "",
            "| | start | end | growth |",
            "|---|---:|---:|---:|",
            f"| driver RSS (MiB) | {rss0:.1f} | {rss1:.1f} | {growth:+.1%} |",
            f"| object store in use (MiB) | {store0:.1f} | {store1:.1f} | "
            f"{store1 - store0:+.1f} MiB |",
            "",
            f"Target (driver RSS growth < 10%): **{verdict}**.",
        ]
    )
    write_section(Path(args.out), "soak", text)
    print(text, file=sys.stderr)


if __name__ == "__main__":
    main()
