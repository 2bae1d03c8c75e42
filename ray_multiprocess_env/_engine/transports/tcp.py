"""The TCP stream transport: a worker on another node served as on the driver's node.

A Ray actor call costs the driver about 0.4 ms (docs/cluster.md), five times a same-node
worker's round trip over shared memory. Ray places, restarts and controls the workers; the data
takes a TCP connection of the driver's own to each: the worker listens on its node's address
(`EnvWorker.listen`, a Ray call that also hands it a random secret), the driver connects, the
two prove to each other that they hold the secret (`_protocol/stream.py`), and the worker
serves the connection on the thread that built its envs (`EnvWorker.serve_stream`) exactly as it
serves pipes. The messages are framed as on the pipes and take the same buffers, waits and
interrupt guards (the driver's end is a `channel.ChannelTransport`).

The rows travel as raw bytes in the layout of the shared memory: the driver keeps the batch in
its own memory (`SharedBatch`, private), writes a step's actions there and sends them after the
doorbell; the worker keeps its rows in memory of its own (`WorkerRows.mirror`) and sends the
rows (and info columns) each call wrote after its reply, which the driver copies into the batch
as the reply is read (`StreamRows`). So the engine sees a worker on another node exactly as one
on shared memory, hot path included. Spaces with no fixed layout travel serialized, as over pipes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import ray

from ray_multiprocess_env._engine.transports.base import Ticket, remaining
from ray_multiprocess_env._engine.transports.channel import ChannelTransport, Link
from ray_multiprocess_env._engine.transports.shared_memory import SharedRows
from ray_multiprocess_env._protocol.shared_layout import ColumnBlock, SharedBatch
from ray_multiprocess_env._protocol.stream import (
    RowTarget,
    handshake_driver,
    keep_alive,
    pack_rows,
    split_tail,
    trailer,
    unpack_rows,
)

__all__ = [
    "PORTS_VARIABLE",
    "StreamRows",
    "Unreachable",
    "open_stream",
    "ports_from_environment",
    "tcp_transport",
]

#: The environment variable that sets the range of ports workers listen in (``first-last``).
PORTS_VARIABLE = "RAY_MULTIPROCESS_ENV_TCP_PORTS"
#: Seconds a worker waits for its driver to connect when the call has no deadline.
_ACCEPT_S = 60.0
#: Seconds the driver tries to reach a worker's port before it uses Ray calls to it instead.
_CONNECT_S = 10.0
_NO_TAIL = trailer(0)


class Unreachable(ConnectionError):
    """The worker's port could not be reached, or what answered failed the handshake."""


def ports_from_environment() -> tuple[int, int] | None:
    """The port range `PORTS_VARIABLE` sets, or None; a ValueError naming it if malformed."""
    value = os.environ.get(PORTS_VARIABLE, "").strip()
    if not value:
        return None
    first, _, last = value.partition("-")
    try:
        ports = (int(first), int(last or first))
    except ValueError:
        ports = (0, -1)
    if not 1 <= ports[0] <= ports[1] <= 65535:
        raise ValueError(
            f"the {PORTS_VARIABLE} environment variable must be a port range like "
            f"'50000-50100' (or one port), got {value!r}."
        )
    return ports


