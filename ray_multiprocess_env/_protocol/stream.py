"""The TCP stream protocol, both ends: the handshake, rows as raw bytes, the worker's listener.

A worker on another node than the driver serves its operations over one TCP connection, framed
as on the pipes (`_protocol/pipes.py`). Before either side reads a pickle, each proves that it
holds the secret the driver handed the worker in a Ray call (`handshake_driver`,
`handshake_worker`: an HMAC-SHA256 challenge each way, fixed-size messages, nothing
deserialized). The worker listens on its node's address only, for its driver only: it accepts
connections until one passes the handshake, closes every other one (logged), and stops
listening as soon as its driver is in (`accept_driver`).

Every message on the stream is ``pickle + tail + trailer``: the trailer (8 bytes) is the tail's
length, and ``pickle.loads`` ignores what follows the pickle. The tail carries rows of arrays as
raw bytes in the layout of the shared memory (`pack_rows`, `unpack_rows`): a step's actions one
way, the observations, rewards, flags and info columns the worker wrote the other way, so no
row of numbers is pickled.

This module imports nothing of the driver side.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._protocol.pipes import Buffer

__all__ = [
    "Acceptor",
    "RowTarget",
    "accept_driver",
    "handshake_driver",
    "keep_alive",
    "listen",
    "pack_rows",
    "split_tail",
    "trailer",
    "unpack_rows",
]

logger = logging.getLogger(__name__)

#: What the worker sends first: the protocol's name and version.
MAGIC = b"RMENV/1\n"
_NONCE = 32  # bytes of a challenge
_DIGEST = hashlib.sha256().digest_size
#: Seconds a connection may take to pass the handshake before the worker closes it.
HANDSHAKE_S = 10.0
#: Connections the worker handles at once before it has found its driver (beyond that, the
#: oldest is closed for each new one).
_PENDING_MAX = 32
#: Seconds of silence after which the kernel probes the other end, between probes, and how many
#: unanswered probes (or seconds of unacknowledged data, x 1000 ms) mean it is gone.
_KEEPALIVE = (10, 5, 4)
_TRAILER = struct.Struct("<q")
_COUNT = struct.Struct("<i")
_ALL_ROWS = -1


class HandshakeError(ConnectionError):
    """The other end of a connection did not prove that it holds the secret."""


def _digest(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


# -- the handshake ------------------------------------------------------------------------------
def handshake_driver(sock: socket.socket, secret: bytes, deadline: float) -> None:
    """The driver's side: answer the worker's challenge, then check its answer to ours.

    Raises:
        HandshakeError: If the other end is not the worker holding `secret` (or says nothing
            before `deadline`).
    """
    hello = _recv_exact(sock, len(MAGIC) + _NONCE, deadline)
    if hello[: len(MAGIC)] != MAGIC:
        raise HandshakeError("the other end does not speak this protocol")
    nonce = os.urandom(_NONCE)
    sock.sendall(_digest(secret, b"driver", hello[len(MAGIC) :]) + nonce)
    proof = _recv_exact(sock, _DIGEST, deadline)
    if not hmac.compare_digest(proof, _digest(secret, b"worker", nonce)):
        raise HandshakeError("the other end does not hold this worker's secret")


def _recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HandshakeError("the other end said too little in time")
        sock.settimeout(left)
        try:
            chunk = sock.recv(size - len(data))
        except TimeoutError:
            raise HandshakeError("the other end said too little in time") from None
        if not chunk:
            raise HandshakeError("the other end closed the connection")
        data += chunk
    return data


# -- the worker's listener ----------------------------------------------------------------------
def listen(host: str, ports: tuple[int, int] | None) -> socket.socket:
    """A socket listening on `host` only, on a port the kernel picks or the first free of `ports`.

    Raises:
        OSError: If no port of `ports` is free (or `host` is not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    candidates = [0] if ports is None else list(range(ports[0], ports[1] + 1))
    error: OSError | None = None
    for port in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # (a restarted worker may take the port its predecessor's connection still holds)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(8)
            return sock
        except OSError as err:
            sock.close()
            error = err
    raise OSError(f"no port of {ports} is free on {host}: {error}")


class _Pending:
    """A connection in the middle of the worker's side of the handshake."""

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock, self.peer = sock, peer
        self.nonce = os.urandom(_NONCE)
        self.data = b""
        self.deadline = time.monotonic() + HANDSHAKE_S


def accept_driver(listener: socket.socket, secret: bytes, deadline: float) -> socket.socket | None:
    """The first connection to `listener` that proves it holds `secret`, or None at `deadline`.

    Connections are handled side by side, so a stranger that stays silent holds up nobody;
    one that fails (garbage, a wrong proof, a pickle: nothing is deserialized) is closed and
    logged. `listener` is closed before this returns: the driver is the only one let in.
    """
    selector = selectors.DefaultSelector()
    pending: dict[int, _Pending] = {}
    try:
        listener.setblocking(False)
        selector.register(listener, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            for fd, late in list(pending.items()):
                if now > late.deadline:
                    _refuse(selector, pending, fd, "it said too little in time")
            soonest = min([deadline, *(c.deadline for c in pending.values())])
            if now >= deadline:
                return None
            for key, _ in selector.select(max(0.0, soonest - now)):
                if key.fileobj is listener:
                    _accept(listener, selector, pending)
                    continue
                conn = pending.get(key.fd)
                if conn is None:  # (closed in this round: it gave way to a newer one)
                    continue
                driver = _advance(conn, secret)
                if driver:
                    selector.unregister(conn.sock)
                    del pending[key.fd]
                    conn.sock.setblocking(True)
                    return conn.sock
                if driver is False:
                    _refuse(selector, pending, key.fd, "it did not prove that it is the driver")
    finally:
        for conn in pending.values():
            conn.sock.close()
        selector.close()
        listener.close()


def _accept(listener: socket.socket, selector: Any, pending: dict[int, _Pending]) -> None:
    try:
        sock, peer = listener.accept()
    except OSError as err:  # (nothing waiting, or out of descriptors: the driver comes later)
        if not isinstance(err, (BlockingIOError, InterruptedError)):
            logger.warning("An env worker could not accept a connection: %s.", err)
            time.sleep(0.05)
        return
    if len(pending) >= _PENDING_MAX:  # the oldest gives way: strangers cannot keep the driver
        # out by filling every place before it comes (each new connection gets one)
        _refuse(selector, pending, next(iter(pending)), "too many; the oldest gave way")
    conn = _Pending(sock, peer)
    try:
        sock.setblocking(True)
        sock.settimeout(1.0)
        sock.sendall(MAGIC + conn.nonce)  # (a fresh socket's buffer takes these 40 bytes)
        sock.setblocking(False)
    except OSError:
        sock.close()
        return
    pending[sock.fileno()] = conn
    selector.register(sock, selectors.EVENT_READ)


def _advance(conn: _Pending, secret: bytes) -> bool | None:
    """Read what `conn` sent: True once it proved it is the driver, False if it failed."""
    try:
        chunk = conn.sock.recv(2 * _DIGEST - len(conn.data))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return False
    if not chunk:
        return False
    conn.data += chunk
    if len(conn.data) < 2 * _DIGEST:
        return None
    proof, nonce = conn.data[:_DIGEST], conn.data[_DIGEST:]
    if not hmac.compare_digest(proof, _digest(secret, b"driver", conn.nonce)):
        return False
    try:
        conn.sock.setblocking(True)
        conn.sock.settimeout(HANDSHAKE_S)
        conn.sock.sendall(_digest(secret, b"worker", nonce))
        conn.sock.settimeout(None)
    except OSError:
        return False
    return True


def _refuse(selector: Any, pending: dict[int, _Pending], fd: int, why: str) -> None:
    conn = pending.pop(fd)
    with contextlib.suppress(KeyError, ValueError):
        selector.unregister(conn.sock)
    conn.sock.close()
    logger.warning("Closed a connection from %s to an env worker's port: %s.", conn.peer, why)


class Acceptor:
    """`accept_driver` on a thread of its own, so the worker's env thread stays free.

    Ray calls to the worker go on meanwhile; if no driver gets in (a firewall), the thread
    gives up at the deadline and closes the listener.
    """

    def __init__(self, listener: socket.socket, secret: bytes, seconds: float) -> None:
        self._driver: socket.socket | None = None
        deadline = time.monotonic() + seconds
        self._thread = threading.Thread(
            target=self._run, args=(listener, secret, deadline), daemon=True
        )
        self._thread.start()

    def _run(self, listener: socket.socket, secret: bytes, deadline: float) -> None:
        self._driver = accept_driver(listener, secret, deadline)

    def driver(self, seconds: float) -> socket.socket | None:
        """The driver's connection once the handshake is done (None if none came)."""
        self._thread.join(seconds)
        return None if self._thread.is_alive() else self._driver


def keep_alive(sock: socket.socket) -> None:
    """Have the kernel notice, in about half a minute, that the other end's node is gone.

    A node that loses power sends no reset: without probes a wait with no `timeout` would wait
    forever for its worker, where a Ray call would raise ``ActorDiedError``.
    """
    idle, interval, count = _KEEPALIVE
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", (idle + interval * count) * 1000),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # (Linux; elsewhere the system's defaults)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


# -- rows as raw bytes --------------------------------------------------------------------------
def trailer(tail_size: int) -> bytes:
    """The last 8 bytes of a message whose tail has `tail_size` bytes."""
    return _TRAILER.pack(tail_size)


def split_tail(payload: bytes) -> memoryview:
    """The tail of a message's `payload` (empty if it has none)."""
    (size,) = _TRAILER.unpack_from(payload, len(payload) - _TRAILER.size)
    end = len(payload) - _TRAILER.size
    return memoryview(payload)[end - size : end]


def pack_rows(arrays: Sequence[np.ndarray], positions: Sequence[int] | None) -> list[Buffer]:
    """Rows `positions` (all if None) of each of `arrays` (C-contiguous), as a tail's parts."""
    if positions is None:
        return [_COUNT.pack(_ALL_ROWS), *(_bytes_of(a) for a in arrays)]
    index = np.asarray(positions, dtype=np.int32)
    return [_COUNT.pack(len(index)), index.tobytes(), *(a[index].tobytes() for a in arrays)]


class RowTarget:
    """An array whose rows a tail fills (its bytes seen flat, once, for whole copies)."""

    __slots__ = ("array", "flat", "row_size")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.flat = _bytes_of(array)
        self.row_size = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous `array`, seen flat (zero-size arrays included)."""
    if not array.flags.c_contiguous:
        raise ValueError("rows travel from and into C-contiguous arrays only")
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def unpack_rows(tail: memoryview, targets: Sequence[RowTarget]) -> int:
    """Copy the rows in `tail` into `targets`: how many of them it filled (a prefix).

    Raises:
        ValueError: If the tail does not end after a whole target.
    """
    (count,) = _COUNT.unpack_from(tail)
    offset, index = _COUNT.size, None
    if count != _ALL_ROWS:
        index = np.frombuffer(tail, np.int32, count, offset)
        offset += 4 * count
    filled = 0
    for target in targets:
        if offset >= len(tail):
            break
        size = len(target.flat) if index is None else target.row_size * count
        if offset + size > len(tail):
            break
        if index is None:
            target.flat[:] = tail[offset : offset + size]
        else:
            array = target.array
            rows = np.frombuffer(tail, array.dtype, size // array.itemsize, offset)
            array[index] = rows.reshape(count, *array.shape[1:])
        offset += size
        filled += 1
    if offset != len(tail):
        raise ValueError(f"a tail of {len(tail)} bytes does not end after a whole array")
    return filled
