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
