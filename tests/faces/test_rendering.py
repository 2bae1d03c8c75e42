"""Rendering in Ray workers: classic control (pygame) and MuJoCo (EGL), frames and video.

The frames each worker renders equal those of the same envs in gymnasium's `SyncVectorEnv`, and
gymnasium's vector `RecordVideo` writes a video from them. MuJoCo renders headless on EGL: the
workers get ``MUJOCO_GL=egl`` through their `runtime_env`, as a user would give it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from gymnasium.wrappers.vector import RecordVideo

from ray_multiprocess_env import GymnasiumVectorEnv

pytest.importorskip("pygame")
pytest.importorskip("mujoco")
pytest.importorskip("moviepy")

pytestmark = pytest.mark.slow

HEADLESS = {"MUJOCO_GL": "egl"}


def _egl_works() -> bool:
    """Whether MuJoCo can make an EGL context here (it needs the system's libEGL and a driver)."""
    probe = "from mujoco.egl import GLContext; GLContext(8, 8).make_current()"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, **HEADLESS},
        capture_output=True,
        timeout=120,
        check=False,
    )
    return result.returncode == 0


ENV_IDS = [
    "CartPole-v1",
    pytest.param(
        "InvertedPendulum-v5",
        marks=pytest.mark.skipif(not _egl_works(), reason="no EGL (apt install libegl1)"),
    ),
]


def _envs(env_id: str) -> tuple[GymnasiumVectorEnv, SyncVectorEnv]:
    make = functools.partial(gym.make, env_id, render_mode="rgb_array")
    ours = GymnasiumVectorEnv(
        [make] * 3,
        envs_per_worker=2,
        actor_options={"runtime_env": {"env_vars": HEADLESS}},
    )
    return ours, SyncVectorEnv([make] * 3)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_frames_rendered_in_workers_equal_sync_vector_envs(env_id, monkeypatch):
    """Each env's frame, after the same seeds and actions, is the one SyncVectorEnv renders."""
    for name, value in HEADLESS.items():
        monkeypatch.setenv(name, value)
    ours, theirs = _envs(env_id)
    ours.reset(seed=4)
    theirs.reset(seed=4)
    ours.action_space.seed(4)
    for _ in range(5):
        actions = ours.action_space.sample()
        ours.step(actions)
        theirs.step(actions)
    frames, expected = ours.render(), theirs.render()
    assert len(frames) == 3
    for i, (frame, want) in enumerate(zip(frames, expected, strict=True)):
        assert frame.dtype == np.uint8
        assert frame.shape == want.shape, i
        np.testing.assert_array_equal(frame, want, err_msg=f"env {i}")
    assert len({frame.tobytes() for frame in frames}) == 3  # three different states, drawn
    ours.close()
    theirs.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_record_video_writes_a_video_from_the_workers_frames(env_id, tmp_path, monkeypatch):
    """The vector RecordVideo of gymnasium over our vector env writes the first episode."""
    for name, value in HEADLESS.items():
        monkeypatch.setenv(name, value)
    ours, theirs = _envs(env_id)
    theirs.close()
    folder = tmp_path / "videos"
    envs = RecordVideo(ours, str(folder), episode_trigger=lambda episode: episode == 0)
    envs.reset(seed=0)
    for _ in range(12):
        envs.step(envs.action_space.sample())
    envs.close()
    videos = list(folder.glob("*.mp4"))
    assert len(videos) == 1
    assert videos[0].stat().st_size > 1000
