"""The worker's loop: read a message, answer it, look for the next one a while before sleeping.

One loop serves the pipes (`serve`), the shared memory's doorbells (a pipe too) and the TCP
stream (`serve_fds` on one socket). Its messages are framed as `_protocol.pipes` says.

A worker that blocks in ``read`` must be woken by the kernel for each message, and a core left
idle meanwhile runs the next env steps slower. So after each answer the loop polls for the next
message (``poll`` with a zero timeout) before it blocks: for at least `spin_us`, and for longer
when its recent messages came later than that (`poll_plan`). The gap it expects is a running
mean of the time from each answer to the next message (each gap counted as four longest polls at
most, so one long pause does not weigh for long). It polls half as long again as that mean, up
to the longest poll: `POLL_STRETCH` times `spin_us` (at most `POLL_MOST_NS`, unless `spin_us`
itself is more). A mean past that but no longer than two longest polls gets a poll until half a
longest poll after the next message is due (2.5 longest polls at most). A longer mean gets
`spin_us` only: a poll would catch few of those messages. A driver whose policy takes a few
hundred microseconds between steps (a torch MLP) is caught by the stretch, one whose trainer
takes about a millisecond (a larger policy, or PPO's work around its forward pass) by the
longer poll, and one that answers within tens of microseconds by `spin_us` itself. The driver
decides `spin_us` (`_engine.worker_spin`): 0 never polls.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Sequence

from ray_multiprocess_env._protocol.pipes import HEADER, Buffer

__all__ = ["POLL_MOST_NS", "POLL_STRETCH", "poll_plan", "serve", "serve_fds", "write_all"]

#: The longest poll, in times `spin_us`: where half as long again as the mean gap fits in it.
POLL_STRETCH = 10
#: The longest a poll lasts (ns), unless `spin_us` alone is longer.
POLL_MOST_NS = 100_000_000
#: A gap counts in the mean as this many times the longest poll at most.
_GAP_MOST = 4


def poll_plan(gap: int, least: int, most: int) -> int:
    """How long (ns) a worker polls for its next message after its answer, before it sleeps.

    `gap`: the mean time from an answer to the next message; `least`, `most`: the shortest
    and the longest poll. Half as long again as `gap` if that is within `most` (and at least
    `least`). A gap of up to two longest polls gets a poll until half a longest poll after
    its message is due, if that is within `POLL_MOST_NS`: a trainer that takes about a
    millisecond between steps sits just past the longest poll (1 ms with ``auto``), where a
    mean drifting to and fro would have its workers poll at one step and sleep at the next.
    A longer gap gets `least`: a poll would catch few of its messages.
    """
    wanted = gap + (gap >> 1)
    if wanted <= most:
        return max(least, wanted)
    until = gap + (most >> 1)
    if gap <= 2 * most and until <= POLL_MOST_NS:
        return max(least, until)
    return least


def serve(
    go: str,
    done: str,
    respond: Callable[[int, bytes], Sequence[Buffer]],
    spin_us: int = 0,
) -> None:
    """Answer the messages read from the named pipe `go` with `respond`'s, on `done`.

    Returns when the driver closes its end (or dies). Call it on the thread that built the
    envs: it holds that thread for as long as the pipes are open. `spin_us`: see `serve_fds`.
    """
    done_fd = os.open(done, os.O_WRONLY)  # the driver holds the read end open already
    go_fd = os.open(go, os.O_RDONLY)  # returns once the driver opens its write end
    try:
        serve_fds(go_fd, done_fd, respond, spin_us)
    finally:
        os.close(go_fd)
        os.close(done_fd)


def serve_fds(
    go_fd: int,
    done_fd: int,
    respond: Callable[[int, bytes], Sequence[Buffer]],
    spin_us: int = 0,
) -> None:
    """Answer each message read from `go_fd` with what `respond` makes of it, on `done_fd`.

    Both descriptors block (they may be one socket). After each answer, the loop polls for the
    next message before it blocks in ``read``: for `spin_us` microseconds, or longer when the
    recent messages came later (the module docstring); 0 never polls. Returns at the end of
    the input, or when the driver goes away mid-message.
    """
    pending = b""  # what was read beyond the last whole message
    scratch = bytearray(1 << 16)  # (``os.read`` would allocate its size at every read)
    least, poll, clock = spin_us * 1000, None, time.monotonic_ns
    if least:
        poller = select.poll()
        poller.register(go_fd, select.POLLIN)
        poll = poller.poll
    most = max(least, min(POLL_STRETCH * least, POLL_MOST_NS))
    budget = gap = least  # this poll's length; the mean time from an answer to the next message
    answered = 0
    try:
        while True:
            if poll is not None:
                answered = clock()
                if not pending:
                    until = answered + budget
                    while not poll(0) and clock() < until:
                        pass
            while len(pending) < HEADER.size:  # a whole message, usually in one read
                count = os.readv(go_fd, [scratch])
                if not count:
                    return  # the driver closed its end (or died)
                pending += scratch[:count]
            seq, size = HEADER.unpack_from(pending)
            end = HEADER.size + size
            if len(pending) < end:
                rest = _read_exact(go_fd, end - len(pending))
                if rest is None:
                    return
                pending += rest
            payload, pending = pending[HEADER.size : end], pending[end:]
            if poll is not None:  # (a mean over about the last 8 messages)
                gap += (min(clock() - answered, _GAP_MOST * most) - gap) >> 3
                budget = poll_plan(gap, least, most)
            write_all(done_fd, respond(seq, payload))
    except OSError:
        return  # the driver went away mid-message


def _read_exact(fd: int, size: int) -> bytes | None:
    """Read exactly `size` bytes from a blocking `fd`, or None at end of file."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, buffers: Sequence[Buffer]) -> None:
    """Write all of `buffers`, in order, to a blocking `fd`."""
    total = sum(len(b) for b in buffers)
    written = os.writev(fd, buffers) if len(buffers) > 1 else os.write(fd, buffers[0])
    if written == total:
        return
    view = memoryview(b"".join(buffers))[written:]  # (a signal cut the write short)
    while view:
        view = view[os.write(fd, view) :]
