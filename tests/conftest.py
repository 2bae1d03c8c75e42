"""One Ray session for the whole test run (2 CPUs, dashboard off), and the `in_process` marker."""

from __future__ import annotations

import compileall
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from ray_multiprocess_env._engine import engine, ray_launcher
from ray_multiprocess_env._engine.options import TRANSPORT_VARIABLE
from ray_multiprocess_env._engine.pool import Launcher, Pool
from ray_multiprocess_env._engine.transports.in_process import InProcessLauncher


@pytest.fixture(scope="session", autouse=True)
def ray_address() -> Iterator[str]:
    """Start the test session's Ray runtime and yield its address for subprocesses to join.

    Ctrl-C is what the interrupt tests deliver: a test run started as a background job of a
    non-interactive shell (``pytest &``) inherits SIGINT ignored, so Python's own handler is
    put back first (else those tests fail with "DID NOT RAISE").
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _compile_once()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _compile_once() -> None:
    """Byte-compile the package and the tests' modules, which every worker process imports.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (CI machines often set it) no process writes them,
    so each of the suite's ~1,000 worker processes (one per actor) compiled them again: about
    0.08 CPU-s each, some 40 s of the run on 2 cores. Reading them needs no setting.
    """
    if sys.dont_write_bytecode:
        root = Path(__file__).resolve().parent.parent
        for folder in ("ray_multiprocess_env", "tests"):
            compileall.compile_dir(root / folder, quiet=1)


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
    workers too. It hands the engine's `start_pool` the launcher it takes for tests, so nothing
    is planned on the cluster.
    """
    if item.get_closest_marker("in_process") is not None and TRANSPORT_VARIABLE not in os.environ:
        _IN_PROCESS.setattr(engine, "start_pool", _in_process_pool)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Ray actors again for the next test."""
    _IN_PROCESS.undo()


def _in_process_pool(
    env_fns: Any, envs_per_worker: int, options: Any, worker_args: dict, launcher: Launcher | None
) -> Pool:
    if launcher is None:
        launcher = InProcessLauncher(worker_args)
    return ray_launcher.start_pool(env_fns, envs_per_worker, options, worker_args, launcher)
