"""One Ray session for the whole test run (2 CPUs, dashboard off)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray


@pytest.fixture(scope="session", autouse=True)
def ray_address() -> Iterator[str]:
    """Start the test session's Ray runtime and yield its address for subprocesses to join."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
