"""Env classes that fail on purpose: they raise, their process dies, or they wait at a gate.

A module, so Ray workers can import it (as `tests/envs.py`, whose `FlakyEnv` and
`ShiftingInfoEnv` they build on).
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np

from tests.envs import FlakyEnv, ShiftingInfoEnv
from tests.interrupts import wait_at_gate


class RaisingEnv(gym.Env[np.ndarray, int]):
    """Counts; raises ValueError on every `raise_every`-th step it takes (0: never).

    Seeded resets start the count at a seeded value (or at ``options["start"]``); episodes are
    truncated after 20 steps. With `raise_on_reset` = n, its n-th reset raises.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, raise_every: int = 0, raise_on_reset: int = 0) -> None:
        self.raise_every, self.raise_on_reset = raise_every, raise_on_reset
        self.taken = self.resets = 0
        self.count = self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.resets += 1
        if self.resets == self.raise_on_reset:
            raise ValueError(f"boom at reset {self.resets}")
        self.count, self.t = int(self.np_random.integers(100)), 0
        if options and "start" in options:
            self.count = int(options["start"])
        return np.array([self.count, self.t], dtype=np.float64), {"start": self.count}

    def step(self, action: int):
        self.taken += 1
        if self.raise_every and self.taken % self.raise_every == 0:
            raise ValueError(f"boom at step {self.taken}")
        self.count += int(action)
        self.t += 1
        obs = np.array([self.count, self.t], dtype=np.float64)
        return obs, float(action), False, self.t >= 20, {"count": self.count}


_BUILT: list[int] = []


def raising_env_built_once() -> RaisingEnv:
    """A RaisingEnv(2) the first time in a process; OSError after (a rebuild that fails)."""
    _BUILT.append(1)
    if len(_BUILT) > 1:
        raise OSError("simulator unreachable")
    return RaisingEnv(2)


class DyingEnv(FlakyEnv):
    """Its worker process dies (``os._exit``) on the second step each new env takes."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    def step(self, action: int):
        self.taken += 1
        if self.taken == 2:
            os._exit(1)
        return super().step(action)


def env_failing_once_flagged(flag: str, fails: tuple[int, ...], index: int) -> DyingEnv:
    """A `DyingEnv` (env `index`), whose factory raises while `flag` exists if `index` in `fails`.

    A worker of such envs can be replaced only once the test removes `flag`.
    """
    if index in fails and os.path.exists(flag):
        raise RuntimeError(f"env {index} cannot be built while {flag} exists")
    return DyingEnv()


def raising_env_one(index: int) -> RaisingEnv:
    """For `make_vector_env`: env 1 raises on every 7th step; the others never."""
    return RaisingEnv(7 if index == 1 else 0)


class FaultyShiftingEnv(ShiftingInfoEnv):
    """A `ShiftingInfoEnv` with faults the caller picks.

    Action 2: the step raises ValueError. Action 3: the worker process dies (``os._exit``;
    a restart sends the call again, and each new env hands over its lost episode's report
    instead of stepping, so it does not die again). With ``gate`` set (a
    `tests.interrupts.Gate`'s folder), its next step or reset, whichever comes first (an
    autoreset is a reset), waits at that gate first.
    """

    action_space = gym.spaces.Discrete(4)

    def __init__(self) -> None:
        self.gate: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._pass_gate()
        return super().reset(seed=seed, options=options)

    def step(self, action: int):
        self._pass_gate()
        if action == 2:
            raise ValueError(f"boom at t={self.t}")
        if action == 3:
            os._exit(1)
        return super().step(action)

    def _pass_gate(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            wait_at_gate(gate)


class HangingSpacesEnv(FlakyEnv):
    """A `FlakyEnv` whose ``metadata``, first read in its worker, waits at the gate `folder`.

    The vector env's start reads it (with its spaces) once the worker is up: a start that hangs
    in an env, with the worker's process there to be killed.
    """

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder: str | None = folder

    @property  # type: ignore[override]
    def metadata(self) -> dict[str, Any]:
        folder, self.folder = getattr(self, "folder", None), None
        if folder is not None:
            wait_at_gate(folder)
        return {}
