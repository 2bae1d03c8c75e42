"""Waiting on the tickets of any transports under one deadline."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ray_multiprocess_env._engine.transports.base import Ticket, Waiter, remaining

__all__ = ["wait_tickets"]

#: How long each kind of transport is waited on in turn when any of several may finish first.
_SLICE_S = 0.002


def wait_tickets(tickets: Sequence[Ticket], deadline: float | None, need: int) -> None:
    """Settle tickets (of any transports) until `need` are settled, or until `deadline`.

    Tickets with an outcome already count; each kind of transport is waited on by its own
    `Waiter`. When several kinds are open and only some tickets are needed (first-ready), they
    are waited on in turn in short slices; when all are needed, one kind after the other.
    """
    while True:
        open_tickets = [t for t in tickets if t.outcome is None]
        settled = len(tickets) - len(open_tickets)
        if settled >= need or not open_tickets:
            return
        groups: dict[int, tuple[Waiter, list[Ticket]]] = {}
        for ticket in open_tickets:
            assert ticket.transport is not None
            waiter = ticket.transport.waiter
            groups.setdefault(id(waiter), (waiter, []))[1].append(ticket)
        if len(groups) == 1:
            ((waiter, group),) = groups.values()
            waiter.wait(group, deadline, need - settled)
        elif need >= len(tickets):  # all of them: one kind after the other
            for waiter, group in groups.values():
                waiter.wait(group, deadline, len(group))
        else:  # the first to finish of any kind: take turns in short slices
            for waiter, group in groups.values():
                slice_end = time.monotonic() + _SLICE_S
                waiter.wait(group, slice_end if deadline is None else min(deadline, slice_end), 1)
        if deadline is not None and remaining(deadline) == 0:
            left = [t for t in tickets if t.outcome is None]
            if len(tickets) - len(left) < need and left:
                return
