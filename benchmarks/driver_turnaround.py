"""What a microsecond of the driver's first-ready round trip costs when the workers fill the cores.

Run by hand from the repository root, on a machine with nothing else running (it writes the
``driver_turnaround`` section of docs/performance.md):

    python -m benchmarks.driver_turnaround [--env HalfCheetah-v5] [--k 8] [--delays 0,25,50,100]

One vector env of 2 workers x `k` envs steps first-ready, ``recv(batch_size=k)`` and the
``send`` of pre-drawn actions to the envs it handed back, as `benchmarks.against_probe` does.
Between the two the driver busy-waits a few microseconds more (`--delays`), a stand-in for a
driver whose round trip costs that much more: the library's own bookkeeping, or a trainer's
work. The delays (0 and one more at least) take turns every round (reversed every other), each
for `--seconds`, and the table gives the medians over the rounds of the env steps per second,
the driver's CPU per round trip (its main thread's) and the workers' CPU per env step (psutil,
every thread).

Each round also runs the bare-Python probe's first-ready (`--probe`, the project's shared
``tools/sol_probe.py``; HalfCheetah-v5, 2 workers x 8 only), as `benchmarks.against_probe` does.

A worker whose answer is in waits for the driver's round trip before it has new actions: it
polls meanwhile (or sleeps and is woken, colder). So on a machine whose cores the workers fill,
a driver's microsecond costs the workers' CPU too. The fit over the delays says how much:
the workers' CPU per round trip against the driver's (the machine's is that and the driver's
own). From the machine's, the last line estimates ours' rate with a driver that cost what
the probe's does (the fit carried past the delays measured: an estimate, not a measurement).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray

from benchmarks.against_probe import PROBE, probe_run
from benchmarks.envs import action_samples
from benchmarks.report import (
    cpu_of,
    cpu_times,
    idle_and_stolen,
    package_version,
    start_ray_settled,
    workers_of,
    write_section,
)
from ray_multiprocess_env import make_vector_env

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 2


def one_window(
    envs: Any,
    workers: list[psutil.Process],
    k: int,
    delay_us: float,
    seconds: float,
    actions: list[Any],
) -> tuple[float, float, float]:
    """``(env steps/s, driver CPU µs per round trip, workers' CPU µs per env step)``."""
    delay, count, steps = delay_us / 1e6, 0, 0
    before = cpu_of(workers)
    cpu, start = time.thread_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            *_, infos = envs.recv(batch_size=k)
            ids = infos["env_id"]
            if delay:
                end = time.perf_counter() + delay
                while time.perf_counter() < end:
                    pass
            envs.send(actions[count % len(actions)][: len(ids)], ids)
            count, steps = count + 1, steps + len(ids)
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    spent = cpu_of(workers) - before
    return steps / wall, cpu / count * 1e6, spent / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--k", type=int, default=8, help="envs per worker")
    parser.add_argument("--delays", default="0,25,50,100", help="µs added per round trip")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--probe", default=str(PROBE), help="the bare-Python probe's script")
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args()
    probe = Path(args.probe) if (args.env, args.k) == ("HalfCheetah-v5", 8) else None
    if probe is not None and not probe.exists():
        print(f"no probe at {probe}: its row is left out (--probe names it)")
        probe = None
    delays = sorted({float(d) for d in args.delays.split(",")})
    if len(delays) < 2 or delays[0] != 0:
        parser.error(f"--delays needs 0 and one more value or more, got {args.delays!r}")
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be 1 or more and --seconds more than 0")
    start_ray_settled()
    try:
        envs = make_vector_env(args.env, WORKERS * args.k, num_workers=WORKERS)
        try:
            workers = workers_of(envs)
            actions = action_samples(envs.action_space)
            envs.async_reset()
            one_window(envs, workers, args.k, 0, 1.0, actions)  # (warm-up)
            windows: dict[float, list[tuple[float, float, float]]] = {d: [] for d in delays}
            probes: list[dict[str, float]] = []
            machine = cpu_times()
            for round_ in range(args.rounds):
                for delay in delays if round_ % 2 == 0 else delays[::-1]:
                    windows[delay].append(
                        one_window(envs, workers, args.k, delay, args.seconds, actions)
                    )
                if probe is not None:
                    probes.append(probe_run(probe, True, args.seconds))
            shares = idle_and_stolen(machine, cpu_times())
        finally:
            envs.close()
    finally:
        ray.shutdown()
    report = "\n".join(_report(args, delays, windows, shares, probes))
    print(report)
    write_section(Path(args.out), "driver_turnaround", report)
    print(f"wrote {args.out}")


def _report(
    args: argparse.Namespace,
    delays: list[float],
    windows: dict[float, list[tuple[float, float, float]]],
    shares: tuple[float, float] | None,
    probes: list[dict[str, float]],
) -> list[str]:
    medians = {d: [statistics.median(w[i] for w in windows[d]) for i in range(3)] for d in delays}
    k = args.k
    rows = [
        f"| {d:g} | {rate:,.0f} | {driver:.0f} | {worker:.1f} | {worker * k:.0f} |"
        for d, (rate, driver, worker) in medians.items()
    ]
    drivers = [medians[d][1] for d in delays]
    # (the slope of the least-squares line of the workers' CPU against the driver's)
    workers_per_driver = float(np.polyfit(drivers, [medians[d][2] * k for d in delays], 1)[0])
    machine_per_driver = 1 + workers_per_driver  # (the driver's own µs, and the workers')
    estimate = []
    if probes:
        probe = {key: statistics.median(p[key] for p in probes) for key in probes[0]}
        rows.append(
            f"| the bare-Python probe | {probe['rate']:,.0f} | {probe['driver_us']:.0f} | "
            f"{probe['workers_us']:.1f} | {probe['workers_us'] * k:.0f} |"
        )
        rate, driver, worker = medians[0.0]  # (no delay: ours as it is)
        spent = driver + worker * k
        cut = spent - machine_per_driver * (driver - probe["driver_us"])
        estimate = [
            "",
            f"With a driver at the probe's {probe['driver_us']:.0f} µs per round trip, the fit "
            f"puts the machine's CPU per round trip of ours at {cut:.0f} µs (now {spent:.0f}): "
            f"about {rate * spent / cut:,.0f} env steps/s, "
            f"{rate * spent / cut / probe['rate']:.2f}x the probe's (ours now "
            f"{rate / probe['rate']:.2f}x).",
        ]
    busy = "" if shares is None else f"; the machine was idle {shares[0]:.0f}% and its "
    busy += "" if shares is None else f"hypervisor took {shares[1]:.1f}% of its time"
    command = " ".join(
        ["python -m benchmarks.driver_turnaround", f"--env {args.env}", f"--k {args.k}",
         f"--delays {args.delays}", f"--rounds {args.rounds}", f"--seconds {args.seconds:g}"]
    )  # fmt: skip
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [
        f"- Command: `{command}`",
        f"- Date: {when}",
        f"- Machine: {psutil.cpu_count()} CPUs, Python {platform.python_version()}; ray "
        f"{package_version('ray')}, gymnasium {package_version('gymnasium')}",
        "",
        f"{WORKERS} workers x {k} envs of {args.env}, `recv(batch_size={k})` + `send`, the driver "
        f"busy a few microseconds more between the two; medians of {args.rounds} rounds of "
        f"{args.seconds:g} s per delay, the delays taking turns{busy}.",
        "",
        "| µs added per round trip | env steps/s | driver CPU per round trip (µs) | workers' CPU "
        f"per env step (µs) | workers' CPU per round trip of {k} envs (µs) |",
        "|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Fitted over the delays: each µs of the driver's CPU per round trip costs the workers "
        f"{workers_per_driver:.2f} µs of CPU, so the machine {machine_per_driver:.2f} µs (the "
        "driver's main thread and the worker processes; Ray's other threads and processes are "
        "not counted).",
        *estimate,
    ]


if __name__ == "__main__":
    main()
