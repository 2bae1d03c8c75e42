"""`Engine`: the workers of one vector env, spoken to in whole batches.

The faces (`RayVectorEnv`, `GymnasiumVectorEnv`, `SB3VecEnv`) use only these verbs: `reset`,
`async_reset`, `step` (one verb), `step_async`/`step_wait` and `step_envs` (`lockstep.py`),
first-ready `send`/`recv` (`first_ready.py`), `call` on envs, `seed`, `close`, and `spec`,
`closed`, `workers`, `node_ids`. Each verb checks the one call state
(`CallState`), takes per-env arguments, splits them per worker itself, and returns one `Batch`:
observations, rewards, flags and infos of every env (or of the envs a `recv` returns), already
batched where they were made (the workers write their rows into the `BatchStore`). A face never
sees the workers' layout.

Pools of the user's own env actors (`of_actors`), and of envs whose spaces differ, have no
batch layout: their verbs run each env's own method and hand back what it returned
(`Batch.rows`).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import ray

from ray_multiprocess_env._engine import driver_threads
from ray_multiprocess_env._engine.call_state import (
    SEND_RECV,
    Call,
    CallState,
    InFlightWords,
    State,
    T,
    as_is,
    hand_out,
)
from ray_multiprocess_env._engine.calls import Calls
from ray_multiprocess_env._engine.interrupts import DEFERRED, deferred_interrupts
from ray_multiprocess_env._engine.lanes import Lanes
from ray_multiprocess_env._engine.lockstep import LockstepVerbs
from ray_multiprocess_env._engine.options import Options
from ray_multiprocess_env._engine.pool import Launcher, Pool
from ray_multiprocess_env._engine.ray_launcher import actor_pool, start_pool
from ray_multiprocess_env._engine.results import Batch, EngineSpec, WorkerInfo
from ray_multiprocess_env._engine.store import BatchStore
from ray_multiprocess_env._engine.transports.base import deadline_in
from ray_multiprocess_env._protocol.shared_layout import shared_memory_supported

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

#: Seconds `close` gives the envs to close before it kills their workers anyway.
_CLOSE_S = 30.0

PerEnv = Sequence[Any]


class Engine(LockstepVerbs):
    """The workers of one vector env and the calls to them (see the module docstring).

    Args:
        pool: The started workers.
        name: The face's class name, for messages.
        info_layout: ``"batched"`` (gymnasium's dict) or ``"per_env"`` (a dict per env).
        uniform: ``"require"``: every env must have the same spaces (a `ValueError` names
            one that differs); ``"prefer"``: envs that differ are stepped one by one;
            ``"none"``: the pool's envs are not asked (the user's own actors).
        observation_mode: gymnasium's ``"same"`` or ``"different"``, or a given single
            observation space; None (a face without the option): "same" (`Calls.describe`).
        words: The face's words for its first-ready calls, which their errors use.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        name: str,
        info_layout: str = "batched",
        uniform: str = "require",
        observation_mode: Any = None,
        words: InFlightWords = SEND_RECV,
    ) -> None:
        self._pool, self._calls = pool, Calls(pool)
        self._failures = self._calls.failures
        self._state = CallState(name, words)
        self._has_method: dict[str, list[bool]] = {}
        self._store: BatchStore | None = None
        self._lanes: Lanes | None = None
        self._workers_here = 0  # worker processes on the driver's node (`driver_threads`)
        self._released = False  # `close` killed (or let go of) the workers
        self._owner = [w.index for w in pool.workers for _ in w.envs]  # each env's worker
        try:
            self.spec = EngineSpec(pool.num_envs)
            if uniform != "none":
                self.spec = self._calls.describe(uniform == "require", observation_mode)
            if self.spec.uniform:
                local = any(w.node_id == _here() for w in pool.workers)
                self._store = BatchStore(
                    self.spec.observation_space,
                    self.spec.action_space,
                    pool.num_envs,
                    share=local and pool.options.transport == "auto",
                    batched_infos=info_layout == "batched",
                )
                pool.shared = self._store.memory
            deadline = deadline_in(pool.options.bound)
            pool.launcher.open(pool.workers, pool.shared, [], deadline)
            if self._store is not None and self._store.memory is not None:
                # numeric infos get columns (memory files) if a worker writes its rows in the
                # batch's layout on a channel: shared memory, or rows after the messages
                hot = any(w.transport.hot for w in pool.workers)
                self._store.use_columns = hot and shared_memory_supported()
                if hot:
                    self._lanes = Lanes(pool, self._store)
            here = _here()
            workers_here = sum(w.node_id == here for w in pool.workers)
            driver_threads.add_workers(workers_here)  # (counted only if it returns)
            self._workers_here = workers_here
        except BaseException as error:
            self.abort(error)
            raise

    @classmethod
    def start(
        cls,
        env_fns: Sequence[Callable[[], Any]],
        envs_per_worker: int | Sequence[int],
        options: Options,
        *,
        name: str,
        info_layout: str = "batched",
        uniform: str = "require",
        observation_mode: Any = None,
        autoreset: bool = True,
        launcher: Launcher | None = None,
        words: InFlightWords = SEND_RECV,
    ) -> Engine:
        """Start `EnvWorker` actors as `envs_per_worker` lays out (`launcher`: in tests).

        `envs_per_worker`: an int or one count per worker (`pool.worker_layout`); with `autoreset`
        False the workers never reset an env themselves (pfrl's way), whatever the autoreset mode.
        The other arguments are `Engine`'s.
        """
        worker_args = options.worker_args(info_layout, autoreset)
        pool = start_pool(env_fns, envs_per_worker, options, worker_args, launcher)
        return cls(
            pool,
            name=name,
            info_layout=info_layout,
            uniform=uniform,
            observation_mode=observation_mode,
            words=words,
        )

    @classmethod
    def of_actors(
        cls, actors: Sequence[Any], options: Options, *, name: str, plan: Any = None
    ) -> Engine:
        """An engine over the user's own env actors, one env each, over Ray calls."""
        return cls(actor_pool(actors, options, plan), name=name, uniform="none")

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._state.mode is State.CLOSED

    def busy_envs(self) -> list[int]:
        """The envs with a first-ready call out (sent, not yet returned by `recv`), sorted."""
        return self._state.busy_envs()

    @property
    def workers(self) -> tuple[WorkerInfo, ...]:
        """Each worker's actor, envs and node (None where not known: `node_ids` asks)."""
        return tuple(WorkerInfo(w.actor, w.envs, w.node_id) for w in self._pool.workers)

    # -- reset ------------------------------------------------------------------------------------
    def reset(
        self,
        seeds: PerEnv | None = None,
        options: Mapping[str, Any] | PerEnv | None = None,
        mask: np.ndarray | None = None,
        *,
        label: str = "reset",
        in_flight_ok: bool = False,
        others_reset: bool = True,
        finish: Callable[[Batch], T] = as_is,
    ) -> T:
        """Reset every env, or those where `mask` is True: `finish` of the whole batch after it.

        Args:
            seeds: One seed (or None) per env; None for every env: the seeds `seed` kept.
            options: One options dict for every env, or one (or None) per env.
            mask: Which envs to reset (a bool array); None: all.
            label: The method named in errors.
            in_flight_ok: Allowed while first-ready calls are out (not for their envs).
            others_reset: A `ValueError` unless the envs `mask` leaves out were reset before
                (their rows are part of the batch).
            finish: What the face makes of the batch, with its own note of the reset: run
                inside the hand-out (`hand_out`), so a Ctrl-C comes before it or after all
                of it.
        """
        self._state.check_idle(label, in_flight_ok=in_flight_ok)
        if self._workers_here:
            driver_threads.fit_torch()  # (torch may have been imported since the start)
        envs = None if mask is None else np.flatnonzero(mask)
        if envs is not None:
            self._state.check_not_busy(envs.tolist(), reset=True)
        if self._store is not None and mask is not None and others_reset:
            self._store.check_ready(mask)
        reset = range(self.spec.num_envs) if envs is None else envs.tolist()
        seeds = self._pool.seeds.for_reset(seeds, reset)
        deadline = deadline_in(self._pool.options.timeout)
        with deferred_interrupts():  # sent and the kept seeds used up, or neither
            call = self._send_reset(seeds, options, mask, label, in_flight_ok)
            self._pool.seeds.sent(seeds, reset)
        lanes = self._lanes  # (a reset's answers are records, read as a step's are)
        if lanes is not None and lanes.now() is not None:
            with DEFERRED:  # (a Ctrl-C comes through in `poll`, where nothing is half read;
                lanes.read(call.tickets, None, deadline)  # the reset is given up then)
        replies = self._calls.wait(call, deadline=deadline)
        if self._store is not None:
            self._store.ready[envs if envs is not None else slice(None)] = True
        make = self._made(call, replies, finish, envs, every_env=True)
        return hand_out(self._state, self._pool.lost_episodes, (), envs, make)

    # -- calls on envs -----------------------------------------------------------------------------
    def call(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[Mapping[str, Any]] | None = None,
        *,
        label: str | None = None,
        in_flight_ok: bool = False,
    ) -> list[Any]:
        """Call env method `method` on each env whose args are not None; a result per env.

        ``call``, ``get_attr``, ``set_attr``, ``has_attr`` and ``is_wrapped`` look through
        gymnasium's wrappers (see `EnvWorker`).
        """
        self._state.check_idle(label or method, in_flight_ok=in_flight_ok)
        return self._calls.apply(method, args_per_env, kwargs_per_env, label or method)

    def seed(self, seeds: Sequence[int | None]) -> list[Any]:
        """Seed each env now if it has a ``seed`` method (old gym), else at its next reset.

        Returns:
            What each env's ``seed`` returned, or the seed kept for its next reset.
        """
        self._beside_pending("seed")
        has_seed = self._has("seed")
        args = [(s,) if has else None for s, has in zip(seeds, has_seed, strict=True)]
        returned = self._calls.apply("seed", args, None, "seed") if any(has_seed) else None
        self._pool.seeds.note(seeds)
        out: list[Any] = []
        for env, seed in enumerate(seeds):
            if has_seed[env] and returned is not None:
                out.append(returned[env])
            else:
                self._pool.seeds.keep(env, seed)
                out.append(seed)
        return out

    def node_ids(self) -> tuple[str, ...]:
        """The Ray node id of each env's worker, by env index."""
        self._state.check_open("node_ids")
        workers = self._pool.workers
        if any(w.node_id is None for w in workers):
            self._beside_pending("node_ids")
            nodes = self._calls.run("node_id", [()] * len(workers), "node_ids")
            for worker, node in zip(workers, nodes, strict=True):
                worker.node_id = node
        return tuple(str(w.node_id) for w in workers for _ in w.envs)

    def run_on_workers(self, op: str) -> list[Any]:
        """Run a worker operation (``pid``, ``node_id``) on every worker: one result each."""
        self._beside_pending(op)
        return self._calls.run(op, [()] * len(self._pool.workers), op)

    # -- close ----------------------------------------------------------------------------------
    def close(self, *, kill: bool = True, close_envs: bool = True) -> None:
        """Close every env, then kill the workers; bounded in time, idempotent.

        An env whose ``close`` fails or does not answer in time is logged and its worker
        killed anyway; with ``kill=False`` (the user keeps the actors) the failure is raised.
        With ``close_envs=False`` the envs are not asked (`abort`). A Ctrl-C that stops it
        before the workers are released leaves the rest to the next ``close``.
        """
        if self._released:
            return
        try:
            if not self.closed:  # (a second `close`, after a Ctrl-C: only the release is left)
                pending, in_flight = self._state.close()
                if pending is not None:
                    self._failures.abandon(pending)
                self._failures.abandon(Call("close", "close", in_flight))
                if close_envs and self._pool.launcher.reachable():
                    self._close_envs(kill)
        finally:
            with deferred_interrupts():  # all or nothing: no worker left running
                self._state.close()  # (closed, if a Ctrl-C came before the line that does it)
                if kill:
                    self._pool.kill()
                else:
                    self._pool.close_transports()
                    self._pool.launcher.release()
                self._release_memory()
                driver_threads.remove_workers(self._workers_here)
                self._workers_here = 0
                self._released = True

    def abort(self, error: BaseException) -> None:
        """`close` after a start that `error` cut short: at once if it is a Ctrl-C.

        The user who pressed it waits for no env's ``close`` (an env may be what hangs); the
        workers are killed with their envs.
        """
        self.close(close_envs=not isinstance(error, KeyboardInterrupt))

    # -- helpers -----------------------------------------------------------------------------
    def _beside_pending(self, name: str) -> None:
        """The checks of a verb `name` that may run while a `step_async` is pending: open.

        (Replies to the calls out that this verb's reads find settle their tickets.)
        """
        self._state.check_open(name)

    def _has(self, name: str) -> list[bool]:
        """Whether each env has a method `name` (asked once, then cached)."""
        if name not in self._has_method:
            answers = self._calls.run("has_method", [(name,)] * len(self._pool.workers), name)
            self._has_method[name] = [flag for answer in answers for flag in answer]
        return self._has_method[name]

    def _close_envs(self, kill: bool) -> None:
        """Ask every worker to close its envs, within `_CLOSE_S` at most."""
        error = self._calls.close_envs(min(self._pool.options.bound, _CLOSE_S))
        if error is not None and not kill:
            raise error
        if error is not None:
            logger.warning("Killing the actors after a failed `close`: %s", error)

    def _release_memory(self) -> None:
        """Release the shared memory, even where a failure's traceback still holds views."""
        store, self._store, self._pool.shared = self._store, None, None
        self._lanes = None
        if store is not None and not store.close():
            gc.collect()  # e.g. a reference cycle of a dead worker's error
            if not store.close():
                logger.info("Shared memory stays mapped while views from `copy=False` live.")


def _here() -> str | None:
    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else None
