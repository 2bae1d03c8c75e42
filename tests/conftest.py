"""One Ray session for the whole test run (2 CPUs, dashboard off), and the `in_process` marker."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import ray

from ray_multiprocess_env._engine import ray_launcher
from ray_multiprocess_env._engine.options import TRANSPORT_VARIABLE
from ray_multiprocess_env._engine.transports.in_process import InProcessLauncher
from ray_multiprocess_env.placement import PlacementPlan


@pytest.fixture(scope="session", autouse=True)
def ray_address() -> Iterator[str]:
    """Start the test session's Ray runtime and yield its address for subprocesses to join."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


_IN_PROCESS = pytest.MonkeyPatch()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `in_process` start their workers as threads of this process, not Ray actors.

    Their subject is a face's or the engine's own logic (arguments, bookkeeping, error names),
    which is the same over every transport; `tests/test_transports.py` and the fault, restart
    and placement tests run the transports themselves over Ray. Each Ray worker costs about
    0.45 s to start on 2 cores; a thread, nothing. With `RAY_MULTIPROCESS_ENV_TRANSPORT` set
    (``=ray`` reruns the faces over Ray calls), marked tests use the transport it names.

    Threads share one process, with the test too, so tests whose envs keep state in their class
    or module stay unmarked, on Ray: a class-level space each env seeds, a count of builds per
    process, a class's `metadata`, which gymnasium's `SyncVectorEnv` in the test writes into. So
    do tests that end a worker's process (``os._exit``) or need picklable factories.

    A hook, not a fixture, so that the test's class- and module-scoped fixtures start in-process
    workers too.
    """
    if item.get_closest_marker("in_process") is not None and TRANSPORT_VARIABLE not in os.environ:
        _IN_PROCESS.setattr(ray_launcher, "RayLauncher", _in_process_launcher)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Ray actors again for the next test."""
    _IN_PROCESS.undo()


def _in_process_launcher(
    options: object, plan: PlacementPlan | None, worker_args: dict
) -> InProcessLauncher:
    if plan is not None:
        plan.release()  # threads take no place on the cluster
    return InProcessLauncher(worker_args)
