"""Env steps/s of ray_multiprocess_env against the machine's limit and its peers, in one run.

Run by hand from the repository root (it writes its section of docs/benchmarks.md):

    python -m benchmarks.throughput              # CartPole, 84x84 frames, a 1 ms env
    python -m benchmarks.throughput --suite real # HalfCheetah-v5 (MuJoCo) and Atari Pong
    python -m benchmarks.throughput --suite tianshou  # Tianshou's vector envs and our face
    python -m benchmarks.throughput --suite policy    # a torch policy in the loop (trainers)

Every implementation steps the same envs with the same pre-drawn actions for about `--seconds`
seconds after a warm-up, one after the other; the tables give env steps/s, the ratio to a raw
single-env loop, and the ratio to the machine's limit (one raw loop per core at once) measured
in the same run. The real suite adds envpool (compiled envs, its own thread pool) and, for the
pfrl face, pfrl's own `MultiprocessVectorEnv`. The Tianshou suite steps CartPole and
HalfCheetah through Tianshou's interface (step every env, reset those done) with Tianshou's own
vector envs and ours. The policy suite steps HalfCheetah and Pong with a torch policy acting on
every step, as a trainer does (`benchmarks/loops.py`).
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
from pathlib import Path
from typing import Any

import gymnasium as gym
import ray

from benchmarks import loops, peers
from benchmarks.envs import CpuBoundEnv, FramesEnv, calibrate, halfcheetah, pong
from benchmarks.report import cpu_times, package_version, plot_rates, stolen, write_section
from benchmarks.targets import (
    ASYNC,
    LIMIT,
    SYNC,
    Row,
    policy_checks,
    rate,
    real_checks,
    report,
    synthetic_checks,
    tianshou_checks,
)
from ray_multiprocess_env import GymnasiumVectorEnv

ROOT = Path(__file__).resolve().parent.parent
MAX_PROCESSES = 128  # one process per env beyond this is not run on a 2-core machine
#: Tianshou's own vector envs, and the most envs each is run with here (a process or an actor each).
TIANSHOU = {"SubprocVectorEnv": MAX_PROCESSES, "ShmemVectorEnv": MAX_PROCESSES, "RayVectorEnv": 32}
#: envpool's own ids of the real envs (the same simulators, compiled; Pong preprocessed alike).
ENVPOOL_TASKS = {"HalfCheetah": "HalfCheetah-v4", "Pong": "Pong-v5"}


def run(
    env_name: str,
    env_fn: Callable[[], gym.Env[Any, Any]],
    workers: int,
    ks: list[int],
    seconds: float,
    log: Callable[[str], None],
    *,
    peer_ns: tuple[int, ...] = (),
    plain_k: tuple[int, ...] = (),
    view_k: tuple[int, ...] = (),
    real: bool = False,
    tianshou: bool = False,
    peers_too: bool = True,
) -> list[Row]:
    """Measure every implementation on one env; one row per measurement.

    Ours runs `workers` workers x k envs for each k in `ks` (and with Ray calls only for
    `plain_k`, with ``copy=False`` for `view_k`); gymnasium's vector envs run the same total
    numbers of envs (and `peer_ns`), subprocess-per-env peers up to MAX_PROCESSES. `real` adds
    envpool, pfrl's `MultiprocessVectorEnv` and our pfrl face; `tianshou` Tianshou's vector
    envs and our Tianshou face.
    """
    cores = os.cpu_count() or 1
    rows = [Row(env_name, "raw single-env loop", 1, peers.raw(env_fn, seconds))]
    log(f"{env_name}: raw {rows[0].steps_per_second:.0f}/s")
    rows.append(Row(env_name, LIMIT, cores, peers.limit(env_fn, cores, seconds)))
    log(f"{env_name}: {cores} raw loops at once {rows[-1].steps_per_second:.0f}/s")

    def add(implementation: str, n: int, measure: Callable[..., float], *args: Any) -> None:
        gc.collect()
        peers.settle()  # what the previous one left behind has finished
        measured = measure(*args)
        rows.append(Row(env_name, implementation, n, measured))
        log(f"{env_name}: {implementation} n={n}: {measured:.0f}/s")

    if not peers_too:
        return rows
    for n in sorted({workers * k for k in ks} | set(peer_ns)):
        fns = [env_fn] * n
        add(SYNC, n, peers.vector, functools.partial(gym.vector.SyncVectorEnv, fns), seconds)
        if n <= MAX_PROCESSES:
            make_async = functools.partial(
                gym.vector.AsyncVectorEnv, fns, context="fork", shared_memory=True
            )
            add(ASYNC, n, peers.vector, make_async, seconds)
            if peers.importable("stable_baselines3") and not real:
                add("SB3 SubprocVecEnv", n, peers.sb3_subproc, fns, seconds)
            if peers.importable("pfrl"):
                add("pfrl MultiprocessVectorEnv", n, peers.pfrl_multiprocess, env_fn, n, seconds)
        for kind, most in TIANSHOU.items() if tianshou else ():
            if n <= most:
                add(f"Tianshou {kind}", n, peers.tianshou, kind, fns, seconds)
        if real and env_name in ENVPOOL_TASKS and peers.importable("envpool"):
            task = ENVPOOL_TASKS[env_name]
            add("envpool (C++)", n, peers.envpool, task, n, cores, seconds)
    for k in ks:
        fns = [env_fn] * (workers * k)
        ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=k)
        add(f"ours, {workers} workers x {k}", workers * k, peers.vector, ours, seconds)
        if real:
            name = f"ours, pfrl face, {workers} workers x {k}"
            add(name, workers * k, peers.ours_pfrl, env_fn, workers, k, seconds)
        if tianshou:
            name = f"ours, Tianshou face, {workers} workers x {k}"
            add(name, workers * k, peers.ours_tianshou, env_fn, workers, k, seconds)
    for k in view_k:  # the same, observations handed out as a view of the shared memory
        fns = [env_fn] * (workers * k)
        ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=k, copy=False)
        name = f"ours with copy=False, {workers} workers x {k}"
        add(name, workers * k, peers.vector, ours, seconds)
    for k in plain_k:  # the same, with every step a Ray actor call (no pipes)
        fns = [env_fn] * (workers * k)
        ours = functools.partial(GymnasiumVectorEnv, fns, envs_per_worker=k, transport="ray")
        name = f"ours with Ray calls only, {workers} workers x {k}"
        add(name, workers * k, peers.vector, ours, seconds)
    return rows


def synthetic(workers: int, seconds: float, log: Callable[[str], None]) -> tuple[list[Row], str]:
    """CartPole, 84x84 frames and a 1 ms env; and what they are, for the report."""
    many = (os.cpu_count() or 1) > 2
    cores = os.cpu_count() or 1
    iterations = {"1 ms env": calibrate(1.0), "frames": calibrate(0.1)}
    rows = run(
        "CartPole",
        functools.partial(gym.make, "CartPole-v1"),
        workers,
        [64, 256] if many else [16, 64, 512],
        seconds,
        log,
        plain_k=(64,),
        peer_ns=(4 * cores,) if many else (),
    )
    rows += run(
        "frames",
        functools.partial(FramesEnv, iterations["frames"]),
        workers,
        [16],
        seconds,
        log,
        peer_ns=(4 * cores,) if many else (),
        view_k=(16,),
    )
    rows += run(
        "1 ms env",
        functools.partial(CpuBoundEnv, iterations["1 ms env"]),
        workers,
        [4, 16] if many else [4, 8, 64],
        seconds,
        log,
        plain_k=() if many else (8,),
        peer_ns=(4 * cores,) if many else (),
    )
    envs = (
        f"- 1 ms env: `benchmarks/envs.py:CpuBoundEnv`, {iterations['1 ms env']} iterations of "
        "integer arithmetic per step (calibrated to about 1 ms in this run), 200-step episodes.\n"
        f"- frames: `benchmarks/envs.py:FramesEnv`, 84x84x4 uint8 observations, "
        f"{iterations['frames']} iterations (about 0.1 ms) per step, 500-step episodes."
    )
    return rows, envs


def real(workers: int, seconds: float, log: Callable[[str], None]) -> tuple[list[Row], str]:
    """HalfCheetah-v5 and Pong, 8 envs per worker; and what they are, for the report."""
    rows = run("HalfCheetah", halfcheetah, workers, [8], seconds, log, real=True)
    task = ENVPOOL_TASKS["HalfCheetah"]
    rows += loops.first_ready_rows("HalfCheetah", halfcheetah, task, workers, seconds, log)
    rows += run("Pong", pong, workers, [8], seconds, log, real=True)
    envs = (
        "- HalfCheetah: gymnasium's `HalfCheetah-v5` (MuJoCo; 17 floats, 6 float32 actions, "
        "4 numeric info keys every step); envpool's `HalfCheetah-v4`.\n"
        "- Pong: ale-py's `ALE/Pong-v5` with `frameskip=1`, gymnasium's `AtariPreprocessing` "
        "(frame skip 4, 84x84 grey) and `FrameStackObservation(4)`; envpool's `Pong-v5` "
        "(the same preprocessing, compiled), with as many threads as cores.\n"
        "- The pfrl face: `RayVectorEnv.from_env_fns` over `GymAPIBridge` envs, stepped by "
        "pfrl's loop (step, then `reset(mask)` of the envs done), as pfrl's "
        "`MultiprocessVectorEnv` is.\n"
        "- First-ready (HalfCheetah): envpool's way, `num_envs = 2 x batch_size`: `recv` the "
        "envs that are ready, act, `send` them back while the others step; ours with "
        "`recv(batch_size=...)`/`send`, envpool with `make(..., batch_size=...)`. "
        "The same loops with a policy acting: `--suite policy`."
    )
    return rows, envs


def policy(workers: int, seconds: float, log: Callable[[str], None]) -> tuple[list[Row], str]:
    """HalfCheetah and Pong with a torch policy in the loop; and what that is, for the report."""
    rows: list[Row] = []
    for env_name, env_fn, kind in (("HalfCheetah", halfcheetah, "mlp"), ("Pong", pong, "conv")):
        rows += run(env_name, env_fn, workers, [], seconds, log, peers_too=False)
        task = ENVPOOL_TASKS[env_name]
        rows += loops.policy_rows(env_name, env_fn, kind, task, workers, seconds, log)
    envs = (
        "- Every loop gets its actions from a torch policy in the driver "
        "(`ray_multiprocess_env.bench_policies.make_policy`, CPU, no gradients): on "
        "HalfCheetah-v5 the MLP 17 -> 256 -> 256 -> 6 (tanh), on Pong (as in `--suite real`) "
        "a conv net (16 8x8/4, 32 4x4/2, 32 3x3 filters, 256 units, 6 logits).\n"
        "- Lockstep: `obs = step(policy(obs))`; first-ready: `recv` the ready half, act, "
        "`send` (ours `recv(batch_size=...)`, envpool `make(..., batch_size=...)`).\n"
        "- torch defaults: torch's own intra-op threads, as a user's code leaves them; ours then "
        "fits them to the cores its workers leave (`RAY_MULTIPROCESS_ENV_TORCH_THREADS`, "
        "docs/usage.md). torch defaults kept: that variable set to `keep`. One torch thread: "
        "`torch.set_num_threads(1)` for every implementation.\n"
        "- Workers reniced: our worker processes set to the driver's niceness (Ray starts "
        "them at 15) once started."
    )
    return rows, envs


def tianshou(workers: int, seconds: float, log: Callable[[str], None]) -> tuple[list[Row], str]:
    """CartPole and HalfCheetah through Tianshou's interface; and what that is, for the report."""
    cartpole = functools.partial(gym.make, "CartPole-v1")
    rows = run("CartPole", cartpole, workers, [16], seconds, log, tianshou=True)
    rows += run("HalfCheetah", halfcheetah, workers, [8], seconds, log, tianshou=True)
    envs = (
        "- Tianshou's vector envs and our Tianshou face (`TianshouVectorEnv`) are stepped as "
        "Tianshou's `Collector` steps them: every env, then `reset(env_id)` of those done; "
        "gymnasium's, SB3's and pfrl's rows are the other suites' loops on the same envs.\n"
        "- HalfCheetah: gymnasium's `HalfCheetah-v5` (MuJoCo)."
    )
    return rows, envs


