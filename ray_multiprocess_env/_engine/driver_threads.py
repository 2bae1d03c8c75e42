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
"""

from __future__ import annotations

import logging
import os
import sys
import threading

__all__ = ["TORCH_THREADS_VARIABLE", "add_workers", "fit_torch", "remove_workers"]

logger = logging.getLogger(__name__)

#: The environment variable that keeps torch's threads as they are (``keep``).
TORCH_THREADS_VARIABLE = "RAY_MULTIPROCESS_ENV_TORCH_THREADS"
_POLICIES = ("auto", "keep")

_lock = threading.Lock()
_workers_here = 0  # worker processes of the open vector envs on the driver's node
_changed: tuple[int, int] | None = None  # (torch's threads before, the threads set)
_warned = False  # the first change is a WARNING, later ones (envs made again) INFO


def add_workers(count: int) -> None:
    """Count `count` more worker processes on the driver's node, then `fit_torch`.

    All or nothing: if it raises (a misspelt variable, even before torch is imported), the
    workers are not counted.
    """
    global _workers_here
    _policy()
    with _lock:
        _workers_here += count
    try:
        fit_torch()
    except BaseException:
        with _lock:
            _workers_here -= count
        raise


def remove_workers(count: int) -> None:
    """Count `count` fewer; after the last, give torch back the threads it had."""
    global _workers_here, _changed
    with _lock:
        _workers_here = max(0, _workers_here - count)
        if _workers_here or _changed is None:
            return
        (before, now), _changed = _changed, None
        torch = sys.modules.get("torch")
        if torch is not None and torch.get_num_threads() == now:  # (else the user changed it)
            torch.set_num_threads(before)
            logger.info("Gave torch back its %d intra-op threads.", before)


def fit_torch() -> None:
    """Lower torch's intra-op threads to the cores the workers leave (module docstring)."""
    global _changed, _warned
    torch = sys.modules.get("torch")
    if torch is None or not _workers_here or not hasattr(torch, "set_num_threads"):
        return
    if _policy() == "keep" or os.environ.get("OMP_NUM_THREADS"):
        return
    with _lock:
        workers = _workers_here
        threads, room = torch.get_num_threads(), threads_left(workers)
        if threads <= room or (_changed is not None and threads != _changed[1]):
            return  # (fits, or the user set the threads after the library's fit: theirs stand)
        torch.set_num_threads(room)
        _changed = (threads if _changed is None else _changed[0], room)
        level, _warned = (logging.INFO if _warned else logging.WARNING), True
    logger.log(
        level,
        "ray_multiprocess_env set torch's intra-op threads from %d to %d: %d env worker "
        "process(es) run on this machine's %d usable cores, and torch's idle threads spin on "
        "the cores they need (on 2 cores that made a policy-in-the-loop step 0.65x to 0.8x as "
        "fast). "
        "To keep torch's setting, set %s=keep (or OMP_NUM_THREADS) before creating the envs, "
        "or call `torch.set_num_threads(n)` after creating them.",
        threads,
        room,
        workers,
        _usable_cores(),
        TORCH_THREADS_VARIABLE,
    )


def threads_left(workers: int) -> int:
    """The cores left to the driver beside `workers` busy worker processes (one at least)."""
    return max(1, _usable_cores() - workers)


def _usable_cores() -> int:
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
