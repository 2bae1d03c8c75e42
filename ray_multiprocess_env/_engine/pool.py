"""The worker pool: the workers and their envs, restart policy, kill.

A `Worker` holds envs ``envs`` (a range of global indices) and talks over one transport. The
pool starts its workers through a `Launcher` (Ray actors, placed on a cluster: `RayLauncher`;
threads in this process for the engine's tests: `InProcessLauncher`), restarts a lost one from
the same factories (``on_actor_failure="restart"``) with a new `generation`, so late news about
the old one is recognised, and kills them all at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ray_multiprocess_env._engine.lost_episodes import LostEpisodes
from ray_multiprocess_env._engine.options import MIN_START_S, Options, check_positive_int
from ray_multiprocess_env._engine.seeds import SeedBook
from ray_multiprocess_env._engine.transports.base import Ticket, Transport, deadline_in
from ray_multiprocess_env._engine.transports.waiting import wait_tickets
from ray_multiprocess_env._protocol.shared_layout import SharedBatch
from ray_multiprocess_env.errors import EnvCrashedError, env_list

__all__ = ["RETRIED", "Launcher", "Pool", "Worker", "worker_layout"]

logger = logging.getLogger(__name__)


#: What an `EnvCrashedError` of a worker the pool restarts says to do next (its hint's end):
#: after a restart that failed (`RETRIED`), after the last restart the budget allows.
RETRIED = "the next call that needs them tries to restart the worker again."
_MAKE_AGAIN = "make the vector env again (or allow more restarts, as said above) to continue."


class Worker:
    """One worker: its actor, its envs, the transport its operations go over, its node."""

    __slots__ = (
        "_transport",
        "actor",
        "env_list",
        "envs",
        "generation",
        "gone",
        "index",
        "lost",
        "node_id",
    )

    #: How many times a worker's transport was set, in any pool: what was made of the
    #: transports of a pool (`lanes.Lanes`) holds while this stays the same.
    transports_set = 0

    def __init__(self, index: int, actor: Any, envs: range, transport: Transport) -> None:
        self.index, self.actor, self.envs, self.transport = index, actor, envs, transport
        self.env_list = list(envs)
        self.generation = 0
        self.lost = False  # killed without a replacement (a restart failed or was given up)
        self.gone = False  # its process is known to have ended (`Failures.error`): not asked again
        self.node_id: str | None = None

    @property
    def transport(self) -> Transport:
        """The transport its operations go over (a restart, or a fallback, replaces it)."""
        return self._transport

    @transport.setter
    def transport(self, transport: Transport) -> None:
        self._transport = transport
        Worker.transports_set += 1


class Launcher(Protocol):
    """Creates, connects and kills the workers of a pool."""

    def create(
        self, index: int, env_fns: Sequence[Callable[[], Any]], envs: range, seeds: Any
    ) -> Any:
        """Start the worker of envs `envs` (reset with `seeds` if not None); nothing waits."""

    def connect(self, workers: Sequence[Worker], deadline: float | None, label: str) -> None:
        """Wait until `workers` are up; give each its node and a first transport."""

    def open(
        self,
        workers: Sequence[Worker],
        shared: SharedBatch | None,
        columns: Sequence[dict[str, Any]],
        deadline: float | None,
        *,
        strict: bool = False,
    ) -> None:
        """Give `workers` their transports for good (`shared` memory for those that can).

        A transport that is not up by `deadline` leaves the worker on a slower one (logged),
        or with `strict` (a restart, bounded by its call) raises `TimeoutError`.
        """

    def kill(self, worker: Worker, *, wait_gone: bool = False) -> None:
        """Close `worker`'s transport and stop it (`wait_gone`: until it writes no more)."""

    def release(self) -> None:
        """Release what the workers' placement held."""

    def reachable(self) -> bool:
        """Whether the workers can still be asked anything (for Ray: Ray still runs)."""


