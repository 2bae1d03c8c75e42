"""The TCP stream transport: a worker on another node served as on the driver's node.

A Ray actor call costs the driver about 0.4 ms (docs/cluster.md), five times a same-node
worker's round trip over shared memory. Ray places, restarts and controls the workers; the data
takes a TCP connection of the driver's own to each: the worker listens on its node's address
(`EnvWorker.listen`, a Ray call that also hands it a random secret), the driver connects, the
two prove to each other that they hold the secret (`_protocol/stream.py`), and the worker
serves the connection on the thread that built its envs (`EnvWorker.serve_stream`) exactly as it
serves pipes. The messages are framed as on the pipes and take the same buffers, waits and
interrupt guards (`PipeTransport`).

The rows travel as raw bytes in the layout of the shared memory: the driver keeps the batch in
its own memory (`SharedBatch`, private), writes a step's actions there and sends them after the
doorbell; the worker keeps its rows in memory of its own (`WorkerRows.mirror`) and sends the
rows (and info columns) each call wrote after its reply, which the driver copies into the batch
as the reply is read. So the engine sees a worker on another node exactly as one on shared
memory, hot path included. Spaces with no fixed layout travel serialized, as over pipes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import ray

from ray_multiprocess_env._engine.interrupts import deferred_interrupts
from ray_multiprocess_env._engine.transports.base import Outcome, Ticket, remaining
from ray_multiprocess_env._engine.transports.pipes import PipeTransport
from ray_multiprocess_env._engine.transports.shared_memory import (
    INFOS,
    NOTHING,
    OTHER,
    SharedMemoryTransport,
)
from ray_multiprocess_env._protocol.pipes import dumps
from ray_multiprocess_env._protocol.shared_layout import ColumnBlock, SharedBatch
from ray_multiprocess_env._protocol.status import DOORBELL, RECORD, code_of, is_record
from ray_multiprocess_env._protocol.stream import (
    RowTarget,
    handshake_driver,
    keep_alive,
    pack_rows,
    split_tail,
    trailer,
    unpack_rows,
)
from ray_multiprocess_env.errors import RemoteFailure

__all__ = ["PORTS_VARIABLE", "TcpTransport", "Unreachable", "ports_from_environment"]

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


class TcpTransport(SharedMemoryTransport):
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

    kind = "tcp"

    def __init__(
        self,
        actor: Any,
        deadline: float | None,
        grace: float,
        batch: SharedBatch | None,
        span: tuple[int, int],
        columns: Sequence[dict[str, Any]] = (),
        ports: tuple[int, int] | None = None,
        spin_us: int = 0,
    ) -> None:
        self._ports, self._span = ports, span
        self._targets: list[RowTarget] = []  # what the rows after a reply fill, in order
        self._blocks: list[ColumnBlock] = []  # the driver's info columns, mapped once more
        PipeTransport.__init__(self, actor, deadline, grace, spin_us)
        try:
            if batch is None:
                self._views, self._leaf, self._actions_shared = None, None, False  # type: ignore[assignment]
                return
            spaces = (batch.observation_space, batch.action_space)
            mirror = Ticket(-1, -1, "mirror", spaces, tuple(range(*span)))
            self._use_rows(batch, span, mirror, deadline)
            views = self._views
            arrays = [*views.observation_leaves, views.rewards, views.terminations]
            self._targets = [RowTarget(array) for array in (*arrays, views.truncations)]
            if columns:
                self.share_infos(columns)
        except BaseException:  # half made: the connection closed, so the worker's serving ends
            self.close()
            raise

    def _connect(self, actor: Any, deadline: float | None, spin_us: int) -> tuple[int, int, Any]:
        """Have the worker listen, connect, and prove to each other who we are.

        Raises:
            Unreachable: If the worker's port cannot be reached or the other end fails the
                handshake (a firewall, another program on the port).
            TimeoutError: If the worker does not say where it listens by `deadline`.
        """
        secret = os.urandom(32)
        left = remaining(deadline)
        accept_s = _ACCEPT_S if left is None else left
        host, port = ray.get(
            actor.listen.remote(secret, self._ports, accept_s), timeout=remaining(deadline)
        )
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
        except OSError as err:
            sock.close()
            raise Unreachable(f"{host}:{port}: {err}") from err
        except BaseException:
            sock.close()
            raise
        serve_ref = actor.serve_stream.remote(spin_us)  # (the worker's acceptor let us in already)
        fd = sock.detach()  # (closed as the pipes' ends are)
        return fd, fd, serve_ref

    def encode(self, ticket: Ticket) -> bytes:
        """The operation; a step's actions that fit the rows' layout follow it as raw rows."""
        if ticket.shared_args and self._actions_shared:
            actions, positions = ticket.args
            if self._place(actions, positions):
                head = DOORBELL if positions is None else dumps((ticket.op, (None, positions)))
                return self._with_actions(head, positions)
        return self.encode_op(ticket.op, ticket.args)

    def encode_op(self, op: str, args: Any) -> bytes:
        """The message of `op` with `args`, pickled, and no rows after it."""
        return dumps((op, args)) + _NO_TAIL

    def _with_actions(self, head: bytes, positions: Any) -> bytes:
        parts = pack_rows(self._views.action_leaves, positions)
        size = sum(len(part) for part in parts)
        return b"".join([head, *parts, trailer(size)])

    def _doorbell(self) -> bytes:
        """The doorbell of a step of every env, its actions (in the driver's rows) after it."""
        return self._with_actions(DOORBELL, None)

    def _received(self, seq: int, payload: bytes) -> None:
        """Copy the rows after the reply into the batch, then settle the ticket.

        The rows are copied for a ticket given up on too: a worker on shared memory would have
        written them there.
        """
        try:
            tail = split_tail(payload)
            if len(tail):
                unpack_rows(tail, self._targets)
        except Exception as err:  # (not from this library's worker; the others still settle)
            ticket = self._waiting.pop(seq, None)
            if ticket is not None:
                cause = RemoteFailure(err, f"the worker's rows did not fit the batch: {err}")
                ticket.outcome = Outcome(False, error=cause)
            return
        super()._received(seq, payload)

    def read_lane(self) -> int:
        """`SharedMemoryTransport.read_lane`: the rows after the record go into the batch."""
        messages, ended = self._inbox.read(self._done)
        if len(messages) == 1 and not ended and self._unsettled is None:
            seq, payload = messages[0]
            if seq == self._seq and is_record(payload) and self._rows_in(payload):
                code = code_of(*RECORD.unpack_from(payload))
                if code >= 0:
                    self._answered = seq
                    if self._waiting:
                        self._settle_lane(seq, code)
                    return code
                if self._take_infos(seq, payload):
                    return INFOS
        elif not messages and not ended:
            return NOTHING
        self._leave(messages, ended)
        return OTHER

    def _rows_in(self, payload: bytes) -> bool:
        """Copy the rows after a reply into the batch; False if they do not fit.

        (`settle` has `_received` say what is wrong then.)
        """
        try:
            tail = split_tail(payload)
            if len(tail):
                unpack_rows(tail, self._targets)
        except Exception:
            return False
        return True

    def share_infos(self, specs: Sequence[dict[str, Any]]) -> None:
        """Have the worker send numeric infos as columns, copied into the driver's columns."""
        if self._views is None:
            return  # (no layout: infos travel in the replies)
        blocks = [ColumnBlock.attach(spec) for spec in specs]
        targets = []
        for block in blocks:
            for column in block.columns(*self._span):
                targets += [RowTarget(column.values), RowTarget(column.mask)]
        with deferred_interrupts():  # the targets and the worker's columns agree, or neither
            self._blocks += blocks
            self._targets += targets
            super().share_infos(specs)

    def close(self) -> None:
        """Close the connection and let go of the rows and columns."""
        super().close()
        self._targets = []
        for block in self._blocks:
            with contextlib.suppress(BufferError):
                block.close()
        self._blocks = []
