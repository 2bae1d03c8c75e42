"""The framing of the pipes and the TCP stream: the driver's `Inbox` takes out whole messages only.

However the bytes arrive: one read may end inside a header, hold several messages, or part of one;
over a pipe and over a connected socket (the stream's), whose end may also be a reset. And what a
worker's reply becomes when it cannot be serialized.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading

import numpy as np
import pytest

from ray_multiprocess_env._protocol import status
from ray_multiprocess_env._protocol.infos import Piece
from ray_multiprocess_env._protocol.pipes import HEADER, Inbox, dumps, encode_result, loads


@pytest.fixture(params=["pipe", "socket"])
def pipe(request):
    """A pipe (or a connected socket pair) whose read end does not block, as the driver's are.

    ``(read fd, write fd)``.
    """
    if request.param == "pipe":
        read, write = os.pipe()
    else:
        ends = socket.socketpair()
        read, write = (end.detach() for end in ends)
    os.set_blocking(read, False)
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):  # (a test may have closed the write end)
            os.close(fd)


def _framed(seq: int, payload: bytes) -> bytes:
    return HEADER.pack(seq, len(payload)) + payload


@pytest.mark.parametrize("cut", range(1, HEADER.size + 5))
def test_a_message_cut_anywhere_comes_out_whole_once(pipe, cut):
    """The first read ends `cut` bytes in (inside the header, or inside the payload)."""
    read, write = pipe
    inbox = Inbox(contextlib.nullcontext)
    data = _framed(7, b"hello")
    os.write(write, data[:cut])
    first, ended = inbox.pump(read)
    assert not ended
    os.write(write, data[cut:] + _framed(8, b"") + _framed(9, b"again"))
    second, _ = inbox.pump(read)
    assert first + second == [(7, b"hello"), (8, b""), (9, b"again")]


def test_several_messages_in_one_read_then_the_end(pipe):
    read, write = pipe
    inbox = Inbox(contextlib.nullcontext)
    os.write(write, _framed(1, b"a") + _framed(2, b"bc"))
    assert inbox.pump(read) == ([(1, b"a"), (2, b"bc")], False)
    assert inbox.pump(read) == ([], False)  # nothing more yet
    os.write(write, _framed(3, b"d"))
    os.close(write)  # the worker is gone: its last message still comes out
    messages, ended = inbox.pump(read)
    if not ended:  # (the message came in a read of its own; the end is seen next)
        more, ended = inbox.pump(read)
        messages += more
    assert (messages, ended) == ([(3, b"d")], True)


def test_a_connection_reset_by_the_worker_is_its_end():
    """A socket reset (the worker's node lost, its process killed) ends the stream as EOF does."""
    driver, worker = socket.socketpair()
    driver.setblocking(False)
    worker.sendall(_framed(1, b"last"))
    # a close with unread data and SO_LINGER 0 sends a reset, not an orderly end
    driver.sendall(b"unread")
    worker.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    worker.close()
    inbox = Inbox(contextlib.nullcontext)
    messages, ended = inbox.pump(driver.fileno())
    if not ended:
        more, ended = inbox.pump(driver.fileno())
        messages += more
    assert ended
    assert messages in ([(1, b"last")], [])  # (a reset may discard what was not read yet)
    driver.close()


def test_numpy_scalars_come_back_with_their_type_and_bits():
    """`dumps` pickles numpy's common scalars by value (cheaper); each comes back exactly."""
    scalars = [
        np.float64(-0.128),
        np.float64(-0.0),
        np.float64("nan"),
        np.float32(-0.006000001),
        np.float32("-inf"),
        np.float16(1.5),
        np.int64(-(2**63)),
        np.uint64(2**64 - 1),
        np.int32(7),
        np.int8(-5),
        np.uint8(255),
        np.bool_(True),
        np.complex128(1 + 2j),  # (not by value: numpy's own reduction)
    ]
    infos = {0: {"x": scalars[0], "y": scalars[3]}, 1: {"flag": scalars[11]}}
    back_scalars, back_infos = loads(dumps((scalars, infos)))
    for sent, got in zip(scalars, back_scalars, strict=True):
        assert type(got) is type(sent)
        assert got.tobytes() == sent.tobytes()
    assert back_infos == infos
    assert type(back_infos[0]["y"]) is np.float32


@pytest.mark.parametrize("layout", ["per_env", "batched"])
def test_a_reply_that_cannot_be_serialized_keeps_the_other_envs_infos(layout):
    """An env whose info holds a lock is named; the reply of the others rides with the error.

    Worker envs 10, 11 and 12; env 11's info cannot be pickled. The error names env 11 only,
    and its `partial` is the same reply without env 11's infos (an info dict per env, or
    gymnasium's batched pieces), so a first-ready `recv` can hand out envs 10 and 12.
    """
    lock = threading.Lock()
    if layout == "per_env":
        infos: object = {0: {"a": 1}, 1: {"a": 2, "lock": lock}, 2: {"a": 3}}
    else:
        objects = np.empty(3, dtype=object)
        objects[:] = ["x", lock, "z"]
        pieces = [
            Piece(("a",), "typed", np.arange(3), np.array([1, 2, 3]), int),
            Piece(("o",), "object", np.arange(3), objects),
        ]
        infos = (pieces, 0)
    reply = status.Reply(None, None, None, None, infos, False)
    ok, (error, _) = loads(encode_result(True, reply, [10, 11, 12], "step"))
    assert not ok
    assert error.env_indices == [11]
    partial = error.partial
    if layout == "per_env":
        assert partial.infos == {0: {"a": 1}, 2: {"a": 3}}
    else:
        kept, written = partial.infos
        assert written == 0
        assert [piece.positions.tolist() for piece in kept] == [[0, 2], [0, 2]]
        assert kept[0].values.tolist() == [1, 3]
        assert kept[1].values.tolist() == ["x", "z"]
