"""Leave the env workers their cores: torch's intra-op threads in the driver, fitted.

A trainer's policy runs in the driver with torch, whose OpenMP threads (one per core by
default) keep spinning for a while after each forward pass, on the cores that this node's env
workers need. On a 2-core machine with 2 workers (HalfCheetah-v5, 16 envs, a 256-wide MLP)
that made the lockstep loop 0.65x to 0.8x as fast as with one torch thread (see
docs/performance.md).

So while vector envs have worker processes on the driver's node, and torch is imported with
more intra-op threads than the cores those workers leave to the driver, the library lowers
torch's threads to that many (one at least), says so in the log (at WARNING the first time, then
at INFO), and puts them back when the last of those vector envs closes (if nobody changed them
meanwhile). The user keeps torch's setting with the environment variable
``RAY_MULTIPROCESS_ENV_TORCH_THREADS=keep`` or by setting ``OMP_NUM_THREADS``; threads the user
sets after the library's fit stand (a later ``reset`` does not fit them again). The library
never imports torch itself.

Each call queues its request (no lock) and then settles the queue: one thread at a time, under
`_lock`, counts the workers and makes the torch calls (`_settle`). A signal handler that closes
envs while its own thread is settling (Ctrl-C during a ``reset``'s fit, with a handler that
calls ``close()``) only queues its request: the settle it interrupted takes it up as soon as the
handler returns, so ``close()`` never waits for its own thread. The bookkeeping is one tuple
(`_Book`), replaced whole, in an order that leaves torch's threads as recorded or as the user had
them wherever an exception (from a signal handler) stops a settle.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
from typing import Any, NamedTuple

from ray_multiprocess_env._engine.interrupts import deferred_interrupts

__all__ = [
    "TORCH_THREADS_VARIABLE",
    "add_workers",
    "fit_torch",
    "remove_workers",
    "usable_cores",
    "workers_counted",
]

logger = logging.getLogger(__name__)

#: The environment variable that keeps torch's threads as they are (``keep``).
TORCH_THREADS_VARIABLE = "RAY_MULTIPROCESS_ENV_TORCH_THREADS"
_POLICIES = ("auto", "keep")
_FIT_NOTE = (  # (short: why, and the numbers, are in docs/usage.md)
    "ray_multiprocess_env set torch's intra-op threads from %d to %d to leave %d env "
    "worker(s) their cores (%d usable); %s=keep stops it (the project's docs/usage.md)."
)


class _Request:
    """Count `count` more workers (fewer if negative); told apart by identity (`_Book.last`)."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


class _Book(NamedTuple):
    """What the library counted and changed, replaced as one tuple (whole at every bytecode)."""

    workers: int = 0  # worker processes of the open vector envs on the driver's node
    changed: tuple[int, int] | None = None  # (torch's threads before, the threads set)
    warned: bool = False  # the first change is a WARNING, later ones (envs made again) INFO
    last: _Request | None = None  # the request counted last (an interrupted settle: not twice)


_book = _Book()
_requests: collections.deque[_Request] = collections.deque()  # queued, not yet counted
_fit_asked = False  # a fit is queued too
_settler: int | None = None  # the thread working the queue off, while it does
_lock = threading.RLock()  # (re-entrant: a handler may come in while it is held, `_settler` unset)


def add_workers(count: int) -> None:
    """Count `count` more worker processes on the driver's node, then `fit_torch`.

    All or nothing: if it raises (a misspelt variable, even before torch is imported), the
    workers are not counted (and torch has its threads back).
    """
    _policy()
    _requests.append(_Request(count))
    try:
        _settle(fit=_fit_allowed())
    except BaseException:
        _requests.append(_Request(-count))
        _settle()
        raise


def remove_workers(count: int) -> None:
    """Count `count` fewer; after the last, give torch back the threads it had.

    Safe in a signal handler: if the handler interrupted its own thread's `fit_torch` (or count),
    that one finishes the work when the handler returns.
    """
    _requests.append(_Request(-count))
    _settle()


def workers_counted() -> int:
    """The worker processes of the open vector envs on the driver's node."""
    return _book.workers


def fit_torch() -> None:
    """Lower torch's intra-op threads to the cores the workers leave (module docstring)."""
    if _fit_allowed():
        _settle(fit=True)


def threads_left(workers: int) -> int:
    """The cores left to the driver beside `workers` busy worker processes (one at least)."""
    return max(1, usable_cores() - workers)


def _settle(fit: bool = False) -> None:
    """Work the queued requests (and a fit) off, unless this thread is at it already; then log."""
    global _fit_asked, _settler
    if fit:
        _fit_asked = True
    me = threading.get_ident()
    if _settler == me:
        return  # (a signal handler amid this thread's settle, which takes the requests up)
    notes: list[tuple[Any, ...]] = []
    with _lock:
        while _requests or _fit_asked:
            _settler = me
            try:
                _work_off(notes)
            except BaseException:  # (a handler that closed envs, then raised: its request too)
                with deferred_interrupts():
                    _work_off(notes)
                raise
            finally:
                _settler = None
    for note in notes:  # (outside the lock)
        logger.log(*note)


def _work_off(notes: list[tuple[Any, ...]]) -> None:
    """Count the queued requests, then fit torch if asked; `notes` gets what to log."""
    global _book, _fit_asked
    while _requests:
        request = _requests[0]
        if _book.last is not request:
            _book = _counted(_book, request, notes)
        _requests.popleft()
    if _fit_asked:
        _fit_asked = False
        _fit(notes)


def _counted(book: _Book, request: _Request, notes: list[tuple[Any, ...]]) -> _Book:
    """`book` after `request`; after the last worker, torch gets back the threads it had."""
    workers = max(0, book.workers + request.count)
    if workers or book.changed is None:
        return book._replace(workers=workers, last=request)
    before, now = book.changed
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() == now:  # (else the user changed it)
        torch.set_num_threads(before)
        notes.append((logging.INFO, "Gave torch back its %d intra-op threads.", before))
    return _Book(0, None, book.warned, request)


def _fit(notes: list[tuple[Any, ...]]) -> None:
    """Lower torch's threads to the cores that `_book.workers` leave, recorded first."""
    global _book
    book, torch = _book, sys.modules.get("torch")
    if not book.workers or torch is None or not hasattr(torch, "set_num_threads"):
        return
    threads, room = torch.get_num_threads(), threads_left(book.workers)
    if threads <= room or (book.changed is not None and threads != book.changed[1]):
        return  # (fits, or the user set the threads after the library's fit: theirs stand)
    before = threads if book.changed is None else book.changed[0]
    _book = book._replace(changed=(before, room), warned=True)  # (then never lowered unrecorded)
    torch.set_num_threads(room)
    level = logging.INFO if book.warned else logging.WARNING
    notes.append(
        (level, _FIT_NOTE, threads, room, book.workers, usable_cores(), TORCH_THREADS_VARIABLE)
    )


def _fit_allowed() -> bool:
    """Whether torch is imported and the user left its threads to the library."""
    if not hasattr(sys.modules.get("torch"), "set_num_threads"):
        return False
    return _policy() == "auto" and not os.environ.get("OMP_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - macOS and Windows


def _policy() -> str:
    value = os.environ.get(TORCH_THREADS_VARIABLE, "auto").strip().lower() or "auto"
    if value not in _POLICIES:
        raise ValueError(
            f"environment variable {TORCH_THREADS_VARIABLE}={value!r} is not one of "
            f"{_POLICIES}: use 'auto' (fit torch's threads to the cores the env workers leave) "
            "or 'keep' (leave torch's threads as they are)"
        )
    return value
