"""Holding SIGINT back while bytes move or a call is launched (all or nothing).

A ``KeyboardInterrupt`` (Jupyter's "interrupt kernel") must never land half-way through moving
a message between the kernel and a link's buffers, nor between sending a call to some workers
and the rest; the few statements that do so run inside `deferred_interrupts`, and the
interrupt is delivered right after. A call on the workers' lanes holds interrupts back from its
first message to its last reply read, and lets them through only while it blocks in ``poll``
(`_DeferredInterrupts.poll`), where nothing is half done. A block that takes something out of
the call state to hand it to the user registers how to put it back
(`_DeferredInterrupts.undo_on_interrupt`): if a Ctrl-C ends the block, that runs before the
``KeyboardInterrupt`` is raised, with SIGINT still held back.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C functions: no enum conversions
import _thread
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["DEFERRED", "POLL_SLICE_MS", "deferred_interrupts"]

_SIGINT = int(signal.SIGINT)
_MAIN_THREAD = threading.main_thread().ident

#: The longest one ``poll`` blocks while it waits for workers. A SIGINT that comes after the
#: interpreter's last look at its signals and before the ``poll`` blocks (the moment the main
#: thread lets go of the GIL, when another thread's Ctrl-C is most likely to land) interrupts
#: nothing: Python runs its handler once the ``poll`` returns. So waits with no deadline, or a
#: far one, block in slices of this many milliseconds, and a Ctrl-C comes through after one.
POLL_SLICE_MS = 50


class _DeferredInterrupts:
    """See `deferred_interrupts`: one object, entered a few times per step (nested: counted).

    Only the main thread defers (a signal handler runs there); on other threads entering and
    leaving do nothing. The outermost block on the main thread swaps the SIGINT handler for
    one that records the signal, and puts the old one back when it ends.
    """

    __slots__ = ("_depth", "_open", "_previous", "_received", "_undo")

    def __init__(self) -> None:
        self._depth = 0  # nested blocks open on the main thread
        self._previous: Any = None  # the handler swapped out (None: none swapped)
        self._received: list[tuple[int, Any]] = []
        self._open = False  # inside `poll`: a SIGINT goes to `previous` at once
        self._undo: list[tuple[Callable[..., object], tuple[Any, ...]]] = []  # (see below)

    def __enter__(self) -> None:
        if _thread.get_ident() != _MAIN_THREAD:
            return
        if self._depth:
            self._depth += 1  # (a SIGINT now is recorded: the handler is ours)
            return
        if _signal.getsignal(_SIGINT) is None:  # a handler set from C: left alone
            self._previous = None
        else:
            self._received = []
            self._previous = _signal.signal(_SIGINT, self._record)  # (a SIGINT: recorded)
        self._depth = 1

    def _record(self, signum: int, frame: Any) -> None:
        if self._open:  # (blocked in `poll`, or between the statements around it)
            try:
                _deliver(self._previous, signum, frame)  # (a handler that returns: polls on)
            except BaseException:
                self._open = False  # (raised out of `poll`, maybe before its `finally`)
                raise
        else:
            self._received.append((signum, frame))

    def poll(self, poller: Any, timeout_ms: int | None) -> list[tuple[int, int]]:
        """``poller.poll(timeout_ms)``, with a SIGINT let through while it blocks.

        Call it in an outermost block, at a point where nothing is half done: a SIGINT
        recorded before, or one arriving meanwhile, goes to the handler swapped out (a
        ``KeyboardInterrupt``, by default) from here, at the latest `POLL_SLICE_MS` after it
        came. In a nested block, or where nothing was swapped, it is a plain ``poll``.
        """
        if self._depth != 1 or self._previous is None or _thread.get_ident() != _MAIN_THREAD:
            return poller.poll(timeout_ms)  # type: ignore[no-any-return]
        if timeout_ms is not None and timeout_ms < 0:
            timeout_ms = None  # (as ``poll``: no deadline)
        ends = None  # (the clock is read only once a slice passed with nothing ready)
        while True:  # (in slices: see `POLL_SLICE_MS`)
            received = self._received
            if received:
                self._received = []
                _deliver(self._previous, *received[0])
            last = timeout_ms is not None and timeout_ms <= POLL_SLICE_MS
            self._open = True
            try:
                ready: list[tuple[int, int]] = poller.poll(timeout_ms if last else POLL_SLICE_MS)
            finally:
                self._open = False
            if ready or last:
                return ready
            if timeout_ms is not None:  # (what is left, by the clock: slices run late)
                now = time.monotonic()
                if ends is None:
                    ends = now + (timeout_ms - POLL_SLICE_MS) / 1000
                timeout_ms = max(0, math.ceil((ends - now) * 1000))

    def undo_on_interrupt(self, undo: Callable[..., object], *args: Any) -> None:
        """Have ``undo(*args)`` run if this block ends by a Ctrl-C, before it is raised.

        For a block that takes something out of the call state to hand it to the user: a
        Ctrl-C held back meanwhile is raised at the block's end, and the result never reaches
        the user. The undo then runs while the guard still holds SIGINT back, so a second
        Ctrl-C (a key held down) cannot cut it short, as it could in an ``except`` clause
        after the block. It also runs if a `KeyboardInterrupt` is raised inside the block.

        The caller's ``except KeyboardInterrupt`` runs it too, so it must do nothing the second
        time: it is the only undo where nothing is held back (another thread, a handler set
        from C), and for a Ctrl-C that lands in the few bytecodes after the guard lets go.
        """
        if self._previous is not None and self._depth and _thread.get_ident() == _MAIN_THREAD:
            self._undo.append((undo, args))

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if _thread.get_ident() != _MAIN_THREAD:
            return
        previous = self._previous
        if self._depth > 1 or previous is None:
            self._depth -= 1
            return
        undo = self._undo
        if undo:
            self._undo = []
        if self._received or (undo and exc_type is not None):
            self._end(previous, exc_type, undo, ours=True)
            return
        self._depth = 0  # (the usual end: nothing to raise, nothing to undo)
        _signal.signal(_SIGINT, previous)  # (a SIGINT pending in it is recorded: still ours)
        self._previous = None  # from here on a SIGINT goes to `previous`
        if self._received:  # (came between the look above and the swap)
            self._end(previous, exc_type, undo, ours=False)

    def _end(self, previous: Any, exc_type: Any, undo: list[Any], ours: bool) -> None:
        """End the outermost block with a Ctrl-C to raise, or an undo to run if one comes out.

        Our handler is in (`ours`), or is put back in first: until it is swapped out again a
        Ctrl-C is only recorded, so one held down cannot cut the undo short. Blocks in the
        undo only count: the outermost stays open until then.
        """
        try:
            while True:
                if not ours:  # (a Ctrl-C landing just before it is in goes to `previous`)
                    _signal.signal(_SIGINT, self._record)
                    self._depth, self._previous = 1, previous  # (counted once ours is in)
                received = self._received
                if received:
                    self._received = []
                    _deliver(previous, *received[0])  # (a handler that returns: it stands)
                if undo and exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                    undo, pending = [], undo  # (raised in the block: it comes out too)
                    _run(pending)
                self._depth = 0
                _signal.signal(_SIGINT, previous)
                self._previous = None
                if not self._received:
                    return
                ours = False  # (one came between the look above and the swap: raised above)
        except BaseException:
            # Raised with our handler in and the block counted: the undo's own blocks only
            # count. Or raised by `previous` at a swap, the block not counted: they hold back.
            try:
                _run(undo)
            finally:  # (the handler put back whatever happens: else Ctrl-C would be dead)
                self._depth, self._received = 0, []
                _signal.signal(_SIGINT, previous)
                self._previous = None
            raise


def _run(undo: list[tuple[Callable[..., object], tuple[Any, ...]]]) -> None:
    """Run the undos of a block a Ctrl-C ends, the last registered first."""
    for function, args in reversed(undo):
        function(*args)


def _deliver(handler: Any, signum: int, frame: Any) -> None:
    """Run the SIGINT `handler` that was swapped out, as Python would have run it."""
    if callable(handler):
        handler(signum, frame)
    elif handler == _signal.SIG_DFL:
        raise KeyboardInterrupt


#: The guard itself (``with DEFERRED:``), for the hot path: `deferred_interrupts` returns it.
DEFERRED = _DeferredInterrupts()


def deferred_interrupts() -> _DeferredInterrupts:
    """Hold SIGINT back for a ``with`` block and deliver it after (main thread only).

    Nested blocks only count; the C-level ``_signal`` functions keep the outer one cheap (a
    few microseconds), since it runs a few times per step.
    """
    return DEFERRED
