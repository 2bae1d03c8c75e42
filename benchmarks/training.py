"""A whole training run, timed: what a user decides on (``python -m benchmarks.training``).

Every other benchmark times the envs. This one times training: SB3's PPO on HalfCheetah-v5 with
16 envs over SB3's `DummyVecEnv` and `SubprocVecEnv` and over ours (`make_sb3_vec_env`), and a
CleanRL-style PPO loop (`benchmarks.ppo_loop`) over gymnasium's `SyncVectorEnv` and
`AsyncVectorEnv` (a process per env), envpool and ours (`make_vector_env`), each for the same
number of env steps with the same seed. It reports the wall time, env steps/s, the share of the
time spent collecting (stepping the envs, the policy's forward passes and the loop around
them) and updating, and the mean return of the first and the last 16 episodes; a second table
splits the median run's time into stepping the envs, the policy acting, the rest of collecting
and updating. ``--write`` puts both in docs/benchmarks.md (section ``training``), from which
the README's short form is quoted.

Runs of one setting differ by 20% and more from one minute to the next on a small machine, so
the settings take turns: each round runs every setting once, in an order rotated by one each
round and reversed every other (`round_order`: no setting always follows the same one), each
run in a process of its own (nothing of one run, a Ray started or torch's threads, is left to
the next). The table has each setting's median wall time with the fastest and slowest run,
and its speed against the first setting of its trainer as the median of the per-round ratios
(each ratio within one round, minutes apart); ``--only`` runs that first setting too
(`chosen_runs`).

Run it with nothing else running: ``python -m benchmarks.training --write`` (3 rounds of 200,000
steps: about half an hour on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
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
from benchmarks.report import child_result, write_section

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SB3_SETTINGS = ("DummyVecEnv", "SubprocVecEnv", "ours (SB3VecEnv)")
LOOP_SETTINGS = ("SyncVectorEnv", "AsyncVectorEnv", "envpool", "ours (make_vector_env)")
EPISODES = 16  # the first and the last this many episodes give the returns reported


def _sb3_envs(setting: str, env_id: str, num_envs: int, seed: int) -> Any:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from ray_multiprocess_env import make_sb3_vec_env

    if setting == "ours (SB3VecEnv)":
        return make_sb3_vec_env(env_id, num_envs, seed=seed, monitor=True)
    vec_env_cls = DummyVecEnv if setting == "DummyVecEnv" else SubprocVecEnv
    return make_vec_env(env_id, n_envs=num_envs, seed=seed, vec_env_cls=vec_env_cls)


def run_sb3(
    setting: str,
    env_id: str,
    num_envs: int,
    steps: int,
    seed: int,
    batch_size: int | None = None,
    epochs: int | None = None,
) -> LoopResult:
    """SB3's PPO (its defaults, 128 steps per env per rollout) with `VecNormalize`.

    `batch_size` and `epochs` (None: SB3's defaults, 64 and 10) set its minibatches.
    """
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
        minibatches = {
            k: v for k, v in (("batch_size", batch_size), ("n_epochs", epochs)) if v is not None
        }
        model = PPO(
            "MlpPolicy", envs, n_steps=128, seed=seed, device="cpu", verbose=0, **minibatches
        )
        # SB3's rollouts call the env's `step` and the policy's `forward` (its updates call
        # neither): each timed where it is called
        envs.step = _timed(envs.step, result, "step_s")  # type: ignore[method-assign]
        model.policy.forward = _timed(model.policy.forward, result, "act_s")  # type: ignore[method-assign]
        start = time.perf_counter()
        model.learn(total_timesteps=steps, callback=Timing())
        result.seconds = time.perf_counter() - start
        result.steps = int(model.num_timesteps)
    finally:
        envs.close()
    result.update_s = result.seconds - result.collect_s
    return result


def _timed(call: Callable[..., Any], result: LoopResult, field: str) -> Callable[..., Any]:
    """`call`, adding the seconds each call takes to `result`'s `field`."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            setattr(result, field, getattr(result, field) + time.perf_counter() - began)

    return timed


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
    if setting in ("SyncVectorEnv", "AsyncVectorEnv"):  # (async: a process per env)
        mode = "sync" if setting == "SyncVectorEnv" else "async"
        envs: Any = gym.make_vec(env_id, num_envs, vectorization_mode=mode)
    elif setting == "envpool":
        envs = _EnvpoolVector(env_id, num_envs, seed)
    else:
        from ray_multiprocess_env import make_vector_env

        envs = make_vector_env(env_id, num_envs, seed=seed)
    try:
        yield envs
    finally:
        envs.close()


def run_loop(
    setting: str, env_id: str, num_envs: int, steps: int, seed: int, **_: Any
) -> LoopResult:
    """The CleanRL-style loop over `setting`'s vector env (SB3's minibatch options unused)."""
    with _loop_envs(setting, env_id, num_envs, seed) as envs:
        return run_ppo(envs, steps, seed=seed)


#: Each setting: (trainer, vector env, the function that runs it).
RUNS: list[tuple[str, str, Callable[..., LoopResult]]] = [
    *(("SB3 PPO", s, run_sb3) for s in SB3_SETTINGS),
    *(("CleanRL-style PPO", s, run_loop) for s in LOOP_SETTINGS),
]


def chosen_runs(only: list[str] | None) -> list[tuple[str, str, Callable[..., LoopResult]]]:
    """The `RUNS` that `--only` names (None or empty: all), with each trainer's first setting.

    A setting's speed is against its trainer's first setting, so that one runs whenever any
    of its trainer's does.

    Raises:
        ValueError: If a name is not a setting's, naming the settings there are.

    Example:
        >>> [setting for _, setting, _ in chosen_runs(["SubprocVecEnv"])]
        ['DummyVecEnv', 'SubprocVecEnv']
    """
    if not only:
        return list(RUNS)
    names = [setting for _, setting, _ in RUNS]
    unknown = [name for name in only if name not in names]
    if unknown:
        raise ValueError(f"--only: no setting {unknown}; the settings are {names}")
    trainers = {trainer for trainer, setting, _ in RUNS if setting in only}
    first = {trainer: next(s for t, s, _ in RUNS if t == trainer) for trainer in trainers}
    return [run for run in RUNS if run[1] in only or first.get(run[0]) == run[1]]


def round_order(runs: list[Any], round_: int) -> list[Any]:
    """The order `runs` take in round `round_`: rotated by one each round, reversed every other.

    So each setting's place moves from round to round, and what runs just before it changes
    (a rotation alone keeps every setting after the same one).

    Example:
        >>> [round_order([1, 2, 3], r) for r in range(3)]
        [[1, 2, 3], [1, 3, 2], [3, 1, 2]]
    """
    shift = round_ % len(runs)
    order = runs[shift:] + runs[:shift]
    return order[::-1] if round_ % 2 else order


def _run_in_child(setting: str, args: argparse.Namespace) -> LoopResult:
    """Run `setting` once in a process of its own; its `LoopResult`."""
    command = [
        sys.executable, "-m", "benchmarks.training", "--child", setting,
        "--env-id", args.env_id, "--num-envs", str(args.num_envs), "--steps", str(args.steps),
        "--seed", str(args.seed),
        *(["--batch-size", str(args.batch_size)] if args.batch_size else []),
        *(["--epochs", str(args.epochs)] if args.epochs else []),
    ]  # fmt: skip
    return LoopResult(**child_result(command, setting))


def _child(setting: str, args: argparse.Namespace) -> None:
    """Run one setting here and print its result as one JSON line."""
    trainer_run = next(run for _, name, run in RUNS if name == setting)
    result = trainer_run(
        setting, args.env_id, args.num_envs, args.steps, args.seed,
        batch_size=args.batch_size, epochs=args.epochs,
    )  # fmt: skip
    print("RESULT " + json.dumps(dataclasses.asdict(result)), flush=True)


def _median_run(results: list[LoopResult]) -> LoopResult:
    """The run of median wall time (of an even number, the faster of the middle two)."""
    return sorted(results, key=lambda r: r.seconds)[(len(results) - 1) // 2]


def _row(trainer: str, setting: str, results: list[LoopResult], ratios: list[float]) -> str:
    """One setting's row: median wall time (fastest, slowest), ratio, and the median run's rest."""
    seconds = sorted(r.seconds for r in results)
    middle = _median_run(results)
    returns = results[0].returns  # (the same seed: the same episodes in every round, as a rule)
    first = np.mean(returns[:EPISODES]) if returns else float("nan")
    last = np.mean(returns[-EPISODES:]) if returns else float("nan")
    spread = f" ({seconds[0]:.0f}-{seconds[-1]:.0f})" if len(seconds) > 1 else ""
    return (
        f"| {trainer} | {setting} | {middle.seconds:.0f} s{spread} | "
        f"{float(np.median(ratios)):.2f}x | {middle.steps / middle.seconds:,.0f} | "
        f"{middle.collect_s / middle.seconds:.0%} | {middle.update_s / middle.seconds:.0%} | "
        f"{len(returns)} | {first:.0f} | {last:.0f} |"
    )


def _time_row(trainer: str, setting: str, results: list[LoopResult]) -> str:
    """Where the median run's time went: the steps, the policy acting, the rest, the updates."""
    run = _median_run(results)
    rest = run.collect_s - run.step_s - run.act_s
    parts = (run.step_s, run.act_s, rest, run.update_s)
    cells = " | ".join(f"{part:.1f} s ({part / run.seconds:.0%})" for part in parts)
    return f"| {trainer} | {setting} | {run.seconds:.1f} s | {cells} |"


def main(argv: list[str] | None = None) -> None:
    """Run the settings in turns, print the table; ``--write`` puts it in docs/benchmarks.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting, in turns")
    parser.add_argument("--batch-size", type=int, help="SB3's minibatch size (default: 64)")
    parser.add_argument("--epochs", type=int, help="SB3's epochs per rollout (default: 10)")
    parser.add_argument("--only", nargs="*", help="run only these settings (names as shown)")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # (one run, in its own process)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args)
        return
    try:
        runs = chosen_runs(args.only)
    except ValueError as err:
        parser.error(str(err))
    results: dict[str, list[LoopResult]] = {setting: [] for _, setting, _ in runs}
    ratios: dict[str, list[float]] = {setting: [] for _, setting, _ in runs}
    for round_ in range(args.rounds):
        for trainer, setting, _ in round_order(runs, round_):
            result = _run_in_child(setting, args)
            results[setting].append(result)
            print(f"round {round_ + 1}: {trainer}, {setting}: {result.seconds:.1f} s", flush=True)
        for trainer in dict.fromkeys(t for t, _, _ in runs):
            mine = [s for t, s, _ in runs if t == trainer]
            base = results[mine[0]][-1].seconds
            for setting in mine:
                ratios[setting].append(base / results[setting][-1].seconds)
    rows = [_row(t, s, results[s], ratios[s]) for t, s, _ in runs]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = " ".join(["python -m benchmarks.training", *(argv or sys.argv[1:])])
    sb3 = f"`batch_size={args.batch_size or 64}`, `n_epochs={args.epochs or 10}`, `n_steps=128`"
    table = "\n".join(
        [
            f"## A whole training run: PPO on {args.env_id}, {args.num_envs} envs",
            "",
            f"`{command}`, {datetime.date.today()}, {platform.processor() or platform.machine()}"
            f" with {cores} cores, torch {torch.__version__} on the CPU, nothing else running. "
            f"{args.rounds} round(s); in each, every setting ran once, {args.steps:,} env steps "
            f"with seed {args.seed}, in a process of its own, the order rotated by one "
            f"each round and reversed every other. SB3: {sb3}. Wall time: the median run (the "
            "fastest and slowest in brackets); the speed is the median over the rounds of the "
            "first row of the same trainer's time over this row's, in the same round. Env "
            "steps/s, collecting and updating are those of the median run. Collecting: "
            "stepping the envs, the policy's forward passes and the loop around them; updating: "
            "the gradient steps (for SB3, everything outside its rollouts)."
            f" Returns: the mean of the first and of the last {EPISODES} episodes.",
            "",
            "| trainer | vector env | wall time | speed | env steps/s | collecting | updating | "
            "episodes | first return | last return |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Where the median run's time went. Collecting is split into the vector env's `step` "
            "(SB3: the `VecNormalize` around it too), the policy's forward passes that chose the "
            "actions, and the rest of the trainer's loop (its buffer, observation statistics, "
            "callbacks); the share of the wall time in brackets.",
            "",
            "| trainer | vector env | wall time | stepping the envs | the policy acting | "
            "the rest of collecting | updating |",
            "|---|---|---:|---:|---:|---:|---:|",
            *(_time_row(t, s, results[s]) for t, s, _ in runs),
        ]
    )
    print(table)
    if args.write:
        write_section(DOCS, "training", table)


if __name__ == "__main__":
    main()
