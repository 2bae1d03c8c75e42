"""One step of the same envs through each face, stepping alone (no policy), in one run.

Run by hand from the repository root, with nothing else running (it writes the ``face-step``
section of docs/benchmarks.md):

    python -m benchmarks.face_step [--rounds 3] [--steps 2000] [--actions random] [--policy sb3]

HalfCheetah-v5, 16 envs, fixed actions (``--actions random``: a cycle of 100 seeded uniform
batches, which move the bodies as a policy's actions do and cost the physics about three times
as much; section ``face-step-random``): ours through `SB3VecEnv` (SB3's per-env info dicts)
and through `GymnasiumVectorEnv` (gymnasium's batched infos, in columns) with the same
autoreset (same step), both 2 workers x 8, beside SB3's in-process `DummyVecEnv`. The settings
take turns each round, each run in a process of its own (a Ray started by one run, or the worker
processes it leaves behind, would run beside the next); the table has the median over the rounds
of the wall time of a step, the driver's main-thread CPU per step, the workers' CPU per step
(psutil, all their threads), and the share of the machine's CPU time (``/proc/stat``, every
core) that was idle, and stolen by the hypervisor of a virtual machine, while the steps were
timed: a step of ours waits for the slower of its workers, and a core that sleeps between two
steps has to be woken for the next.

``--policy sb3`` (section ``face-step-policy``) runs what SB3's PPO runs between two steps as it
collects a rollout: its ``MlpPolicy`` (seeded, untrained) on the observations, under
``no_grad``, and the actions it samples, clipped to the action space, are the next step's. The
step and the policy are timed apart; torch's threads are what a user gets (ours fits them while
its workers run, `DummyVecEnv` keeps torch's default), and a row of ours with its workers not
polling (``RAY_MULTIPROCESS_ENV_WORKER_SPIN_US=0``) is added.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from benchmarks.report import (
    child_result,
    cpu_times,
    environment_variable,
    idle_and_stolen,
    write_section,
)
from ray_multiprocess_env._engine.worker_spin import SPIN_VARIABLE

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


class SB3Policy:
    """What SB3's PPO runs between two steps of a rollout: the policy, then clipped actions."""

    def __init__(self, observation_space: Any, action_space: Any) -> None:
        import torch
        from stable_baselines3.common.policies import ActorCriticPolicy

        torch.manual_seed(0)
        self._torch = torch
        self._policy = ActorCriticPolicy(observation_space, action_space, lambda _: 3e-4)
        self._policy.set_training_mode(False)
        self._low, self._high = action_space.low, action_space.high

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        with self._torch.no_grad():
            actions, _, _ = self._policy(self._torch.as_tensor(observations))
        clipped: np.ndarray = np.clip(actions.numpy(), self._low, self._high)
        return clipped


def _measure(
    envs: Any, observations: Any, actions: list[np.ndarray], steps: int, policy: str | None
) -> dict[str, float]:
    """Per step of `envs` (after 200 untimed): wall and CPU µs, the machine's idle and steal.

    `observations`: the reset's. With `policy` (``"sb3"``), SB3's policy acts between the steps
    (`SB3Policy`), timed apart: the wall and the driver's CPU are the steps' own.
    """
    engine = getattr(envs, "_engine", None)
    workers = [] if engine is None else [psutil.Process(p) for p in engine.run_on_workers("pid")]
    act = None
    if policy is not None:
        single = getattr(envs, "single_observation_space", envs.observation_space)
        act = SB3Policy(single, getattr(envs, "single_action_space", envs.action_space))

    def workers_cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in workers)

    clock, cpu_clock = time.perf_counter, time.thread_time
    stepped = acting = cpu = 0.0
    for i in range(steps + 200):
        if i == 200:
            before, machine = workers_cpu(), cpu_times()
            stepped = acting = cpu = 0.0
        began = clock()
        action = actions[i % len(actions)] if act is None else act(observations)
        middle, cpu_began = clock(), cpu_clock()
        observations = envs.step(action)[0]
        cpu += cpu_clock() - cpu_began
        acting, stepped = acting + middle - began, stepped + clock() - middle
    idle, steal = idle_and_stolen(machine, cpu_times()) or (0.0, 0.0)
    return {
        "wall": stepped / steps * 1e6,
        "policy": acting / steps * 1e6,
        "driver": cpu / steps * 1e6,
        "workers": (workers_cpu() - before) / steps * 1e6,
        "idle": idle,
        "steal": steal,
    }


def _sb3(steps: int, kind: str, policy: str | None) -> dict[str, float]:
    from ray_multiprocess_env import make_sb3_vec_env

    envs = make_sb3_vec_env(ENV_ID, NUM_ENVS, num_workers=2, seed=0)
    try:
        observations = envs.reset()
        actions = action_batches(kind, (NUM_ENVS, *envs.action_space.shape))
        return _measure(envs, observations, actions, steps, policy)
    finally:
        envs.close()