def _markdown(
    suite: str,
    rows: list[Row],
    command: str,
    envs: str,
    seconds: float,
    workers: int,
    steal: str,
) -> str:
    packages = ["ray", "gymnasium", "numpy", "stable-baselines3", "pfrl", "torch"]
    if suite == "real":
        packages += ["mujoco", "ale-py", "envpool"]
    if suite == "tianshou":
        packages += ["mujoco", "tianshou"]
    if suite == "policy":
        packages += ["mujoco", "ale-py", "envpool"]
    versions = ", ".join(f"{p} {package_version(p)}" for p in packages)
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    cores = os.cpu_count()
    title = {
        "real": "real envs",
        "tianshou": "Tianshou",
        "policy": "a torch policy in the loop",
    }.get(suite, "gymnasium, SB3 and pfrl")
    checks = {
        "real": real_checks,
        "tianshou": tianshou_checks,
        "policy": policy_checks,
    }.get(suite, synthetic_checks)(workers)
    out = [
        f"## Throughput on {cores} CPUs: {title}, against the machine's limit",
        "",
        "Env steps per second (higher is better) of every vector env on the same envs and the",
        f"same {'torch policy' if suite == 'policy' else 'pre-drawn random'} actions, each run "
        "for about "
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
        envs,
        f"- Subprocess-per-env peers run up to {MAX_PROCESSES} envs.",
        "",
        "### Targets",
        "",
        *report(rows, checks, workers),
        "",
        "### Results",
        "",
        "| env | implementation | envs | env steps/s | x raw loop | of the limit |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        raw = rate(rows, row.env, "raw single-env loop", 1) or float("nan")
        limit = rate(rows, row.env, LIMIT) or float("nan")
        out.append(
            f"| {row.env} | {row.implementation} | {row.num_envs} | "
            f"{row.steps_per_second:,.0f} | {row.steps_per_second / raw:.2f} | "
            f"{row.steps_per_second / limit:.2f} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--suite", choices=("synthetic", "real", "tianshou", "policy"), default="synthetic"
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--workers", type=int, default=None, help="default: 2 on 2 cores, else cores - 1"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    workers = args.workers or (2 if cores <= 2 else cores - 1)
    log = functools.partial(print, file=sys.stderr, flush=True)
    ray.init(include_dashboard=False, logging_level="warning", log_to_driver=False)
    before = cpu_times()
    measure = {"real": real, "tianshou": tianshou, "policy": policy}.get(args.suite, synthetic)
    rows, envs = measure(workers, args.seconds, log)
    ray.shutdown()
    steal = stolen(before, cpu_times())
    out = Path(args.out)
    command = (
        "python -m benchmarks.throughput"
        + (f" --suite {args.suite}" if args.suite != "synthetic" else "")
        + (f" --seconds {args.seconds:g}" if args.seconds != 3.0 else "")
        + (f" --workers {args.workers}" if args.workers else "")
    )
    section = "throughput" + (f"-{args.suite}" if args.suite != "synthetic" else "")
    section += f"-{cores}-cpus" if cores > 2 else ""
    markdown = _markdown(args.suite, rows, command, envs, args.seconds, workers, steal)
    write_section(out, section, markdown)
    print(markdown)
    if peers.importable("matplotlib") and cores <= 2 and args.suite == "synthetic":
        plot_rates(rows, out.with_suffix(".png"), LIMIT)
        markdown += "\n\n![env steps/s against the number of envs](benchmarks.png)\n"
        write_section(out, section, markdown)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
