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

__all__ = ["equivalent", "mismatch"]


def mismatch(
    envs: Iterable[tuple[int, Any, Any]],
    observations: tuple[str, Any],
    actions: tuple[str, Any],
    same: bool,
) -> str | None:
    """The first of `envs` whose spaces do not fit the references: what differs, or None.

    Each item of `envs` is ``(env index, observation space, action space)``; `observations`
    and `actions` are ``(whose, space)``: the space the others are held to and whose it is
    (``"env 0"``, ``"the given single observation space"``). `same`: the observation spaces
    must be equal (else only their shape and dtype).
    """
    (who, observation_reference), (whose_actions, action_reference) = observations, actions
    for index, observation_space, action_space in envs:
        if action_space != action_reference:
            return (
                f"env {index} has action_space {action_space} but {whose_actions} has "
                f"{action_reference}; every env of a vector env needs the same action space"
            )
        if observation_space == observation_reference:
            continue
        if same:
            return (
                f"env {index} has observation_space {observation_space} but {who} has "
                f"{observation_reference}; every env of a vector env needs the same "
                "observation space"
            )
        if not equivalent(observation_space, observation_reference):
            return (
                f"env {index} has observation_space {observation_space}, whose shape or dtype "
                f"differs from that of {who}, {observation_reference}; every env of a vector "
                "env needs observations of one shape and dtype"
            )
    return None


def equivalent(one: Any, other: Any) -> bool:
    """Same shape and dtype (False for what gymnasium cannot compare, e.g. None).

    Asked both ways: gymnasium's check of a Tuple compares only as many items as the first
    has, and raises when the second has fewer.
    """
    try:
        return bool(
            is_space_dtype_shape_equiv(one, other) and is_space_dtype_shape_equiv(other, one)
        )
    except Exception:  # (what gymnasium cannot compare)
        return False
