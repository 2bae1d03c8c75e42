"""A real two-node Ray cluster (`ray.cluster_utils.Cluster`) on this machine, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_multiprocess_env._engine.worker_spin import DEFAULT_SPIN_US

pytestmark = pytest.mark.slow

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "multinode_check.py"


def test_two_node_cluster_placement_node_loss_and_runtime_env(tmp_path):
    """Envs spread over two nodes step like in-process envs; a lost node's envs restart.

    The script joins the cluster through RAY_ADDRESS (the library starts nothing local), checks
    SPREAD / STRICT_SPREAD / custom-resource placement by each env's node id, how long the
    second node's workers would poll by its CPUs (`worker_spin`), steps 8 envs
    against `SyncVectorEnv` (the second node's workers over the TCP stream), removes the second
    node mid-run (`on_actor_failure="restart"`: its envs come back on the head node, on shared
    memory, the others' episodes match the reference step for step),
    checks that a restart no node can hold (STRICT_SPREAD after losing a node) fails within its
    bound and that `close` returns, and ships a driver-only module with ``runtime_env``.
    """
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run(
        [sys.executable, str(_SCRIPT)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    head, node_b = summary["nodes"]["head"], summary["nodes"]["node_b"]
    assert set(summary["placement"]["spread"]) == {head, node_b}
    assert summary["worker_spin"] == [DEFAULT_SPIN_US, 0]  # by the second node's 2 CPUs
    loss = summary["node_loss"]
    assert loss["lost"]
    assert loss["kept"]
    assert set(loss["after"]) == {head}
    assert "tcp" in loss["transports_before"]  # the second node's workers, over the stream
    assert set(loss["transports_before"]) == {"tcp", "shared_memory"}
    assert set(loss["transports_after"]) == {"shared_memory"}  # restarted on the head node
    assert "ModuleNotFoundError" in summary["runtime_env"]["error"]
    assert "STRICT_SPREAD" in summary["unsatisfiable_restart"]["error"]