def _gymnasium(steps: int, kind: str, policy: str | None) -> dict[str, float]:
    from ray_multiprocess_env import make_vector_env

    envs = make_vector_env(ENV_ID, NUM_ENVS, num_workers=2, seed=0, autoreset_mode="same_step")
    try:
        observations, _ = envs.reset(seed=0)
        actions = action_batches(kind, envs.action_space.shape)
        return _measure(envs, observations, actions, steps, policy)
    finally:
        envs.close()


def _dummy(steps: int, kind: str, policy: str | None) -> dict[str, float]:
    from stable_baselines3.common.vec_env import DummyVecEnv

    envs = DummyVecEnv([lambda: gym.make(ENV_ID)] * NUM_ENVS)
    try:
        observations = envs.reset()
        actions = action_batches(kind, (NUM_ENVS, *envs.action_space.shape))
        return _measure(envs, observations, actions, steps, policy)
    finally:
        envs.close()


def _sb3_not_polling(steps: int, kind: str, policy: str | None) -> dict[str, float]:
    with environment_variable(SPIN_VARIABLE, "0"):
        return _sb3(steps, kind, policy)


Setting = Callable[[int, str, "str | None"], dict[str, float]]
SETTINGS: dict[str, Setting] = {
    "ours, SB3VecEnv (per-env infos), 2 x 8": _sb3,
    "ours, GymnasiumVectorEnv (same-step autoreset), 2 x 8": _gymnasium,
    "SB3 DummyVecEnv, in this process": _dummy,
}
#: Added with a policy: whether the workers' polling pays when the driver acts between steps.
NOT_POLLING: dict[str, Setting] = {
    "ours, SB3VecEnv, 2 x 8, workers not polling": _sb3_not_polling,
}


def _run_in_child(name: str, argv: list[str] | None) -> dict[str, float]:
    """Setting `name`'s run, in a process of its own (this one's arguments)."""
    command = [sys.executable, "-m", "benchmarks.face_step", *(argv or sys.argv[1:])]
    result: dict[str, float] = child_result([*command, "--child", name], name)
    return result


def main(argv: list[str] | None = None) -> None:
    """Run the settings in turns and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per setting")
    parser.add_argument("--actions", choices=("fixed", "random"), default="fixed")
    parser.add_argument(
        "--policy", choices=("sb3",), default=None, help="SB3's policy acts between the steps"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # (one run, in its own process)
    args = parser.parse_args(argv)
    settings = SETTINGS if args.policy is None else {**SETTINGS, **NOT_POLLING}
    if args.child:
        result = settings[args.child](args.steps, args.actions, args.policy)
        print("RESULT " + json.dumps(result), flush=True)
        return
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    names = list(settings)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            runs[name].append(_run_in_child(name, argv))
            print(f"round {round_ + 1}: {name}: {runs[name][-1]}", flush=True)
    rows = []
    for name, results in runs.items():
        median = {key: float(np.median([r[key] for r in results])) for key in results[0]}
        workers = f"{median['workers']:.0f}" if median["workers"] else "-"
        walls = [r["wall"] for r in results]
        wall = f"{median['wall']:.0f} ({min(walls):.0f} to {max(walls):.0f})"
        acting = f" {median['policy']:.0f} |" if args.policy else ""
        machine = f"{median['idle']:.0f}% / {median['steal']:.1f}%"
        rows.append(f"| {name} | {wall} |{acting} {median['driver']:.0f} | {workers} | {machine} |")
    if args.policy is None:
        title, what, acting_head = f"stepping alone, {args.actions} actions", "no policy", ""
    else:
        title = "with SB3's policy acting between the steps"
        what, acting_head = "SB3's `MlpPolicy` acting between the steps", " policy µs per step |"
    flags = "" if args.policy is None else f" --policy {args.policy}"
    table = "\n".join(
        [
            f"## One step of 16 HalfCheetahs through each face, {title} (#66)",
            "",
            f"`python -m benchmarks.face_step --rounds {args.rounds} --steps {args.steps} "
            f"--actions {args.actions}{flags}`, {datetime.date.today()}, {platform.machine()}, "
            f"nothing else running; {args.actions} actions, {what}; the median of the rounds, "
            "the settings taking turns. The machine's CPU time (every core) idle and stolen by "
            "its hypervisor while the steps were timed in the last column.",
            "",
            "| setting | wall µs per step (fastest to slowest round) |"
            f"{acting_head} driver CPU µs per step | workers' CPU µs per step "
            "| machine idle / stolen |",
            "|---|---:|" + ("---:|" if args.policy else "") + "---:|---:|---:|",
            *rows,
        ]
    )
    print(table)
    if not args.no_write:
        if args.policy is not None:
            section = "face-step-policy"
        else:
            section = "face-step" if args.actions == "fixed" else "face-step-random"
        write_section(DOCS, section, table)


if __name__ == "__main__":
    main()
