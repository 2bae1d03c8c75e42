"""A CleanRL-style PPO loop over any gymnasium-API vector env (continuous actions).

One file of plain torch, as CleanRL writes its scripts, so that the same loop runs over
gymnasium's `SyncVectorEnv`, envpool and ours and only the vector env differs. The envs
autoreset on the step after the last one (gymnasium's ``next_step`` mode, envpool's only mode):
the step that ends an episode returns its final observation (so a truncated episode is
bootstrapped from it), and the step after it (which resets, with reward 0) is left out of the
loss. Observations are normalised by running statistics and rewards scaled by the running
deviation of the discounted return, in the loop itself, so each vector env gets the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium.wrappers.utils import RunningMeanStd
from torch import nn

__all__ = ["LoopResult", "run_ppo"]


@dataclass
class LoopResult:
    """What one run measured: seconds in all, in collection and in updates; episode returns.

    Of the collection: `step_s` in the vector env's ``step`` (the actions clipped to its space
    first), `act_s` in the policy's forward passes that chose the actions.
    """

    steps: int
    seconds: float
    collect_s: float
    update_s: float
    returns: list[float] = field(default_factory=list)
    step_s: float = 0.0
    act_s: float = 0.0


class _Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int) -> None:
        super().__init__()

        def mlp(out: int, std: float) -> nn.Sequential:
            layers = [nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()]
            last = nn.Linear(64, out)
            nn.init.orthogonal_(last.weight, std)
            nn.init.zeros_(last.bias)
            return nn.Sequential(*layers, last)

        self.critic, self.actor = mlp(1, 1.0), mlp(act_dim, 0.01)
        self.log_std = nn.Parameter(torch.zeros(act_dim))

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.actor(obs), self.log_std.exp())


def run_ppo(envs: Any, total_steps: int, seed: int = 0, num_steps: int = 128) -> LoopResult:
    """Train PPO on `envs` (a gymnasium-API vector env with Box spaces) for `total_steps`.

    CleanRL's continuous-action defaults: 64x64 tanh actor and critic, Adam 3e-4, 10 epochs of
    32 minibatches, clip 0.2, GAE 0.95, gamma 0.99; `num_steps` per env per rollout.
    """
    torch.manual_seed(seed)
    n = envs.num_envs
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    obs_dim, act_dim = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    low, high = act_space.low, act_space.high
    agent = _Agent(obs_dim, act_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)
    obs_stats, ret_stats = RunningMeanStd(shape=(obs_dim,)), RunningMeanStd(shape=())
    gamma, lam = 0.99, 0.95
    buf_obs = np.zeros((num_steps, n, obs_dim), np.float32)
    buf_act = np.zeros((num_steps, n, act_dim), np.float32)
    buf_logp, buf_val, buf_rew = (np.zeros((num_steps, n), np.float32) for _ in range(3))
    buf_term, buf_done, buf_valid = (np.zeros((num_steps, n), np.float32) for _ in range(3))
    result = LoopResult(0, 0.0, 0.0, 0.0)
    start = time.perf_counter()
    raw, _ = envs.reset(seed=seed)
    was_done = np.zeros(n, dtype=bool)  # (the env resets at this step: its transition is void)
    episode = np.zeros(n)
    discounted = np.zeros(n)
    while result.steps < total_steps:
        began = time.perf_counter()
        for t in range(num_steps):
            obs_stats.update(np.asarray(raw, np.float64).reshape(n, obs_dim))
            obs = _normalise(raw, obs_stats, n, obs_dim)
            acting = time.perf_counter()
            with torch.no_grad():
                dist = agent.dist(torch.from_numpy(obs))
                action = dist.sample()
                logp, value = dist.log_prob(action).sum(-1), agent.critic(torch.from_numpy(obs))
            act = action.numpy()
            stepping = time.perf_counter()
            raw, reward, terminated, truncated, _ = envs.step(np.clip(act, low, high))
            result.step_s += time.perf_counter() - stepping
            result.act_s += stepping - acting
            done = np.logical_or(terminated, truncated)
            episode += reward
            discounted = discounted * gamma + reward
            if not was_done.all():  # (every env resetting at once: nothing to learn from)
                ret_stats.update(discounted[~was_done])
            for env in np.flatnonzero(done):
                result.returns.append(float(episode[env]))
            episode[done], discounted[done] = 0.0, 0.0
            buf_obs[t], buf_act[t], buf_logp[t], buf_val[t] = obs, act, logp, value.squeeze(-1)
            buf_rew[t] = reward / np.sqrt(ret_stats.var + 1e-8)
            buf_term[t], buf_done[t], buf_valid[t] = terminated, done, ~was_done
            was_done = done
        result.steps += num_steps * n
        with torch.no_grad():  # the value of the observation after the last step
            last = agent.critic(torch.from_numpy(_normalise(raw, obs_stats, n, obs_dim)))
        result.collect_s += time.perf_counter() - began
        began = time.perf_counter()
        advantages = _gae(buf_rew, buf_val, last.squeeze(-1).numpy(), buf_term, buf_done,
                          buf_valid, gamma, lam)  # fmt: skip
        _update(agent, optimizer, buf_obs, buf_act, buf_logp, buf_val, advantages, buf_valid)
        result.update_s += time.perf_counter() - began
    result.seconds = time.perf_counter() - start
    return result


def _normalise(raw: Any, stats: RunningMeanStd, n: int, dim: int) -> np.ndarray:
    obs = (np.asarray(raw, np.float64).reshape(n, dim) - stats.mean) / np.sqrt(stats.var + 1e-8)
    return np.clip(obs, -10, 10).astype(np.float32)


def _gae(
    rew: np.ndarray,
    val: np.ndarray,
    last: np.ndarray,
    term: np.ndarray,
    done: np.ndarray,
    valid: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """GAE over a rollout; an episode's last step bootstraps from its final observation's value.

    The value of the observation after step t is ``val[t + 1]`` (after the last step, `last`):
    at an episode's end that is its final observation (next-step autoreset), worth 0 if the
    episode terminated. No advantage flows back across an episode's end.
    """
    steps = rew.shape[0]
    advantages = np.zeros_like(rew)
    running = np.zeros_like(last)
    for t in reversed(range(steps)):
        following = last if t == steps - 1 else val[t + 1]
        delta = rew[t] + gamma * following * (1.0 - term[t]) - val[t]
        running = delta + gamma * lam * (1.0 - done[t]) * running
        running = running * valid[t]  # (a void step carries nothing back)
        advantages[t] = running
    return advantages


def _update(
    agent: _Agent,
    optimizer: torch.optim.Optimizer,
    obs: np.ndarray,
    act: np.ndarray,
    logp: np.ndarray,
    val: np.ndarray,
    advantages: np.ndarray,
    valid: np.ndarray,
) -> None:
    """10 epochs of 32 minibatches of PPO's clipped loss, over the valid transitions."""
    keep = valid.reshape(-1) > 0
    b_obs = torch.from_numpy(obs.reshape(-1, obs.shape[-1])[keep])
    b_act = torch.from_numpy(act.reshape(-1, act.shape[-1])[keep])
    b_logp = torch.from_numpy(logp.reshape(-1)[keep])
    b_adv = torch.from_numpy(advantages.reshape(-1)[keep])
    b_ret = b_adv + torch.from_numpy(val.reshape(-1)[keep])
    size = b_obs.shape[0]
    for _ in range(10):
        for idx in torch.tensor_split(torch.randperm(size), min(32, max(1, size // 2))):
            dist = agent.dist(b_obs[idx])
            ratio = (dist.log_prob(b_act[idx]).sum(-1) - b_logp[idx]).exp()
            adv = b_adv[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
            value_loss = 0.5 * (agent.critic(b_obs[idx]).squeeze(-1) - b_ret[idx]).pow(2).mean()
            optimizer.zero_grad()
            (policy_loss + 0.5 * value_loss).backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()
