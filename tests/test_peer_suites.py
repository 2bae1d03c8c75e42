"""stable-baselines3's own VecEnv tests pass with `SB3VecEnv` in place of ``SubprocVecEnv``.

`scripts/peers/run.py` fetches the source distribution of the installed SB3 version from the package
index and runs its tests there (gymnasium's suite is run by hand; see that file).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long]  # python -m pytest -m long

RUN = Path(__file__).resolve().parent.parent / "scripts" / "peers" / "run.py"


@pytest.mark.timeout(900)
def test_sb3_vec_env_suite_passes_with_sb3vecenv_as_subprocvecenv(tmp_path):
    """Every SB3 VecEnv test passes, SubprocVecEnv's variants included, but start methods."""
    pytest_args = ["-v", "-o", "timeout=120"]  # for SB3's pytest: a hung test shows its stack
    result = subprocess.run(
        [sys.executable, str(RUN), "sb3", "--workdir", str(tmp_path), "--", *pytest_args],
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    ours = set(re.findall(r"^tests/\S+::(\S+\[\S*RaySubprocVecEnv\S*\]) PASSED", output, re.M))
    assert len(ours) >= 14, output[-6000:]  # the substitute really ran
    assert {  # what failed before SB3VecEnv followed SubprocVecEnv's conventions
        "test_vecenv_dict_spaces[RaySubprocVecEnv]",
        "test_vecenv_tuple_spaces[RaySubprocVecEnv]",
        "test_vecenv_custom_calls[None-RaySubprocVecEnv]",
        "test_vecenv_custom_calls[VecNormalize-RaySubprocVecEnv]",
        "test_vecenv_custom_calls[VecFrameStack-RaySubprocVecEnv]",
    } <= ours
    summary = re.search(r"(\d+) passed.*?(\d+) deselected", output)
    assert summary is not None, output[-3000:]
    assert int(summary.group(1)) >= 70
    assert "not applicable: tests/test_vec_envs.py::test_subproc_start_method" in output
