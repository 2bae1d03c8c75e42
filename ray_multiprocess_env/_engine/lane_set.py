"""Every worker's lane (`Lane`) and pollers of sets of their pipes (`LaneSet`).

A lane is one worker on a hot transport (shared memory, or a TCP stream whose rows follow the
messages); `lanes.Lanes` makes a `LaneSet` of every worker's once all are hot. The steps and
resets of `lanes.py` wait for each worker in turn on its lane's own poller; the first-ready
calls of `first_ready_lanes.py` poll the pipes of all the workers they wait for at once.
"""

from __future__ import annotations

import select
from typing import Any

__all__ = ["Lane", "LaneSet", "Polled"]

#: A poller of some workers' pipes, with each descriptor's worker and its place among them.
Polled = tuple[Any, dict[int, int], dict[int, int]]

#: The most pollers a `LaneSet` keeps (one per set of workers waited on; then it starts over).
_POLLERS = 256


class Lane:
    """One worker's lane: its transport, what a step of all its envs needs, its pipe's poller."""

    __slots__ = ("envs", "generation", "poller", "start", "stop", "transport", "worker")

    def __init__(self, worker: Any) -> None:
        self.worker, self.generation, self.envs = worker.index, worker.generation, worker.envs
        self.transport: Any = worker.transport
        self.start, self.stop = worker.envs.start, worker.envs.stop
        self.poller = select.poll()  # (`Lanes.wait_held`)
        self.poller.register(self.transport.fileno(), select.POLLIN)


class LaneSet:
    """Every worker's lane, as made once all were hot, and pollers of sets of their pipes."""

    __slots__ = ("lanes", "pollers")

    def __init__(self, lanes: list[Lane]) -> None:
        self.lanes = lanes
        self.pollers: dict[int, Polled] = {}

    def polled(self, key: int) -> Polled:
        """A poller of the pipes of the workers in `key` (a bit each).

        With each descriptor's worker, and its place among those workers (ascending).
        """
        polled = self.pollers.get(key)
        if polled is None:
            poller = select.poll()
            worker_of: dict[int, int] = {}
            at: dict[int, int] = {}
            for lane in self.lanes:
                if key >> lane.worker & 1:
                    fd = lane.transport.fileno()
                    poller.register(fd, select.POLLIN)
                    worker_of[fd], at[fd] = lane.worker, len(at)
            if len(self.pollers) >= _POLLERS:  # (sets of workers seen: bounded)
                self.pollers = {}
            polled = self.pollers[key] = (poller, worker_of, at)
        return polled
