"""Where the actors of a vector env run: Ray scheduling strategies and placement groups.

`plan_placement` turns the `placement` argument of the vector envs into the ``.options(...)`` of
each actor. The same code then runs on a laptop and on a multi-node cluster:

* ``None``: Ray's default scheduling (the local node first), or whatever ``scheduling_strategy``
  the actor options give.
* ``"SPREAD"``, ``"PACK"``, ``"STRICT_SPREAD"``, ``"STRICT_PACK"``: a placement group with one
  bundle per actor and that strategy is reserved first (the bundle holds the actor's
  ``num_cpus``, 1 by default, and its ``num_gpus``, ``memory`` and custom ``resources``); actor
  ``i`` runs in bundle ``i``. ``"SPREAD"`` puts the bundles on as many nodes as it can,
  ``"PACK"`` on as few; the strict ones fail rather than do otherwise. The group belongs to the
  vector env and is removed by its ``close``. (Ray's own unreserved, best-effort spreading is
  ``actor_options={"scheduling_strategy": "SPREAD"}``.)
* A `ray.util.placement_group.PlacementGroup` of the user's: actor ``i`` runs in bundle
  ``i % bundle_count``; or ``(group, bundle_indices)`` with one bundle index per actor.
* A Ray scheduling strategy object (``NodeAffinitySchedulingStrategy``, ...): used for every
  actor as it is.

When a node is lost, Ray moves its bundles of a ``"SPREAD"`` or ``"PACK"`` group to the nodes
left (when they have room), so a restarted worker (``on_actor_failure="restart"``) lands in its
own bundle again; a strict group waits for a node that fits.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    NodeLabelSchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from ray_multiprocess_env.runtime import ensure_runtime

__all__ = ["GROUP_STRATEGIES", "PlacementPlan", "plan_placement"]

logger = logging.getLogger(__name__)

#: The `placement` strings that reserve a placement group of one bundle per actor.
GROUP_STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")

_STRATEGY_OBJECTS = (
    NodeAffinitySchedulingStrategy,
    NodeLabelSchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)
_PLACEMENT_KEYS = ("scheduling_strategy", "placement_group", "placement_group_bundle_index")
_DEFAULT_READY_TIMEOUT_S = 60.0


class PlacementPlan:
    """The Ray ``.options(...)`` of each actor of a vector env, and the group it reserved.

    Made by `plan_placement`; vector envs make one themselves from their `placement` argument.

    Attributes:
        placement_group: The placement group the actors run in, or None.
        owns_group: Whether `release` removes `placement_group` (True when the plan made it).
    """

    def __init__(
        self,
        actor_options: Mapping[str, Any],
        strategies: Sequence[Any],
        placement_group: PlacementGroup | None = None,
        *,
        owns_group: bool = False,
    ) -> None:
        self._actor_options = dict(actor_options)
        self._strategies = list(strategies)
        self.placement_group = placement_group
        self.owns_group = owns_group

    def options(self, index: int) -> dict[str, Any]:
        """The keyword arguments of ``ActorClass.options`` for actor `index`."""
        options = dict(self._actor_options)
        strategy = self._strategies[index % len(self._strategies)]
        if strategy is not None:
            options["scheduling_strategy"] = strategy
        return options

    def release(self) -> None:
        """Remove the placement group if this plan made it; calling it again does nothing."""
        if self.owns_group and self.placement_group is not None and ray.is_initialized():
            remove_placement_group(self.placement_group)
        self.owns_group = False

    def __repr__(self) -> str:
        group = None if self.placement_group is None else self.placement_group.id.hex()[:8]
        return f"PlacementPlan(actors={len(self._strategies)}, placement_group={group})"


def plan_placement(
    placement: Any,
    num_actors: int,
    actor_options: Mapping[str, Any] | None = None,
    *,
    timeout: float | None = None,
) -> PlacementPlan:
    """Plan where `num_actors` actors run: the ``.options(...)`` of each.

    Args:
        placement: None, ``"SPREAD"``, ``"PACK"``, ``"STRICT_SPREAD"``, ``"STRICT_PACK"``, a
            `PlacementGroup`, ``(placement_group, bundle_indices)`` or a Ray scheduling strategy
            object (see the module docstring).
        num_actors: How many actors will be created.
        actor_options: The other ``ray.remote`` options of every actor (``num_cpus``,
            ``num_gpus``, ``memory``, ``resources``, ``runtime_env``, ...). With a strategy
            name they also size the bundles.
        timeout: Seconds to wait for a placement group this call reserves (60 if None).

    Returns:
        The plan; ``plan.options(i)`` are the options of actor ``i``. Call ``plan.release()``
        when the actors are gone (vector envs do that in ``close``).

    Raises:
        TypeError: If `placement` or `actor_options` has the wrong type.
        ValueError: If `placement` is an unknown string, a bundle index is out of range, or
            `actor_options` already holds a scheduling strategy.
        TimeoutError: If the cluster cannot hold the placement group within `timeout` (the
            message names the bundles asked for and the cluster's resources; the group is
            removed).

    Example:
        >>> plan = plan_placement("SPREAD", 2, {"num_cpus": 0.5})
        >>> plan.placement_group.bundle_specs
        [{'CPU': 0.5}, {'CPU': 0.5}]
        >>> plan.options(1)["scheduling_strategy"].placement_group_bundle_index
        1
        >>> plan.release()
    """
    if actor_options is not None and not isinstance(actor_options, Mapping):
        raise TypeError(
            f"`actor_options` must be a mapping of `ray.remote` options, got {actor_options!r}; "
            "e.g. `actor_options={'num_cpus': 1}`."
        )
    options = dict(actor_options or {})
    if placement is None:
        return PlacementPlan(options, [None])
    clashing = [key for key in _PLACEMENT_KEYS if key in options]
    if clashing:
        raise ValueError(
            f"`actor_options` sets {clashing[0]!r} and `placement={placement!r}` is given too; "
            "pass the strategy only once, as `placement`."
        )
    if isinstance(placement, str):
        return _plan_for_string(placement, num_actors, options, timeout)
    if isinstance(placement, PlacementGroup):
        return _plan_in_group(placement, list(range(placement.bundle_count)), options)
    if isinstance(placement, tuple) and len(placement) == 2:
        group, indices = placement
        if isinstance(group, PlacementGroup):
            return _plan_in_group(group, _check_bundle_indices(group, indices, num_actors), options)
    if isinstance(placement, _STRATEGY_OBJECTS):
        return PlacementPlan(options, [placement])
    raise TypeError(
        f"`placement` must be None, one of {', '.join(map(repr, GROUP_STRATEGIES))}, a Ray "
        f"PlacementGroup, (placement_group, bundle_indices) or a Ray scheduling strategy, got "
        f"{placement!r} ({type(placement).__name__})."
    )


def _plan_for_string(
    placement: str, num_actors: int, options: dict[str, Any], timeout: float | None
) -> PlacementPlan:
    name = placement.upper()
    if name not in GROUP_STRATEGIES:
        raise ValueError(
            f"`placement` must be one of {', '.join(map(repr, GROUP_STRATEGIES))} (or a "
            f"placement group, or None), got {placement!r}."
        )
    bundle = _bundle(options)
    options.setdefault("num_cpus", bundle.get("CPU", 0))
    ensure_runtime()
    group = placement_group([dict(bundle) for _ in range(num_actors)], strategy=name)
    wait = _DEFAULT_READY_TIMEOUT_S if timeout is None else float(timeout)
    ready, _ = ray.wait([group.ready()], timeout=wait)
    if not ready:
        state = placement_group_table(group).get("state")
        remove_placement_group(group)
        free = ray.available_resources()  # type: ignore[no-untyped-call]
        total = ray.cluster_resources()  # type: ignore[no-untyped-call]
        raise TimeoutError(
            f"the placement group for `placement={placement!r}` ({num_actors} bundles of "
            f"{bundle}) was not ready after {wait:g} s (state {state}); the cluster has "
            f"{free} free of {total}. Use fewer or "
            "smaller workers (e.g. `actor_options={'num_cpus': 0.5}`), add nodes, or use "
            "`actor_options={'scheduling_strategy': 'SPREAD'}`, which reserves nothing."
        )
    strategies = [
        PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
        for i in range(num_actors)
    ]
    logger.info("Reserved placement group %s (%s) for %d actors.", group.id.hex(), name, num_actors)
    return PlacementPlan(options, strategies, group, owns_group=True)


def _plan_in_group(
    group: PlacementGroup, indices: list[int], options: dict[str, Any]
) -> PlacementPlan:
    strategies = [
        PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i) for i in indices
    ]
    return PlacementPlan(options, strategies, group, owns_group=False)


def _check_bundle_indices(group: PlacementGroup, indices: Any, num_actors: int) -> list[int]:
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
        raise TypeError(
            f"the bundle indices of `placement=(placement_group, bundle_indices)` must be a "
            f"list of ints, one per actor, got {indices!r}."
        )
    if len(indices) != num_actors:
        raise ValueError(
            f"`placement` gives {len(indices)} bundle indices for {num_actors} actors; give "
            "one bundle index per actor."
        )
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"bundle index {index!r} in `placement` must be an int.")
        if not 0 <= int(index) < group.bundle_count:
            raise ValueError(
                f"bundle index {index} in `placement` is out of range: the placement group has "
                f"{group.bundle_count} bundles (0..{group.bundle_count - 1})."
            )
    return [int(index) for index in indices]


def _bundle(options: Mapping[str, Any]) -> dict[str, float]:
    """The resources one actor with `options` needs, as a placement-group bundle."""
    bundle: dict[str, float] = {"CPU": float(options.get("num_cpus", 1))}
    if options.get("num_gpus"):
        bundle["GPU"] = float(options["num_gpus"])
    if options.get("memory"):
        bundle["memory"] = float(options["memory"])
    for name, amount in (options.get("resources") or {}).items():
        bundle[name] = float(amount)
    return {name: amount for name, amount in bundle.items() if amount > 0} or {"CPU": 0.01}
