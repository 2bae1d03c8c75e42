"""Start or join the Ray runtime the vector envs run on.

The library starts a Ray runtime only when none is running and the first actor is needed. With
``RAY_ADDRESS`` set it connects to that cluster instead; otherwise it starts a local runtime with
the dashboard off (and, as Ray >= 2.59 does for every local runtime, token authentication on),
and says so in the log. It never shuts down a runtime it did not start.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any

import ray

__all__ = ["ensure_runtime", "ray_cpus", "shutdown_runtime", "started_runtime"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_started_here = False


def ensure_runtime(**init_kwargs: Any) -> bool:
    """Make sure a Ray runtime is up, starting a local one only if none is running.

    If Ray is already initialized (by the user, a trainer, or an earlier call) nothing happens.
    If the ``RAY_ADDRESS`` environment variable names a cluster, this connects to it and never
    starts a local runtime. Otherwise it starts a local Ray runtime of this process's own with
    the dashboard off, even where ``ray start`` left a cluster running on this machine (join
    one with ``RAY_ADDRESS`` or ``ray.init(address="auto")``).

    Args:
        **init_kwargs: Extra keyword arguments for `ray.init` (for example ``num_cpus``), used
            only when this call starts or joins the runtime.

    Returns:
        True if this call started or joined a runtime, False if one was already running.

    Example:
        >>> from ray_multiprocess_env import ensure_runtime
        >>> _ = ensure_runtime(num_cpus=2)
    """
    global _started_here
    with _lock:
        if ray.is_initialized():
            return False
        address = os.environ.get("RAY_ADDRESS")
        if address:
            logger.info("Connecting to the Ray cluster at RAY_ADDRESS=%s", address)
            ray.init(address=address, **init_kwargs)
            return True
        # "local": a runtime of this process's own, even where `ray start` left a cluster
        # running on this machine (which a bare `ray.init()` would join)
        options: dict[str, Any] = {"address": "local", "include_dashboard": False}
        options.update(init_kwargs)
        ray.init(**options)
        _started_here = options["address"] == "local"
        logger.info(
            "Started a local Ray runtime for ray_multiprocess_env (dashboard off); "
            "call `ray.init(...)` yourself first to choose its settings."
        )
        return True


def started_runtime() -> bool:
    """Tell whether the running Ray runtime was started by this library."""
    return _started_here and ray.is_initialized()


def shutdown_runtime() -> bool:
    """Shut Ray down only if this library started it.

    Returns:
        True if a runtime this library started was shut down, False otherwise (a runtime the user
        or a cluster started is left running).
    """
    global _started_here
    with _lock:
        if not (_started_here and ray.is_initialized()):
            return False
        ray.shutdown()
        _started_here = False
        logger.info("Shut down the local Ray runtime that ray_multiprocess_env started.")
        return True


def start_runtime_on_creation(actor_class: Any) -> Any:
    """Make `actor_class.remote()` (and `.options(...).remote()`) call `ensure_runtime` first.

    Ray's own automatic start would use Ray's defaults; this routes actor creation through
    `ensure_runtime` so the library's defaults apply. Both creation paths of Ray's `ActorClass`
    go through its `_remote` method, so that is the one place wrapped. If a future Ray renames
    it, creation falls back to Ray's own automatic start.
    """
    create = getattr(actor_class, "_remote", None)
    if create is None:  # pragma: no cover - depends on Ray internals
        return actor_class

    @functools.wraps(create)
    def _remote(*args: Any, **kwargs: Any) -> Any:
        ensure_runtime()
        return create(*args, **kwargs)

    actor_class._remote = _remote
    return actor_class


def ray_cpus() -> int:
    """The CPUs of the Ray cluster (on a local runtime, this machine's), starting one if needed."""
    ensure_runtime()
    return max(1, int(ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]
