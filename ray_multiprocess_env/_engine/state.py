"""The call state of a vector env: closed or not, the pending `step_async`, what is in flight.

One tracker per engine (as gymnasium's ``AsyncVectorEnv`` keeps one state), checked first by
every entry point of every face.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

from ray_multiprocess_env._engine.transport import Ticket
from ray_multiprocess_env.errors import ClosedEnvError, NoPendingCallError, PendingCallError

__all__ = ["Call", "CallState"]


class Call:
    """One operation launched on some workers: a ticket per worker."""

    __slots__ = ("label", "op", "tickets")

    def __init__(self, op: str, label: str, tickets: list[Ticket]) -> None:
        self.op, self.label, self.tickets = op, label, tickets


class CallState:
    """Whether the vector env is closed, its pending `step_async`, its first-ready tickets."""

    def __init__(self) -> None:
        self.closed = False
        self.name = "vector env"  # the face's class name, for messages
        self.pending: Call | None = None  # the `step_async` waiting for its `step_wait`
        self.in_flight: list[tuple[Ticket, str]] = []  # first-ready tickets and what they are

    def check_open(self, name: str) -> None:
        """Raise `ClosedEnvError` naming `name` if the vector env is closed."""
        if self.closed:
            raise ClosedEnvError(f"`{name}` was called on a closed {self.name}; create a new one.")

    def check_idle(self, name: str, *, in_flight_ok: bool = False) -> None:
        """Raise if the vector env is closed or a call waits to be collected.

        `ClosedEnvError` after `close`; `PendingCallError` for a pending `step_async`, or (unless
        `in_flight_ok`) for first-ready calls in flight.
        """
        self.check_open(name)
        if self.pending is not None:
            raise PendingCallError(
                f"`{name}` was called while a `step_async` is pending; call `step_wait` first.",
                self.pending.op,
            )
        if self.in_flight and not in_flight_ok:
            raise PendingCallError(
                f"`{name}` was called while env(s) {self.busy_envs()} have calls in flight; "
                "`recv` them first.",
                "send",
            )

    def busy_envs(self) -> list[int]:
        """The envs with a first-ready call in flight, sorted."""
        return sorted(i for ticket, _ in self.in_flight for i in ticket.envs)

    def check_not_busy(self, env_ids: Iterable[int], then: str) -> None:
        """A ValueError naming the first of `env_ids` with a first-ready call in flight."""
        busy = set(self.busy_envs())
        for env in env_ids:
            if env in busy:
                raise ValueError(
                    f"env {env} already has a call in flight; `recv` its result before {then}."
                )

    def recv_size(self, batch_size: Any) -> int:
        """How many envs `recv` waits for (`batch_size`, or all in flight if None)."""
        self.check_open("recv")
        busy = len(self.busy_envs())
        if not busy:
            raise NoPendingCallError(
                "`recv` was called with nothing in flight; `send` actions (or `async_reset`) "
                "first.",
                "recv",
            )
        wanted = busy if batch_size is None else batch_size
        if isinstance(wanted, bool) or not isinstance(wanted, numbers.Integral) or wanted < 1:
            raise ValueError(f"`batch_size` must be a positive int or None, got {batch_size!r}.")
        return int(wanted)
