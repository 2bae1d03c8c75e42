"""Fit docs/cluster.md's cost model on a real two-node Ray cluster and check its predictions.

Run by hand from the repository root (it writes the ``cluster`` section of docs/cluster.md):

    python -m benchmarks.cluster

Starts a head node and a second node on this machine (`ray.cluster_utils.Cluster`, one CPU
each), puts one worker on each (``placement="STRICT_SPREAD"``) and steps `GymnasiumVectorEnv`
twice: over the TCP stream (``transport="tcp"``: what workers on other nodes use by default, the
head node's worker too) and over Ray calls (``transport="ray"``), fitting one model for each.
For each setting it records the wall time of a step, the driver's CPU time and the workers' CPU
time (psutil). The per-call and per-env costs of the driver and the workers are fitted on
CartPole with 16 and 256 envs per worker; the model then predicts the other settings (CartPole
with 32 and 64 envs per worker, HalfCheetah with 8, and a 1 ms env it has never seen), and the
table compares prediction and measurement. Finally it extrapolates to 1, 10 and 100 nodes, and
says how many workers one driver keeps busy.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gymnasium as gym
import psutil
import ray
from ray.cluster_utils import Cluster

from benchmarks.envs import CpuBoundEnv, action_samples, calibrate, halfcheetah
from benchmarks.report import write_section
from ray_multiprocess_env import GymnasiumVectorEnv

ROOT = Path(__file__).resolve().parent.parent
NODES = 2
CORES = os.cpu_count() or 1


@dataclass
class Sample:
    """One measured setting: seconds per vector step, split by where the CPU went."""

    env: str
    envs_per_worker: int
    wall: float  # seconds per vector step
    driver_cpu: float  # driver CPU seconds per vector step
    worker_cpu: float  # CPU seconds per call of one worker
    env_step: float  # seconds per step of one env, in-process


@dataclass
class Model:
    """Seconds per vector step from per-call and per-env costs (see docs/cluster.md)."""

    driver_call: float  # o_d: driver CPU per actor call
    driver_env: float  # e_d: driver CPU per env per step (actions, stacking, infos)
    worker_call: float  # o_w: worker CPU per call, besides stepping its envs
    worker_env: float  # e_w: worker CPU per env per step besides the env's own step

    def step_time(
        self,
        *,
        nodes: int,
        workers_per_node: int,
        envs_per_worker: int,
        env_step: float,
        cores_per_node: float,
        rtt: float = 0.0,
        shared_cores: float | None = None,
    ) -> float:
        """Predicted seconds per vector step (``shared_cores``: all nodes on one machine)."""
        calls = nodes * workers_per_node
        driver = calls * (self.driver_call + envs_per_worker * self.driver_env)
        call = self.worker_call + envs_per_worker * (env_step + self.worker_env)
        rounds = math.ceil(workers_per_node / cores_per_node)
        critical = driver + rounds * call + rtt
        if shared_cores is None:
            return critical
        return max(critical, (driver + calls * call) / shared_cores)


def _worker_pids(envs: GymnasiumVectorEnv) -> list[int]:
    return list(envs._engine.run_on_workers("pid"))  # (through the private engine)


def _env_step_seconds(env_fn: Any, seconds: float) -> float:
    env = env_fn()
    env.reset(seed=0)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        count += 1
    return (time.perf_counter() - start) / count


def measure(name: str, env_fn: Any, envs_per_worker: int, seconds: float, transport: str) -> Sample:
    """Step ``NODES`` workers of `envs_per_worker` envs over `transport` for about `seconds`."""
    n = NODES * envs_per_worker
    envs = GymnasiumVectorEnv(
        [env_fn] * n,
        envs_per_worker=envs_per_worker,
        placement="STRICT_SPREAD",
        actor_options={"num_cpus": 1},
        transport=transport,  # (forced: the head node's worker would use shared memory)
    )
    try:
        assert len(set(envs.node_ids())) == NODES, envs.node_ids()
        workers = [psutil.Process(pid) for pid in _worker_pids(envs)]
        actions = action_samples(envs.action_space)
        envs.reset(seed=0)
        for t in range(10):
            envs.step(actions[t % 64])
        worker_start = sum(p.cpu_times().user + p.cpu_times().system for p in workers)
        driver_start, start, count = time.process_time(), time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            envs.step(actions[count % 64])
            count += 1
        wall = (time.perf_counter() - start) / count
        driver = (time.process_time() - driver_start) / count
        worker_end = sum(p.cpu_times().user + p.cpu_times().system for p in workers)
        worker = (worker_end - worker_start) / count / NODES
    finally:
        envs.close()
    sample = Sample(name, envs_per_worker, wall, driver, worker, _env_step_seconds(env_fn, 1.0))
    print(
        f"{transport} {name} {NODES}x{envs_per_worker}: {n / wall:,.0f} steps/s, "
        f"step {wall * 1e3:.2f} ms, "
        f"driver {driver * 1e3:.2f} ms, worker call {worker * 1e3:.2f} ms",
        file=sys.stderr,
    )
    return sample


def fit(a: Sample, b: Sample) -> Model:
    """Per-call and per-env costs from two samples of one env with different envs per worker."""
    dk = b.envs_per_worker - a.envs_per_worker
    driver_env = (b.driver_cpu - a.driver_cpu) / NODES / dk
    worker_env = (b.worker_cpu - a.worker_cpu) / dk - a.env_step
    return Model(
        driver_call=max(0.0, a.driver_cpu / NODES - a.envs_per_worker * driver_env),
        driver_env=max(0.0, driver_env),
        worker_call=max(0.0, a.worker_cpu - a.envs_per_worker * (a.env_step + worker_env)),
        worker_env=max(0.0, worker_env),
    )


def predict_local(model: Model, sample: Sample) -> float:
    """Predicted env steps/s of `sample`'s setting on this machine (nodes share its cores)."""
    seconds = model.step_time(
        nodes=NODES,
        workers_per_node=1,
        envs_per_worker=sample.envs_per_worker,
        env_step=sample.env_step,
        cores_per_node=1,
        shared_cores=CORES,
    )
    return NODES * sample.envs_per_worker / seconds


