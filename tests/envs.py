"""Env classes the tests turn into actors (a module, so Ray workers can import it).

Env factories that are module-level functions belong here too, not in a test module: a worker
imports the module of every factory it unpickles, and some test modules import torch (through
SB3's face), a second more for every worker they start.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import ray

from ray_multiprocess_env import GymAPIBridge
from tests.interrupts import wait_at_gate


class GymHolder:
    """Holds ``gym.make(env_id, **kwargs)`` in ``self.env``."""

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        self.env = gym.make(env_id, **kwargs)


class BridgeHolder:
    """Holds a gymnasium env behind the old gym API."""

    def __init__(self, env_id: str) -> None:
        self.env = GymAPIBridge(gym.make(env_id))


class FlakyEnv(gym.Env[np.ndarray, int]):
    """Counts steps; raises on a negative action and sleeps ``delay`` seconds per step.

    With ``gate`` (a `tests.interrupts.Gate`'s folder) each step waits at that gate first,
    and with ``reset_gate`` each reset; with ``fail_reset`` set its resets raise, and with
    ``exit_on_reset`` set its worker process dies in its next reset.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,))
    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:
        self.count = 0
        self.delay = 0.0
        self.gate: str | None = None
        self.fail_reset = False
        self.reset_gate: str | None = None
        self.exit_on_reset = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.exit_on_reset:
            os._exit(1)
        if self.reset_gate is not None:
            wait_at_gate(self.reset_gate)
        if self.fail_reset:
            raise ValueError("reset asked to fail")
        super().reset(seed=seed)
        self.count = int(self.np_random.integers(100)) if seed is not None else 0
        return np.array([self.count], dtype=np.float32), {}

    def render(self) -> np.ndarray:
        """An 8x8 grey image whose brightness is the step count."""
        return np.full((8, 8, 3), self.count % 256, dtype=np.uint8)

    def step(self, action: int):
        if action < 0:
            raise ValueError(f"negative action {action}")
        if self.gate is not None:
            wait_at_gate(self.gate)
        time.sleep(self.delay)
        self.count += action
        return np.array([self.count], dtype=np.float32), 1.0, False, False, {}


def bounded_flaky_env(bound: float) -> FlakyEnv:
    """A `FlakyEnv` whose observations are bounded by `bound` (envs whose spaces differ)."""
    env = FlakyEnv()
    env.observation_space = gym.spaces.Box(-bound, bound, shape=(1,))
    return env


class FlakyHolder:
    """Holds a `FlakyEnv`."""

    def __init__(self) -> None:
        self.env = FlakyEnv()


@ray.remote
class SeedStyleEnv:
    """A plain Ray actor like the seed notebook's: old-gym 4-tuples, no `seed`/`get_attr`."""

    def __init__(self, start: int) -> None:
        self.value = np.array([start])

    def reset(self) -> np.ndarray:
        self.value = self.value * 0
        return self.value.copy()

    def step(self, action: int):
        self.value = self.value + action
        return self.value.copy(), 0, False, None


@ray.remote
class PlainStepEnv:
    """A plain Ray actor whose ``step`` returns a bare number."""

    def __init__(self) -> None:
        self.total = 0

    def reset(self) -> int:
        self.total = 0
        return self.total

    def step(self, action: int) -> int:
        self.total += action
        return self.total


class DictObsEnv(gym.Env[dict, int]):
    """A small env with a Dict observation, varied infos, terminations and truncations."""

    observation_space = gym.spaces.Dict(
        {
            "position": gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float64),
            "steps": gym.spaces.Discrete(50),
        }
    )
    action_space = gym.spaces.Discrete(3)

    def __init__(self, max_steps: int = 12) -> None:
        self.max_steps = max_steps
        self.position = np.zeros(2)
        self.steps = 0

    def _obs(self) -> dict:
        return {"position": self.position.copy(), "steps": self.steps}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, size=2)
        self.steps = 0
        return self._obs(), {"start": self.position.copy()}

    def step(self, action: int):
        self.position = self.position + (action - 1) * 0.5 + self.np_random.normal(0, 0.3, 2)
        self.steps += 1
        distance = float(np.abs(self.position).max())
        terminated = distance > 2.5
        truncated = self.steps >= self.max_steps
        info: dict[str, Any] = {"distance": distance, "nested": {"even": self.steps % 2 == 0}}
        if self.steps % 3 == 0:
            info["every_third"] = self.steps
        return self._obs(), -distance, terminated, truncated, info


class RenderingFlakyEnv(FlakyEnv):
    """A `FlakyEnv` that declares ``render_mode="rgb_array"``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}
    render_mode = "rgb_array"


class TwoAgentEnv:
    """A tiny multi-agent env in RLlib's / PettingZoo-parallel style: per-agent dicts."""

    agents = ("left", "right")

    def __init__(self) -> None:
        self.positions = {"left": 0, "right": 0}
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        start = 0 if seed is None else seed % 5
        self.positions = {"left": -start, "right": start}
        self.steps = 0
        return dict(self.positions), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, int]):
        self.steps += 1
        for agent, move in actions.items():
            self.positions[agent] += move
        rewards = {agent: float(-abs(self.positions[agent])) for agent in self.agents}
        terminated = {agent: abs(self.positions[agent]) > 3 for agent in self.agents}
        terminated["__all__"] = all(terminated[a] for a in self.agents)
        truncated = {agent: self.steps >= 10 for agent in self.agents}
        truncated["__all__"] = self.steps >= 10
        infos = {agent: {"position": self.positions[agent]} for agent in self.agents}
        return dict(self.positions), rewards, terminated, truncated, infos


