"""The training examples run as written and learn (shortened where the full run is long)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
pytestmark = [pytest.mark.slow, pytest.mark.long]  # python -m pytest -m long


def _run(script: str, args: list[str], ray_address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "RAY_ADDRESS": ray_address},
    )


def test_pfrl_ppo_learns_cartpole(ray_address, tmp_path):
    """Pfrl's PPO on a RayVectorEnv, evaluated in batches, goes far above random (about 22)."""
    pytest.importorskip("pfrl")
    result = _run(
        "pfrl_ppo_cartpole.py",
        ["--steps", "20000", "--eval-interval", "10000", "--outdir", str(tmp_path)],
        ray_address,
    )
    match = re.search(r"best mean evaluation return: ([\d.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) > 60
    # pfrl's batched evaluator logs "length: " (its one-env evaluator logs "length:")
    assert re.search(r"evaluation episode \d+ length: \d+ R: ", result.stderr), result.stderr


def test_sb3_ppo_learns_cartpole(ray_address):
    """SB3's PPO trained on an SB3VecEnv beats a random policy (about 22) by far."""
    pytest.importorskip("stable_baselines3")
    result = _run("sb3_ppo_cartpole.py", ["--timesteps", "25000"], ray_address)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mean return over 10 test episodes" in result.stdout


def test_rllib_ppo_trains_on_our_vector_env_in_two_remote_env_runners(ray_address):
    """RLlib's PPO with 2 remote env runners, each on a GymnasiumVectorEnv; returns rise."""
    pytest.importorskip("ray.rllib")
    result = _run("rllib_ppo_cartpole.py", ["--iterations", "3", "--env-runners", "2"], ray_address)
    assert "env runners' envs: ['GymnasiumVectorEnv', 'GymnasiumVectorEnv']" in result.stdout, (
        result.stdout + result.stderr
    )
    returns = [float(x) for x in re.findall(r"mean episode return ([\d.]+)", result.stdout)]
    assert len(returns) == 3, result.stdout + result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert returns[-1] > returns[0]


def test_torchrl_ppo_learns_cartpole(ray_address):
    """TorchRL's PPO over `GymWrapper(make_vector_env(...))` beats a random policy (about 22)."""
    pytest.importorskip("torchrl")
    result = _run("torchrl_ppo_cartpole.py", ["--frames", "16384"], ray_address)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"final mean return of the last \d+ episodes: ([\d.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) > 60


def test_tianshou_dqn_reaches_195_on_cartpole(ray_address):
    """Tianshou's DQN with our vector envs for training and testing reaches a mean of 195."""
    pytest.importorskip("tianshou")
    result = _run("tianshou_dqn_cartpole.py", [], ray_address)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"best mean test return ([\d.]+) after (\d+) env steps", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) >= 195
