"""Issue #41's targets in one run: ours against the bare-Python probe and gymnasium's loop.

Run by hand from the repository root, on a machine with nothing else running (it writes the
``against_probe`` section of docs/benchmarks.md; docs/performance.md says what it shows):

    python -m benchmarks.against_probe [--probe ../shared/tools/sol_probe.py] [--rounds 3]

The probe (``tools/sol_probe.py`` of the project's shared tools, a plain-Python vector env with
no error handling) is the yardstick: forked workers stepping HalfCheetah-v5 in one shared block,
one byte per wake-up. Each round runs every setting once, one after the other, for `--seconds`
(this machine's speed drifts by a quarter within seconds, so the settings take turns and the
table gives the median of the rounds):

- HalfCheetah-v5, 16 envs: the probe in lockstep (pipes) and first-ready (2 workers); ours
  lockstep ``step`` and first-ready ``recv(8)``/``send``, 2 workers x 8; gymnasium's
  ``SyncVectorEnv(16)``; the same two of ours and ``SyncVectorEnv`` with the 256-wide torch MLP
  of ``--suite policy`` acting in the driver (torch's defaults, as a trainer has them);
- ours first-ready with a bare driver over the same workers (`driver_floor.bare_first_ready`:
  the library's protocol and nothing else): what the workers allow, however cheap the driver;
- ours first-ready again with ``RAY_MULTIPROCESS_ENV_WORKER_SPIN_US=0``: the probe's workers
  never poll, and a polling worker's CPU counts its polls;
- CartPole-v1, 2 workers x 64 against ``SyncVectorEnv(128)``;
- the CPU time of the driver's main thread per ``step`` and per ``recv`` + ``send``, ours and the
  probe's (the probe's from the difference of a 1 s run and a longer one, so its set-up
  cancels; with ``--seconds`` under about 2 that difference is mostly noise), and the workers'
  per env step (ours read with psutil, the probe's the same way as its driver's);
- what one first-ready cycle costs in the workers and in the driver, ours against the probe's:
  the ratio of the two is ours against the probe when both keep every core busy;
- a worker's CPU per env step against a raw loop over the same envs in the same process
  (`benchmarks.worker_step`);
- the driver's CPU per first-ready round trip, stage by stage (`benchmarks.driver_stages`);
- the driver's CPU per lockstep step of CartPole-v1 2 x 8 against a bare loop over the same
  workers (`benchmarks.driver_floor`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gymnasium as gym
import psutil
import ray

from benchmarks import driver_floor, driver_stages, loops, worker_step
from benchmarks.envs import action_samples
from benchmarks.report import (
    cpu_of,
    environment_variable,
    start_ray_settled,
    workers_of,
    write_section,
)
from ray_multiprocess_env import make_vector_env
from ray_multiprocess_env._engine.worker_spin import SPIN_VARIABLE
from ray_multiprocess_env.bench_policies import make_policy

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT.parent / "shared" / "tools" / "sol_probe.py"
CHEETAH, CARTPOLE = "HalfCheetah-v5", "CartPole-v1"
#: The setting of ours first-ready with a bare driver: what its workers allow.
BARE = "ours first-ready, bare driver over the same workers"


_PROBE_RUN = """
import importlib.util, json, resource, sys
spec = importlib.util.spec_from_file_location("sol_probe", sys.argv[1])
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
first_ready, seconds = sys.argv[2] == "first-ready", float(sys.argv[3])

def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime

def run(s):
    start, workers = cpu(resource.RUSAGE_THREAD), cpu(resource.RUSAGE_CHILDREN)
    if first_ready:
        rate = probe.run_async("cheetah", 16, s, 2)
    else:
        rate = probe.run("cheetah", 16, s, "pipe")
    # (the workers count once joined, as the probe does at the end of its run)
    return rate, cpu(resource.RUSAGE_THREAD) - start, cpu(resource.RUSAGE_CHILDREN) - workers

