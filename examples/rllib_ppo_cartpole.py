"""Train RLlib's PPO (new API stack) on CartPole, our vector env in each remote env runner.

    python examples/rllib_ppo_cartpole.py --iterations 5 --env-runners 2

``tune.register_env(name, rllib_env_creator)`` reaches every env runner process (RLlib keeps the
creator in Ray's registry), and with ``gym_env_vectorize_mode="vector_entry_point"`` each env
runner builds its ``num_envs_per_env_runner`` envs as one `GymnasiumVectorEnv` whose envs live
in Ray worker actors nested in that env runner (NEXT_STEP autoreset, which RLlib expects).

CPU accounting (Ray's logical CPUs, not cores): each remote env runner reserves
``num_cpus_per_env_runner`` and each of its workers ``actor_options["num_cpus"]``; the learner
runs in this (driver) process here and reserves none. With 2 env runners of 4 envs in 1 worker
each: 2 x 0.5 + 2 x 0.25 = 1.5 CPUs. Both levels must fit in the cluster, or the workers wait
for CPUs forever; under Tune, the trial's placement group must hold them too.
"""

from __future__ import annotations

import argparse
import sys

from ray.rllib.algorithms.ppo import PPOConfig
from ray.tune.registry import register_env

from ray_multiprocess_env import rllib_env_creator

ENV_NAME = "ray-vector-cartpole"


def build_config(env_runners: int) -> PPOConfig:
    """PPO with `env_runners` env runners (0: in this process), 4 envs in 1 Ray worker each."""
    register_env(ENV_NAME, rllib_env_creator)
    return (
        PPOConfig()
        .environment(
            ENV_NAME,
            env_config={
                "env_id": "CartPole-v1",
                "envs_per_worker": 4,
                "actor_options": {"num_cpus": 0.25},
            },
        )
        .env_runners(
            num_env_runners=env_runners,
            num_envs_per_env_runner=4,
            num_cpus_per_env_runner=0.5,
            gym_env_vectorize_mode="vector_entry_point",
        )
        .training(train_batch_size_per_learner=2000, minibatch_size=250, num_epochs=6, lr=3e-4)
    )


def train(iterations: int, env_runners: int) -> list[float]:
    """Train for `iterations` and return the mean episode return after each."""
    algo = build_config(env_runners).build_algo()
    returns = []
    try:
        kinds = algo.env_runner_group.foreach_env_runner(
            lambda runner: type(runner.env.unwrapped).__name__, local_env_runner=env_runners == 0
        )
        print(f"env runners' envs: {kinds}", flush=True)
        for i in range(iterations):
            result = algo.train()
            mean = float(result["env_runners"]["episode_return_mean"])
            returns.append(mean)
            print(f"iteration {i + 1}: mean episode return {mean:.1f}", flush=True)
    finally:
        algo.stop()
    return returns


def main(argv: list[str] | None = None) -> int:
    """Run the example; exit status 0 if the returns rose."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--env-runners", type=int, default=2)
    args = parser.parse_args(argv)
    returns = train(args.iterations, args.env_runners)
    return 0 if returns[-1] > returns[0] else 1


if __name__ == "__main__":
    sys.exit(main())
