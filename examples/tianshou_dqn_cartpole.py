"""Tianshou's DQN on CartPole, the training and test envs stepped in Ray workers.

`make_tianshou_vector_env` gives Tianshou's ``Collector`` the vector env it expects: it steps
the envs that are ready and resets finished ones itself. Training stops once the mean return
of a test round reaches 195 (CartPole's old threshold). Run it as a script:

    python examples/tianshou_dqn_cartpole.py --epochs 10
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats, VectorReplayBuffer
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net
from tianshou.utils.torch_utils import policy_within_training_step

from ray_multiprocess_env import make_tianshou_vector_env

# torch is imported above, before any env is made: ray_multiprocess_env then fits torch's
# threads to the cores its workers leave, so they do not spin on them (docs/usage.md, "A torch
# policy in the driver").

TARGET = 195.0


def main() -> None:
    """Train until a test round's mean return reaches `TARGET`; print the best mean return."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps-per-epoch", type=int, default=5000)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--test-envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)  # Tianshou's epsilon-greedy exploration draws from numpy's global generator

    # the seed resets every env at once with its own seed (env i: seed + i), as Tianshou's do
    workers = args.workers
    train_envs = make_tianshou_vector_env("CartPole-v1", args.envs, num_workers=workers, seed=0)
    test_envs = make_tianshou_vector_env("CartPole-v1", args.test_envs, num_workers=workers, seed=9)
    probe = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(
        model=Net(state_shape=(4,), action_shape=2, hidden_sizes=[64, 64]),
        action_space=probe.action_space,
        observation_space=probe.observation_space,
        eps_training=0.1,
        eps_inference=0.0,
    )
    algorithm = DQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.95,
        n_step_return_horizon=3,
        target_update_freq=320,
    )
    buffer = VectorReplayBuffer(20_000, buffer_num=args.envs)
    train_collector = Collector[CollectStats](algorithm, train_envs, buffer, exploration_noise=True)
    test_collector = Collector[CollectStats](algorithm, test_envs)
    with policy_within_training_step(policy):  # a first batch of experience
        train_collector.reset()
        train_collector.collect(n_step=64 * args.envs)

    try:
        result = algorithm.run_training(
            OffPolicyTrainerParams(
                training_collector=train_collector,
                test_collector=test_collector,
                max_epochs=args.epochs,
                epoch_num_steps=args.steps_per_epoch,
                collection_step_num_env_steps=2 * args.envs,
                test_step_num_episodes=args.test_envs,
                batch_size=64,
                update_step_num_gradient_steps_per_sample=0.1,
                stop_fn=lambda mean_return: mean_return >= TARGET,
                test_in_training=True,
                show_progress=False,
            )
        )
    finally:
        train_envs.close()
        test_envs.close()
    print(f"best mean test return {result.best_reward:.1f} after {result.train_step} env steps")


if __name__ == "__main__":
    main()
