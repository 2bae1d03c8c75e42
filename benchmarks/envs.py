"""Envs for the benchmarks (a module, so Ray workers and subprocesses can import it)."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


def burn(iterations: int) -> int:
    """Fixed CPU work: `iterations` rounds of integer arithmetic (no sleep, no numpy)."""
    x = 0
    for i in range(iterations):
        x = (x * 31 + i) & 0xFFFF
    return x


def calibrate(milliseconds: float = 1.0) -> int:
    """How many `burn` iterations take about `milliseconds` on this machine (median of 5)."""
    iterations = 10_000
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        burn(iterations)
        samples.append(time.perf_counter() - start)
    per_iteration = float(np.median(samples)) / iterations
    return max(1, round(milliseconds / 1000 / per_iteration))


class CpuBoundEnv(gym.Env[np.ndarray, int]):
    """An env whose step costs a fixed amount of CPU work; episodes of 200 steps."""

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.steps = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: int):
        value = burn(self.iterations)
        self.steps += 1
        obs = np.full(4, (value % 100) / 100.0, dtype=np.float32)
        return obs, 1.0, False, self.steps >= 200, {}


class VariableCostEnv(CpuBoundEnv):
    """Like `CpuBoundEnv`, but each step's work is drawn from ``low``..``high`` milliseconds."""

    def __init__(self, iterations_per_ms: int, low: float = 0.2, high: float = 2.0) -> None:
        super().__init__(iterations_per_ms)
        self.low, self.high = low, high

    def step(self, action: int):
        cost = self.np_random.uniform(self.low, self.high)
        value = burn(int(self.iterations * cost))
        self.steps += 1
        obs = np.full(4, (value % 100) / 100.0, dtype=np.float32)
        return obs, 1.0, False, self.steps >= 200, {}


class FramesEnv(gym.Env[np.ndarray, int]):
    """Atari-like: 84x84x4 uint8 frame stacks, `iterations` of CPU work a step; 500-step episodes.

    Each step draws a new frame into the oldest of the stack's 4 slots (a ring, as a cheap
    frame-stacking wrapper keeps it); the observation returned is a new array.
    """

    observation_space = gym.spaces.Box(0, 255, shape=(84, 84, 4), dtype=np.uint8)
    action_space = gym.spaces.Discrete(6)

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.steps = 0
        self._stack = np.zeros((84, 84, 4), dtype=np.uint8)
        self._frames = np.random.default_rng(0).integers(0, 256, (16, 84, 84), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.steps = 0
        self._stack[...] = self.np_random.integers(0, 256, dtype=np.uint8)
        return self._stack.copy(), {}

    def step(self, action: int):
        value = burn(self.iterations)
        self.steps += 1
        self._stack[:, :, self.steps % 4] = self._frames[(value + int(action)) % 16]
        return self._stack.copy(), 1.0, False, self.steps >= 500, {}


def halfcheetah() -> gym.Env[Any, Any]:
    """MuJoCo's HalfCheetah-v5 (about 0.1 ms a step, 17 floats, 4 numeric info keys)."""
    return gym.make("HalfCheetah-v5")


def pong() -> gym.Env[Any, Any]:
    """Atari Pong as trained on: ale-py, frame skip 4, 84x84 grey frames, 4 of them stacked."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True)
    return gym.wrappers.FrameStackObservation(env, 4)


def action_samples(space: gym.spaces.Space[Any], count: int = 64) -> list[Any]:
    """`count` seeded samples of `space` (single or batched), cycled through by every peer."""
    space.seed(0)
    return [space.sample() for _ in range(count)]


def raw_loop_count(env_fn: Any, seconds: float, start: Any, counts: Any) -> None:
    """Step one env in a raw loop for `seconds` once `start` is set; put the step count in `counts`.

    Run in P processes at once, their summed rate is the machine's limit for this env.
    """
    env = env_fn()
    env.reset(seed=0)
    actions = action_samples(env.action_space)
    for t in range(100):
        _, _, terminated, truncated, _ = env.step(actions[t % len(actions)])
        if terminated or truncated:
            env.reset()
    start.wait()
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        _, _, terminated, truncated, _ = env.step(actions[count % len(actions)])
        if terminated or truncated:
            env.reset()
        count += 1
    counts.put(count / (time.perf_counter() - began))
    env.close()