def main() -> None:
    """Measure, fit, check, extrapolate; write the section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "cluster.md"))
    args = parser.parse_args()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
    cartpole = functools.partial(gym.make, "CartPole-v1")
    one_ms = functools.partial(CpuBoundEnv, calibrate(1.0))
    fitted: dict[str, tuple[Model, list[Sample]]] = {}
    try:
        for transport in ("tcp", "ray"):
            run = functools.partial(measure, seconds=args.seconds, transport=transport)
            checks = [
                run("CartPole", cartpole, 16),
                run("CartPole", cartpole, 256),
                run("CartPole", cartpole, 32),
                run("CartPole", cartpole, 64),
                run("HalfCheetah", halfcheetah, 8),
                run("1 ms env", one_ms, 4),
                run("1 ms env", one_ms, 16),
            ]
            fitted[transport] = (fit(checks[0], checks[1]), checks)
    finally:
        ray.shutdown()
        cluster.shutdown()
    write_section(Path(args.out), "cluster", _report(fitted, args.seconds))
    print(f"wrote {args.out}", file=sys.stderr)


_NAMES = {"tcp": "TCP stream", "ray": "Ray calls"}


def _report(fitted: dict[str, tuple[Model, list[Sample]]], seconds: float) -> str:
    command = "python -m benchmarks.cluster" + (f" --seconds {seconds:g}" if seconds != 5 else "")
    versions = ", ".join(f"{p} {version(p)}" for p in ("ray", "gymnasium", "numpy"))
    lines = [
        "## Measured on a two-node local cluster",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {CORES} CPUs shared by both nodes and the driver, Python "
        f"{platform.python_version()}; {versions}",
        "",
        "Fitted on CartPole with 16 and 256 envs per worker (microseconds):",
        "",
        "| transport | o_d (driver, per call) | e_d (driver, per env) | o_w (worker, per call) "
        "| e_w (worker, per env) |",
        "|---|---:|---:|---:|---:|",
    ]
    for transport, (model, _) in fitted.items():
        lines.append(
            f"| {_NAMES[transport]} | {model.driver_call * 1e6:.0f} | "
            f"{model.driver_env * 1e6:.2f} | {model.worker_call * 1e6:.0f} | "
            f"{model.worker_env * 1e6:.2f} |"
        )
    lines += [
        "",
        "Prediction against measurement, 2 nodes x 1 worker (both nodes on this machine's cores):",
        "",
        "| transport | env | envs per worker | env step (us) | measured steps/s "
        "| predicted steps/s | predicted / measured |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for transport, (model, checks) in fitted.items():
        for sample in checks:
            measured = NODES * sample.envs_per_worker / sample.wall
            predicted = predict_local(model, sample)
            lines.append(
                f"| {_NAMES[transport]} | {sample.env} | {sample.envs_per_worker} "
                f"| {sample.env_step * 1e6:.1f} | {measured:,.0f} | {predicted:,.0f} "
                f"| {predicted / measured:.2f} |"
            )
    lines += [
        "",
        "Extrapolated with the fitted costs to nodes of 16 cores running 15 workers each, one "
        "driver, and a 0.2 ms round trip between nodes (an assumption, not measured here):",
        "",
        "| transport | env | envs per worker | 1 node | 10 nodes | 100 nodes "
        "| driver-bound ceiling | workers one driver feeds |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for transport, (model, checks) in fitted.items():
        env_steps = {s.env: s.env_step for s in checks}
        for env, k in (
            ("CartPole", 64),
            ("CartPole", 512),
            ("HalfCheetah", 8),
            ("HalfCheetah", 64),
            ("1 ms env", 16),
            ("1 ms env", 256),
        ):
            rates = []
            for nodes in (1, 10, 100):
                t = model.step_time(
                    nodes=nodes,
                    workers_per_node=15,
                    envs_per_worker=k,
                    env_step=env_steps[env],
                    cores_per_node=15,
                    rtt=0.0 if nodes == 1 else 2e-4,
                )
                rates.append(nodes * 15 * k / t)
            ceiling = 1 / (model.driver_call / k + model.driver_env)
            # a worker's call takes this long; the driver spends this much on each worker
            call = model.worker_call + k * (env_steps[env] + model.worker_env)
            fed = call / (model.driver_call + k * model.driver_env)
            lines.append(
                f"| {_NAMES[transport]} | {env} | {k} | "
                + " | ".join(f"{r:,.0f}" for r in rates)
                + f" | {ceiling:,.0f} | {fed:,.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
