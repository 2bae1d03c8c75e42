"""Waiting on tickets of either transport under one deadline."""

from __future__ import annotations

import time

from ray_multiprocess_env._engine.pipes import wait_pipes
from ray_multiprocess_env._engine.transport import RayLink, Ticket, remaining

__all__ = ["deadline_in", "wait_tickets"]


def deadline_in(seconds: float | None) -> float | None:
    """The monotonic time `seconds` from now, or None for no deadline."""
    return None if seconds is None else time.monotonic() + seconds


def wait_tickets(tickets: list[Ticket], deadline: float | None, need: int) -> None:
    """Settle tickets (over pipes and Ray calls alike) until `need` are settled or `deadline`."""
    while True:
        open_tickets = [t for t in tickets if t.outcome is None]
        settled = len(tickets) - len(open_tickets)
        if settled >= need or not open_tickets:
            return
        pipes = [t for t in open_tickets if t.link.kind == "pipe"]
        rays = [t for t in open_tickets if t.link.kind == "ray"]
        if pipes and rays:
            if need >= len(tickets):  # all of them: the pipes, then the Ray calls
                wait_pipes(pipes, deadline, len(pipes))
                RayLink.wait(rays, deadline, len(rays))
            else:  # the first to finish of either kind: take turns in short slices
                slice_end = time.monotonic() + 0.002
                wait_pipes(pipes, slice_end if deadline is None else min(deadline, slice_end), 1)
                RayLink.wait(rays, time.monotonic() + 0.002, 1)
        elif pipes:
            wait_pipes(pipes, deadline, need - settled)
        else:
            RayLink.wait(rays, deadline, need - settled)
        if deadline is not None and remaining(deadline) == 0:
            open_left = [t for t in tickets if t.outcome is None]
            if len(tickets) - len(open_left) < need and open_left:
                return
