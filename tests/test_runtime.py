"""The embedded runtime: started only when needed, dashboard off, never shut down if foreign."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import ray

from ray_multiprocess_env import ensure_runtime, shutdown_runtime, started_runtime

_FIRST_ACTOR_SCRIPT = textwrap.dedent(
    """
    import logging
    import os
    import gymnasium as gym
    import ray
    from ray_multiprocess_env import make_remote_class, RayVectorEnv, started_runtime

    logging.basicConfig(level=logging.INFO)

    class CartPole:
        def __init__(self):
            self.env = gym.make("CartPole-v1")

    RemoteCartPole = make_remote_class(CartPole, "env", gym.Env)
    assert not ray.is_initialized(), "make_remote_class must not start Ray"
    actors = [RemoteCartPole.remote(), RemoteCartPole.options(num_cpus=0).remote()]
    assert ray.is_initialized()
    vec = RayVectorEnv(actors)
    vec.seed(0)
    obs, infos = vec.reset()
    print("started_runtime", started_runtime())
    print("dashboard", repr(ray._private.worker.global_worker.node.address_info.get("webui_url")))
    print("auth", os.environ.get("RAY_AUTH_MODE"))
    """
)


def _run(
    script: str, drop: tuple[str, ...] = ("RAY_ADDRESS",), **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environ, timeout=300
    )


def test_first_actor_starts_a_local_runtime_with_the_dashboard_off():
    """Without Ray running, creating the first actor starts a local runtime and logs it."""
    result = _run(_FIRST_ACTOR_SCRIPT, drop=("RAY_ADDRESS", "RAY_AUTH_MODE"))
    assert result.returncode == 0, result.stderr
    assert "Started a local Ray runtime for ray_multiprocess_env (dashboard off)" in result.stderr
    assert "started_runtime True" in result.stdout
    assert "dashboard ''" in result.stdout or "dashboard None" in result.stdout
    assert "auth token" in result.stdout  # token authentication (Ray >= 2.59, required)


def test_a_users_auth_mode_is_kept():
    """The library never overrides a `RAY_AUTH_MODE` the user set."""
    result = _run(_FIRST_ACTOR_SCRIPT, RAY_AUTH_MODE="disabled")
    assert result.returncode == 0, result.stderr
    assert "auth disabled" in result.stdout


def test_ray_address_joins_that_cluster(ray_address):
    """With RAY_ADDRESS set, the library joins that cluster and starts nothing local."""
    result = _run(_FIRST_ACTOR_SCRIPT, RAY_ADDRESS=ray_address)
    assert result.returncode == 0, result.stderr
    assert f"Connecting to the Ray cluster at RAY_ADDRESS={ray_address}" in result.stderr
    assert "Started a local Ray runtime" not in result.stderr
    assert "started_runtime False" in result.stdout


def test_a_running_runtime_is_used_and_never_shut_down():
    """With Ray already running, ensure_runtime does nothing and shutdown_runtime refuses."""
    assert ray.is_initialized()
    assert ensure_runtime() is False
    assert started_runtime() is False
    assert shutdown_runtime() is False
    assert ray.is_initialized()


_ENSURE_SCRIPT = textwrap.dedent(
    """
    import ray
    from ray_multiprocess_env import ensure_runtime, shutdown_runtime, started_runtime

    ensure_runtime(num_cpus=1)
    print("started_runtime", started_runtime())
    print("gcs", ray.get_runtime_context().gcs_address)
    print("shut_down", shutdown_runtime())
    """
)

_BARE_INIT_SCRIPT = "import ray\nray.init()\nprint(ray.get_runtime_context().gcs_address)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_a_cluster_left_by_ray_start_is_not_joined_nor_claimed():
    """`ray start --head` left running, no RAY_ADDRESS: ensure_runtime starts its own runtime.

    A bare `ray.init()` joins such a cluster (through ray_current_cluster in Ray's temp dir);
    the library must not join it while saying it started a local runtime it may shut down.
    The cluster and the scripts share a temp dir of their own (``RAY_TMPDIR``; short, for Ray's
    socket paths): no other process on the machine finds the cluster, and the machine's own
    /tmp/ray/ray_current_cluster (a developer's `ray start`, say) is left as it was.
    """
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    current = pathlib.Path(temp, "ray", "ray_current_cluster")
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    command = [ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=1"]
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    head = subprocess.Popen(
        [*command, "--include-dashboard=false"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**environ, "RAY_TMPDIR": temp},
    )
    try:
        deadline = time.monotonic() + 120
        while not (current.exists() and current.read_text().endswith(f":{port}")):
            assert head.poll() is None, "`ray start --head` exited"
            assert time.monotonic() < deadline, "`ray start --head` did not come up in 120 s"
            time.sleep(0.5)
        joined = _run(_BARE_INIT_SCRIPT, RAY_TMPDIR=temp)  # (what the library must not do)
        assert joined.stdout.strip().endswith(f":{port}"), joined.stderr
        result = _run(_ENSURE_SCRIPT, RAY_TMPDIR=temp)
        assert result.returncode == 0, result.stderr
        assert "started_runtime True" in result.stdout
        assert "shut_down True" in result.stdout
        gcs = result.stdout.split("gcs ", 1)[1].split()[0]
        assert not gcs.endswith(f":{port}"), "joined the cluster `ray start` left running"
    finally:
        head.terminate()  # --block: stopping it stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)
