"""Waiting on the tickets of any transports under one deadline, and on channels' descriptors.

Each kind of transport has its `Waiter`; the channels' (`CHANNELS`) polls the descriptors their
replies arrive on (`channel.ChannelTransport`), and writes what waits to be written.
"""

from __future__ import annotations

import select
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ray_multiprocess_env._engine.interrupts import POLL_SLICE_MS
from ray_multiprocess_env._engine.transports.base import Ticket, Waiter, remaining

if TYPE_CHECKING:
    from ray_multiprocess_env._engine.transports.channel import ChannelTransport

__all__ = ["CHANNELS", "wait_tickets"]

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


#: A poller of some channels, with their transports by descriptor (`_ChannelWaiter._last`).
_Polled = tuple[tuple["ChannelTransport", ...], Any, dict[int, "ChannelTransport"]]


class _ChannelWaiter:
    """Polls the reply descriptors of the tickets' transports (``poll``: any descriptor number)."""

    def __init__(self) -> None:
        self._last: _Polled | None = None

    def wait(self, tickets: Sequence[Ticket], deadline: float | None, min_count: int) -> None:
        channels = tuple(
            {id(t.transport): cast("ChannelTransport", t.transport) for t in tickets}.values()
        )
        count = len(tickets)
        while True:
            settled = 0
            for ticket in tickets:
                if ticket.outcome is not None:
                    settled += 1
            if settled >= min_count or settled == count:
                return
            live = tuple(c for c in channels if not c.broken)  # (a broken one stays ready)
            if not live:
                return  # (every ticket of theirs has its outcome)
            poller, readers, writers = self._poller(live)
            left = remaining(deadline)
            wait = POLL_SLICE_MS if left is None else min(int(left * 1000) + 1, POLL_SLICE_MS)
            ready = poller.poll(wait)  # (in slices, so that a Ctrl-C comes through)
            for fd, event in ready:
                writer = writers.get(fd)
                if writer is not None and (event & select.POLLOUT or fd not in readers):
                    writer.flush()
                reader = readers.get(fd)
                if reader is not None and (writer is None or event & ~select.POLLOUT):
                    reader.pump()
            if left is not None and left <= 0:
                return

    def _poller(
        self, channels: tuple[ChannelTransport, ...]
    ) -> tuple[Any, dict[int, ChannelTransport], dict[int, ChannelTransport]]:
        """A ``poll`` object for `channels` (the last one again when only the same read)."""
        writers = {c.write_fileno(): c for c in channels if c.wants_write}
        if not writers and self._last is not None and self._last[0] == channels:
            return self._last[1], self._last[2], writers
        poller, readers = select.poll(), {}
        for channel in channels:
            readers[channel.fileno()] = channel
            poller.register(channel.fileno(), select.POLLIN)
        for fd in writers:  # a message still half in its out-buffer (a socket reads too)
            poller.register(fd, select.POLLOUT | (select.POLLIN if fd in readers else 0))
        self._last = None if writers else (channels, poller, readers)
        return poller, readers, writers


#: The `Waiter` of every `ChannelTransport`.
CHANNELS = _ChannelWaiter()
