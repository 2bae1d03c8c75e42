"""Train RLlib's PPO (new API stack) on CartPole with our vector env in its env runner.

    python examples/rllib_ppo_cartpole.py --iterations 5

RLlib's env runner builds its envs with ``gymnasium.make_vec(..., vectorization_mode=
"vector_entry_point")``; registering an id with ``ray_multiprocess_env:vector_entry_point``
makes that a `GymnasiumVectorEnv` whose envs live in two Ray worker actors. The settings:

- ``num_env_runners=0``: the env runner is the driver process, so the id registered here is
  the one it sees (with remote env runners, register the id in each of them, e.g. from a
  callback, or pass ``config.environment(env=callable)``);
- ``num_envs_per_env_runner=8`` and ``gym_env_vectorize_mode="vector_entry_point"``;
- the envs autoreset in NEXT_STEP mode, which is what RLlib's env runner expects.
"""

from __future__ import annotations

import argparse
import sys

import gymnasium as gym
from ray.rllib.algorithms.ppo import PPOConfig

ENV_ID = "RayVectorCartPole-v1"


def register() -> None:
    """Register the id whose vector entry point is our Ray vector env."""
    if ENV_ID not in gym.registry:
        gym.register(
            ENV_ID,
            entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            max_episode_steps=500,
            vector_entry_point="ray_multiprocess_env:vector_entry_point",
            kwargs={"env_id": "CartPole-v1", "envs_per_worker": 4},
        )


def build_config() -> PPOConfig:
    """PPO on the registered id: 8 envs in 2 Ray workers, one local env runner."""
    return (
        PPOConfig()
        .environment(ENV_ID)
        .env_runners(
            num_env_runners=0,
            num_envs_per_env_runner=8,
            gym_env_vectorize_mode="vector_entry_point",
        )
        .training(train_batch_size_per_learner=2000, minibatch_size=250, num_epochs=6, lr=3e-4)
    )


def train(iterations: int) -> list[float]:
    """Train for `iterations` and return the mean episode return after each."""
    register()
    algo = build_config().build_algo()
    returns = []
    try:
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
    args = parser.parse_args(argv)
    returns = train(args.iterations)
    return 0 if returns[-1] > returns[0] else 1


if __name__ == "__main__":
    sys.exit(main())
