"""`RayLauncher`: workers as Ray actors, placed as asked, on the transport that suits each.

Each worker is an `EnvWorker` actor created with the placement plan's options. Once it is up,
its transport is chosen by where it runs: shared memory (with pipes for the messages) for a
worker on the driver's node (``transport="auto"`` and spaces with a fixed layout), pipes alone
for one whose batch has no layout or with ``transport="pipe"``, a TCP stream for workers on
other nodes (``"auto"``) or everywhere (``"tcp"``), Ray calls with ``transport="ray"``, for
workers on other nodes with ``"pipe"``, where the platform has no ``poll``, and for a worker
that cannot be reached over TCP (one warning says why). Ray calls carry the stream's bytes,
the worker's rows after its record (`_open_ray_calls`), except for a worker that fell back to
them: it answers with pickles, read right as well.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from ray_multiprocess_env._engine import driver_threads
from ray_multiprocess_env._engine.options import Options, check_env_fns, check_worker_options
from ray_multiprocess_env._engine.pool import Launcher, Pool, Worker, worker_layout
from ray_multiprocess_env._engine.transports.base import remaining
from ray_multiprocess_env._engine.transports.pipes import pipe_transport, pipes_supported
from ray_multiprocess_env._engine.transports.ray_calls import ActorTransport, RayCallTransport
from ray_multiprocess_env._engine.transports.shared_memory import shared_memory_transport
from ray_multiprocess_env._engine.transports.tcp import (
    PORTS_VARIABLE,
    StreamRows,
    ports_from_environment,
    tcp_transport,
)
from ray_multiprocess_env._engine.worker_spin import spin_by_node
from ray_multiprocess_env._protocol.shared_layout import SharedBatch
from ray_multiprocess_env._worker.env_worker import EnvWorker
from ray_multiprocess_env.errors import EnvCrashedError, env_list
from ray_multiprocess_env.placement import PlacementPlan, plan_placement
from ray_multiprocess_env.runtime import ensure_runtime

__all__ = ["ActorLauncher", "RayLauncher", "actor_pool", "start_pool"]

#: Seconds a start may ask for resources no node has (with no `timeout`) before it fails.
_INFEASIBLE_S = 10.0

logger = logging.getLogger(__name__)


class RayLauncher:
    """Starts `EnvWorker` actors (see the module docstring); `worker_args` go to each.

    Args:
        options: The vector env's options (actor options, transport, timeouts).
        plan: Where each worker goes (None: Ray's default placement).
        worker_args: `EnvWorker`'s arguments after its envs: autoreset mode and info layout.
    """

    def __init__(
        self,
        options: Options,
        plan: PlacementPlan | None = None,
        worker_args: dict[str, Any] | None = None,
    ) -> None:
        self.options, self.plan = options, plan
        self._worker_args = dict(worker_args or {})
        self._serving: dict[int, Any] = {}  # the `serve` call of each worker on pipes
        self._nodes: dict[int, str | None] = {}  # each opened worker's node, by index
        self._others_here = 0  # other vector envs' workers on the driver's node, at the start

    def create(
        self, index: int, env_fns: Sequence[Callable[[], Any]], envs: range, seeds: Any
    ) -> Any:
        """Create the actor of worker `index`; nothing waits for it."""
        ensure_runtime()
        options = self.plan.options(index) if self.plan is not None else {}
        try:
            return (
                _worker_class()
                .options(**options)
                .remote(list(env_fns), list(envs), restart_seeds=seeds, **self._worker_args)
            )
        except Exception as err:
            raise _creation_error(err, envs, options) from err

    def connect(self, workers: Sequence[Worker], deadline: float | None, label: str) -> None:
        """Wait until the actors are up (their node ids); Ray calls until `open`."""
        refs = [worker.actor.handle.remote("node_id", ()) for worker in workers]
        nodes = self._wait_started(workers, refs, deadline, label)
        for worker, node in zip(workers, nodes, strict=True):
            worker.node_id, worker.transport = node, RayCallTransport(worker.actor)

    def _wait_started(
        self, workers: Sequence[Worker], refs: list[Any], deadline: float | None, label: str
    ) -> list[Any]:
        """The results of `refs`, the first calls of `workers`, once all started.

        A request of resources no node of the cluster has (``num_gpus=1`` on a machine without
        a GPU) is a `ValueError` naming them: at the deadline (a cluster may add nodes until
        then), or, for a start without a deadline (``timeout=None``), once it has been so for
        `_INFEASIBLE_S`, where it would otherwise wait forever.
        """
        early = _INFEASIBLE_S if deadline is None and label == "start" else None
        infeasible_since: float | None = None
        while True:
            left = remaining(deadline)
            wait = 1.0 if left is None else min(left, 1.0)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait)
            if len(ready) == len(refs) or any(_failed(ref) for ref in ready):
                break
            if left == 0:
                why = self._infeasible(workers, refs, ready)
                if why is not None:
                    raise ValueError(f"`{label}`: {why}")
                raise TimeoutError(self._late_start(workers, label))
            if early is None:
                continue
            why = self._infeasible(workers, refs, ready)
            now = time.monotonic()
            infeasible_since = None if why is None else (infeasible_since or now)
            if why is not None and infeasible_since is not None and now - infeasible_since >= early:
                raise ValueError(f"`{label}`: {why}")
        try:
            return list(ray.get(refs, timeout=remaining(deadline)))
        except GetTimeoutError:
            raise TimeoutError(self._late_start(workers, label)) from None
        except RayError as err:
            failed = next(w for w, r in zip(workers, refs, strict=True) if _failed(r))
            every = workers[-1].envs.stop if label == "start" else None  # (all: at the start)
            raise EnvCrashedError(
                failed.envs.start, label, err, env_indices=failed.envs, num_envs=every
            ) from err

    def _infeasible(
        self, workers: Sequence[Worker], refs: list[Any], ready: list[Any]
    ) -> str | None:
        """Why the workers not started yet can never be placed, or None if they may be."""
        waiting = [w for w, ref in zip(workers, refs, strict=True) if ref not in ready]
        if not waiting or self.plan is None:
            return None
        options = self.plan.options(waiting[0].index)
        if options.get("scheduling_strategy") not in (None, "DEFAULT", "SPREAD"):
            return None  # a placement group or a node: planned (and bounded) elsewhere
        asked = {
            "CPU": float(options.get("num_cpus", 1)),
            "GPU": float(options.get("num_gpus", 0)),
            "memory": float(options.get("memory", 0)),
            **{k: float(v) for k, v in dict(options.get("resources") or {}).items()},
        }
        asked = {k: v for k, v in asked.items() if v > 0}
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        if any(all(node.get(k, 0.0) >= v for k, v in asked.items()) for node in nodes):
            return None
        envs = [i for worker in waiting for i in worker.envs]
        have = [{k: v for k, v in node.items() if not k.startswith("node:")} for node in nodes]
        return (
            f"the worker(s) of env(s) {env_list(envs)} ask for {asked} each (`actor_options`), "
            f"which no node of the cluster has: its nodes have {have}. Ask for less, or add a "
            "node that has them (on a cluster that adds nodes as needed, give a `timeout` long "
            "enough for it)."
        )

    def open(
        self,
        workers: Sequence[Worker],
        shared: SharedBatch | None,
        columns: Sequence[dict[str, Any]],
        deadline: float | None,
        *,
        strict: bool = False,
    ) -> None:
        """Each worker's transport for good, by where it runs (see the module docstring).

        `shared`: the batch's memory (shared with this node's workers, or private); `strict`:
        a transport not up by `deadline` raises `TimeoutError` (else: logged, and the worker
        goes on with pipes alone or Ray calls).
        """
        transport = self.options.transport
        if transport == "ray" or not pipes_supported():
            for worker in workers:
                self._open_ray_calls(worker, shared, deadline, strict)
            return
        here = ray.get_runtime_context().get_node_id()
        grace = min(self.options.bound, 10.0)
        ports = ports_from_environment() if transport in ("auto", "tcp") else None
        spins = self._spins(workers)
        for worker in workers:
            span = (worker.envs.start, worker.envs.stop)
            spin = spins.get(worker.node_id or "", 0)
            if transport == "tcp" or (transport == "auto" and worker.node_id != here):
                self._open_tcp(worker, shared, span, columns, deadline, ports, strict, spin)
                continue
            if worker.node_id != here:  # (``"pipe"``: Ray calls off the driver's node)
                self._open_ray_calls(worker, shared, deadline, strict)
                continue
            if shared is not None and shared.spec is not None and transport == "auto":
                try:
                    memory = shared_memory_transport(
                        worker.actor, deadline, grace, shared, span, columns, spin
                    )
                    worker.transport, self._serving[worker.index] = memory, memory.serve_ref
                    continue
                except Exception as err:  # e.g. /proc not readable: pipes alone
                    if strict and isinstance(err, TimeoutError):
                        raise
                    logger.warning("Envs %s: no shared memory (%s).", list(worker.envs), str(err))
                    self._stop_serving(worker)
            rows = None if shared is None else StreamRows(shared, span)
            try:
                pipe = pipe_transport(worker.actor, deadline, grace, spin, rows, columns)
                worker.transport, self._serving[worker.index] = pipe, pipe.serve_ref
            except Exception as err:  # (its rows and pipes closed: Ray calls work again)
                if strict and isinstance(err, TimeoutError):
                    raise
                logger.warning("Envs %s use Ray calls: no pipes (%s).", list(worker.envs), str(err))

    def _open_tcp(
        self,
        worker: Worker,
        batch: SharedBatch | None,
        span: tuple[int, int],
        columns: Sequence[dict[str, Any]],
        deadline: float | None,
        ports: tuple[int, int] | None,
        strict: bool,
        spin: int,
    ) -> None:
        """A TCP stream to `worker`; if it cannot be made, Ray calls and one warning why."""
        grace = min(self.options.bound, 10.0)
        try:
            stream = tcp_transport(worker.actor, deadline, grace, batch, span, columns, ports, spin)
        except (OSError, RuntimeError, TimeoutError, RayError) as err:
            if strict and isinstance(err, TimeoutError):
                raise
            logger.warning(
                "Envs %s use Ray calls: their worker on node %s could not be reached over TCP "
                "(%s: %s). Let the driver's node connect to the workers' nodes on the ports "
                "they listen on (set a range with %s=first-last and open it in the firewall), "
                "or pass transport='ray' to use Ray calls without trying.",
                list(worker.envs),
                worker.node_id,
                type(err).__name__,
                err,
                PORTS_VARIABLE,
            )
            return  # (Ray calls wait behind the worker's `serve_stream` until it gives up)
        worker.transport, self._serving[worker.index] = stream, stream.serve_ref

    def _open_ray_calls(
        self, worker: Worker, batch: SharedBatch | None, deadline: float | None, strict: bool
    ) -> None:
        """Ray calls to `worker`, its rows of `batch` (if the spaces have a layout) after them.

        Until the worker says it keeps its rows in the batch's layout (by `deadline`), a step's
        actions are pickled; its replies are read right either way.
        """
        if batch is None:
            return  # (no layout: everything pickled, as `connect` left it)
        calls = RayCallTransport(
            worker.actor, StreamRows(batch, (worker.envs.start, worker.envs.stop))
        )
        worker.transport = calls
        try:
            calls.use_rows(deadline)
        except Exception as err:  # (a worker that cannot: its replies are read right anyway)
            if strict and isinstance(err, TimeoutError):
                raise
            logger.warning("Envs %s: actions pickled in Ray calls (%s).", list(worker.envs), err)

    def _spins(self, workers: Sequence[Worker]) -> dict[str, int]:
        """How long the workers on each node poll for their next message (`worker_spin`).

        Counted over every worker opened so far (a restarted one where it now runs), and on the
        driver's node the other vector envs' workers open when the first were opened.
        """
        if not self._nodes:
            self._others_here = driver_threads.workers_counted()
        self._nodes.update((worker.index, worker.node_id) for worker in workers)
        return spin_by_node(self.options.worker_spin, self._nodes.values(), self._others_here)

    def _stop_serving(self, worker: Worker) -> None:
        """After a transport that failed half-way: the worker's `serve` ends, Ray calls work."""
        serving = self._serving.pop(worker.index, None)
        if serving is not None:
            ray.wait([serving], timeout=min(self.options.bound, 10.0))
        worker.transport = RayCallTransport(worker.actor)

    def kill(self, worker: Worker, *, wait_gone: bool = False) -> None:
        """Close `worker`'s transport and kill its actor (`wait_gone`: until its pipe ended)."""
        worker.transport.close()
        serving = self._serving.pop(worker.index, None)
        if ray.is_initialized():
            ray.kill(worker.actor, no_restart=True)
            if wait_gone and serving is not None:
                # the old worker may still be writing its rows of the shared memory until then
                ray.wait([serving], timeout=min(self.options.bound, 10.0))

    def release(self) -> None:
        """Remove the placement group made for the workers, if any."""
        if self.plan is not None:
            self.plan.release()

    @staticmethod
    def reachable() -> bool:
        """Whether Ray still runs (at interpreter exit it may be gone, and the actors too)."""
        return bool(ray.is_initialized())

    def _late_start(self, workers: Sequence[Worker], label: str) -> str:
        placement = self.options.placement
        where = f" with `placement={placement!r}`" if placement is not None else ""
        envs = [i for worker in workers for i in worker.envs]
        if label != "start":  # (a restart: `Failures._replace` gives it `restart_bound`)
            within = f"within {self.options.restart_bound:g} s of the restart"
        elif self.options.start_bound is not None:
            within = f"within {self.options.start_bound:g} s"
        else:
            within = "before the call's `timeout` ran out"
        return (
            f"`{label}`: the worker(s) of env(s) {env_list(envs)} did not start {within}{where}; "
            "the cluster has "
            f"{ray.available_resources()} free of {ray.cluster_resources()}. "  # type: ignore[no-untyped-call]
            "Check that the placement can be satisfied (nodes, resources), or raise `timeout`."
        )


