"""Every worker's lane (`Lane`) and pollers of sets of their pipes (`LaneSet`).

A lane is one worker on a hot transport (shared memory, or a TCP stream whose rows follow the
messages); `lanes.Lanes` makes a `LaneSet` of every worker's once all are hot, and the steps
and resets of `lanes.py` and `first_ready_lanes.py` poll the pipes of the workers they call
through it.
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
    """One worker's lane: its transport, and what a step of all of its envs needs."""

    __slots__ = ("envs", "generation", "start", "stop", "transport", "worker")

    def __init__(self, worker: Any) -> None:
        self.worker, self.generation, self.envs = worker.index, worker.generation, worker.envs
        self.transport: Any = worker.transport
        self.start, self.stop = worker.envs.start, worker.envs.stop


class LaneSet:
    """Every worker's lane, as made once all were hot, and pollers of sets of their pipes."""

    __slots__ = ("every", "every_key", "lanes", "pollers")

    def __init__(self, lanes: list[Lane]) -> None:
        self.lanes = lanes
        self.pollers: dict[int, Polled] = {}
        self.every_key = (1 << len(lanes)) - 1
        self.every = self.polled(self.every_key)  # (of all of them: the full step's)

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
                self.pollers = {self.every_key: self.pollers[self.every_key]}
            polled = self.pollers[key] = (poller, worker_of, at)
        return polled
