"""The package as users get it: a wheel built from this tree, installed in a fresh venv.

The venv has no access to the source tree (the commands run elsewhere, and the test checks that
the module comes from the venv), so anything missing from the wheel (a module, ``py.typed``, the
version metadata, the LICENSE) fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
IGNORED = (".git", ".venv", ".devrun", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")

TINY_STEP = textwrap.dedent(
    """
    import ray_multiprocess_env
    from ray_multiprocess_env import make_vector_env

    print("module:", ray_multiprocess_env.__file__)
    envs = make_vector_env("CartPole-v1", 4, num_workers=2)
    envs.reset(seed=0)
    obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
    print("step:", obs.shape, rewards.tolist())
    envs.close()
    """
)


def _run(command, cwd, env=None):
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.timeout(900)
def test_wheel_installs_in_a_fresh_venv_and_steps(tmp_path):
    """Build the wheel, install it with its dependencies in a new venv, run --version and a step."""
    source = tmp_path / "source"  # a copy: setuptools would reuse (stale) files in ROOT/build
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*IGNORED))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(source)], source)
    (wheel,) = dist.glob("ray_multiprocess_env-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ray_multiprocess_env/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/"))]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", str(wheel)], tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    printed = _run([python, "-m", "ray_multiprocess_env", "--version"], elsewhere, env)
    assert printed.split()[-1] == version("ray-multiprocess-env")
    printed = _run([python, "-c", TINY_STEP], elsewhere, env)
    assert f"module: {venv}" in printed
    assert "step: (4, 4) [1.0, 1.0, 1.0, 1.0]" in printed
