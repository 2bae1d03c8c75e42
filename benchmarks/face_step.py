"""One step of the same envs through each face, stepping alone (no policy), in one run.

Run by hand from the repository root, with nothing else running (it writes the ``face-step``
section of docs/benchmarks.md):

    python -m benchmarks.face_step [--rounds 3] [--steps 2000]

HalfCheetah-v5, 16 envs, fixed actions: ours through `SB3VecEnv` (SB3's per-env info dicts)
and through `GymnasiumVectorEnv` (gymnasium's batched infos, in columns) with the same
autoreset (same step), both 2 workers x 8, beside SB3's in-process `DummyVecEnv`. The settings
take turns each round; the table has the median over the rounds of the wall time of a step, the
driver's main-thread CPU per step, and the workers' CPU per step (psutil, all their threads).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from benchmarks.report import write_section

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
ENV_ID = "HalfCheetah-v5"
NUM_ENVS = 16


def _measure(envs: Any, step: Callable[[], Any], steps: int) -> dict[str, float]:
    """Wall µs, driver CPU µs and workers' CPU µs per step of `step` (after 200 untimed)."""
    engine = getattr(envs, "_engine", None)
    workers = [] if engine is None else [psutil.Process(p) for p in engine.run_on_workers("pid")]

    def workers_cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in workers)

    for _ in range(200):
        step()
    before, cpu, start = workers_cpu(), time.thread_time(), time.perf_counter()
    for _ in range(steps):
        step()
    wall = time.perf_counter() - start
    return {
        "wall": wall / steps * 1e6,
        "driver": (time.thread_time() - cpu) / steps * 1e6,
        "workers": (workers_cpu() - before) / steps * 1e6,
    }


def _sb3(steps: int) -> dict[str, float]:
    from ray_multiprocess_env import make_sb3_vec_env

    envs = make_sb3_vec_env(ENV_ID, NUM_ENVS, num_workers=2, seed=0)
    try:
        envs.reset()
        actions = np.full((NUM_ENVS, *envs.action_space.shape), 0.1, dtype=np.float32)
        return _measure(envs, lambda: envs.step(actions), steps)
    finally:
        envs.close()


def _gymnasium(steps: int) -> dict[str, float]:
    from ray_multiprocess_env import make_vector_env

    envs = make_vector_env(ENV_ID, NUM_ENVS, num_workers=2, seed=0, autoreset_mode="same_step")
    try:
        envs.reset(seed=0)
        actions = np.full(envs.action_space.shape, 0.1, dtype=np.float32)
        return _measure(envs, lambda: envs.step(actions), steps)
    finally:
        envs.close()


def _dummy(steps: int) -> dict[str, float]:
    from stable_baselines3.common.vec_env import DummyVecEnv

    envs = DummyVecEnv([lambda: gym.make(ENV_ID)] * NUM_ENVS)
    try:
        envs.reset()
        actions = np.full((NUM_ENVS, *envs.action_space.shape), 0.1, dtype=np.float32)
        return _measure(envs, lambda: envs.step(actions), steps)
    finally:
        envs.close()


SETTINGS: dict[str, Callable[[int], dict[str, float]]] = {
    "ours, SB3VecEnv (per-env infos), 2 x 8": _sb3,
    "ours, GymnasiumVectorEnv (same-step autoreset), 2 x 8": _gymnasium,
    "SB3 DummyVecEnv, in this process": _dummy,
}


def main(argv: list[str] | None = None) -> None:
    """Run the settings in turns and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per setting")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            runs[name].append(SETTINGS[name](args.steps))
            print(f"round {round_ + 1}: {name}: {runs[name][-1]}", flush=True)
    rows = []
    for name, results in runs.items():
        median = {key: float(np.median([r[key] for r in results])) for key in results[0]}
        workers = f"{median['workers']:.0f}" if median["workers"] else "-"
        rows.append(f"| {name} | {median['wall']:.0f} | {median['driver']:.0f} | {workers} |")
    table = "\n".join(
        [
            "## One step of 16 HalfCheetahs through each face, stepping alone (#66)",
            "",
            f"`python -m benchmarks.face_step --rounds {args.rounds} --steps {args.steps}`, "
            f"{datetime.date.today()}, {platform.machine()}, nothing else running; fixed actions, "
            "no policy; the median of the rounds, the settings taking turns.",
            "",
            "| setting | wall µs per step | driver CPU µs per step | workers' CPU µs per step |",
            "|---|---:|---:|---:|",
            *rows,
        ]
    )
    print(table)
    if not args.no_write:
        write_section(DOCS, "face-step", table)


if __name__ == "__main__":
    main()
