"""The transports' common shape, and the Ray-call transport.

A transport carries one worker's operations (``step``, ``reset``, ``apply``, ...) and their
replies. Each operation sent is a `Ticket`; its `Outcome` is a value (a result, an env error, or
the worker's death), never an exception thrown across the engine. Two transports exist:

* `RayLink`: a Ray actor call per operation (any node; the only one for plain actors).
* `PipeLink` (`pipes.py`): same-node named pipes, served on the worker's env thread.

Both have ``encode(ticket)``, ``submit(ticket)``, ``forget(ticket)``, ``detached(op, value)``
and ``close()``;
`wait.wait_tickets` waits on tickets of either kind under one deadline.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import ray
from ray.exceptions import RayError, RayTaskError

__all__ = ["Outcome", "RayLink", "Ticket", "remaining"]


class Outcome(NamedTuple):
    """What became of one ticket: ``ok`` with `value`, or `error` (`died`: the worker is gone)."""

    ok: bool
    value: Any = None
    error: BaseException | None = None
    died: bool = False


class Ticket:
    """One operation sent to one worker (`slot`, as it was in `generation`)."""

    __slots__ = ("args", "envs", "generation", "handle", "link", "op", "outcome", "slot")

    def __init__(
        self, slot: int, generation: int, op: str, args: tuple[Any, ...], envs: tuple[int, ...]
    ) -> None:
        self.slot, self.generation, self.op, self.args, self.envs = (
            slot,
            generation,
            op,
            args,
            envs,
        )
        self.link: Any = None
        self.handle: Any = None  # a Ray object ref, or a pipe's sequence number
        self.outcome: Outcome | None = None


def remaining(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (never negative), or None for no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class RayLink:
    """Operations as Ray actor calls: to an `EnvWorker` (``batched``) or a plain env actor.

    A plain actor holds one env and is called by method name: ``apply`` becomes a call of the
    env's method (or of the actor's ``call`` method for names it lacks), and its single result
    is wrapped in a list so every worker answers ``apply`` with one result per env.
    """

    kind = "ray"

    def __init__(self, actor: Any, batched: bool) -> None:
        self.actor, self.batched = actor, batched

    @staticmethod
    def encode(ticket: Ticket) -> None:
        """Nothing: Ray serializes the arguments when it sends them."""

    def submit(self, ticket: Ticket, data: None = None) -> None:
        """Send `ticket`'s operation; a plain actor's local answers settle it at once."""
        ticket.link = self
        if self.batched:
            ticket.handle = self.actor.handle.remote(ticket.op, ticket.args)
            return
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

    def settle(self, ticket: Ticket) -> None:
        """Set the outcome of `ticket`, whose object ref is ready."""
        try:
            value = ray.get(ticket.handle, timeout=0)
        except RayTaskError as err:  # the env (or the actor's method) raised
            ticket.outcome = Outcome(False, error=err)
        except RayError as err:  # the actor died, or its result was lost with it
            ticket.outcome = Outcome(False, error=err, died=True)
        else:
            wrap = not self.batched and ticket.op == "apply"
            ticket.outcome = Outcome(True, [value] if wrap else value)

    @staticmethod
    def detached(op: str, value: Any) -> Any:
        """`value` itself: Ray's results are the caller's own."""
        return value

    def forget(self, ticket: Ticket) -> None:
        """Drop interest in `ticket` (its reply, when it comes, is ignored)."""

    def close(self) -> None:
        """Nothing to release: Ray owns the connection."""

    @staticmethod
    def wait(tickets: list[Ticket], deadline: float | None, min_count: int) -> None:
        """Settle tickets whose refs are ready; wait for at least `min_count` of them."""
        by_ref = {t.handle: t for t in tickets}
        refs = list(by_ref)
        if not refs:
            return
        wanted = max(0, min(min_count, len(refs)))
        ready, _ = ray.wait(refs, num_returns=max(wanted, 1), timeout=remaining(deadline))
        if ready:
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = list({*ready, *more})
        for ref in ready:
            ticket = by_ref[ref]
            ticket.link.settle(ticket)
