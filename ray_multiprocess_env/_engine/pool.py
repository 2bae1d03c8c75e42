"""The worker pool: start, place and connect workers, map envs to them, restart, close.

A `Slot` is one worker: an `EnvWorker` actor holding envs ``start..stop-1`` (``batched``), or a
plain env actor of the user's holding one env. Each slot talks over one transport link, chosen
when it connects: pipes for an `EnvWorker` on the driver's node (``transport="auto"``), Ray calls
otherwise. A restarted slot gets a new actor and a new `generation`, so late news about the old
one is recognised.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayError

from ray_multiprocess_env._engine.options import (
    Options,
    check_env_fns,
    check_positive_int,
    check_worker_options,
)
from ray_multiprocess_env._engine.pipes import PipeLink, pipes_supported
from ray_multiprocess_env._engine.transport import RayLink, remaining
from ray_multiprocess_env._engine.wait import deadline_in
from ray_multiprocess_env._shared_memory import SharedBatch
from ray_multiprocess_env.errors import EnvCrashedError
from ray_multiprocess_env.placement import PlacementPlan, plan_placement
from ray_multiprocess_env.runtime import ensure_runtime
from ray_multiprocess_env.worker import EnvWorker

__all__ = ["Pool", "Slot", "restart_seed"]

logger = logging.getLogger(__name__)


def restart_seed(seed: int | None, restarts: int) -> int | None:
    """The seed a restarted env is reset with: derived from its last seed and its restart count.

    None (unseeded) if the env was never given a seed; otherwise the same for the same run.
    """
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, restarts]).generate_state(1)[0])


class Slot:
    """One worker: its actor, its envs ``start..stop-1`` and the link its operations go over."""

    def __init__(self, actor: Any, start: int, stop: int, batched: bool) -> None:
        self.actor, self.start, self.stop, self.batched = actor, start, stop, batched
        self.link: Any = RayLink(actor, batched)
        self.generation = 0

    @property
    def envs(self) -> range:
        """The global indices of this worker's envs."""
        return range(self.start, self.stop)