class StreamRows:
    """Rows ``span`` of `batch` (the driver's own memory) sent after the messages.

    A `base.Rows`: a step's actions after its doorbell, the rows each reply wrote after it
    (copied into the batch as it is read). With no `batch` (spaces with no fixed layout) the
    messages only carry the stream's framing (an empty tail).
    """

    shared = False

    def __init__(self, batch: SharedBatch | None, span: tuple[int, int]) -> None:
        self._span = span
        self._targets: list[RowTarget] = []  # what the rows after a reply fill, in order
        self._blocks: list[ColumnBlock] = []  # the driver's info columns, mapped once more
        self._mirror: Ticket | None = None
        self._rows: SharedRows | None = None
        self.leaf: Any = None
        if batch is None:
            return
        spaces = (batch.observation_space, batch.action_space)
        self._mirror = Ticket(-1, -1, "mirror", spaces, tuple(range(*span)))
        self._rows = rows = SharedRows(batch, span)  # (where actions are placed, as in memory)
        self.leaf, views = rows.leaf, rows.views
        arrays = [*views.observation_leaves, views.rewards, views.terminations]
        self._targets = [RowTarget(array) for array in (*arrays, views.truncations)]

    def handshake(self) -> Ticket | None:
        """The worker keeps its rows in memory of its own, in the batch's layout."""
        return self._mirror

    def place(self, actions: Any, positions: Any) -> bool:
        """Write a step's `actions` into the driver's rows (sent after the message)."""
        return self._rows is not None and self._rows.place(actions, positions)

    def message(self, head: bytes, positions: Any) -> bytes:
        """`head`, then the rows of actions placed (`positions`; all if None)."""
        parts = pack_rows(self._rows.views.action_leaves, positions)  # type: ignore[union-attr]
        size = sum(len(part) for part in parts)
        return b"".join([head, *parts, trailer(size)])

    def plain(self, data: bytes) -> bytes:
        """`data` with an empty tail."""
        return data + _NO_TAIL

    def take(self, payload: bytes) -> None:
        """Copy the rows after the reply `payload` into the batch."""
        tail = split_tail(payload)
        if len(tail):
            unpack_rows(tail, self._targets)

    def add_columns(self, specs: Sequence[dict[str, Any]]) -> bool:
        """Copy these columns' rows too, as the worker will send them (False: no layout)."""
        if self._rows is None:
            return False  # (no layout: infos travel in the replies)
        blocks = [ColumnBlock.attach(spec) for spec in specs]
        targets = []
        for block in blocks:
            for column in block.columns(*self._span):
                targets += [RowTarget(column.values), RowTarget(column.mask)]
        self._blocks += blocks
        self._targets += targets
        return True

    def close(self) -> None:
        """Let go of the rows and columns."""
        self._targets = []
        if self._rows is not None:
            self._rows.close()
        self._rows = self.leaf = None  # (`add_columns` maps no more)
        for block in self._blocks:
            with contextlib.suppress(BufferError):
                block.close()
        self._blocks = []


def tcp_transport(
    actor: Any,
    deadline: float | None,
    grace: float,
    batch: SharedBatch | None,
    span: tuple[int, int],
    columns: Sequence[dict[str, Any]] = (),
    ports: tuple[int, int] | None = None,
    spin_us: int = 0,
) -> ChannelTransport:
    """A TCP connection to one worker, with the rows of `span` of `batch` as raw bytes.

    Args:
        actor: The worker (`EnvWorker`).
        deadline: When connecting must be done by (None: 60 s for the worker to be reached).
        grace: Seconds to wait for Ray's word on a worker whose connection ended.
        batch: The driver's batch (None: the spaces have no layout; everything is pickled).
        span: The worker's rows of it.
        columns: The info columns made so far (`ColumnBlock` specs).
        ports: The range the worker listens in (None: a port the kernel picks).
        spin_us: How long the worker polls for its next message before it sleeps.

    Raises:
        Unreachable: If the worker's port cannot be reached (a firewall) within 10 s, or the
            other end does not prove it is the worker.
        RayError: If the worker cannot listen (no free port in `ports`) or is gone.
        TimeoutError: If the worker does not say where it listens by `deadline`.
    """
    rows = StreamRows(batch, span)
    return ChannelTransport.open(
        "tcp",
        lambda: open_stream(actor, deadline, ports, spin_us),
        grace,
        spin_us,
        rows,
        deadline,
        columns,
    )


def open_stream(
    actor: Any, deadline: float | None, ports: tuple[int, int] | None, spin_us: int
) -> Link:
    """Have the worker listen, connect, prove to each other who we are, and start its serving.

    Raises:
        Unreachable: If the worker's port cannot be reached or the other end fails the
            handshake (a firewall, another program on the port).
        TimeoutError: If the worker does not say where it listens by `deadline`.
    """
    secret = os.urandom(32)
    left = remaining(deadline)
    accept_s = _ACCEPT_S if left is None else left
    host, port = ray.get(actor.listen.remote(secret, ports, accept_s), timeout=remaining(deadline))
    until = time.monotonic() + min(_CONNECT_S, accept_s)
    try:
        sock = socket.create_connection((host, port), timeout=remaining(until))
    except OSError as err:
        raise Unreachable(f"{host}:{port}: {err}") from err
    try:
        handshake_driver(sock, secret, until)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        keep_alive(sock)
        sock.setblocking(False)
        serve_ref = actor.serve_stream.remote(spin_us)  # (the worker's acceptor let us in)
    except OSError as err:
        sock.close()
        raise Unreachable(f"{host}:{port}: {err}") from err
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # (closed as the pipes' ends are)
    return Link(fd, fd, serve_ref)
