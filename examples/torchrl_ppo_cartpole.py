"""TorchRL's PPO on CartPole, the envs stepped in Ray workers by `make_vector_env`.

TorchRL wraps a gymnasium vector env with `GymWrapper` (its batch size is the number of envs)
and resets finished envs itself, so the vector env runs with ``autoreset_mode="disabled"``
(TorchRL refuses gymnasium's default ``"next_step"``). Run it as a script:

    python examples/torchrl_ppo_cartpole.py --frames 40960
"""

from __future__ import annotations

import argparse

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import GymWrapper, RewardSum, TransformedEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from ray_multiprocess_env import make_vector_env

# torch is imported above, before any env is made: ray_multiprocess_env then fits torch's
# threads to the cores its workers leave, so they do not spin on them (docs/usage.md, "A torch
# policy in the driver").


def main() -> None:
    """Train, printing the mean return of the last 20 episodes after each batch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=40_960, help="env steps in all")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)

    vector_env = make_vector_env(
        "CartPole-v1", args.envs, num_workers=args.workers, autoreset_mode="disabled", seed=0
    )
    # RewardSum keeps each episode's return under "episode_reward"
    env = TransformedEnv(GymWrapper(vector_env), RewardSum())

    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2)),
            in_keys=["observation"],
            out_keys=["logits"],
        ),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
        return_log_prob=True,
    )
    critic = ValueOperator(
        nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1)), in_keys=["observation"]
    )
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=2.5e-3)

    collector = Collector(env, actor, frames_per_batch=128 * args.envs, total_frames=args.frames)
    returns: list[float] = []
    for i, batch in enumerate(collector):
        with torch.no_grad():
            advantage(batch)
        done = batch["next", "done"].squeeze(-1)
        returns += batch["next", "episode_reward"][done].flatten().tolist()
        data = batch.reshape(-1)
        for _ in range(4):  # epochs
            for index in torch.randperm(data.numel()).split(256):  # minibatches
                losses = loss_module(data[index])
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), 0.5)
                optimizer.step()
        collector.update_policy_weights_()
        recent = returns[-20:]
        if recent:
            mean = sum(recent) / len(recent)
            print(f"batch {i}: mean return of the last {len(recent)} episodes {mean:.1f}")
    collector.shutdown()
    env.close()
    recent = returns[-20:]
    print(f"final mean return of the last {len(recent)} episodes: {sum(recent) / len(recent):.1f}")


if __name__ == "__main__":
    main()
