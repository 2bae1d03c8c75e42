"""A real two-node Ray cluster on this machine, checked end to end (run by test_cluster.py).

Runs in its own process because the test session already has a Ray runtime. Starts a head node
and a second node with `ray.cluster_utils.Cluster`, points ``RAY_ADDRESS`` at it and lets the
library join, then checks placement, stepping against in-process envs (the second node's
workers over the TCP stream, the head node's over shared memory), the loss of a node with
``on_actor_failure="restart"``, a restart that no node can hold (it must fail within bounds,
and `close` return), and a module that only the driver has. Every check raises
`AssertionError` with what it saw; the last line printed is a JSON summary.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import ray
from ray.cluster_utils import Cluster

from ray_multiprocess_env import (
    EnvCrashedError,
    GymnasiumVectorEnv,
    RayVectorEnv,
    make_remote_class,
    started_runtime,
)
from ray_multiprocess_env._engine.worker_spin import spin_by_node

NUM_ENVS = 8
ENVS_PER_WORKER = 2
STEPS_BEFORE, STEPS_AFTER = 20, 30


class CartPole:
    """A plain env holder for `make_remote_class`."""

    def __init__(self) -> None:
        self.env = gym.make("CartPole-v1")


def make_env() -> gym.Env[Any, Any]:
    """The env factory of every worker env."""
    return gym.make("CartPole-v1")


def check_placement(head: str, node_b: str) -> dict[str, Any]:
    """make_remote_class actors spread over both nodes, or pinned by a custom resource."""
    remote_class = make_remote_class(CartPole, "env", gym.wrappers.TimeLimit)
    with RayVectorEnv.from_remote_class(remote_class, 2, placement="SPREAD") as vec:
        spread = vec.node_ids()
        vec.reset()
        vec.step([0, 1])
    assert set(spread) == {head, node_b}, f"SPREAD put the actors on {spread}"
    with RayVectorEnv.from_remote_class(
        remote_class, 2, actor_options={"resources": {"node_b": 0.1}}
    ) as vec:
        pinned = vec.node_ids()
    assert pinned == (node_b, node_b), f"resources={{'node_b': 0.1}} put the actors on {pinned}"
    envs = GymnasiumVectorEnv(
        [make_env] * 4, envs_per_worker=2, placement="STRICT_SPREAD", actor_options={"num_cpus": 1}
    )
    strict = envs.node_ids()
    envs.close()
    assert strict[0] == strict[1], strict
    assert strict[2] == strict[3], strict
    assert strict[0] != strict[2], strict
    return {"spread": spread, "pinned": pinned, "strict_spread": strict}


def check_node_loss(cluster: Cluster, node: Any, head: str, node_b: str) -> dict[str, Any]:
    """Step 8 envs over both nodes against in-process envs; remove one node mid-run."""
    fns = [make_env] * NUM_ENVS
    envs = GymnasiumVectorEnv(
        fns,
        envs_per_worker=ENVS_PER_WORKER,
        placement="SPREAD",
        actor_options={"num_cpus": 0.5},  # the head node alone can hold every bundle
        on_actor_failure="restart",
        timeout=60,
    )
    reference = gym.vector.SyncVectorEnv(fns)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    ref_obs, _ = reference.reset(seed=0)
    np.testing.assert_array_equal(obs, ref_obs)
    before = envs.node_ids()
    for worker in range(NUM_ENVS // ENVS_PER_WORKER):
        first = worker * ENVS_PER_WORKER
        assert len(set(before[first : first + ENVS_PER_WORKER])) == 1, before
    assert set(before) == {head, node_b}, f"SPREAD put the workers on {before}"
    kinds_before = _transports(envs)
    for worker, kind in enumerate(kinds_before):
        want = "tcp" if before[worker * ENVS_PER_WORKER] == node_b else "shared_memory"
        assert kind == want, f"worker {worker} on {before[worker * ENVS_PER_WORKER]} has {kind}"
    for _ in range(STEPS_BEFORE):
        actions = rng.integers(0, 2, NUM_ENVS)
        got, want = envs.step(actions), reference.step(actions)
        for field, (a, b) in enumerate(zip(got[:4], want[:4], strict=True)):
            np.testing.assert_array_equal(a, b, err_msg=f"field {field} before the node loss")
    lost = [i for i, n in enumerate(before) if n == node_b]
    kept = [i for i, n in enumerate(before) if n == head]
    cluster.remove_node(node)
    crashed_once = np.zeros(NUM_ENVS, dtype=bool)
    for _ in range(STEPS_AFTER):
        actions = rng.integers(0, 2, NUM_ENVS)
        got, want = envs.step(actions), reference.step(actions)
        crashed = got[4].get("env_crashed", np.zeros(NUM_ENVS, dtype=bool))
        crashed_once |= crashed
        assert not crashed[kept].any(), f"envs {kept} kept their node but were reported crashed"
        assert got[3][crashed].all(), "a restarted env must be reported truncated"
        for field, (a, b) in enumerate(zip(got[:4], want[:4], strict=True)):
            np.testing.assert_array_equal(a[kept], b[kept], err_msg=f"field {field} after")
    assert crashed_once[lost].all(), crashed_once
    assert not crashed_once[kept].any(), crashed_once
    after = envs.node_ids()
    assert set(after) == {head}, f"after the node loss the envs run on {after}"
    kinds_after = _transports(envs)
    envs.close()
    reference.close()
    return {
        "before": before,
        "after": after,
        "lost": lost,
        "kept": kept,
        "transports_before": kinds_before,
        "transports_after": kinds_after,
    }


def _transports(envs: GymnasiumVectorEnv) -> list[str]:
    """Each worker's transport (through the private engine)."""
    return [worker.transport.kind for worker in envs._engine._pool.workers]


