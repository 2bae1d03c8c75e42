"""Holding SIGINT back while bytes move or a call is launched (all or nothing).

A ``KeyboardInterrupt`` (Jupyter's "interrupt kernel") must never land half-way through moving
a message between the kernel and a link's buffers, nor between sending a call to some workers
and the rest; the few statements that do so run inside `deferred_interrupts`, and the
interrupt is delivered right after.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C functions: no enum conversions
import _thread
import signal
import threading
from typing import Any

__all__ = ["deferred_interrupts"]

_SIGINT = int(signal.SIGINT)
_MAIN_THREAD = threading.main_thread().ident


class _DeferredInterrupts:
    """See `deferred_interrupts`; a plain class, as it is entered a few times per step."""

    __slots__ = ("_previous", "_received")
    _active = False  # whether the main thread is inside one already (nested ones do nothing)

    def __enter__(self) -> None:
        self._previous = None
        if _DeferredInterrupts._active or _thread.get_ident() != _MAIN_THREAD:
            return
        if _signal.getsignal(_SIGINT) is None:  # a handler set from C: leave it alone
            return
        self._received: list[tuple[int, Any]] = []
        self._previous = _signal.signal(_SIGINT, self._record)
        _DeferredInterrupts._active = True

    def _record(self, signum: int, frame: Any) -> None:
        self._received.append((signum, frame))

    def __exit__(self, *exc_info: object) -> None:
        previous = self._previous
        if previous is None:
            return
        _DeferredInterrupts._active = False
        _signal.signal(_SIGINT, previous)
        if self._received:
            if callable(previous):
                previous(*self._received[0])
            elif previous == _signal.SIG_DFL:
                raise KeyboardInterrupt


def deferred_interrupts() -> _DeferredInterrupts:
    """Hold SIGINT back for a ``with`` block and deliver it after (main thread only).

    Nested blocks do nothing; the C-level ``_signal`` functions keep the outer one cheap (a
    few microseconds), since it runs a few times per step.
    """
    return _DeferredInterrupts()
