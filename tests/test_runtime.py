"""The embedded runtime: started only when needed, dashboard off, never shut down if foreign."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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
