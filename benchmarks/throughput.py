"""Env steps/s of ray_multiprocess_env against gymnasium, stable-baselines3 and pfrl.

Run by hand from the repository root (it writes docs/benchmarks.md and docs/benchmarks.png):

    python -m benchmarks.throughput

Every implementation steps the same envs with the same pre-drawn actions for about `--seconds`
seconds after a warm-up; the table gives env steps/s and the ratio to a raw single-env loop
measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import ray

from benchmarks.envs import CpuBoundEnv, calibrate
from benchmarks.report import write_section
from ray_multiprocess_env import GymAPIBridge, GymnasiumVectorEnv
from ray_multiprocess_env.bench import measure_steps_per_second

ROOT = Path(__file__).resolve().parent.parent
MAX_PROCESSES = 128  # one process per env beyond this is not run on a 2-core machine
MAX_RAY_ACTORS = 32  # one Ray actor (a full Python process) per env beyond this is not run


@dataclass
class Row:
    env: str
    implementation: str
    num_envs: int
    steps_per_second: float


def _actions(num_envs: int, count: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 2, size=num_envs) for _ in range(count)]


def _raw(env_fn: Callable[[], gym.Env], seconds: float) -> float:
    env = env_fn()
    env.reset(seed=0)
    actions = _actions(1)

    def step(t: int) -> None:
        _, _, terminated, truncated, _ = env.step(int(actions[t % len(actions)][0]))
        if terminated or truncated:
            env.reset()

    rate = measure_steps_per_second(step, 1, seconds=seconds)
    env.close()
    return rate


def _gymnasium(make_vec: Callable[[], Any], num_envs: int, seconds: float) -> float:
    vec = make_vec()
    vec.reset(seed=0)
    actions = _actions(num_envs)
    try:
        return measure_steps_per_second(
            lambda t: vec.step(actions[t % len(actions)]), num_envs, seconds=seconds
        )
    finally:
        vec.close()


def _sb3(env_fns: list[Callable[[], gym.Env]], seconds: float) -> float:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    vec = SubprocVecEnv(env_fns, start_method="fork")
    vec.reset()
    actions = _actions(len(env_fns))
    try:
        return measure_steps_per_second(
            lambda t: vec.step(actions[t % len(actions)]), len(env_fns), seconds=seconds
        )
    finally:
        vec.close()


def _pfrl(env_fns: list[Callable[[], Any]], seconds: float) -> float:
    from pfrl.envs import MultiprocessVectorEnv

    vec = MultiprocessVectorEnv(env_fns)
    vec.reset()
    actions = _actions(len(env_fns))

    def step(t: int) -> None:
        _, _, dones, _ = vec.step(actions[t % len(actions)])
        if any(dones):
            vec.reset(np.logical_not(dones))

    try:
        return measure_steps_per_second(step, len(env_fns), seconds=seconds)
    finally:
        vec.close()


def _bridged(env_fn: Callable[[], gym.Env]) -> GymAPIBridge:
    return GymAPIBridge(env_fn())


def run(
    env_name: str,
    env_fn: Callable[[], gym.Env],
    ns: list[int],
    ours_k: list[int],
    extra_sync: list[int],
    seconds: float,
    log: Callable[[str], None],
    plain_k: tuple[int, ...] = (),
) -> list[Row]:
    """Measure every implementation on one env; returns one row per measurement."""
    rows = [Row(env_name, "raw single-env loop", 1, _raw(env_fn, seconds))]
    log(f"{env_name}: raw {rows[0].steps_per_second:.0f}/s")

    def add(implementation: str, n: int, measure: Callable[..., float], *args: Any) -> None:
        gc.collect()
        rate = measure(*args)
        rows.append(Row(env_name, implementation, n, rate))
        log(f"{env_name}: {implementation} n={n}: {rate:.0f}/s")

    sync = functools.partial(gym.vector.SyncVectorEnv)
    for n in ns:
        fns = [env_fn] * n
        add("gymnasium SyncVectorEnv", n, _gymnasium, functools.partial(sync, fns), n, seconds)
        if n <= MAX_PROCESSES:
            make_async = functools.partial(gym.vector.AsyncVectorEnv, fns, context="fork")
            add("gymnasium AsyncVectorEnv", n, _gymnasium, make_async, n, seconds)
            add("SB3 SubprocVecEnv", n, _sb3, fns, seconds)
            bridged = [functools.partial(_bridged, env_fn)] * n
            add("pfrl MultiprocessVectorEnv", n, _pfrl, bridged, seconds)
        if n <= MAX_RAY_ACTORS:
            ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=1)
            add("ours, 1 env per actor", n, _gymnasium, ours, n, seconds)
    for k in ours_k:
        ours = functools.partial(GymnasiumVectorEnv, [env_fn] * (2 * k), envs_per_worker=k)
        add(f"ours, 2 workers x {k}", 2 * k, _gymnasium, ours, 2 * k, seconds)
    for k in plain_k:  # the same, with every step a Ray actor call (no pipes)
        ours = functools.partial(
            GymnasiumVectorEnv, [env_fn] * (2 * k), envs_per_worker=k, transport="ray"
        )
        add(f"ours with Ray calls only, 2 workers x {k}", 2 * k, _gymnasium, ours, 2 * k, seconds)
    for n in extra_sync:
        add(
            "gymnasium SyncVectorEnv",
            n,
            _gymnasium,
            functools.partial(sync, [env_fn] * n),
            n,
            seconds,
        )
    return rows


def _rate(rows: list[Row], env: str, implementation: str, n: int) -> float | None:
    for row in rows:
        if (row.env, row.implementation, row.num_envs) == (env, implementation, n):
            return row.steps_per_second
    return None


def _targets(rows: list[Row]) -> list[str]:
    checks = [
        (
            "CartPole, 2 workers x 64 envs >= 1.0x gymnasium SyncVectorEnv with 128 envs",
            1.0,
            ("CartPole", "ours, 2 workers x 64", 128),
            ("CartPole", "gymnasium SyncVectorEnv", 128),
        ),
        (
            "CartPole, 2 workers x 64 envs >= 5x gymnasium AsyncVectorEnv with 128 envs",
            5.0,
            ("CartPole", "ours, 2 workers x 64", 128),
            ("CartPole", "gymnasium AsyncVectorEnv", 128),
        ),
        (
            "CartPole, 2 workers x 512 envs >= 1.0x gymnasium SyncVectorEnv with 1024 envs",
            1.0,
            ("CartPole", "ours, 2 workers x 512", 1024),
            ("CartPole", "gymnasium SyncVectorEnv", 1024),
        ),
        (
            "1 ms env, 2 workers x 8 envs >= 1.75x the raw single-env loop",
            1.75,
            ("1 ms env", "ours, 2 workers x 8", 16),
            ("1 ms env", "raw single-env loop", 1),
        ),
        (
            "1 ms env, 2 workers x 8 envs >= 0.95x the same with Ray calls only",
            0.95,
            ("1 ms env", "ours, 2 workers x 8", 16),
            ("1 ms env", "ours with Ray calls only, 2 workers x 8", 16),
        ),
        (
            "CartPole, 2 workers x 64 envs: pipes against Ray calls only (no target)",
            0.0,
            ("CartPole", "ours, 2 workers x 64", 128),
            ("CartPole", "ours with Ray calls only, 2 workers x 64", 128),
        ),
    ]
    lines = []
    for text, goal, ours, peer in checks:
        a, b = _rate(rows, *ours), _rate(rows, *peer)
        if a is None or b is None:
            lines.append(f"- {text}: not measured in this run")
            continue
        ratio = a / b
        verdict = "measured" if goal == 0 else "**met**" if ratio >= goal else "**not met**"
        lines.append(f"- {text}: {verdict}, {ratio:.2f}x ({a:,.0f} vs {b:,.0f} env steps/s)")
    return lines


def _markdown(rows: list[Row], command: str, iterations: int, seconds: float) -> str:
    packages = ["ray", "gymnasium", "numpy", "stable-baselines3", "pfrl", "torch"]
    versions = ", ".join(f"{p} {version(p)}" for p in packages)
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    out = [
        "## Throughput against gymnasium, stable-baselines3 and pfrl",
        "",
        "Env steps per second (higher is better) of every vector env on the same envs and the",
        "same pre-drawn random actions, each run for about "
        f"{seconds:g} s after a warm-up, all in one run.",
        "The ratio column compares with the raw single-env loop of the same env in the same run.",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
        f"{platform.system()}",
        f"- Versions: {versions}",
        f"- 1 ms env: `benchmarks/envs.py:CpuBoundEnv`, {iterations} iterations of integer "
        "arithmetic per step (calibrated to about 1 ms in this run), 200-step episodes.",
        "- Subprocess-per-env peers run up to "
        f"{MAX_PROCESSES} envs; one Ray actor per env up to {MAX_RAY_ACTORS} envs "
        "(each actor is a full Python process).",
        "",
        "### Targets",
        "",
        *_targets(rows),
        "",
        "### Results",
        "",
        "| env | implementation | envs | env steps/s | x raw loop |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        raw = _rate(rows, row.env, "raw single-env loop", 1) or float("nan")
        out.append(
            f"| {row.env} | {row.implementation} | {row.num_envs} | "
            f"{row.steps_per_second:,.0f} | {row.steps_per_second / raw:.2f} |"
        )
    out += ["", "![env steps/s against the number of envs](benchmarks.png)", ""]
    return "\n".join(out)


def _plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r.env for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4.5), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        env_rows = [r for r in rows if r.env == env]
        kinds = {r.implementation.split(", 2 workers")[0] for r in env_rows}
        for kind in sorted(kinds):
            pts = sorted(
                (r.num_envs, r.steps_per_second)
                for r in env_rows
                if r.implementation.split(", 2 workers")[0] == kind
            )
            label = "ours, 2 workers x n/2" if kind == "ours" else kind
            if kind == "raw single-env loop":
                ax.axhline(pts[0][1], color="grey", linestyle="--", label=kind)
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="envs", ylabel="env steps/s", title=env)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    log = functools.partial(print, file=sys.stderr, flush=True)
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    iterations = calibrate(1.0)
    rows = run(
        "CartPole",
        functools.partial(gym.make, "CartPole-v1"),
        [8, 32, 128],
        [1, 16, 64, 256, 512],
        [1024],
        args.seconds,
        log,
        plain_k=(64,),
    )
    rows += run(
        "1 ms env",
        functools.partial(CpuBoundEnv, iterations),
        [8, 32, 128],
        [1, 4, 8, 16, 64],
        [],
        args.seconds,
        log,
        plain_k=(8,),
    )
    ray.shutdown()
    out = Path(args.out)
    command = "python -m benchmarks.throughput" + (
        f" --seconds {args.seconds:g}" if args.seconds != 3.0 else ""
    )
    write_section(out, "throughput", _markdown(rows, command, iterations, args.seconds))
    _plot(rows, out.with_suffix(".png"))
    log(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
