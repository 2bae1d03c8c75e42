"""What several test modules share: making, inspecting and killing vector envs, comparing batches.

The only test module other modules import from (with `tests/interrupts.py`, and the env classes
Ray workers import: `tests/envs.py`, `tests/envs_spaces.py`, `tests/envs_faults.py`). Functions
that look inside a vector env use its private engine and say so.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import ray
from ray.exceptions import RayActorError

from ray_multiprocess_env import RayVectorEnv, make_remote_class
from tests.envs import FlakyEnv, FlakyHolder

#: The two shapes of a `RayVectorEnv`: one actor per env, or workers holding two envs each.
LAYOUTS = ["actor-per-env", "workers-of-2"]

RemoteFlaky = make_remote_class(FlakyHolder, "env", __import__("gymnasium").Env)


def flaky_vec(num_envs, layout, vec_class=RayVectorEnv, **kwargs):
    """Flaky envs in one actor each, or in workers of two envs (``from_env_fns``)."""
    if layout == "actor-per-env":
        return vec_class([RemoteFlaky.remote() for _ in range(num_envs)], **kwargs)
    return vec_class.from_env_fns([FlakyEnv] * num_envs, envs_per_worker=2, **kwargs)


def wait_until_ready(vec):
    """Wait for the actors to start, so a short `timeout` does not count their start-up."""
    vec.node_ids()


def worker_pids(envs):
    """The process id of each worker of `envs` (any face), asked through its private engine."""
    return envs._engine.run_on_workers("pid")


def transport_kinds(envs):
    """Each worker's transport: ``"shared_memory"``, ``"pipe"`` or ``"ray"`` (private engine)."""
    return [worker.transport.kind for worker in envs._engine._pool.workers]


def answer_waits(envs, worker: int, within: float = 60.0) -> bool:
    """Whether worker `worker`'s answer is waiting in its pipe (or socket) within `within` s."""
    transport = envs._engine._pool.workers[worker].transport  # (private engine)
    return bool(select.select([transport.fileno()], [], [], within)[0])


def env_slices(envs):
    """``(start, stop)`` of each worker's envs."""
    return [(worker.envs.start, worker.envs.stop) for worker in envs._engine.workers]


def engine_options(envs):
    """The options the private engine of `envs` runs with."""
    return envs._engine._pool.options


def placement_group_of(envs):
    """The placement group the private engine of `envs` made (None if it made none)."""
    plan = envs._engine._pool.launcher.plan
    return None if plan is None else plan.placement_group


def assert_killed(actor, within=30.0):
    """Wait (bounded) until `actor` is dead; `ray.kill` and SIGKILL take effect asynchronously.

    One readiness call at a time, polled every 20 ms: an actor serving its pipe never answers
    it, and Ray fails it as soon as it knows the actor is dead (waiting for it in steps of
    1 s had cost most of a second per kill).
    """
    deadline = time.monotonic() + within
    ref = actor.__ray_ready__.remote()
    while time.monotonic() < deadline:
        ready, _ = ray.wait([ref], timeout=0.02)
        if not ready:
            continue  # serving its pipe (alive), or not yet known dead
        try:
            ray.get(ref)
        except RayActorError:
            return
        time.sleep(0.02)  # it answered: alive and idle; ask again
        ref = actor.__ray_ready__.remote()
    pytest.fail(f"actor {actor} is still alive {within} s after it was killed")


def memory_files():
    """This process's open anonymous memory files of ours."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:ray-multiprocess-env"):
                found.append(fd)
    return found


def assert_same(ours, theirs, path="value"):
    """Recursively compare batched values: dicts, tuples, arrays (object arrays included)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), path
        assert set(ours) == set(theirs), f"{path}: keys {set(ours)} != {set(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, tuple):
        assert isinstance(ours, tuple), path
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(theirs, np.ndarray) and theirs.dtype == object:
        assert isinstance(ours, np.ndarray), path
        assert ours.dtype == object, path
        assert ours.shape == theirs.shape, path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), f"{path}: {type(ours)}"
        assert ours.dtype == theirs.dtype, f"{path}: {ours.dtype} != {theirs.dtype}"
        np.testing.assert_array_equal(ours, theirs, err_msg=path)
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


@contextlib.contextmanager
def interrupt_after(seconds, *, signal_now=False):
    """Deliver a KeyboardInterrupt to the main thread after `seconds` (Jupyter's interrupt).

    With `signal_now`, a real SIGINT to the main thread, which also cuts short a blocking wait
    (``_thread.interrupt_main`` only raises once the main thread runs Python code again).
    """
    main = threading.main_thread().ident

    def interrupt():
        if signal_now:
            signal.pthread_kill(main, signal.SIGINT)
        else:
            _thread.interrupt_main()

    timer = threading.Timer(seconds, interrupt)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def assert_loaded_on_first_use(module: str, *names: str) -> None:
    """A face is loaded on first use: checked in a fresh interpreter.

    Importing the package imports neither `module` nor torch; reading the package's `names`
    imports `module`.
    """
    code = (
        "import sys, ray_multiprocess_env as r\n"
        f"assert {module!r} not in sys.modules and 'torch' not in sys.modules\n"
        + "".join(f"r.{name}\n" for name in names)
        + f"assert {module!r} in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def without_comments(code: str) -> str:
    """`code` with each line's ``#`` comment cut off (a translation may change only those)."""
    return "\n".join(line.split("#", 1)[0].rstrip() for line in code.splitlines())


def counts(envs):
    """Each `FlakyEnv`'s steps since its reset, as floats (the first entry of its observation)."""
    return [float(count) for count in envs.get_attr("count")]
