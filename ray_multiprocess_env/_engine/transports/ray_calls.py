"""The Ray-call transport: each operation is a Ray actor call (workers on any node).

`RayCallTransport` calls an `EnvWorker`'s ``message`` with the bytes a TCP stream would carry
(`channel.encode_message`, `tcp.StreamRows`), and the worker answers with the stream's bytes:
a step's or reset's record, or a pickle, then the rows the call wrote. Once the worker keeps
its rows in the batch's layout (`use_rows`), a step's actions and results travel as raw rows
and the record is the reply, as on every other transport.

`ActorTransport` calls a plain env actor of the user's (one env each, e.g. made by
`make_remote_class`) by method name: an ``apply`` becomes a call of the env's method (or of the
actor's ``call`` method for names it lacks), and its single result is wrapped in a list so
every worker answers ``apply`` with one result per env.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

import ray
from ray.exceptions import RayError, RayTaskError

from ray_multiprocess_env._engine.transports import base
from ray_multiprocess_env._engine.transports.base import Outcome, Ticket, remaining
from ray_multiprocess_env._engine.transports.channel import encode_message
from ray_multiprocess_env._engine.transports.tcp import StreamRows

__all__ = ["ActorTransport", "RayCallTransport"]


class _RayWaiter:
    """Settles tickets whose object refs are ready (`ray.wait`)."""

    def wait(self, tickets: Sequence[Ticket], deadline: float | None, min_count: int) -> None:
        by_ref = {t.handle: t for t in tickets}
        refs = list(by_ref)
        if not refs:
            return
        wanted = max(1, min(min_count, len(refs)))
        ready, _ = ray.wait(refs, num_returns=wanted, timeout=remaining(deadline))
        if ready:
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = list({*ready, *more})
        for ref in ready:
            _settle(by_ref[ref])


_WAITER = _RayWaiter()


class _Answers(Protocol):
    def outcome(self, ticket: Ticket, value: Any) -> Outcome:
        """The outcome of `ticket`, whose call returned `value`."""


def _settle(ticket: Ticket) -> None:
    """Set the outcome of `ticket`, whose object ref is ready."""
    try:
        value = ray.get(ticket.handle, timeout=0)
    except RayTaskError as err:  # the actor's method raised
        ticket.outcome = Outcome(False, error=err)
    except RayError as err:  # the actor died, or its result was lost with it
        ticket.outcome = Outcome(False, error=err, died=True)
    else:
        ticket.outcome = cast(_Answers, ticket.transport).outcome(ticket, value)


class RayCallTransport:
    """Operations as Ray calls of an `EnvWorker` actor's ``message`` (module docstring).

    `rows`: the rows of the worker's envs in the driver's batch (None: everything pickled).
    """

    kind = "ray"
    waiter = _WAITER
    hot = False

    def __init__(self, actor: Any, rows: StreamRows | None = None) -> None:
        self.actor = actor
        self._rows = StreamRows(None, (0, 0)) if rows is None else rows
        self._in_rows = False  # the worker uses the rows: actions and results go in them
        self._lost: Outcome | None = None  # every reply's outcome once closed

    def use_rows(self, deadline: float | None) -> None:
        """Have the worker keep its rows in the batch's layout (`base.use_rows`).

        Raises:
            TimeoutError: If the worker does not answer by `deadline`.
            RemoteFailure: If it cannot.
        """
        self._in_rows = base.use_rows(self, self._rows, deadline)

    def encode(self, ticket: Ticket) -> bytes:
        """`ticket`'s operation as the stream's bytes (serialization errors are raised here)."""
        in_rows = ticket.shared_args and self._in_rows
        return encode_message(ticket.op, ticket.args, self._rows, in_rows)

    def submit(self, ticket: Ticket, data: Any = None) -> None:
        """Send `ticket`'s operation."""
        ticket.transport = self
        data = self.encode(ticket) if data is None else data
        ticket.handle = self.actor.message.remote(data)

    def outcome(self, ticket: Ticket, value: Any) -> Outcome:
        """The outcome of the reply `value` (bytes), its rows copied into the batch first.

        Once closed, lost with the worker, as a closed channel's tickets are (a restart sends
        them to the new one): the rows have nowhere to go.
        """
        return self._lost or base.outcome_of_reply(value, self._rows)

    def forget(self, ticket: Ticket) -> None:
        """Nothing to do: an unread result is dropped by Ray."""

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Nothing: infos travel in the replies."""

    def close(self) -> None:
        """Let go of the rows (replies read later settle as lost); Ray owns the connection."""
        cause = RuntimeError("the worker's Ray calls were closed")
        self._lost, self._in_rows = Outcome(False, error=cause, died=True), False
        self._rows.close()


class ActorTransport:
    """Operations as Ray calls of a plain env actor's own methods (see the module docstring)."""

    kind = "ray"
    waiter = _WAITER
    hot = False

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def encode(self, ticket: Ticket) -> None:
        """Nothing: Ray serializes the arguments when it sends them."""

    def submit(self, ticket: Ticket, data: Any = None) -> None:
        """Send `ticket`'s operation; answers the actor can give without a call settle at once."""
        ticket.transport = self
        op, args = ticket.op, ticket.args
        if op == "has_method":
            ticket.outcome = Outcome(True, [hasattr(self.actor, args[0])])
        elif op == "close" and not hasattr(self.actor, "close"):
            ticket.outcome = Outcome(True, None)
        elif op == "apply":
            method, (env_args,), (env_kwargs,) = args
            ticket.handle = self._call(ticket.envs[0], method, env_args, env_kwargs)
        else:
            ticket.handle = self._call(ticket.envs[0], op, (), {})

    def outcome(self, ticket: Ticket, value: Any) -> Outcome:
        """The outcome of the call's result `value`: one env's, in a list for ``apply``."""
        return Outcome(True, [value] if ticket.op == "apply" else value)

    def forget(self, ticket: Ticket) -> None:
        """Nothing to do: an unread result is dropped by Ray."""

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Nothing: infos travel in the results."""

    def close(self) -> None:
        """Nothing to release: Ray owns the connection."""

    def _call(self, env: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method == "call" and args and hasattr(self.actor, args[0]):
            method, args = args[0], args[1:]  # the actor's own method of that name
        if not hasattr(self.actor, method):
            builtin = method in ("call", "get_attr", "set_attr", "node_id", "is_wrapped")
            if builtin or not hasattr(self.actor, "call"):
                also = "" if builtin else " (nor a `call` method to reach it)"
                raise ValueError(
                    f"env {env}'s actor has no `{method}`{also}; build the actors with "
                    "`make_remote_class` (which adds `call`, `get_attr`, `set_attr` and "
                    "`node_id`) or define it on the actor class."
                )
            method, args = "call", (method, *args)
        try:
            return getattr(self.actor, method).remote(*args, **kwargs)
        except TypeError as err:  # Ray checks the arguments against the method's signature
            hint = (
                " Its actor has no `seed` method and its `reset` takes no `seed`: add a "
                "`seed(seed)` method or a `reset(seed=None)` to the actor class, or do not seed."
                if method == "reset" and "seed" in kwargs
                else ""
            )
            raise TypeError(
                f"env {env}: `{method}` does not accept these arguments ({err}).{hint}"
            ) from err
