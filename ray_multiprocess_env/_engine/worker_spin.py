"""How long a worker looks for its next message before it sleeps: set per node, by cores.

A worker served over a pipe or the TCP stream blocks in ``read`` between messages; the kernel
then has to wake it for each one, and a core left idle meanwhile runs the next env steps
slower. When the driver sends the next message soon (lockstep with a core per worker), it pays
to poll for it for a while first (`_worker.serve_loop`): on 2 cores HalfCheetah-v5 2 x 8 and
CartPole-v1 2 x 64 stepped 1.25x to 1.27x as fast in lockstep (`benchmarks/worker_spin.py`,
docs/performance.md). A worker polls for at least the time set here, and up to ten times as long
when its recent messages came later than that (a policy of a few hundred microseconds in the
driver: 1.09x), and when they came up to two such polls apart, until just after the next is
due (`_worker.serve_loop.poll_plan`). With more workers than cores the polling takes the cores
other workers need: 8 workers on 2 cores lost a quarter to two thirds.

So by default (``auto``) a worker polls for `DEFAULT_SPIN_US` (longer when its messages come
later: up to 25 times, `_worker.serve_loop.poll_plan`) when its node has at least as many cores
as workers of the vector env there, and not at all otherwise. On the driver's node the cores are
the fewer of those this process may run on and those Ray counts (a container's CPU limit), and
the workers of the vector envs already open when this one starts count too; on other nodes, the
CPUs Ray counts there. A vector env opened later, or a worker restarted onto the node, does not
stop the workers already running from polling; each of their answers then costs at most 25 times
`DEFAULT_SPIN_US` of a core. A restarted worker is counted where it now runs.

The environment variable ``RAY_MULTIPROCESS_ENV_WORKER_SPIN_US`` (read where the driver runs,
when a vector env is made) sets the least number of microseconds for every worker instead (a
worker polls longer when its messages come later, at most 100 ms unless the setting is more),
0 for none.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping

import ray

from ray_multiprocess_env._engine.driver_threads import usable_cores

__all__ = [
    "DEFAULT_SPIN_US",
    "MAX_SPIN_US",
    "SPIN_VARIABLE",
    "auto_spins",
    "check_spin",
    "spin_by_node",
]

#: The environment variable that sets how long workers poll (``auto`` or microseconds).
SPIN_VARIABLE = "RAY_MULTIPROCESS_ENV_WORKER_SPIN_US"
#: Microseconds a worker with a core of its own polls for its next message at least (``auto``).
DEFAULT_SPIN_US = 100
#: The most the variable may set: beyond, a worker mostly burns its core.
MAX_SPIN_US = 100_000


def check_spin() -> int | None:
    """The variable's setting: None for ``auto`` (the default), else microseconds.

    Raises:
        ValueError: If it is neither ``auto`` nor a whole number of microseconds in range.
    """
    given = os.environ.get(SPIN_VARIABLE, "auto")
    value = given.strip().lower() or "auto"
    if value == "auto":
        return None
    try:
        spin = int(value)
    except ValueError:
        spin = -1
    if not 0 <= spin <= MAX_SPIN_US:
        raise ValueError(
            f"the {SPIN_VARIABLE} environment variable must be 'auto' or a whole number of "
            f"microseconds from 0 to {MAX_SPIN_US}, got {given!r}; e.g. {SPIN_VARIABLE}=0 to "
            "keep the workers from polling, or unset it."
        )
    return spin


def spin_by_node(setting: int | None, nodes: Iterable[str | None], here: int) -> dict[str, int]:
    """Microseconds the workers on each node poll, by node id (`nodes`: each worker's).

    `setting`: `check_spin`'s; `here`: the workers of other vector envs on the driver's node.
    """
    counts = Counter(node for node in nodes if node is not None)
    if setting is not None:
        return dict.fromkeys(counts, setting)
    driver_node = ray.get_runtime_context().get_node_id()
    if here:
        counts[driver_node] += here
    cores = _cores_by_node()
    cores[driver_node] = min(usable_cores(), cores.get(driver_node, math.inf))
    return auto_spins(counts, cores)


def auto_spins(workers: Mapping[str, int], cores: Mapping[str, float]) -> dict[str, int]:
    """`DEFAULT_SPIN_US` for each node with a core per worker, else 0 (`workers` by node)."""
    return {
        node: DEFAULT_SPIN_US if count <= cores.get(node, 0) else 0
        for node, count in workers.items()
    }


def _cores_by_node() -> dict[str, float]:
    """The CPUs Ray counts on each live node."""
    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    return {n["NodeID"]: float(n["Resources"].get("CPU", 0)) for n in nodes if n.get("Alive")}
