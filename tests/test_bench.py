"""The ``bench`` command and its helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ray_multiprocess_env.bench import (
    DEFAULT_ENVS_PER_WORKER,
    BenchResult,
    default_settings,
    env_factory,
    format_table,
    measure_steps_per_second,
    sweep,
)


def test_measure_counts_env_steps_per_second():
    """The timing loop calls step at least min_steps times and scales by num_envs."""
    calls = []
    rate = measure_steps_per_second(calls.append, 4, seconds=0.01, warmup_steps=2, min_steps=5)
    assert calls[:2] == [0, 1]
    assert len(calls) >= 7
    assert rate > 0


def test_env_factory_accepts_ids_and_module_factories():
    """A gymnasium id stays an id, 'module:factory' gives the factory; junk is a ValueError."""
    assert env_factory("CartPole-v1") == "CartPole-v1"
    assert type(env_factory("tests.envs:FlakyEnv")()).__name__ == "FlakyEnv"
    with pytest.raises(ValueError, match="neither a registered gymnasium id"):
        env_factory("NoSuchEnv-v9")
    with pytest.raises(ValueError, match="cannot import `no_such_module`"):
        env_factory("no_such_module:make")


def test_sweep_and_table_mark_the_best_setting():
    """A sweep measures each setting; the table marks the fastest as recommended."""
    results = sweep(env_factory("CartPole-v1"), [(1, 1), (1, 4)], seconds=0.05, progress=False)
    assert [(r.num_workers, r.envs_per_worker) for r in results] == [(1, 1), (1, 4)]
    table = format_table([BenchResult(1, 1, 10.0), BenchResult(2, 8, 20.0)])
    assert table.splitlines()[-1].endswith("<- recommended")


def _bench_two_settings(env, ray_address, *more):
    """``bench ENV`` with 1 worker x 1 and x 4 envs, briefly, on the session's Ray."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_multiprocess_env",
            "bench",
            env,
            "--workers",
            "1",
            "--envs-per-worker",
            "1,4",
            "--seconds",
            "0.2",
            "--no-progress",
            *more,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ray_address},
        timeout=300,
    )


@pytest.mark.parametrize("env", ["CartPole-v1", "tests.envs:FlakyEnv"])
def test_bench_command_prints_code_that_runs_when_pasted(ray_address, env):
    """``bench`` prints a table and the recommended setting as code; pasted, the code runs."""
    run_env = {**os.environ, "RAY_ADDRESS": ray_address}
    result = _bench_two_settings(env, ray_address)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") >= 4
    code = result.stdout.split("recommended (paste it):\n", 1)[1]
    assert "envs = make_vector_env(" in code
    pasted = subprocess.run(
        [sys.executable, "-c", code + "\nenvs.reset(seed=0)\nprint(envs.num_envs)\nenvs.close()"],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=300,
    )
    assert pasted.returncode == 0, pasted.stderr
    assert pasted.stdout.strip().splitlines()[-1] in ("1", "4")


def test_bench_command_rejects_an_unknown_env():
    """An unknown env exits with status 2 and says why."""
    result = subprocess.run(
        [sys.executable, "-m", "ray_multiprocess_env", "bench", "NoSuchEnv-v9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "neither a registered gymnasium id" in result.stderr


def test_bench_json_output_and_default_settings(ray_address):
    """``--json`` prints every setting and the recommended one; the defaults try 64 and 256."""
    assert default_settings(2) == [(w, k) for w in (1, 2) for k in DEFAULT_ENVS_PER_WORKER]
    assert {64, 256} <= set(DEFAULT_ENVS_PER_WORKER)
    result = _bench_two_settings("CartPole-v1", ray_address, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["env"] == "CartPole-v1"
    settings = [(s["num_workers"], s["envs_per_worker"]) for s in document["settings"]]
    assert settings == [(1, 1), (1, 4)]
    assert sum(s["recommended"] for s in document["settings"]) == 1
    assert all(s["steps_per_second"] > 0 for s in document["settings"])


def test_bench_with_a_policy_in_the_loop(ray_address):
    """``--policy mlp`` steps with a torch MLP's actions and says so in the JSON."""
    pytest.importorskip("torch")
    result = _bench_two_settings("CartPole-v1", ray_address, "--json", "--policy", "mlp")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["policy"] == "mlp"
    assert all(s["steps_per_second"] > 0 for s in document["settings"])
