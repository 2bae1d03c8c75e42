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
        open_tickets: list[Ticket] = []
        waiter: Waiter | None = None
        mixed = False
        for ticket in tickets:
            if ticket.outcome is None:
                open_tickets.append(ticket)
                assert ticket.transport is not None
                kind = ticket.transport.waiter
                mixed |= waiter is not None and kind is not waiter
                waiter = kind
        settled = len(tickets) - len(open_tickets)
        if settled >= need or not open_tickets:
            return
        if not mixed:  # one kind of transport (the usual case)
            assert waiter is not None
            waiter.wait(open_tickets, deadline, need - settled)
        else:
            _wait_mixed(open_tickets, deadline, need - settled, need >= len(tickets))
        if deadline is not None and remaining(deadline) == 0:
            left = [t for t in tickets if t.outcome is None]
            if len(tickets) - len(left) < need and left:
                return


def _wait_mixed(open_tickets: list[Ticket], deadline: float | None, need: int, all_: bool) -> None:
    """Wait on tickets of several kinds of transport.

    One kind after the other if `all_` are needed, else (first-ready) in turn in short slices.
    """
    groups: dict[int, tuple[Waiter, list[Ticket]]] = {}
    for ticket in open_tickets:
        assert ticket.transport is not None
        waiter = ticket.transport.waiter
        groups.setdefault(id(waiter), (waiter, []))[1].append(ticket)
    if all_:
        for waiter, group in groups.values():
            waiter.wait(group, deadline, len(group))
    else:
        for waiter, group in groups.values():
            slice_end = time.monotonic() + _SLICE_S
            waiter.wait(group, slice_end if deadline is None else min(deadline, slice_end), 1)
