"""pfrl support: the old gym API on top of gymnasium envs, and `pfrl.env.VectorEnv` membership.

pfrl 0.4 speaks the old gym API: ``reset()`` returns the observation and ``step()`` returns
``(obs, reward, done, info)``. `GymAPIBridge` presents a gymnasium env that way, inside the actor.
`register_pfrl_vector_env` makes ``isinstance(vec, pfrl.env.VectorEnv)`` true (pfrl's
``eval_performance`` checks it) without importing pfrl or torch before the user does.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ray_multiprocess_env.compat import (
    add_vector_env_hook,
    env_get_attr,
    env_has_attr,
    env_set_attr,
)

__all__ = ["GymAPIBridge", "register_pfrl_vector_env"]

_PFRL_ENV_MODULE = "pfrl.env"


class GymAPIBridge:
    """Present a gymnasium env with the old gym API that pfrl's training loops expect.

    * ``reset(**kwargs)`` returns only the observation; the seed given to `seed` is passed to
      the next ``reset``.
    * ``step(action)`` returns ``(obs, reward, done, info)`` with ``done = terminated`` and
      ``info["needs_reset"] = truncated``: pfrl's own convention for a time limit (its
      ``ContinuingTimeLimit``), so pfrl resets a truncated episode and still bootstraps from its
      last state instead of learning it as terminal.
    * ``seed(seed)`` seeds the next reset and the action space, and returns ``[seed]``.
    * Other attributes (``action_space``, ``observation_space``, ``spec``, ...) are the env's.

    Args:
        env: A gymnasium env (5-tuple ``step``, ``reset`` returning ``(obs, info)``).

    Example:
        >>> import gymnasium as gym
        >>> env = GymAPIBridge(gym.make("CartPole-v1"))
        >>> env.seed(0)
        [0]
        >>> obs = env.reset()
        >>> obs, reward, done, info = env.step(0)
        >>> sorted(info)
        ['needs_reset']
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self._next_seed: int | None = None

    def reset(self, **kwargs: Any) -> Any:
        """Reset the env and return the first observation only."""
        if self._next_seed is not None and "seed" not in kwargs:
            kwargs["seed"] = self._next_seed
        self._next_seed = None
        obs, _info = self.env.reset(**kwargs)
        return obs

    def step(self, action: Any) -> tuple[Any, float, bool, dict[str, Any]]:
        """Step the env: ``(obs, reward, terminated, info)`` with ``info["needs_reset"]``."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        info["needs_reset"] = bool(truncated)
        return obs, reward, bool(terminated), info

    def seed(self, seed: int | None = None) -> list[int | None]:
        """Seed the next ``reset`` (and the action space) with `seed`, as old gym's ``seed`` did."""
        self._next_seed = seed
        if seed is not None:
            self.env.action_space.seed(seed)
        return [seed]

    def render(self) -> Any:
        """Render the env (gymnasium's ``render``; the mode is set at ``make`` time)."""
        return self.env.render()

    def close(self) -> None:
        """Close the env."""
        self.env.close()

    def get_wrapper_attr(self, name: str) -> Any:
        """Attribute `name` of the bridge (its old gym API), else of the env inside it.

        As a gymnasium wrapper's: ``call``, ``get_attr`` (and SB3's ``env_method``) reach the
        bridge's ``seed``, ``reset`` and ``step`` first, then look through the env's wrappers.
        """
        try:
            return object.__getattribute__(self, name)  # (not `__getattr__`'s forwarding)
        except AttributeError:
            return env_get_attr(self.env, name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        """Set attribute `name` where `get_wrapper_attr` finds it (on the bridge if neither has it).

        `force`: set it on the bridge where no env has it (gymnasium's wrappers' argument).
        """
        try:
            object.__getattribute__(self, name)
        except AttributeError:
            if env_has_attr(self.env, name):
                env_set_attr(self.env, name, value)
                return True
            if not force:
                return False
        setattr(self, name, value)
        return True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"GymAPIBridge({self.env!r})"


_registered: list[type] = []
_lock = threading.Lock()


def register_pfrl_vector_env(cls: type) -> None:
    """Register `cls` as a virtual subclass of `pfrl.env.VectorEnv`, now or when pfrl is imported.

    Nothing is imported: if pfrl is already imported the class is registered at once, otherwise
    an import hook registers it the moment ``pfrl.env`` is first imported.
    """
    with _lock:
        if cls in _registered:
            return
        _registered.append(cls)
        module = sys.modules.get(_PFRL_ENV_MODULE)
        if module is not None:
            module.VectorEnv.register(cls)
        elif not any(isinstance(finder, _PfrlEnvFinder) for finder in sys.meta_path):
            sys.meta_path.insert(0, _PfrlEnvFinder())


def _register_all(module: ModuleType) -> None:
    for cls in _registered:
        module.VectorEnv.register(cls)


class _PfrlEnvFinder(importlib.abc.MetaPathFinder):
    """Finds ``pfrl.env`` with the usual machinery and registers our classes once it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _PFRL_ENV_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RegisteringLoader(spec.loader)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            _register_all(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


add_vector_env_hook(register_pfrl_vector_env)
