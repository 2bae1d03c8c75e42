"""A whole training run, timed: what a user decides on (``python -m benchmarks.training``).

Every other benchmark times the envs. This one times training: SB3's PPO on HalfCheetah-v5 with
16 envs over SB3's `DummyVecEnv` and `SubprocVecEnv` and over ours (`make_sb3_vec_env`), and a
CleanRL-style PPO loop (`benchmarks.ppo_loop`) over gymnasium's `SyncVectorEnv`, envpool and
ours (`make_vector_env`), each for the same number of env steps with the same seed, one after
another in one run. It reports the wall time, env steps/s, the share of the time spent
collecting (stepping the envs and the policy's forward passes) and updating, and the mean
return of the first and the last 16 episodes. ``--write`` puts the table in docs/benchmarks.md
(section ``training``), from which the README's short form is quoted.

Run it with nothing else running: ``python -m benchmarks.training --write`` (about 10 minutes
on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from benchmarks.ppo_loop import LoopResult, run_ppo
from benchmarks.report import write_section

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SB3_SETTINGS = ("DummyVecEnv", "SubprocVecEnv", "ours (SB3VecEnv)")
LOOP_SETTINGS = ("SyncVectorEnv", "envpool", "ours (make_vector_env)")
EPISODES = 16  # the first and the last this many episodes give the returns reported


def _sb3_envs(setting: str, env_id: str, num_envs: int, seed: int) -> Any:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from ray_multiprocess_env import make_sb3_vec_env

    if setting == "ours (SB3VecEnv)":
        return make_sb3_vec_env(env_id, num_envs, seed=seed, monitor=True)
    vec_env_cls = DummyVecEnv if setting == "DummyVecEnv" else SubprocVecEnv
    return make_vec_env(env_id, n_envs=num_envs, seed=seed, vec_env_cls=vec_env_cls)


def run_sb3(setting: str, env_id: str, num_envs: int, steps: int, seed: int) -> LoopResult:
    """SB3's PPO (its defaults, 128 steps per env per rollout) with `VecNormalize`."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    result = LoopResult(0, 0.0, 0.0, 0.0)

    class Timing(BaseCallback):  # type: ignore[misc]
        """Times each rollout (the rest is updates) and keeps each finished episode's return."""

        def _on_rollout_start(self) -> None:
            self.began = time.perf_counter()

        def _on_rollout_end(self) -> None:
            result.collect_s += time.perf_counter() - self.began

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    result.returns.append(float(info["episode"]["r"]))
            return True

    envs = VecNormalize(_sb3_envs(setting, env_id, num_envs, seed))
    try:
        model = PPO("MlpPolicy", envs, n_steps=128, seed=seed, device="cpu", verbose=0)
        start = time.perf_counter()
        model.learn(total_timesteps=steps, callback=Timing())
        result.seconds = time.perf_counter() - start
        result.steps = int(model.num_timesteps)
    finally:
        envs.close()
    result.update_s = result.seconds - result.collect_s
    return result


class _EnvpoolVector:
    """envpool's gymnasium-API env with the attributes the loop reads (`num_envs`, spaces)."""

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        import envpool

        self._env = envpool.make_gymnasium(env_id, num_envs=num_envs, seed=seed)
        self.num_envs = num_envs
        self.single_observation_space = self._env.observation_space
        self.single_action_space = self._env.action_space

    def reset(self, seed: int | None = None) -> tuple[Any, Any]:
        return self._env.reset()  # type: ignore[no-any-return]  # (seeded at make)

    def step(self, actions: Any) -> tuple[Any, ...]:
        return self._env.step(actions)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._env.close()


@contextlib.contextmanager
def _loop_envs(setting: str, env_id: str, num_envs: int, seed: int) -> Iterator[Any]:
    if setting == "SyncVectorEnv":
        envs: Any = gym.make_vec(env_id, num_envs, vectorization_mode="sync")
    elif setting == "envpool":
        envs = _EnvpoolVector(env_id, num_envs, seed)
    else:
        from ray_multiprocess_env import make_vector_env

        envs = make_vector_env(env_id, num_envs, seed=seed)
    try:
        yield envs
    finally:
        envs.close()


def run_loop(setting: str, env_id: str, num_envs: int, steps: int, seed: int) -> LoopResult:
    """The CleanRL-style loop over `setting`'s vector env."""
    with _loop_envs(setting, env_id, num_envs, seed) as envs:
        return run_ppo(envs, steps, seed=seed)


def _row(trainer: str, setting: str, result: LoopResult, base: float | None) -> str:
    first = np.mean(result.returns[:EPISODES]) if result.returns else float("nan")
    last = np.mean(result.returns[-EPISODES:]) if result.returns else float("nan")
    speed = "" if base is None else f" ({base / result.seconds:.2f}x)"
    return (
        f"| {trainer} | {setting} | {result.seconds:.0f} s{speed} | "
        f"{result.steps / result.seconds:,.0f} | {result.collect_s / result.seconds:.0%} | "
        f"{result.update_s / result.seconds:.0%} | {len(result.returns)} | {first:.0f} | "
        f"{last:.0f} |"
    )


def main(argv: list[str] | None = None) -> None:
    """Run every setting once, print the table; ``--write`` puts it in docs/benchmarks.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="run only these settings (names as shown)")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args(argv)
    runs: list[tuple[str, str, Callable[..., LoopResult]]] = [
        *(("SB3 PPO", s, run_sb3) for s in SB3_SETTINGS),
        *(("CleanRL-style PPO", s, run_loop) for s in LOOP_SETTINGS),
    ]
    rows, bases = [], {}
    for trainer, setting, run in runs:
        if args.only and setting not in args.only:
            continue
        result = run(setting, args.env_id, args.num_envs, args.steps, args.seed)
        bases.setdefault(trainer, result.seconds)  # (the first of each trainer: the baseline)
        rows.append(_row(trainer, setting, result, bases[trainer]))
        print(rows[-1], flush=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = " ".join(["python -m benchmarks.training", *(argv or sys.argv[1:])])
    table = "\n".join(
        [
            f"## A whole training run: PPO on {args.env_id}, {args.num_envs} envs",
            "",
            f"`{command}`, {datetime.date.today()}, {platform.processor() or platform.machine()}"
            f" with {cores} cores, torch {torch.__version__} on the CPU, nothing else running. "
            f"Each row is one run of {args.steps:,} env steps with seed {args.seed}, the rows "
            "one after another in the same run. Collecting: stepping the envs and the policy's "
            "forward passes; updating: the gradient steps (for SB3, everything outside its "
            "rollouts). Returns: the mean of the first and of the last "
            f"{EPISODES} episodes. The speed-up is against the first row of the same trainer.",
            "",
            "| trainer | vector env | wall time | env steps/s | collecting | updating | "
            "episodes | first return | last return |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    print(table)
    if args.write:
        write_section(DOCS, "training", table)


if __name__ == "__main__":
    main()