class ActorLauncher(RayLauncher):
    """The user's own env actors (one env each): nothing to create, Ray calls to each."""

    def connect(self, workers: Sequence[Worker], deadline: float | None, label: str) -> None:
        """Ray calls of each actor's own methods (its first call waits for it to start)."""
        for worker in workers:
            worker.transport = ActorTransport(worker.actor)

    def open(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: a plain actor has no pipes to serve."""

    def kill(self, worker: Worker, *, wait_gone: bool = False) -> None:
        """Kill the actor."""
        worker.transport.close()
        if ray.is_initialized():
            ray.kill(worker.actor, no_restart=True)


@functools.cache
def _worker_class() -> Any:
    """The Ray actor class of `EnvWorker`, made once (Ray exports a class once per object)."""
    return ray.remote(EnvWorker)


def _failed(ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return False
    try:
        ray.get(ref, timeout=0)
    except RayError:
        return True
    return False


def _creation_error(err: Exception, envs: range, options: dict[str, Any]) -> Exception:
    """A user error for an actor Ray would not create: bad options, or unpicklable factories."""
    start, stop = envs.start, envs.stop
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


def start_pool(
    env_fns: Sequence[Callable[[], Any]],
    envs_per_worker: int | Sequence[int],
    options: Options,
    worker_args: dict[str, Any],
    launcher: Launcher | None = None,
) -> Pool:
    """Start `EnvWorker` actors where `options` place them, as `envs_per_worker` lays out.

    `envs_per_worker`: an int (workers of that many envs, the last may hold fewer) or one
    count per worker (`worker_layout`); `worker_args`: every worker's (`Options.worker_args`);
    `launcher`: another (in tests).
    """
    factories = check_env_fns(env_fns)
    layout = worker_layout(len(factories), envs_per_worker)
    check_worker_options(options.actor_options)
    if launcher is None:
        plan = plan_placement(
            options.placement, len(layout), options.actor_options, timeout=options.timeout
        )
        launcher = RayLauncher(options, plan, worker_args)
    return Pool.start(factories, layout, options, launcher)


def actor_pool(actors: Sequence[Any], options: Options, plan: Any = None) -> Pool:
    """A pool of the user's own env actors, one env each, over Ray calls."""
    workers = [
        Worker(i, actor, range(i, i + 1), ActorTransport(actor)) for i, actor in enumerate(actors)
    ]
    pool = Pool(workers, options, ActorLauncher(options, plan))
    pool.unstarted = {worker.index for worker in workers}  # their first call waits longer
    return pool
