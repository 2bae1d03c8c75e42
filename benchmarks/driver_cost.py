"""What the driver costs per step as workers and envs grow, fitted, beside the bare design.

Run by hand from the repository root, on a machine with nothing else running (it writes the
``driver-cost`` section of docs/performance.md):

    python -m benchmarks.driver_cost [--probe ../shared/tools/driver_probe.py] [--rounds 2]

One trainer's driver is what caps it on a machine with many cores, or a cluster: as workers
are added, the steps per second tend to ``1 / (o_d / K + e_d)``, where ``o_d`` is the driver's
CPU per worker per step and ``e_d`` its CPU per env step (K envs per worker). This script
steps ``make_vector_env("CartPole-v1", num_envs=W * K, num_workers=W)`` in lockstep with free
actions over W in {2, 4, 8, 16} and K in {8, 64} (the workers oversubscribe a small machine:
only the driver's CPU is read), and fits ``driver µs per step = W * o_d + W * K * e_d + c`` by
least squares. Beside it, in the same run, the bare plain-Python design of the project's shared
tools (``driver_probe.py``: one shared block, a pipe byte each way per worker, no error
handling) on the same grid, the settings taking turns round by round; each cell's figure is the
median of the rounds.

Ours is read as the CPU time of the driver's main thread (``getrusage`` of the thread: what a
step costs the trainer's thread); the process's CPU, Ray's own threads included, is shown
beside it. The workers do not poll for their next message, as the bare design's do not
(``RAY_MULTIPROCESS_ENV_WORKER_SPIN_US=0``), unless ``--spin auto``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from benchmarks.report import start_ray_settled, write_section

GRID = [(2, 8), (4, 8), (8, 8), (16, 8), (2, 64), (8, 64)]
PROBE = Path(__file__).resolve().parents[2] / "shared" / "tools" / "driver_probe.py"
DOC = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
_PROBE_ROW = re.compile(r"bare W=\s*(\d+) K=\s*(\d+): driver\s+([\d.]+) us/step")


def ours(w: int, k: int, seconds: float) -> tuple[float, float, float]:
    """Driver µs per step (main thread, whole process) and env steps/s of ours at W x K."""
    from ray_multiprocess_env import make_vector_env

    n = w * k
    envs = make_vector_env("CartPole-v1", num_envs=n, num_workers=w)
    try:
        envs.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, size=(64, n))
        for i in range(100):
            envs.step(actions[i % 64])
        thread0, process0 = _cpu()
        start, steps = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            envs.step(actions[steps % 64])
            steps += 1
        wall = time.perf_counter() - start
        thread1, process1 = _cpu()
    finally:
        envs.close()
    return (thread1 - thread0) / steps * 1e6, (process1 - process0) / steps * 1e6, steps * n / wall


def _cpu() -> tuple[float, float]:
    thread = resource.getrusage(resource.RUSAGE_THREAD)
    process = resource.getrusage(resource.RUSAGE_SELF)
    return thread.ru_utime + thread.ru_stime, process.ru_utime + process.ru_stime


def bare(probe: Path, seconds: float) -> dict[tuple[int, int], float]:
    """The bare design's driver µs per step on its grid (the probe, in a process of its own)."""
    out = subprocess.run(
        [sys.executable, str(probe), str(seconds)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = {(int(w), int(k)): float(us) for w, k, us in _PROBE_ROW.findall(out)}
    missing = [cell for cell in GRID if cell not in found]
    if missing:
        raise RuntimeError(f"the probe {probe} printed no row for {missing}:\n{out}")
    return found


def fit(rows: dict[tuple[int, int], float]) -> tuple[float, float, float]:
    """Least squares of ``µs per step = W * o_d + W * K * e_d + c``: ``(o_d, e_d, c)``."""
    cells = sorted(rows)
    a = np.array([[w, w * k, 1.0] for w, k in cells])
    y = np.array([rows[cell] for cell in cells])
    (o_d, e_d, c), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(o_d), float(e_d), float(c)


def ceiling(o_d: float, e_d: float, k: int = 64) -> float:
    """The env steps/s one driver feeds at most with `k` envs per worker, however many workers."""
    return 1e6 / (o_d / k + e_d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", type=Path, default=PROBE, help="the bare design's probe")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    parser.add_argument("--spin", default="0", help="the workers' polling (µs, or auto)")
    parser.add_argument("--no-write", action="store_true", help="print, leave the docs alone")
    args = parser.parse_args()
    if not args.probe.is_file():
        parser.error(f"--probe {args.probe} is not a file; pass the path of driver_probe.py")
    os.environ["RAY_MULTIPROCESS_ENV_WORKER_SPIN_US"] = args.spin
    start_ray_settled()
    runs: dict[str, dict[tuple[int, int], list[float]]] = {"ours": {}, "process": {}, "bare": {}}
    rates: dict[tuple[int, int], list[float]] = {}
    for round_ in range(args.rounds):
        for cell, us in bare(args.probe, args.seconds).items():
            if cell in GRID:
                runs["bare"].setdefault(cell, []).append(us)
        for w, k in GRID:
            thread_us, process_us, rate = ours(w, k, args.seconds)
            runs["ours"].setdefault((w, k), []).append(thread_us)
            runs["process"].setdefault((w, k), []).append(process_us)
            rates.setdefault((w, k), []).append(rate)
            print(f"round {round_ + 1} W={w:2d} K={k:3d}: ours {thread_us:7.1f} µs/step "
                  f"(process {process_us:7.1f}), bare {runs['bare'][(w, k)][-1]:7.1f}",
                  flush=True)  # fmt: skip
    median = {name: {c: statistics.median(v) for c, v in got.items()} for name, got in runs.items()}
    markdown = report(median, {c: statistics.median(v) for c, v in rates.items()}, args)
    print(markdown)
    if not args.no_write:
        write_section(DOC, "driver-cost", markdown)
        print(f"wrote the driver-cost section of {DOC}")


def report(
    median: dict[str, dict[tuple[int, int], float]],
    rates: dict[tuple[int, int], float],
    args: argparse.Namespace,
) -> str:
    fits = {name: fit(median[name]) for name in ("ours", "bare")}
    lines = [
        "### The driver's cost per step, fitted (`benchmarks.driver_cost`)",
        "",
        f"`python -m benchmarks.driver_cost --rounds {args.rounds} --seconds {args.seconds}` "
        f"(workers' polling: {args.spin}), {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()} with {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}, Ray {version('ray')}, gymnasium "
        f"{version('gymnasium')}; CartPole-v1, lockstep `step`, free actions; the median of "
        f"{args.rounds} rounds, the settings taking turns. Driver CPU per step in µs: ours (the "
        "driver's main thread; the whole process, Ray's threads too, beside it) and the bare "
        "design of `driver_probe.py`.",
        "",
        "| W x K | ours | ours, process | bare | ours / bare | ours, env steps/s here |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for w, k in GRID:
        o, b = median["ours"][(w, k)], median["bare"][(w, k)]
        lines.append(
            f"| {w} x {k} | {o:.0f} | {median['process'][(w, k)]:.0f} | {b:.0f} | {o / b:.1f}x "
            f"| {rates[(w, k)]:,.0f} |"
        )
    lines += [
        "",
        "| fit | o_d, µs per worker-step | e_d, µs per env-step | c, µs | ceiling at K = 64 |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ("ours", "bare"):
        o_d, e_d, c = fits[name]
        top = ceiling(o_d, e_d)
        lines.append(f"| {name} | {o_d:.1f} | {e_d:.2f} | {c:.0f} | {top:,.0f} env steps/s |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
