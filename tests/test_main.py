"""The command line: ``python -m ray_multiprocess_env demo`` and ``--version``."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

import pytest

from ray_multiprocess_env import __version__
from ray_multiprocess_env.__main__ import main


def _value(lines, prefix):
    """The text after `prefix` on the line that starts with it."""
    return next(line[len(prefix) :] for line in lines if line.startswith(prefix))


def test_demo_runs_and_reports_beside_gymnasium(ray_address):
    """The demo prints its env steps/s, gymnasium's, episodes and mean return; no bar in a log."""
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_multiprocess_env",
            "demo",
            "--num-envs",
            "4",
            "--steps",
            "60",
            "--peer-seconds",
            "0.2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "vector steps" not in result.stderr  # (no progress bar when output is not a terminal)
    lines = result.stdout.splitlines()
    assert _value(lines, "env: ").startswith("CartPole-v1 x 4 in 2 Ray workers (make_vector_env")
    assert float(_value(lines, "env steps/s: ")) > 0
    for peer in (
        "SyncVectorEnv, the same 4 envs in this process",
        "AsyncVectorEnv, 4 envs, a process each",  # (not more processes than envs)
    ):
        rate, ratio = _value(lines, f"gymnasium {peer}: ").split(" env steps/s (ours: ")
        assert float(rate) > 0
        assert float(ratio.rstrip("x)")) > 0
    assert int(_value(lines, "episodes finished: ")) >= 4
    assert 8 <= float(_value(lines, "mean return: ")) <= 60
    assert "python -m ray_multiprocess_env bench CartPole-v1" in _value(lines, "next: ")


def test_help_documents_the_options(capsys):
    """``demo --help`` lists every option."""
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--env-id",
        "--num-envs",
        "--steps",
        "--seed",
        "--peer-seconds",
        "--no-progress",
    ):
        assert option in out


def test_version_comes_from_the_installed_metadata(capsys):
    """``--version`` prints the one version, the package's metadata (pyproject.toml)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"python -m ray_multiprocess_env {__version__}"
    assert __version__ == version("ray-multiprocess-env")


def test_bad_option_value_exits_with_status_2(capsys):
    """A non-positive env count is reported with exit status 2."""
    assert main(["demo", "--num-envs", "0"]) == 2
    assert "`num_envs` must be at least 1, got 0" in capsys.readouterr().err
