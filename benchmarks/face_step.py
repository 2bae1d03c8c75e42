"""One step of the same envs through each face, stepping alone (no policy), in one run.

Run by hand from the repository root, with nothing else running (it writes the ``face-step``
section of docs/benchmarks.md):

    python -m benchmarks.face_step [--rounds 3] [--steps 2000] [--actions random]

HalfCheetah-v5, 16 envs, fixed actions (``--actions random``: a cycle of 100 seeded uniform
batches, which move the bodies as a policy's actions do and cost the physics about three times
as much; section ``face-step-random``): ours through `SB3VecEnv` (SB3's per-env info dicts)
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


def action_batches(kind: str, shape: tuple[int, ...]) -> list[np.ndarray]:
    """The action batches of shape `shape` that the steps take in turn: `kind` fixed or random.

    Example:
        >>> [len(action_batches(kind, (16, 6))) for kind in ("fixed", "random")]
        [1, 100]
    """
    if kind == "fixed":
        return [np.full(shape, 0.1, dtype=np.float32)]
    rng = np.random.default_rng(0)
    return [rng.uniform(-1.0, 1.0, shape).astype(np.float32) for _ in range(100)]


def _measure(envs: Any, actions: list[np.ndarray], steps: int) -> dict[str, float]:
    """Wall µs, driver CPU µs and workers' CPU µs per step of `envs` (after 200 untimed)."""
    engine = getattr(envs, "_engine", None)
    workers = [] if engine is None else [psutil.Process(p) for p in engine.run_on_workers("pid")]

    def workers_cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in workers)

    for i in range(200):
        envs.step(actions[i % len(actions)])
    before, cpu, start = workers_cpu(), time.thread_time(), time.perf_counter()
    for i in range(steps):
        envs.step(actions[i % len(actions)])
    wall = time.perf_counter() - start
    return {
        "wall": wall / steps * 1e6,
        "driver": (time.thread_time() - cpu) / steps * 1e6,
        "workers": (workers_cpu() - before) / steps * 1e6,
    }


def _sb3(steps: int, kind: str) -> dict[str, float]:
    from ray_multiprocess_env import make_sb3_vec_env

    envs = make_sb3_vec_env(ENV_ID, NUM_ENVS, num_workers=2, seed=0)
    try:
        envs.reset()
        actions = action_batches(kind, (NUM_ENVS, *envs.action_space.shape))
        return _measure(envs, actions, steps)
    finally:
        envs.close()


def _gymnasium(steps: int, kind: str) -> dict[str, float]:
    from ray_multiprocess_env import make_vector_env

    envs = make_vector_env(ENV_ID, NUM_ENVS, num_workers=2, seed=0, autoreset_mode="same_step")
    try:
        envs.reset(seed=0)
        return _measure(envs, action_batches(kind, envs.action_space.shape), steps)
    finally:
        envs.close()


def _dummy(steps: int, kind: str) -> dict[str, float]:
    from stable_baselines3.common.vec_env import DummyVecEnv

    envs = DummyVecEnv([lambda: gym.make(ENV_ID)] * NUM_ENVS)
    try:
        envs.reset()
        actions = action_batches(kind, (NUM_ENVS, *envs.action_space.shape))
        return _measure(envs, actions, steps)
    finally:
        envs.close()


SETTINGS: dict[str, Callable[[int, str], dict[str, float]]] = {
    "ours, SB3VecEnv (per-env infos), 2 x 8": _sb3,
    "ours, GymnasiumVectorEnv (same-step autoreset), 2 x 8": _gymnasium,
    "SB3 DummyVecEnv, in this process": _dummy,
}


def main(argv: list[str] | None = None) -> None:
    """Run the settings in turns and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per setting")
    parser.add_argument("--actions", choices=("fixed", "random"), default="fixed")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            runs[name].append(SETTINGS[name](args.steps, args.actions))
            print(f"round {round_ + 1}: {name}: {runs[name][-1]}", flush=True)
    rows = []
    for name, results in runs.items():
        median = {key: float(np.median([r[key] for r in results])) for key in results[0]}
        workers = f"{median['workers']:.0f}" if median["workers"] else "-"
        walls = [r["wall"] for r in results]
        wall = f"{median['wall']:.0f} ({min(walls):.0f} to {max(walls):.0f})"
        rows.append(f"| {name} | {wall} | {median['driver']:.0f} | {workers} |")
    table = "\n".join(
        [
            f"## One step of 16 HalfCheetahs through each face, stepping alone, {args.actions} "
            "actions (#66)",
            "",
            f"`python -m benchmarks.face_step --rounds {args.rounds} --steps {args.steps} "
            f"--actions {args.actions}`, {datetime.date.today()}, {platform.machine()}, nothing "
            f"else running; {args.actions} actions, no policy; the median of the rounds, the "
            "settings taking turns.",
            "",
            "| setting | wall µs per step (fastest to slowest round) | driver CPU µs per step "
            "| workers' CPU µs per step |",
            "|---|---:|---:|---:|",
            *rows,
        ]
    )
    print(table)
    if not args.no_write:
        section = "face-step" if args.actions == "fixed" else "face-step-random"
        write_section(DOCS, section, table)


if __name__ == "__main__":
    main()