per_call = 8 if first_ready else 16
run(0.0)  # (first-time costs)
short_rate, short_cpu, short_workers = run(1.0)
rate, spent, workers = run(seconds + 1.0)
steps = rate * (seconds + 1.0) - short_rate * 1.0  # (the set-up cancels out)
print(json.dumps({
    "rate": rate,
    "driver_us": (spent - short_cpu) / (steps / per_call) * 1e6,
    "workers_us": (workers - short_workers) / steps * 1e6,
}))
"""


def probe_run(probe: Path, first_ready: bool, seconds: float) -> dict[str, float]:
    """The probe's env steps/s and its driver's CPU per call.

    The CPU per call is the difference of a run of 1 s and one of `seconds` + 1 s, per call
    more: the set-up (forking, making envs) is the same in both.

    Run in a process of its own: the probe forks its workers, which a process with Ray's and
    torch's threads should not do.
    """
    mode = "first-ready" if first_ready else "lockstep"
    done = subprocess.run(
        [sys.executable, "-c", _PROBE_RUN, str(probe), mode, str(seconds)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def _result(
    steps: int, wall: float, calls: int, cpu: float, workers: list[psutil.Process], before: float
) -> dict[str, float]:
    """Env steps/s, the driver's CPU per call and (with workers) theirs per env step."""
    out = {"rate": steps / wall, "driver_us": (_thread_cpu() - cpu) / calls * 1e6}
    if workers:
        out["workers_us"] = (cpu_of(workers) - before) / steps * 1e6
    return out


def ours_lockstep(
    envs: Any, seconds: float, policy: Callable[[Any], Any] | None
) -> dict[str, float]:
    """Env steps/s of `step` (actions from `policy`, else pre-drawn), driver CPU per step."""
    workers = workers_of(envs)
    actions = action_samples(envs.action_space)
    obs, _ = envs.reset(seed=0)
    for t in range(50):
        obs, *_ = envs.step(actions[t % len(actions)] if policy is None else policy(obs))
    before, cpu, start, count = cpu_of(workers), _thread_cpu(), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        obs, *_ = envs.step(actions[count % len(actions)] if policy is None else policy(obs))
        count += 1
    wall = time.perf_counter() - start
    return _result(count * envs.num_envs, wall, count, cpu, workers, before)


def ours_first_ready(envs: Any, k: int, seconds: float) -> dict[str, float]:
    """Env steps/s of `recv(k)` + `send`, the driver's CPU per `k` envs handed back.

    (A `recv` hands back every worker whose answer is in: sometimes two workers' envs, two
    round trips of the probe's, whose driver's CPU is per round trip.)
    """
    workers = workers_of(envs)
    envs.async_reset(seed=0)
    result = _first_ready_run(loops.recv_send(envs, k), seconds, workers, k)
    envs.recv()
    return result


def bare_first_ready(envs: Any, k: int, seconds: float) -> dict[str, float]:
    """`ours_first_ready`'s loop with a bare driver over the same workers (`driver_floor`).

    Its driver's CPU is per worker's round trip (`k` env steps), as the probe's is. Call it
    with nothing in flight; it leaves nothing in flight.
    """
    workers = workers_of(envs)
    engine = envs._engine  # (private: the workers the face steps)
    start_loop, one, drain = driver_floor.bare_first_ready(
        engine, action_samples(envs.action_space)
    )
    start_loop(0)
    result = _first_ready_run(one, seconds, workers, k)
    drain()
    return result


