"""Train pfrl's PPO on CartPole with 8 envs in a RayVectorEnv, evaluating in batches.

    python examples/pfrl_ppo_cartpole.py            # until the mean evaluation return >= 195

The envs are gymnasium envs behind `GymAPIBridge` (pfrl 0.4 speaks the old gym API), held by
two worker actors of 4 envs each. Evaluation goes through pfrl's batched path, since the
evaluation env is a `RayVectorEnv` too (a `pfrl.env.VectorEnv`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import pfrl
import torch
from torch import nn

from ray_multiprocess_env import GymAPIBridge, RayVectorEnv

# torch is imported above, before any env is made: ray_multiprocess_env then fits torch's
# threads to the cores its workers leave, so they do not spin on them (docs/usage.md, "A torch
# policy in the driver").


def make_env() -> GymAPIBridge:
    """One CartPole-v1 with the old gym API."""
    return GymAPIBridge(gym.make("CartPole-v1"))


def make_agent(obs_size: int, n_actions: int) -> pfrl.agents.PPO:
    """PPO with separate 64-64 policy and value networks."""
    policy = nn.Sequential(
        nn.Linear(obs_size, 64),
        nn.Tanh(),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, n_actions),
        pfrl.policies.SoftmaxCategoricalHead(),
    )
    value = nn.Sequential(
        nn.Linear(obs_size, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )
    model = pfrl.nn.Branched(policy, value)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5)
    return pfrl.agents.PPO(
        model,
        optimizer,
        gpu=-1,
        update_interval=2048,
        minibatch_size=64,
        epochs=10,
        gamma=0.99,
        lambd=0.95,
        clip_eps=0.2,
        entropy_coef=0.0,
        standardize_advantages=True,
    )


def train(
    steps: int,
    target: float,
    outdir: str,
    seed: int = 0,
    num_envs: int = 8,
    envs_per_worker: int = 4,
    eval_interval: int = 10_000,
) -> float:
    """Train until `target` mean evaluation return or `steps` env steps; return the best mean."""
    pfrl.utils.set_random_seed(seed)
    env = RayVectorEnv.from_env_fns([make_env] * num_envs, envs_per_worker=envs_per_worker)
    eval_env = RayVectorEnv.from_env_fns([make_env] * num_envs, envs_per_worker=envs_per_worker)
    env.seed(seed)
    eval_env.seed(seed + 10_000)
    agent = make_agent(env.observation_space.low.size, env.action_space.n)
    try:
        _, eval_stats = pfrl.experiments.train_agent_batch_with_evaluation(
            agent=agent,
            env=env,
            eval_env=eval_env,
            steps=steps,
            eval_n_steps=None,
            eval_n_episodes=10,
            eval_interval=eval_interval,
            outdir=outdir,
            successful_score=target,
            log_interval=10_000,
            logger=logging.getLogger("pfrl_ppo_cartpole"),
        )
    finally:
        env.close()
        eval_env.close()
    return max(stats["eval_score"] for stats in eval_stats) if eval_stats else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Run the example; exit status 0 if the target was reached."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300_000, help="env steps at most")
    parser.add_argument("--target", type=float, default=195.0, help="stop at this eval mean")
    parser.add_argument("--eval-interval", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--outdir", default=None, help="pfrl's output folder (a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    outdir = args.outdir or tempfile.mkdtemp(prefix="pfrl_ppo_cartpole_")
    best = train(args.steps, args.target, outdir, args.seed, eval_interval=args.eval_interval)
    print(f"best mean evaluation return: {best:.1f} (scores in {Path(outdir) / 'scores.txt'})")
    return 0 if best >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