class Pool:
    """The workers of one vector env; see the module docstring."""

    def __init__(
        self,
        slots: list[Slot],
        options: Options,
        plan: PlacementPlan | None = None,
        env_fns: Sequence[Callable[[], Any]] | None = None,
    ) -> None:
        self.slots, self.options, self.plan = slots, options, plan
        self._env_fns = list(env_fns) if env_fns is not None else None
        self.num_envs = len(self._env_fns) if self._env_fns is not None else slots[-1].stop
        self.seeds: list[int | None] = [None] * self.num_envs  # each env's last seed
        self._restarts = [0] * self.num_envs
        self.shared: SharedBatch | None = None  # the batched arrays the pipe workers share

    @classmethod
    def start(
        cls, env_fns: Sequence[Callable[[], Any]], envs_per_worker: int, options: Options
    ) -> Pool:
        """Start `EnvWorker` actors of `envs_per_worker` envs each and connect to them."""
        factories = check_env_fns(env_fns)
        per_worker = check_positive_int("envs_per_worker", envs_per_worker)
        check_worker_options(options.actor_options)
        count = -(-len(factories) // per_worker)
        plan = plan_placement(
            options.placement, count, options.actor_options, timeout=options.timeout
        )
        pool = cls([], options, plan, factories)
        try:
            for w, start in enumerate(range(0, len(factories), per_worker)):
                stop = min(start + per_worker, len(factories))
                pool.slots.append(Slot(pool._create(w, start, stop, None), start, stop, True))
            pool._connect(pool.slots, deadline_in(options.timeout), "start")
        except BaseException:
            pool.kill()
            raise
        return pool

    @classmethod
    def of_actors(cls, actors: Sequence[Any], options: Options) -> Pool:
        """A pool over the user's own env actors, one env each, over Ray calls."""
        return cls([Slot(a, i, i + 1, False) for i, a in enumerate(actors)], options)

    @property
    def can_restart(self) -> bool:
        """Whether lost workers are restarted (``on_actor_failure="restart"`` with factories)."""
        return self.options.on_actor_failure == "restart" and self._env_fns is not None

    def _create(self, w: int, start: int, stop: int, seeds: list[int | None] | None) -> Any:
        """Create the actor of worker `w` (envs ``start..stop-1``); nothing waits for it."""
        ensure_runtime()
        options = self.plan.options(w) if self.plan is not None else {}
        assert self._env_fns is not None
        try:
            return (
                _worker_class()
                .options(**options)
                .remote(
                    self._env_fns[start:stop],
                    list(range(start, stop)),
                    self.options.autoreset_mode.value,
                    seeds,
                )
            )
        except Exception as err:
            raise _creation_error(err, start, stop, options) from err

    def _connect(self, slots: Sequence[Slot], deadline: float | None, label: str) -> None:
        """Wait until the workers of `slots` are up; open pipes to those on this node."""
        refs = [slot.actor.handle.remote("node_id", ()) for slot in slots]
        try:
            nodes = ray.get(refs, timeout=remaining(deadline))
        except GetTimeoutError:
            raise TimeoutError(self._late_start(slots, label)) from None
        except RayError as err:
            failed = next(s for s, r in zip(slots, refs, strict=True) if _failed(r))
            raise EnvCrashedError(failed.start, label, err, env_indices=failed.envs) from err
        if self.options.transport == "ray" or not pipes_supported():
            return
        here = ray.get_runtime_context().get_node_id()
        for slot, node in zip(slots, nodes, strict=True):
            if node == here:
                try:
                    slot.link = PipeLink(slot.actor, deadline, grace=_grace(self.options))
                except (OSError, RuntimeError, TimeoutError, RayError) as err:
                    logger.warning("Envs %s use Ray calls: no pipes (%s).", list(slot.envs), err)
        if self.shared is not None:
            self._share(slots, self.shared, deadline)

    def share(self, observation_space: Any, action_space: Any) -> None:
        """Put the batched arrays of the workers on pipes in shared memory (``"auto"`` only).

        Nothing happens for spaces `_shared_memory` does not cover; a worker that cannot map
        the memory goes on without it (logged).
        """
        if self.options.transport != "auto" or self.shared is not None:
            return
        if not any(isinstance(slot.link, PipeLink) for slot in self.slots):
            return  # no worker on this node
        self.shared = SharedBatch.create(observation_space, action_space, self.num_envs)
        if self.shared is not None:
            self._share(self.slots, self.shared, deadline_in(self.options.bound))

    def _share(self, slots: Sequence[Slot], shared: SharedBatch, deadline: float | None) -> None:
        for slot in slots:
            if isinstance(slot.link, PipeLink):
                try:
                    slot.link.share(shared, slot.start, slot.stop, deadline)
                except Exception as err:  # e.g. /proc not readable: serialize instead
                    logger.warning("Envs %s: no shared memory (%s).", list(slot.envs), err)

    def _late_start(self, slots: Sequence[Slot], label: str) -> str:
        placement = self.options.placement
        where = f" with `placement={placement!r}`" if placement is not None else ""
        envs = [i for slot in slots for i in slot.envs]
        return (
            f"`{label}`: the worker(s) of env(s) {envs} did not start within "
            f"{self.options.bound:g} s{where}; the cluster has "
            f"{ray.available_resources()} free of {ray.cluster_resources()}. "  # type: ignore[no-untyped-call]
            "Check that the placement can be satisfied (nodes, resources), or raise `timeout`."
        )

    def restart(self, index: int, generation: int, label: str, why: str) -> None:
        """Replace worker `index` (if still in `generation`) by a new one, its envs reset.

        Raises:
            EnvCrashedError: If the new worker cannot be started (placed) within the options'
                bound; it names the envs and the placement.
        """
        slot = self.slots[index]
        if slot.generation != generation:
            return  # another call already restarted it
        logger.warning(
            "The worker of env(s) %s %s in `%s`; restarting it.", list(slot.envs), why, label
        )
        old_serve = getattr(slot.link, "serve_ref", None)
        slot.link.close()
        ray.kill(slot.actor, no_restart=True)
        seeds = []
        for i in slot.envs:
            self._restarts[i] += 1
            seeds.append(restart_seed(self.seeds[i], self._restarts[i]))
        slot.generation += 1
        slot.actor = self._create(index, slot.start, slot.stop, seeds)
        slot.link = RayLink(slot.actor, True)
        if old_serve is not None and self.shared is not None:
            # the old worker may still be writing its rows of the shared memory until it is gone
            ray.wait([old_serve], timeout=min(self.options.bound, 10.0))
        try:
            self._connect([slot], deadline_in(self.options.bound), label)
        except (TimeoutError, EnvCrashedError) as err:
            ray.kill(slot.actor, no_restart=True)
            raise EnvCrashedError(slot.start, label, err, env_indices=slot.envs) from err

    def kill(self) -> None:
        """Kill every worker and release the placement group (never waits for the envs)."""
        self.close_links()
        if ray.is_initialized():
            for slot in self.slots:
                ray.kill(slot.actor, no_restart=True)
        if self.plan is not None:
            self.plan.release()

    def close_links(self) -> None:
        """Close every worker's link and the shared memory; the workers keep running."""
        for slot in self.slots:
            slot.link.close()
        if self.shared is not None:
            self.shared.close()


@functools.cache
def _worker_class() -> Any:
    """The Ray actor class of `EnvWorker`, made once (Ray exports a class once per object)."""
    return ray.remote(EnvWorker)


def _grace(options: Options) -> float:
    """Seconds to wait for Ray's word on a worker whose pipe closed."""
    return min(options.bound, 10.0)


def _failed(ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return False
    try:
        ray.get(ref, timeout=0)
    except RayError:
        return True
    return False


def _creation_error(err: Exception, start: int, stop: int, options: dict[str, Any]) -> Exception:
    """A user error for an actor Ray would not create: bad options, or unpicklable factories."""
    lines = str(err).splitlines() or [""]
    reason = next((line for line in lines if "cannot pickle" in line), None)
    if reason is None and "serialize" not in str(err):
        return ValueError(
            f"the worker of envs {start}..{stop - 1} could not be created with the options "
            f"{options!r}: {lines[0]} Fix `actor_options` or `placement` (a `runtime_env` with "
            "local directories goes to `ray.init(runtime_env=...)`)."
        )
    reason = (reason or lines[0]).replace("\x1b[31m", "").replace("\x1b[39m", "").strip()
    return TypeError(
        f"the env factories of envs {start}..{stop - 1} could not be sent to a Ray worker "
        f"({reason}). Env factories must be picklable: use a module-level function or "
        "`functools.partial`, with no open files, locks or sockets in closures. Ray's "
        "diagnosis is in this error's `__cause__`."
    )
