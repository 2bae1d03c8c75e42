"""Small torch policies that act in a benchmark's loop, as a trainer's policy does.

A loop with free, pre-drawn actions hides the trainer: between two steps its policy runs in the
driver, with torch, on the cores the env workers need. ``bench --policy mlp`` and
``benchmarks/policy_loops.py`` put one of these in the loop. torch is imported only when a
policy is made (``pip install torch``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["POLICIES", "make_policy"]

#: The policies `make_policy` makes: an MLP (two hidden layers of 256, tanh) for any Box or
#: Discrete observation, and a small conv net for image observations (Atari frames).
POLICIES = ("mlp", "conv")

Policy = Callable[[Any], Any]  # a batch of observations -> a batch of actions


def make_policy(kind: str, observation_space: Any, action_space: Any, seed: int = 0) -> Policy:
    """A torch policy (CPU, no gradients) from a batch of observations to a batch of actions.

    Args:
        kind: ``"mlp"`` (17 -> 256 -> 256 -> 6 on HalfCheetah) or ``"conv"`` (three conv
            layers and a 256 layer, for frames such as 4 x 84 x 84 Atari stacks).
        observation_space: One env's observation space (a Box; flattened for the MLP).
        action_space: One env's action space: a Box (actions tanh-scaled to its bounds) or
            a Discrete (the highest output).
        seed: torch's seed for the weights.

    Raises:
        ValueError: For an unknown `kind` or spaces it cannot act on.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> act = make_policy("mlp", env.observation_space, env.action_space)
        >>> act(np.zeros((3, 4), dtype=np.float32)).shape
        (3,)
    """
    if kind not in POLICIES:
        raise ValueError(f"`policy`={kind!r} is not one of {POLICIES}: pick one of them")
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(
            f"`policy`={kind!r} needs Box observations, not {observation_space}: bench this env "
            "without a policy"
        )
    if isinstance(action_space, spaces.Discrete):
        outputs = int(action_space.n)
    elif isinstance(action_space, spaces.Box):
        outputs = int(np.prod(action_space.shape))
    else:
        raise ValueError(
            f"`policy`={kind!r} acts in Box or Discrete action spaces, not {action_space}: bench "
            "this env without a policy"
        )
    import torch

    torch.manual_seed(seed)
    shape = tuple(int(d) for d in observation_space.shape)
    net = _conv(shape, outputs) if kind == "conv" else _mlp(int(np.prod(shape)), outputs)
    net.eval()
    to_action = _action_map(action_space)

    def act(observations: Any) -> Any:
        batch = np.asarray(observations)
        with torch.no_grad():
            x = torch.as_tensor(batch, dtype=torch.float32)
            out = net(x.reshape(len(batch), -1) if kind == "mlp" else x / 255.0)
        return to_action(out.numpy())

    return act


def _mlp(inputs: int, outputs: int) -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Linear(inputs, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, outputs)
    )


def _conv(shape: tuple[int, ...], outputs: int) -> Any:
    """Three conv layers over a (channels, height, width) frame stack, then 256 units."""
    import torch
    from torch import nn

    if len(shape) != 3:
        raise ValueError(
            f"`policy`='conv' needs (channels, height, width) observations, not shape {shape}: "
            "use 'mlp'"
        )
    features = nn.Sequential(
        nn.Conv2d(shape[0], 16, 8, stride=4), nn.ReLU(),
        nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=1), nn.ReLU(),
        nn.Flatten(),
    )  # fmt: skip
    with torch.no_grad():
        width = int(features(torch.zeros(1, *shape)).shape[1])
    return nn.Sequential(features, nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, outputs))


def _action_map(action_space: Any) -> Callable[[np.ndarray], Any]:
    """The network's outputs to actions of `action_space` (one row per env)."""
    if isinstance(action_space, spaces.Discrete):
        start = int(action_space.start)
        return lambda out: out.argmax(axis=1).astype(np.int64) + start
    shape, dtype = action_space.shape, action_space.dtype
    if not action_space.is_bounded():
        return lambda out: out.reshape(len(out), *shape).astype(dtype, copy=False)
    low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
    scale, shift = (high - low) / 2, (high + low) / 2

    def box(out: np.ndarray) -> np.ndarray:
        actions: np.ndarray = np.tanh(out) * scale + shift
        return actions.reshape(len(out), *shape).astype(dtype, copy=False)

    return box