class Pool:
    """The workers of one vector env; see the module docstring.

    Args:
        workers: The workers, in env order.
        options: The vector env's options.
        launcher: What starts and kills workers.
        env_fns: The env factories, for restarts (None: the user's own actors, not restarted).
    """

    def __init__(
        self,
        workers: list[Worker],
        options: Options,
        launcher: Launcher,
        env_fns: Sequence[Callable[[], Any]] | None = None,
    ) -> None:
        self.workers, self.options, self.launcher = workers, options, launcher
        self._env_fns = list(env_fns) if env_fns is not None else None
        self.num_envs = workers[-1].envs.stop if workers else len(env_fns or ())
        self.seeds = SeedBook(self.num_envs)
        self.lost_episodes = LostEpisodes(self.num_envs)  # reports owed after restarts
        self._restarts: dict[int, int] = {}  # how many times each worker was restarted
        self.unstarted: set[int] = set()  # workers not known to be up (the user's actors)
        self.shared: SharedBatch | None = None  # the batch's memory (shared or not), once made
        self.columns: list[dict[str, Any]] = []  # the info columns in shared memory

    @classmethod
    def start(
        cls,
        env_fns: Sequence[Callable[[], Any]],
        layout: Sequence[int],
        options: Options,
        launcher: Launcher,
    ) -> Pool:
        """Start one worker per entry of `layout`, of that many envs in order; wait for them.

        `layout` is a `worker_layout` of ``len(env_fns)`` envs.
        """
        pool = cls([], options, launcher, env_fns)
        try:
            start = 0
            for index, size in enumerate(layout):
                envs = range(start, start + size)
                start = envs.stop
                actor = launcher.create(index, env_fns[envs.start : envs.stop], envs, None)
                pool.workers.append(Worker(index, actor, envs, _NOT_CONNECTED))
            launcher.connect(pool.workers, deadline_in(options.start_bound), "start")
        except BaseException:
            pool.kill()
            raise
        return pool

    def deadline_for(
        self, tickets: Sequence[Ticket], seconds: float | None, deadline: float | None
    ) -> tuple[float | None, float | None]:
        """`seconds` and `deadline` of a call of `tickets`, longer for a first call.

        `deadline`: the call's, from `seconds` (None: it starts now).
        """
        longer = self._seconds_for(tickets, seconds)
        if deadline is None or longer != seconds:
            return longer, deadline_in(longer)
        return seconds, deadline

    def _seconds_for(self, tickets: Sequence[Ticket], seconds: float | None) -> float | None:
        """How long a call of `tickets` may take: `seconds`, or more for a first call.

        The user's own actors start with their first call, which is given at least the time
        a worker's start is given.
        """
        if seconds is None or not self.unstarted:
            return seconds
        if any(ticket.worker in self.unstarted for ticket in tickets):
            self.unstarted -= {ticket.worker for ticket in tickets}
            return max(seconds, MIN_START_S)
        return seconds

    @property
    def has_factories(self) -> bool:
        """Whether the envs' factories are known (not the user's own actors): restarts can be."""
        return self._env_fns is not None

    @property
    def can_restart(self) -> bool:
        """Whether lost workers are restarted (``on_actor_failure="restart"`` with factories)."""
        return self.options.on_actor_failure == "restart" and self.has_factories

    def restart(
        self,
        index: int,
        generation: int,
        label: str,
        why: str,
        cause: BaseException | None,
        deadline: float | None,
    ) -> None:
        """Replace worker `index` (if still in `generation`) by a new one, its envs reset.

        The new worker must be placed, started and connected by `deadline`.

        Raises:
            EnvCrashedError: If the worker was restarted `max_restarts` times already (chained
                to `cause`, its last failure), or if the new worker cannot be started (placed)
                by `deadline` (it names the envs and the placement).
        """
        worker = self.workers[index]
        if (worker.generation != generation and not worker.lost) or self._env_fns is None:
            return  # another call already restarted it
        restarts = self._restarts.get(index, 0)
        limit = self.options.max_restarts
        if limit is not None and restarts >= limit:
            envs = list(worker.envs)
            budget = RuntimeError(
                f"the worker of env(s) {env_list(envs)} {why} after {restarts} restart(s), "
                f"the most `max_restarts={limit}` allows (raise it, or pass None for no limit)"
            )
            budget.__cause__ = cause
            raise EnvCrashedError(
                worker.envs.start, label, budget, env_indices=envs, next_step=_MAKE_AGAIN
            ) from budget
        logger.warning(
            "The worker of env(s) %s %s in `%s`; restarting it.", env_list(worker.envs), why, label
        )
        self.lost_episodes.owe(worker.envs, worker.generation + 1)  # (until handed over)
        self.launcher.kill(worker, wait_gone=self.shared is not None and bool(self.shared.spec))
        seeds = self.seeds.for_restart(worker.envs)
        worker.generation += 1
        fns = self._env_fns[worker.envs.start : worker.envs.stop]
        try:
            worker.actor = self.launcher.create(index, fns, worker.envs, seeds)
            self.launcher.connect([worker], deadline, label)
            self.launcher.open([worker], self.shared, self.columns, deadline, strict=True)
        except (TimeoutError, ValueError, EnvCrashedError) as err:  # (ValueError: no node fits)
            self._restarts[index] = restarts + 1  # a failed try counts; an interrupted one not
            self.give_up(worker)
            raise EnvCrashedError(
                worker.envs.start, label, err, env_indices=worker.envs, next_step=RETRIED
            ) from err
        except BaseException:  # interrupted: the next call finds it lost and tries again
            self.give_up(worker)
            raise
        worker.lost = worker.gone = False
        self._restarts[index] = restarts + 1  # counted once the replacement is connected

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Give every worker the new info columns `specs` in shared memory (none: nothing)."""
        if specs:
            self.columns += specs
            for worker in self.workers:
                worker.transport.share_infos(specs)

    def give_up(self, worker: Worker) -> None:
        """Kill `worker` with no replacement: the next call that needs it restarts it."""
        self.launcher.kill(worker)
        worker.lost = True

    def close_envs(self, seconds: float) -> list[Ticket]:
        """Ask every worker to close its envs; the tickets that failed or are late.

        A worker given up (`give_up`: killed by the library, with no replacement), or whose
        process is known to have ended (`Worker.gone`), is not asked.
        """
        tickets = []
        for worker in self.workers:
            if worker.lost or worker.gone:
                continue
            ticket = Ticket(worker.index, worker.generation, "close", (), tuple(worker.envs))
            worker.transport.submit(ticket)
            tickets.append(ticket)
        wait_tickets(tickets, deadline_in(seconds), len(tickets))
        return [t for t in tickets if t.outcome is None or not t.outcome.ok]

    def kill(self) -> None:
        """Stop every worker and release their placement (never waits for the envs)."""
        for worker in self.workers:
            self.launcher.kill(worker)
        self.launcher.release()

    def close_transports(self) -> None:
        """Close every worker's transport; the workers keep running."""
        for worker in self.workers:
            worker.transport.close()