def check_unsatisfiable_restart(cluster: Cluster, node: Any) -> dict[str, Any]:
    """A worker that cannot be re-placed (STRICT_SPREAD, a node gone) fails within bounds."""
    envs = GymnasiumVectorEnv(
        [make_env] * 4,
        envs_per_worker=2,
        placement="STRICT_SPREAD",
        actor_options={"num_cpus": 1},
        on_actor_failure="restart",
        timeout=10,
    )
    envs.reset(seed=0)
    envs.step(np.zeros(4, dtype=np.int64))
    cluster.remove_node(node)
    start = time.monotonic()
    try:
        for _ in range(100):  # until Ray reports the lost worker
            call_start = time.monotonic()
            envs.step(np.zeros(4, dtype=np.int64))
            time.sleep(0.1)
    except EnvCrashedError as err:
        message = str(err)
    else:
        raise AssertionError("stepping on after losing a STRICT_SPREAD node did not fail")
    failed_after = time.monotonic() - start
    failed_call = time.monotonic() - call_start
    assert "STRICT_SPREAD" in message, message
    assert "did not start within 30 s of the restart" in message, message
    assert failed_call < 10 + 30 + 1, failed_call  # the call's timeout, then 30 s to restart
    start = time.monotonic()
    envs.close()
    closed_after = time.monotonic() - start
    assert failed_after < 60, failed_after
    assert closed_after < 30, closed_after
    return {
        "error": message.splitlines()[0],
        "failed_after": failed_after,
        "failed_call": failed_call,
        "closed": closed_after,
    }


def check_driver_only_module(address: str, node_b: str) -> dict[str, Any]:
    """A factory from a module only the driver can import: fails clearly, then runtime_env."""
    package = Path(tempfile.mkdtemp()) / "driver_only_envs"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            import gymnasium as gym

            def make():
                return gym.make("CartPole-v1")
            """
        )
    )
    sys.path.insert(0, str(package.parent))  # the driver can import it; workers cannot
    import driver_only_envs  # type: ignore[import-not-found]

    try:
        GymnasiumVectorEnv([driver_only_envs.make] * 2, placement="SPREAD", timeout=60)
    except EnvCrashedError as err:
        message = str(err)
    else:  # pragma: no cover - only if Ray starts shipping the driver's sys.path
        raise AssertionError("a worker imported a module that only the driver has")
    assert "ModuleNotFoundError" in message, message
    assert "runtime_env" in message, message
    ray.shutdown()
    ray.init(address=address, runtime_env={"py_modules": [str(package)]})
    envs = GymnasiumVectorEnv([driver_only_envs.make] * 2, placement="SPREAD", timeout=120)
    obs, _ = envs.reset(seed=0)
    nodes = envs.node_ids()
    envs.close()
    assert obs.shape == (2, 4), obs.shape
    assert node_b in nodes, nodes
    return {"error": message.splitlines()[0], "nodes_with_runtime_env": nodes}


def main() -> None:
    """Start the cluster, run the checks, print the JSON summary, shut everything down."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False},
    )
    node = cluster.add_node(num_cpus=2, resources={"node_b": 1})
    try:
        cluster.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = cluster.address
        remote_class = make_remote_class(CartPole, "env", gym.wrappers.TimeLimit)
        first = remote_class.remote()  # the library joins RAY_ADDRESS; nothing local starts
        ray.get(first.node_id.remote())
        ray.kill(first)
        head = ray.get_runtime_context().get_node_id()  # the driver runs on the head node
        assert not started_runtime(), "the library started a runtime though RAY_ADDRESS was set"
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        assert len(alive) == 2, alive
        assert head in alive, alive
        node_b = node.node_id
        summary = {
            "nodes": {"head": head, "node_b": node_b},
            # by the second node's 2 CPUs, as Ray counts them: 2 workers poll, 3 do not
            "worker_spin": [spin_by_node(None, [node_b] * n, 0)[node_b] for n in (2, 3)],
            "placement": check_placement(head, node_b),
            "node_loss": check_node_loss(cluster, node, head, node_b),
        }
        node = cluster.add_node(num_cpus=2, resources={"node_b": 1})
        cluster.wait_for_nodes()
        summary["unsatisfiable_restart"] = check_unsatisfiable_restart(cluster, node)
        cluster.add_node(num_cpus=2, resources={"node_b": 1})
        cluster.wait_for_nodes()
        new_b = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
        summary["runtime_env"] = check_driver_only_module(cluster.address, new_b)
        print(json.dumps(summary))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
