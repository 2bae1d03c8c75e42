"""Env classes with rich spaces (every space shared memory covers, and one it does not).

A module, so Ray workers can import it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np


class NestedSpacesEnv(gym.Env[dict, dict]):
    """Every space shared memory covers, nested; episodes end on step 7; seeded observations.

    The info reports the type and dtype of the Box action the env was given.
    """

    observation_space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, shape=(3, 4, 2), dtype=np.uint8),
            "pair": gym.spaces.Tuple((gym.spaces.Discrete(5), gym.spaces.MultiDiscrete([2, 3]))),
            "bits": gym.spaces.MultiBinary(4),
            "z": gym.spaces.Box(-1.0, 1.0, shape=(), dtype=np.float64),
        }
    )
    action_space = gym.spaces.Dict(
        {
            "move": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
            "pick": gym.spaces.Discrete(3),
        }
    )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        return self.observation_space.sample(), {}

    def step(self, action: dict):
        self.t += 1
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        obs = self.observation_space.sample()
        reward = float(action["pick"]) + float(np.sum(action["move"]))
        info = {"action_dtype": str(np.asarray(action["move"]).dtype)}
        return obs, reward, self.t >= 7, False, info


class TupleObsDictActionEnv(NestedSpacesEnv):
    """`NestedSpacesEnv` with a Tuple observation and a Dict action whose keys are not sorted.

    Not nested, as SB3's ``DummyVecEnv`` needs.
    """

    observation_space = gym.spaces.Tuple(
        (
            gym.spaces.Discrete(4),
            gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
            gym.spaces.MultiBinary(3),
            gym.spaces.MultiDiscrete([2, 5]),
        )
    )
    action_space = gym.spaces.Dict(
        OrderedDict(
            [
                ("pick", gym.spaces.Discrete(3)),
                ("move", gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)),
            ]
        )
    )


class UnsortedDictObsEnv(TupleObsDictActionEnv):
    """`TupleObsDictActionEnv` with a Dict observation whose keys are not in sorted order."""

    observation_space = gym.spaces.Dict(
        OrderedDict(
            [
                ("z", gym.spaces.Discrete(4)),
                ("a", gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)),
            ]
        )
    )


class GraphActionEnv(gym.Env[np.ndarray, tuple]):
    """Its action is a (Graph, Discrete) pair; the observation reports the graph's node count."""

    observation_space = gym.spaces.Box(0, 100, shape=(2,), dtype=np.int64)
    action_space = gym.spaces.Tuple(
        (
            gym.spaces.Graph(gym.spaces.Box(-1.0, 1.0, shape=(2,)), None),
            gym.spaces.Discrete(2),
        )
    )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.int64), {}

    def step(self, action: tuple):
        graph, choice = action
        obs = np.array([len(graph.nodes), int(choice)], dtype=np.int64)
        return obs, 0.0, False, False, {}


class BoundedEnv(gym.Env[np.ndarray, int]):
    """Env `index`'s observations lie in ``[-index - 1, index + 1]``: its bounds are its own.

    For gymnasium's ``observation_mode="different"``; `shape` changes the observations' shape,
    `actions` the number of actions.
    Seeded observations; episodes end on step 5.
    """

    def __init__(self, index: int, shape: tuple[int, ...] = (3,), actions: int = 2) -> None:
        bound = float(index + 1)
        self.action_space = gym.spaces.Discrete(actions)
        self.observation_space = gym.spaces.Box(-bound, bound, shape=shape, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        return self.observation_space.sample(), {"t": self.t}

    def step(self, action: int):
        self.t += 1
        obs = self.observation_space.sample()
        return obs, float(action) + self.t, self.t >= 5, False, {"t": self.t}