def worker_layout(num_envs: int, envs_per_worker: Any) -> tuple[int, ...]:
    """How many of `num_envs` envs each worker holds, in env order, from `envs_per_worker`.

    An int: workers of that many envs, the last holding fewer if `num_envs` is not a multiple;
    a sequence: one count per worker (``[2, 2, 1, 1]``), adding up to `num_envs`.

    Raises:
        TypeError: If `envs_per_worker` is neither a positive int nor a sequence of them.
        ValueError: If a count is not positive, or the counts do not add up to `num_envs`.
    """
    if isinstance(envs_per_worker, (str, bytes)) or not isinstance(envs_per_worker, Sequence):
        size = check_positive_int("envs_per_worker", envs_per_worker)
        return tuple(min(size, num_envs - start) for start in range(0, num_envs, size))
    try:
        layout = tuple(check_positive_int("envs_per_worker", size) for size in envs_per_worker)
    except (TypeError, ValueError) as err:
        raise type(err)(
            f"`envs_per_worker` must be a positive int, or one positive int per worker, got "
            f"{envs_per_worker!r}."
        ) from None
    if sum(layout) != num_envs:
        raise ValueError(
            f"`envs_per_worker={list(envs_per_worker)!r}` gives {sum(layout)} envs in all, but "
            f"there are {num_envs} env factories; pass one count per worker adding up to "
            f"{num_envs}, or an int (workers of that many envs each)."
        )
    return layout


class _NotConnected:
    """The transport of a worker until its launcher connects it: refuses everything."""

    kind = "none"
    waiter: Any = None
    hot = False

    def encode(self, ticket: Any) -> Any:
        """Refused."""
        raise RuntimeError("the worker is not connected")

    def submit(self, ticket: Any, data: Any = None) -> None:
        """Refused."""
        raise RuntimeError("the worker is not connected")

    def forget(self, ticket: Any) -> None:
        """Nothing was sent."""

    def share_infos(self, specs: Any) -> None:
        """Nothing was sent."""

    def close(self) -> None:
        """Nothing to release."""


_NOT_CONNECTED = _NotConnected()
