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
import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import ray

from benchmarks.envs import CpuBoundEnv, FramesEnv, calibrate, raw_loop_count
from benchmarks.report import write_section
from ray_multiprocess_env import GymAPIBridge, GymnasiumVectorEnv
from ray_multiprocess_env.bench import measure_steps_per_second

ROOT = Path(__file__).resolve().parent.parent
MAX_PROCESSES = 128  # one process per env beyond this is not run on a 2-core machine
LIMIT = "machine limit: raw loops at once"  # one per core, each in its own process


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


def _limit(env_fn: Callable[[], gym.Env], processes: int, seconds: float) -> float:
    """The machine's limit: `processes` independent raw single-env loops at once, summed."""
    context = multiprocessing.get_context("spawn")
    start, counts = context.Event(), context.Queue()
    children = [
        context.Process(target=raw_loop_count, args=(env_fn, seconds, start, counts))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    time.sleep(2.0)  # every child imported and warmed up (they wait for `start`)
    start.set()
    rates = [counts.get(timeout=120) for _ in children]
    for child in children:
        child.join()
    return float(sum(rates))


def _cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat: user ... steal), or [] off Linux."""
    try:
        return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return []


def _steal(before: list[int], after: list[int]) -> str:
    """The share of CPU time the hypervisor gave to others (steal) between two readings."""
    if len(before) < 8 or len(after) < 8:
        return "unknown"
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return f"{100 * delta[7] / max(1, sum(delta)):.1f}%"


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def run(
    env_name: str,
    env_fn: Callable[[], gym.Env],
    workers: int,
    ks: list[int],
    seconds: float,
    log: Callable[[str], None],
    plain_k: tuple[int, ...] = (),
    peer_ns: tuple[int, ...] = (),
    view_k: tuple[int, ...] = (),
) -> list[Row]:
    """Measure every implementation on one env; returns one row per measurement.

    Ours runs `workers` workers x k envs for each k in `ks` (and with Ray calls only for
    `plain_k`, with ``copy=False`` for `view_k`); gymnasium's vector envs run the same total
    numbers of envs (and `peer_ns`), subprocess-per-env peers up to MAX_PROCESSES.
    """
    cores = os.cpu_count() or 1
    rows = [Row(env_name, "raw single-env loop", 1, _raw(env_fn, seconds))]
    log(f"{env_name}: raw {rows[0].steps_per_second:.0f}/s")
    rows.append(Row(env_name, LIMIT, cores, _limit(env_fn, cores, seconds)))
    log(f"{env_name}: {cores} raw loops at once {rows[-1].steps_per_second:.0f}/s")

    def add(implementation: str, n: int, measure: Callable[..., float], *args: Any) -> None:
        gc.collect()
        rate = measure(*args)
        rows.append(Row(env_name, implementation, n, rate))
        log(f"{env_name}: {implementation} n={n}: {rate:.0f}/s")

    for n in sorted({workers * k for k in ks} | set(peer_ns)):
        fns = [env_fn] * n
        sync = functools.partial(gym.vector.SyncVectorEnv, fns)
        add("gymnasium SyncVectorEnv", n, _gymnasium, sync, n, seconds)
        if n <= MAX_PROCESSES:
            make_async = functools.partial(gym.vector.AsyncVectorEnv, fns, context="fork")
            add("gymnasium AsyncVectorEnv", n, _gymnasium, make_async, n, seconds)
            if _importable("stable_baselines3"):
                add("SB3 SubprocVecEnv", n, _sb3, fns, seconds)
            if _importable("pfrl"):
                bridged = [functools.partial(_bridged, env_fn)] * n
                add("pfrl MultiprocessVectorEnv", n, _pfrl, bridged, seconds)
    for k in ks:
        fns = [env_fn] * (workers * k)
        ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=k)
        add(f"ours, {workers} workers x {k}", workers * k, _gymnasium, ours, workers * k, seconds)
    for k in view_k:  # the same, observations handed out as a view of the shared memory
        fns = [env_fn] * (workers * k)
        ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=k, copy=False)
        name = f"ours with copy=False, {workers} workers x {k}"
        add(name, workers * k, _gymnasium, ours, workers * k, seconds)
    for k in plain_k:  # the same, with every step a Ray actor call (no pipes)
        fns = [env_fn] * (workers * k)
        ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=k, transport="ray")
        name = f"ours with Ray calls only, {workers} workers x {k}"
        add(name, workers * k, _gymnasium, ours, workers * k, seconds)
    return rows


def _rate(rows: list[Row], env: str, implementation: str, n: int | None = None) -> float | None:
    for row in rows:
        if (row.env, row.implementation) == (env, implementation) and n in (None, row.num_envs):
            return row.steps_per_second
    return None


def _targets(rows: list[Row], workers: int) -> list[str]:
    """Issue #14's targets (2 cores, or many cores), and the older ones of #3 and #9."""
    w = workers

    def ours(env: str, k: int) -> tuple[str, str, int]:
        return env, f"ours, {w} workers x {k}", w * k

    def limit(env: str) -> tuple[str, str, None]:
        return env, LIMIT, None

    def gymnasium(env: str, kind: str, k: int) -> tuple[str, str, int]:
        return env, f"gymnasium {kind}VectorEnv", w * k

    if (os.cpu_count() or 1) <= 2:
        checks = [
            (
                "frames, W x 16 >= 1.5x AsyncVectorEnv",
                1.5,
                ours("frames", 16),
                gymnasium("frames", "Async", 16),
            ),
            ("frames, W x 16 >= 0.8 of the limit", 0.8, ours("frames", 16), limit("frames")),
            (
                "CartPole, W x 64 >= 1.3x SyncVectorEnv",
                1.3,
                ours("CartPole", 64),
                gymnasium("CartPole", "Sync", 64),
            ),
            (
                "CartPole, W x 512 >= 0.8 of the limit",
                0.8,
                ours("CartPole", 512),
                limit("CartPole"),
            ),
            ("1 ms env, W x 8 >= 0.9 of the limit", 0.9, ours("1 ms env", 8), limit("1 ms env")),
            (
                "CartPole, W x 64 >= 5x AsyncVectorEnv (#3)",
                5.0,
                ours("CartPole", 64),
                gymnasium("CartPole", "Async", 64),
            ),
            (
                "CartPole, W x 512 >= 1.0x SyncVectorEnv (#9)",
                1.0,
                ours("CartPole", 512),
                gymnasium("CartPole", "Sync", 512),
            ),
            (
                "1 ms env, W x 8 >= 0.95x the same with Ray calls only (#9)",
                0.95,
                ours("1 ms env", 8),
                ("1 ms env", f"ours with Ray calls only, {w} workers x 8", w * 8),
            ),
        ]
    else:
        checks = [
            (
                "CartPole, W x 256 >= 0.75 of the limit",
                0.75,
                ours("CartPole", 256),
                limit("CartPole"),
            ),
            ("frames, W x 16 >= 0.6 of the limit", 0.6, ours("frames", 16), limit("frames")),
            ("1 ms env, W x 4 >= 0.9 of the limit", 0.9, ours("1 ms env", 4), limit("1 ms env")),
        ]
    checks.append(
        (
            "frames, W x 16 with copy=False: of the limit (no target)",
            0.0,
            ("frames", f"ours with copy=False, {w} workers x 16", w * 16),
            limit("frames"),
        )
    )
    checks.append(
        (
            "CartPole, W x 64: against Ray calls only (no target)",
            0.0,
            ours("CartPole", 64),
            ("CartPole", f"ours with Ray calls only, {w} workers x 64", w * 64),
        ),
    )
    lines = []
    for text, goal, mine, peer in checks:
        a, b = _rate(rows, *mine), _rate(rows, *peer)
        text = text.replace("W x", f"{w} workers x")
        if a is None or b is None:
            lines.append(f"- {text}: not measured in this run")
            continue
        ratio = a / b
        verdict = "measured" if goal == 0 else "**met**" if ratio >= goal else "**not met**"
        lines.append(f"- {text}: {verdict}, {ratio:.3f}x ({a:,.0f} vs {b:,.0f} env steps/s)")
    return lines


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _markdown(
    rows: list[Row],
    command: str,
    iterations: dict[str, int],
    seconds: float,
    workers: int,
    steal: str,
) -> str:
    packages = ["ray", "gymnasium", "numpy", "stable-baselines3", "pfrl", "torch"]
    versions = ", ".join(f"{p} {_version(p)}" for p in packages)
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    cores = os.cpu_count()
    out = [
        f"## Throughput on {cores} CPUs against the machine's limit, gymnasium, SB3 and pfrl",
        "",
        "Env steps per second (higher is better) of every vector env on the same envs and the",
        "same pre-drawn random actions, each run for about "
        f"{seconds:g} s after a warm-up, all in one run. The machine's limit is {cores} "
        "independent raw single-env loops at once, one process per CPU (their summed rate).",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {cores} CPUs ({cpu}), Python {platform.python_version()}, "
        f"{platform.system()}; CPU time stolen by the hypervisor during the run: {steal}",
        f"- Versions: {versions}",
        f"- Ours: {workers} workers (`num_workers`) x k envs each, the default transport "
        "(pipes and shared memory).",
        f"- 1 ms env: `benchmarks/envs.py:CpuBoundEnv`, {iterations['1 ms env']} iterations of "
        "integer arithmetic per step (calibrated to about 1 ms in this run), 200-step episodes.",
        f"- frames: `benchmarks/envs.py:FramesEnv`, 84x84x4 uint8 observations, "
        f"{iterations['frames']} iterations (about 0.1 ms) per step, 500-step episodes.",
        f"- Subprocess-per-env peers run up to {MAX_PROCESSES} envs.",
        "",
        "### Targets",
        "",
        *_targets(rows, workers),
        "",
        "### Results",
        "",
        "| env | implementation | envs | env steps/s | x raw loop | of the limit |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        raw = _rate(rows, row.env, "raw single-env loop", 1) or float("nan")
        limit = _rate(rows, row.env, LIMIT) or float("nan")
        out.append(
            f"| {row.env} | {row.implementation} | {row.num_envs} | "
            f"{row.steps_per_second:,.0f} | {row.steps_per_second / raw:.2f} | "
            f"{row.steps_per_second / limit:.2f} |"
        )
    return "\n".join(out)


def _plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r.env for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4.5), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        env_rows = [r for r in rows if r.env == env]
        kinds = {r.implementation.split(", ")[0] for r in env_rows}
        for kind in sorted(kinds):
            pts = sorted(
                (r.num_envs, r.steps_per_second)
                for r in env_rows
                if r.implementation.split(", ")[0] == kind
            )
            if kind in ("raw single-env loop", LIMIT):
                style = "--" if kind == LIMIT else ":"
                ax.axhline(pts[0][1], color="grey", linestyle=style, label=kind)
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
        ax.set(xscale="log", yscale="log", xlabel="envs", ylabel="env steps/s", title=env)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--workers", type=int, default=None, help="default: 2 on 2 cores, else cores - 1"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    workers = args.workers or (2 if cores <= 2 else cores - 1)
    many = cores > 2
    log = functools.partial(print, file=sys.stderr, flush=True)
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    iterations = {"1 ms env": calibrate(1.0), "frames": calibrate(0.1)}
    before = _cpu_times()
    rows = run(
        "CartPole",
        functools.partial(gym.make, "CartPole-v1"),
        workers,
        [64, 256] if many else [16, 64, 512],
        args.seconds,
        log,
        plain_k=(64,),
        peer_ns=(4 * cores,) if many else (),
    )
    rows += run(
        "frames",
        functools.partial(FramesEnv, iterations["frames"]),
        workers,
        [16],
        args.seconds,
        log,
        peer_ns=(4 * cores,) if many else (),
        view_k=(16,),
    )
    rows += run(
        "1 ms env",
        functools.partial(CpuBoundEnv, iterations["1 ms env"]),
        workers,
        [4, 16] if many else [4, 8, 64],
        args.seconds,
        log,
        plain_k=() if many else (8,),
        peer_ns=(4 * cores,) if many else (),
    )
    ray.shutdown()
    steal = _steal(before, _cpu_times())
    out = Path(args.out)
    command = (
        "python -m benchmarks.throughput"
        + (f" --seconds {args.seconds:g}" if args.seconds != 3.0 else "")
        + (f" --workers {args.workers}" if args.workers else "")
    )
    section = "throughput" if not many else f"throughput-{cores}-cpus"
    markdown = _markdown(rows, command, iterations, args.seconds, workers, steal)
    write_section(out, section, markdown)
    print(markdown)
    if _importable("matplotlib") and not many:
        _plot(rows, out.with_suffix(".png"))
        markdown += "\n\n![env steps/s against the number of envs](benchmarks.png)\n"
        write_section(out, section, markdown)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
