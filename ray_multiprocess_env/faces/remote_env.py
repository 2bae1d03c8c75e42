"""`RemoteEnv`: one env in a Ray actor, seen as a plain `gymnasium.Env`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

import gymnasium as gym

from ray_multiprocess_env.faces.pfrl import RayVectorEnv

__all__ = ["RemoteEnv"]


class RemoteEnv(gym.Env[Any, Any]):
    """One env in a Ray actor, seen as a plain `gymnasium.Env` (e.g. for gymnasium's checker).

    Args:
        env_fn: A picklable factory of the env, called inside the actor.
        actor_options: Options for `ray.remote` of the actor.
        timeout: Seconds to wait for any one call, or None.
        transport: As in `WorkerOptions`.

    Example:
        >>> import gymnasium as gym
        >>> env = RemoteEnv(lambda: gym.make("CartPole-v1"))
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(0)
        >>> env.close()
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env[Any, Any]],
        *,
        actor_options: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        transport: str | None = None,
    ) -> None:
        self._vec = RayVectorEnv.from_env_fns(
            [env_fn], actor_options=actor_options, timeout=timeout, transport=transport
        )
        self.observation_space = self._vec.observation_space
        self.action_space = self._vec.action_space
        self.metadata = self._vec.get_attr("metadata")[0]
        self.render_mode = self._vec.get_attr("render_mode")[0]
        self.spec = self._vec.spec

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the remote env."""
        super().reset(seed=seed)
        result: tuple[Any, dict[str, Any]] = self._vec.call_each(
            "reset", [()], seed=seed, options=options
        )[0]
        return result

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the remote env."""
        result: tuple[Any, SupportsFloat, bool, bool, dict[str, Any]] = self._vec.call_each(
            "step", [(action,)]
        )[0]
        return result

    def render(self) -> Any:
        """Render the remote env."""
        return self._vec.call("render")[0]

    def close(self) -> None:
        """Close the remote env and kill its actor."""
        self._vec.close()
