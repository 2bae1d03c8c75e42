"""Workers on another node: the TCP stream beside Ray calls, and beside pipes on the driver's node.

Run by hand from the repository root, on a machine with nothing else running (it writes the
``remote`` section of docs/cluster.md):

    python -m benchmarks.remote_workers

Starts a head node (the driver's) and a second node on this machine (`ray.cluster_utils.Cluster`,
each with its own raylet and a custom resource that pins workers to it). The same two workers
then run on the second node over the TCP stream (``transport="auto"``) and over Ray calls
(``"ray"``), and on the driver's node over pipes (``"pipe"``) and shared memory (``"auto"``):
HalfCheetah-v5 2 x 8 and CartPole-v1 2 x 64 in lockstep with pre-drawn actions,
HalfCheetah-v5 2 x 8 first-ready (``recv(8)``/``send``), and the driver's CPU time per round
trip of one worker of 8 HalfCheetahs (``time.process_time`` per ``step``).
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import ray
from ray.cluster_utils import Cluster

from benchmarks.envs import action_samples, halfcheetah
from benchmarks.loops import first_ready
from benchmarks.report import write_section
from ray_multiprocess_env import GymnasiumVectorEnv

ROOT = Path(__file__).resolve().parent.parent
CORES = os.cpu_count() or 1
#: Where the workers run and over what: (label, custom resource of the node, transport).
SETTINGS = [
    ("second node, TCP stream", "node_b", "auto"),
    ("second node, Ray calls", "node_b", "ray"),
    ("driver's node, pipes", "head", "pipe"),
    ("driver's node, shared memory", "head", "auto"),
]
#: The transport each setting's workers must have got (a fallback would void the numbers).
EXPECTED = {
    "node_b/auto": "tcp",
    "node_b/ray": "ray",
    "head/pipe": "pipe",
    "head/auto": "shared_memory",
}


def cartpole() -> gym.Env[Any, Any]:
    """CartPole-v1."""
    return gym.make("CartPole-v1")


def _vec(
    env_fn: Callable[[], Any], workers: int, per_worker: int, node: str, transport: str
) -> GymnasiumVectorEnv:
    envs = GymnasiumVectorEnv(
        [env_fn] * (workers * per_worker),
        envs_per_worker=per_worker,
        actor_options={"num_cpus": 1, "resources": {node: 1}},
        transport=transport,
    )
    kinds = {worker.transport.kind for worker in envs._engine._pool.workers}  # (private engine)
    if kinds != {EXPECTED[f"{node}/{transport}"]}:
        envs.close()
        raise RuntimeError(f"{node}/{transport}: the workers got {kinds}")
    return envs


def lockstep(envs: GymnasiumVectorEnv, seconds: float) -> tuple[float, float, float]:
    """Env steps/s of `step` with pre-drawn actions; the driver's CPU seconds per step.

    The CPU is counted twice: of the thread that steps (`time.thread_time`), and of the whole
    process (`time.process_time`, Ray's own threads included: they carry Ray calls).
    """
    actions = action_samples(envs.action_space)
    envs.reset(seed=0)
    for t in range(20):
        envs.step(actions[t % 64])
    count, thread, process = 0, time.thread_time(), time.process_time()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(actions[count % 64])
        count += 1
    wall = time.perf_counter() - start
    thread, process = time.thread_time() - thread, time.process_time() - process
    return count * envs.num_envs / wall, thread / count, process / count


def measure(seconds: float, rounds: int) -> dict[str, dict[str, float]]:
    """Every setting's figures (env steps/s; the driver's µs per round trip), medians of rounds.

    The settings take turns in each round, so a slow spell of the machine (this VM's speed
    drifts by a quarter from one second to the next) falls on all of them.
    """
    samples: dict[str, dict[str, list[float]]] = {label: {} for label, _, _ in SETTINGS}
    for _ in range(rounds):
        for label, node, transport in SETTINGS:
            row = samples[label]
            for name, env_fn, per_worker in (
                ("HalfCheetah", halfcheetah, 8),
                ("CartPole", cartpole, 64),
            ):
                make = functools.partial(_vec, env_fn, 2, per_worker, node, transport)
                envs = make()
                try:
                    row.setdefault(f"{name} lockstep", []).append(lockstep(envs, seconds)[0])
                finally:
                    envs.close()
                if name == "HalfCheetah":  # (pre-drawn actions; it closes its own vector env)
                    rate = first_ready(make, None, 8, seconds)
                    row.setdefault("HalfCheetah first-ready", []).append(rate)
            envs = _vec(halfcheetah, 1, 8, node, transport)
            try:
                _, thread, process = lockstep(envs, seconds)
                row.setdefault("driver thread us", []).append(thread * 1e6)
                row.setdefault("driver process us", []).append(process * 1e6)
            finally:
                envs.close()
            print(label, {k: [round(x) for x in v] for k, v in row.items()}, file=sys.stderr)
    return {
        label: {key: float(np.median(values)) for key, values in row.items()}
        for label, row in samples.items()
    }


def main() -> None:
    """Start the cluster, measure every setting, write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "docs" / "cluster.md"))
    args = parser.parse_args()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"head": 2}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, resources={"node_b": 2})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
    try:
        results = measure(args.seconds, args.rounds)
    finally:
        ray.shutdown()
        cluster.shutdown()
    write_section(Path(args.out), "remote", _report(results, args.seconds, args.rounds))
    print(f"wrote {args.out}", file=sys.stderr)


def _report(results: dict[str, dict[str, float]], seconds: float, rounds: int) -> str:
    flags = (f" --seconds {seconds:g}" if seconds != 3 else "") + (
        f" --rounds {rounds}" if rounds != 3 else ""
    )
    versions = ", ".join(f"{p} {version(p)}" for p in ("ray", "gymnasium", "numpy"))
    columns = [
        "HalfCheetah lockstep",
        "CartPole lockstep",
        "HalfCheetah first-ready",
        "driver thread us",
        "driver process us",
    ]
    lines = [
        "## Workers on the second node, measured",
        "",
        f"- Command: `python -m benchmarks.remote_workers{flags}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {CORES} CPUs shared by both nodes and the driver, Python "
        f"{platform.python_version()}; {versions}",
        "",
        f"Env steps/s (HalfCheetah-v5 2 workers x 8 envs, CartPole-v1 2 x 64, first-ready "
        f"`recv(8)`/`send`), and the driver's CPU per `step` of one worker of 8 HalfCheetahs in "
        f"µs (of the thread that steps, and of the whole process with Ray's threads); the "
        f"median of {rounds} rounds of {seconds:g} s, the settings taking turns. In brackets: "
        "the ratio to pipes on the driver's node.",
        "",
        "| workers | HalfCheetah 2 x 8 | CartPole 2 x 64 | HalfCheetah first-ready | "
        "driver µs per round trip (thread) | (process) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    pipes = results["driver's node, pipes"]
    for label, row in results.items():
        cells = [f"{row[c]:,.0f} ({row[c] / pipes[c]:.2f}x)" for c in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    stream, calls = results["second node, TCP stream"], results["second node, Ray calls"]
    lines += [
        "",
        "The stream against Ray calls, same workers on the second node: "
        + ", ".join(f"{c} {stream[c] / calls[c]:.2f}x" for c in columns[:3])
        + f"; the driver's CPU per round trip {stream[columns[4]] / calls[columns[4]]:.2f}x "
        "(whole process).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
