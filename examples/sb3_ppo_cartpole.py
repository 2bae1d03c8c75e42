"""Train stable-baselines3's PPO on CartPole with 8 envs in 2 Ray worker actors.

python examples/sb3_ppo_cartpole.py --timesteps 50000
"""

from __future__ import annotations

import argparse
import sys

import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

from ray_multiprocess_env import make_sb3_vec_env

# torch is imported above (by stable_baselines3), before any env is made: ray_multiprocess_env
# then fits torch's threads to the cores its workers leave, so they do not spin on them
# (docs/usage.md, "A torch policy in the driver").


def train(timesteps: int, seed: int = 0) -> float:
    """Train PPO for `timesteps` env steps; return its mean return over 10 test episodes."""
    envs = make_sb3_vec_env("CartPole-v1", 8, num_workers=2, seed=seed, monitor=True)
    try:
        model = PPO(
            "MlpPolicy",
            envs,
            n_steps=256,
            batch_size=256,
            learning_rate=1e-3,
            seed=seed,
            device="cpu",
            verbose=0,
        )
        model.learn(total_timesteps=timesteps)
    finally:
        envs.close()
    mean_return, _ = evaluate_policy(model, gym.make("CartPole-v1"), n_eval_episodes=10)
    return float(mean_return)


def main(argv: list[str] | None = None) -> int:
    """Run the example; exit status 0 if the policy beats a random one (about 22) by far."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    mean_return = train(args.timesteps, args.seed)
    print(f"mean return over 10 test episodes: {mean_return:.1f}")
    return 0 if mean_return > 100 else 1


if __name__ == "__main__":
    sys.exit(main())
