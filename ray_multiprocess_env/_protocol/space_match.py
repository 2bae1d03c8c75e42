"""Whether envs' spaces fit one vector env, by gymnasium's ``observation_mode`` rules.

``"same"``: every env's observation space equals the first's. ``"different"`` (or a batched
and single space given as a pair): they share a shape and dtype, the bounds may differ
(`gymnasium.spaces.utils.is_space_dtype_shape_equiv`). The action spaces are equal in every
mode, as gymnasium's vector envs require. Both ends use it: a worker to tell whether its rows
have one layout, the driver to accept or refuse the envs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gymnasium.spaces.utils import is_space_dtype_shape_equiv

__all__ = ["mismatch"]


def mismatch(
    envs: Iterable[tuple[int, Any, Any]],
    reference: tuple[int, Any, Any],
    same: bool,
) -> str | None:
    """The first of `envs` whose spaces do not fit `reference`'s: what differs, or None.

    Each item is ``(env index, observation space, action space)``; `reference` is the env (or
    the given single space, index -1) the others are held to; `same`: the observation spaces
    must be equal (else only their shape and dtype).
    """
    who, observations, actions = reference
    whose = "the given `observation_mode`'s single space" if who < 0 else f"env {who}"
    for index, observation_space, action_space in envs:
        if action_space != actions:
            return f"env {index} has action_space {action_space} but env {who} has {actions}"
        if observation_space == observations:
            continue
        if same:
            hint = ""
            if _equivalent(observation_space, observations):
                hint = ' (only their bounds differ: pass `observation_mode="different"` to '
                hint += "batch them as gymnasium does)"
            return (
                f"env {index} has observation_space {observation_space} but {whose} has "
                f"{observations}{hint}"
            )
        if not _equivalent(observation_space, observations):
            return (
                f"env {index} has observation_space {observation_space}, whose shape or dtype "
                f"differs from {whose}'s {observations}"
            )
    return None


def _equivalent(one: Any, other: Any) -> bool:
    """Same shape and dtype (False for what gymnasium cannot compare, e.g. None)."""
    try:
        return bool(is_space_dtype_shape_equiv(one, other))
    except (AttributeError, TypeError, NotImplementedError):
        return False