class TwoAgentHolder:
    """Holds a `TwoAgentEnv`."""

    def __init__(self) -> None:
        self.env = TwoAgentEnv()


class EndOnTwoEnv(FlakyEnv):
    """A `FlakyEnv` whose episode terminates on action 2."""

    def step(self, action: int):
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, action == 2, truncated, info


class ThreadBoundEnv(FlakyEnv):
    """Raises if any method runs off the thread that built it; `step` sets a `signal.alarm`.

    Stands in for envs bound to their thread: OpenGL/EGL contexts, pygame, signal timeouts.
    """

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def _check_thread(self, method: str) -> None:
        if threading.get_ident() != self.thread:
            raise RuntimeError(f"`{method}` ran off the thread that built the env")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._check_thread("reset")
        return super().reset(seed=seed, options=options)

    def step(self, action: int):
        self._check_thread("step")
        previous = signal.signal(signal.SIGALRM, lambda *_: None)  # main thread only
        signal.alarm(30)
        try:
            return super().step(action)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    def render(self) -> np.ndarray:
        self._check_thread("render")
        return super().render()

    def close(self) -> None:
        self._check_thread("close")


class UnpicklableInfoEnv(FlakyEnv):
    """A `FlakyEnv` whose info holds a lock (which no pickler can carry) on action 2."""

    def step(self, action: int):
        obs, reward, terminated, truncated, info = super().step(action)
        if action == 2:
            info = {"lock": threading.Lock()}
        return obs, reward, terminated, truncated, info


class NamedCallEnv(FlakyEnv):
    """A `FlakyEnv` with a method that takes a keyword called ``name``."""

    def greet(self, name: str) -> str:
        return f"hello {name}"


class ShiftingInfoEnv(gym.Env[np.ndarray, int]):
    """Infos that test their batching; episodes end after 3 to 6 steps (seeded).

    Numeric keys every step, keys only at an episode's end, a key whose array shape changes
    (`shape_size`, set from outside), one whose type changes, text, and a nested dict.
    """

    shape_size = 1

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(3, 7))
        return np.zeros(2), {"length": self.length}

    def step(self, action: int):
        self.t += 1
        x = float(self.np_random.normal())
        done = self.t >= self.length
        info: dict[str, Any] = {
            "x": x,
            "lives": np.int32(self.length - self.t),
            "shape": np.zeros(self.shape_size),  # when it changes, it no longer fits its column
            "maybe_int": self.t if self.t % 2 else float(self.t),  # int, then float
            "note": f"t{self.t}",
        }
        if done:
            info["episode"] = {"r": float(self.t), "l": self.t}
            info["at_end"] = np.float32(x)
        return np.array([x, self.t]), float(action), done, False, info


class OddInfoEnv(FlakyEnv):
    """A `FlakyEnv` whose step info has ``odd`` (1) while its count is odd, nothing else."""

    def step(self, action: int):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {"odd": 1} if self.count % 2 else info


class InPlaceEnv(FlakyEnv):
    """Changes what it is given in place, as envs may.

    It clips its action, doubles an array it is passed, keeps its `weights` and adds to them.
    """

    action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def step(self, action: np.ndarray):
        np.clip(action, -0.5, 0.5, out=action)
        self.kept = action
        return np.array([float(action.sum())], dtype=np.float32), 0.0, False, False, {}

    def double(self, values: np.ndarray) -> np.ndarray:
        values *= 2
        return values

    def bump(self) -> np.ndarray:
        self.weights += 1
        return self.weights


class WalkEnv(gym.Env[np.ndarray, int]):
    """Walk right to ``size`` (action 1; 0 stays); its observation space depends on ``size``.

    ``delay`` seconds of sleep per step; ``reset(options={"start": k})`` starts at ``k``.
    """

    action_space = gym.spaces.Discrete(2)

    def __init__(self, size: int, delay: float = 0.0) -> None:
        self.size, self.delay, self.position = size, delay, 0
        self.observation_space = gym.spaces.Box(0, size, shape=(1,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.position = int((options or {}).get("start", self.np_random.integers(2)))
        return np.array([self.position], dtype=np.float32), {"size": self.size}

    def step(self, action: int):
        time.sleep(self.delay)
        self.position += int(action)
        done = self.position >= self.size
        return np.array([self.position], dtype=np.float32), float(done), done, False, {"k": 1}


def bridged_cartpole() -> GymAPIBridge:
    """CartPole behind the old gym API (pfrl's), as `RayVectorEnv` users run it."""
    return GymAPIBridge(gym.make("CartPole-v1"))


class BigActionEnv(gym.Env[np.ndarray, np.ndarray]):
    """An action of 2 MiB; the observation is its first entry plus its last."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,))
    action_space = gym.spaces.Box(-1.0, 1.0, shape=(1 << 19,), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: np.ndarray):
        return np.array([action[0] + action[-1]], dtype=np.float32), 0.0, False, False, {}


class OldTimeLimitEnv(gym.Env[np.ndarray, int]):
    """An old gym env (4-tuple steps) ended at step 2 by old gym's `TimeLimit`.

    `done` with ``info["TimeLimit.truncated"]``, as gym < 0.25's `TimeLimit` reports it; with
    `ends_first`, a real end at step 3 instead (no such key). `reset` gives the observation.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, ends_first: bool = False) -> None:
        self.ends_first = ends_first
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        return np.zeros(1, dtype=np.float32)

    def step(self, action: int):
        self.t += 1
        if self.ends_first:
            return np.array([self.t], dtype=np.float32), 1.0, self.t >= 3, {}
        done = self.t >= 2
        info = {"TimeLimit.truncated": True} if done else {}
        return np.array([self.t], dtype=np.float32), 1.0, done, info