def _first_ready_run(
    one: Callable[[int], int], seconds: float, workers: list[psutil.Process], k: int
) -> dict[str, float]:
    """`_result` of `one` (a round trip: the env steps it handed back) run for `seconds`.

    After 50 round trips not counted. The driver's CPU is per `k` env steps handed back (a
    worker's round trip).
    """
    for t in range(50):
        one(t)
    before, cpu, start = cpu_of(workers), _thread_cpu(), time.perf_counter()
    count = steps = 0
    while time.perf_counter() - start < seconds:
        steps += one(count)
        count += 1
    wall = time.perf_counter() - start
    return _result(steps, wall, max(steps // k, 1), cpu, workers, before)


def _mlp(envs: Any) -> Callable[[Any], Any]:
    """The policy suite's torch MLP (`bench_policies.make_policy`), torch's default threads."""
    return make_policy("mlp", envs.single_observation_space, envs.single_action_space)


def one_round(probe: Path | None, seconds: float) -> dict[str, dict[str, float]]:
    """Every setting once, in turn."""
    out: dict[str, dict[str, float]] = {}
    if probe is not None:
        out["probe lockstep"] = probe_run(probe, False, seconds)
        out["probe first-ready"] = probe_run(probe, True, seconds)
    envs = make_vector_env(CHEETAH, 16, num_workers=2)
    out["ours lockstep"] = ours_lockstep(envs, seconds, None)
    out["ours first-ready"] = ours_first_ready(envs, 8, seconds)
    out[BARE] = bare_first_ready(envs, 8, seconds)
    out["ours lockstep, MLP"] = ours_lockstep(envs, seconds, _mlp(envs))
    envs.close()
    # the probe's workers never poll: ours not polling either
    with environment_variable(SPIN_VARIABLE, "0"):
        envs = make_vector_env(CHEETAH, 16, num_workers=2)
    out["ours first-ready, workers not polling"] = ours_first_ready(envs, 8, seconds)
    envs.close()
    sync = gym.vector.SyncVectorEnv([lambda: gym.make(CHEETAH)] * 16)
    out["SyncVectorEnv(16)"] = ours_lockstep(sync, seconds, None)
    out["SyncVectorEnv(16), MLP"] = ours_lockstep(sync, seconds, _mlp(sync))
    sync.close()
    envs = make_vector_env(CARTPOLE, 128, num_workers=2)
    out["CartPole ours lockstep"] = ours_lockstep(envs, seconds, None)
    envs.close()
    sync = gym.vector.SyncVectorEnv([lambda: gym.make(CARTPOLE)] * 128)
    out["CartPole SyncVectorEnv(128)"] = ours_lockstep(sync, seconds, None)
    sync.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", default=str(PROBE))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    probe = Path(args.probe) if Path(args.probe).exists() else None
    if probe is None:
        print(f"no probe at {args.probe}: its rows are left out")
    start_ray_settled()
    rounds = [one_round(probe, args.seconds) for _ in range(args.rounds)]
    stages = driver_stages.measure(CHEETAH, 8)
    floor = driver_floor.measure("CartPole-v1", 8, rounds=100)
    ray.shutdown()
    worker = worker_step.measure(CHEETAH, 8, rounds=300)
    medians = {
        name: {key: statistics.median(r[name][key] for r in rounds) for key in rounds[0][name]}
        for name in rounds[0]
    }
    report = (
        _report(medians, rounds, worker, args)
        + "\n\n"
        + "\n".join(driver_stages.table(stages))
        + "\n\n"
        + "\n".join(driver_floor.table("CartPole-v1", 8, floor))
    )
    print(report)
    write_section(Path(args.out), "against_probe", report)
    print(f"wrote {args.out}")


def _report(
    medians: dict[str, dict[str, float]],
    rounds: list[dict[str, dict[str, float]]],
    worker: dict[str, float],
    args: argparse.Namespace,
) -> str:
    def ratios(a: str, b: str) -> str:
        each = [r[a]["rate"] / r[b]["rate"] for r in rounds]  # (each round's pair: close in time)
        listed = ", ".join(f"{x:.2f}" for x in each)
        return f"{statistics.median(each):.2f} (rounds: {listed})"

    versions = ", ".join(f"{p} {version(p)}" for p in ("ray", "gymnasium", "numpy", "mujoco"))
    lines = [
        "## Against the bare-Python probe (#41)",
        "",
        f"- Command: `python -m benchmarks.against_probe --rounds {args.rounds} "
        f"--seconds {args.seconds:g}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; {versions}",
        "",
        f"Medians of {args.rounds} rounds, each setting {args.seconds:g} s per round, the "
        "settings taking turns; a ratio is the median of the rounds' ratios. A call of the "
        "driver is a step in lockstep, and a worker's round trip in first-ready: 8 envs handed "
        "back (a `recv` of ours may hand back two workers' envs: two calls).",
        "",
        "| setting | env steps/s | driver CPU per call (µs) | workers' CPU per env step (µs) |",
        "|---|---:|---:|---:|",
    ]
    for name, m in medians.items():
        workers = f"{m['workers_us']:.1f}" if "workers_us" in m else "-"
        lines.append(f"| {name} | {m['rate']:,.0f} | {m['driver_us']:,.0f} | {workers} |")
    targets = [
        ("ours lockstep >= 0.85x the probe's lockstep", "ours lockstep", "probe lockstep"),
        ("ours first-ready >= 0.8x the probe's", "ours first-ready", "probe first-ready"),
        ("(ours first-ready with a bare driver, against the probe's)", BARE, "probe first-ready"),
        ("ours lockstep >= 1.3x `SyncVectorEnv(16)`", "ours lockstep", "SyncVectorEnv(16)"),
        (
            "CartPole 2 x 64 >= 1.3x `SyncVectorEnv(128)`",
            "CartPole ours lockstep",
            "CartPole SyncVectorEnv(128)",
        ),
        (
            "with the MLP: lockstep >= 1.2x `SyncVectorEnv(16)`",
            "ours lockstep, MLP",
            "SyncVectorEnv(16), MLP",
        ),
    ]
    lines += ["", "| target (#41) | measured |", "|---|---:|"]
    for label, a, b in targets:
        if a in medians and b in medians:
            lines.append(f"| {label} | {ratios(a, b)} |")
    fr_us, step_us = medians["ours first-ready"]["driver_us"], medians["ours lockstep"]["driver_us"]
    lines += [
        f"| driver CPU per `recv` + `send`, per 8 envs handed back, <= 45 µs | {fr_us:.0f} µs |",
        f"| driver CPU per 2 x 8 `step` <= 60 µs | {step_us:.0f} µs |",
        f"| a worker's CPU per env step within 15% of a raw loop | {worker['ours_us']:.1f} µs "
        f"against {worker['raw_us']:.1f} µs: +{worker['overhead'] * 100:.1f}% |",
    ]
    if "probe lockstep" in medians:
        lines += [
            "",
            f"The probe's driver spends {medians['probe lockstep']['driver_us']:.0f} µs per step "
            f"and {medians['probe first-ready']['driver_us']:.0f} µs per first-ready round trip "
            "on the same machine (a run of 1 s subtracted from a longer one: its set-up).",
            "",
            *_first_ready_cycle(medians, "ours first-ready", ""),
            *_first_ready_cycle(
                medians,
                "ours first-ready, workers not polling",
                " with its workers not polling (the probe's never do)",
            ),
            *_first_ready_cycle(
                medians, BARE, " with a bare driver over its workers (the workers' own share)"
            ),
        ]
    return "\n".join(lines)


def _first_ready_cycle(medians: dict[str, dict[str, float]], name: str, how: str) -> list[str]:
    """What one cycle of first-ready (each of the 2 workers' 8 envs once) costs the 2 cores.

    `name`: the setting of ours, against the probe's first-ready; `how`: what says which. On a
    machine with as many cores as workers the driver's CPU comes out of the workers' cores, so
    the ratio of the two cycles' CPU is ours against the probe when both keep every core busy
    (a probe that leaves a core idle a while gives ours a little more).
    """
    ours, probe = medians.get(name, {}), medians.get("probe first-ready", {})
    if "workers_us" not in ours or "workers_us" not in probe:
        return []
    ours_w, ours_d = 2 * 8 * ours["workers_us"], 2 * ours["driver_us"]
    probe_w, probe_d = 2 * 8 * probe["workers_us"], 2 * probe["driver_us"]
    gap = ours_w + ours_d - probe_w - probe_d
    split = (
        f"of the {gap:.0f} µs more, {100 * (ours_w - probe_w) / gap:.0f}% are the workers' and "
        f"{100 * (ours_d - probe_d) / gap:.0f}% the driver's"
        if gap > 0
        else "ours costs no more"
    )
    return [
        "One first-ready cycle (2 workers x 8 env steps, 2 round trips of the driver), "
        f"ours{how}, in µs of CPU: {ours_w:.0f} in the workers and {ours_d:.0f} in the driver; "
        f"the probe's {probe_w:.0f} and {probe_d:.0f}. Their ratio, "
        f"{(probe_w + probe_d) / (ours_w + ours_d):.2f}, is ours against the probe when both "
        f"keep every core busy; {split}.",
        "",
    ]


if __name__ == "__main__":
    main()
