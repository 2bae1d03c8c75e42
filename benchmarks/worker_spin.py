"""How long workers poll before they sleep (`RAY_MULTIPROCESS_ENV_WORKER_SPIN_US`), in turns.

Each value is the least a worker polls; it polls up to ten times as long when its messages came
later, and when they came up to two such polls apart, until just after the next was due
(`_worker.serve_loop.poll_plan`).

Run by hand from the repository root, on a machine with nothing else running (it writes the
``worker_spin`` section of docs/benchmarks.md; docs/performance.md says what it shows):

    python -m benchmarks.worker_spin [--spins auto,0,100,200] [--rounds 3] [--seconds 3]

Each round runs every setting under every spin once, one after the other (the variable is read
when a vector env is made, so each setting makes its own): HalfCheetah-v5 2 workers x 8 in
lockstep, first-ready ``recv(8)``/``send``, lockstep with the 256-wide torch MLP acting in the
driver, and lockstep with a trainer that keeps one core busy for 1 ms or 3 ms between steps
(`busy_policy`: a larger policy, or PPO's own work around the forward pass); CartPole-v1 2
workers x 64, and 8 workers x 16, which on a machine with fewer than 8 cores is more workers
than cores (``auto`` does not poll there). The table gives the medians of the rounds' env
steps/s, and each spin's ratio to ``0`` (no polling) round by round.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from benchmarks.against_probe import CARTPOLE, CHEETAH, ROOT, ours_first_ready, ours_lockstep
from benchmarks.envs import action_samples
from benchmarks.report import environment_variable, start_ray_settled, write_section
from ray_multiprocess_env import make_vector_env
from ray_multiprocess_env._engine.worker_spin import SPIN_VARIABLE
from ray_multiprocess_env.bench_policies import make_policy

#: Each setting: how its vector env is made, and what is measured on it.
SETTINGS: dict[str, tuple[tuple[str, int, int], Callable[[Any, float], dict[str, float]]]] = {
    "HalfCheetah 2 x 8, lockstep": ((CHEETAH, 16, 2), lambda e, s: ours_lockstep(e, s, None)),
    "HalfCheetah 2 x 8, first-ready `recv(8)`": (
        (CHEETAH, 16, 2),
        lambda e, s: ours_first_ready(e, 8, s),
    ),
    "HalfCheetah 2 x 8, lockstep, MLP": (
        (CHEETAH, 16, 2),
        lambda e, s: ours_lockstep(
            e, s, make_policy("mlp", e.single_observation_space, e.single_action_space)
        ),
    ),
    "HalfCheetah 2 x 8, lockstep, 1 ms between steps": (
        (CHEETAH, 16, 2),
        lambda e, s: ours_lockstep(e, s, busy_policy(e, 1_000)),
    ),
    "HalfCheetah 2 x 8, lockstep, 3 ms between steps": (
        (CHEETAH, 16, 2),
        lambda e, s: ours_lockstep(e, s, busy_policy(e, 3_000)),
    ),
    "CartPole 2 x 64, lockstep": ((CARTPOLE, 128, 2), lambda e, s: ours_lockstep(e, s, None)),
    "CartPole 8 x 16, lockstep": ((CARTPOLE, 128, 8), lambda e, s: ours_lockstep(e, s, None)),
}


def busy_policy(envs: Any, microseconds: float) -> Callable[[Any], Any]:
    """A trainer that keeps one core busy for `microseconds` before each step (drawn actions).

    A stand-in for a policy whose forward pass (with the trainer's own work around it: a
    rollout buffer, a normalizer) takes that long, without torch's threads in the measure.
    """
    actions, count = action_samples(envs.action_space), 0

    def act(observations: Any) -> Any:
        nonlocal count
        end = time.perf_counter() + microseconds / 1e6
        while time.perf_counter() < end:
            pass
        count += 1
        return actions[count % len(actions)]

    return act


def one_round(spins: list[str], seconds: float) -> dict[tuple[str, str], float]:
    """Env steps/s of every setting under every spin, in turn."""
    rates = {}
    for name, ((env, num_envs, workers), measure) in SETTINGS.items():
        for spin in spins:
            with environment_variable(SPIN_VARIABLE, spin):  # (read as the envs are made)
                envs = make_vector_env(env, num_envs, num_workers=workers)
            try:
                rates[name, spin] = measure(envs, seconds)["rate"]
            finally:
                envs.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spins", default="auto,0,100,200")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    spins = args.spins.split(",")
    if "0" not in spins:
        parser.error("--spins must include 0 (the ratios are against it)")
    start_ray_settled()
    try:
        rounds = [one_round(spins, args.seconds) for _ in range(args.rounds)]
    finally:
        ray.shutdown()
    report = "\n".join(_report(spins, rounds, args))
    print(report)
    write_section(Path(args.out), "worker_spin", report)
    print(f"wrote {args.out}")


def _report(
    spins: list[str], rounds: list[dict[tuple[str, str], float]], args: argparse.Namespace
) -> list[str]:
    lines = [
        "## A worker that polls before it sleeps (#41)",
        "",
        f"- Command: `python -m benchmarks.worker_spin --spins {args.spins} --rounds "
        f"{args.rounds} --seconds {args.seconds:g}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "",
        f"Env steps/s, medians of {args.rounds} rounds, each cell {args.seconds:g} s per round, "
        f"the cells taking turns; `{SPIN_VARIABLE}` set to each value (µs a worker polls at "
        "least, up to ten times as long when its messages came later, and when they came up "
        "to two such polls apart, until just after the next was due; `auto`: 100 µs where a "
        "node has a core per worker, else 0). In brackets: the median of the rounds' ratios "
        "to `0`.",
        "",
        "| setting | " + " | ".join(f"`{spin}`" for spin in spins) + " |",
        "|---|" + "---:|" * len(spins),
    ]
    for name in SETTINGS:
        cells = []
        for spin in spins:
            rate = statistics.median(r[name, spin] for r in rounds)
            ratio = statistics.median(r[name, spin] / r[name, "0"] for r in rounds)
            cells.append(f"{rate:,.0f}" + ("" if spin == "0" else f" ({ratio:.2f}x)"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
