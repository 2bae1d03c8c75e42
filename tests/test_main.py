"""The command line: ``python -m ray_multiprocess_env demo``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ray_multiprocess_env.__main__ import main


def test_demo_runs_and_reports(ray_address):
    """The demo steps envs with a random policy and prints steps/s, episodes and mean return."""
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ray_multiprocess_env",
            "demo",
            "--num-envs",
            "2",
            "--steps",
            "60",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert float(lines["env steps/s"]) > 0
    assert int(lines["episodes finished"]) >= 2
    assert 8 <= float(lines["mean return"]) <= 60


def test_help_documents_the_options(capsys):
    """``demo --help`` lists every option."""
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--env-id", "--num-envs", "--steps", "--seed", "--no-progress"):
        assert option in out


def test_bad_option_value_exits_with_status_2(capsys):
    """A non-positive env count is reported with exit status 2."""
    assert main(["demo", "--num-envs", "0"]) == 2
    assert "`num_envs` must be at least 1, got 0" in capsys.readouterr().err
