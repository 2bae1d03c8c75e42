"""Envs people train on, and infos that test their batching, against gymnasium's SyncVectorEnv.

Over every transport: HalfCheetah-v5 (MuJoCo; numeric infos every step, which go to shared
memory columns), and `ShiftingInfoEnv` (keys only at an episode's end, a key whose shape
changes, one whose type changes, text, nested dicts) in every autoreset mode: the observations,
rewards, flags and infos equal SyncVectorEnv's, dtypes included.
"""

from __future__ import annotations

import contextlib
import functools

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env import GymnasiumVectorEnv
from tests.envs import ShiftingInfoEnv
from tests.helpers import assert_same

TRANSPORTS = ["auto", "pipe", "ray"]


def _compare(fns, steps, transport, mode=AutoresetMode.NEXT_STEP, shape_changes=False):
    reference = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    ours = GymnasiumVectorEnv(fns, envs_per_worker=2, transport=transport, autoreset_mode=mode)
    with contextlib.closing(ours), contextlib.closing(reference):
        assert_same(ours.reset(seed=7), reference.reset(seed=7), "reset")
        reference.action_space.seed(1)
        for t in range(steps):
            if t % 10 == 9 and shape_changes:  # every env's "shape" info changes its shape
                for envs in (ours, reference):
                    envs.set_attr("shape_size", 1 + t // 10)
            actions = reference.action_space.sample()
            got, want = ours.step(actions), reference.step(actions)
            assert_same(got, want, f"step {t}")
            if mode == AutoresetMode.DISABLED and (want[2] | want[3]).any():
                mask = want[2] | want[3]
                assert_same(
                    ours.reset(options={"reset_mask": mask}),
                    reference.reset(options={"reset_mask": mask}),
                    f"masked reset {t}",
                )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_halfcheetah_equals_sync_vector_env(transport):
    """MuJoCo HalfCheetah-v5, 2 workers x 2: every result equal, numeric infos included."""
    pytest.importorskip("mujoco")
    _compare([functools.partial(gym.make, "HalfCheetah-v5")] * 4, 30, transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_shifting_infos_equal_sync_vector_env(transport, mode):
    """Keys that come and go, change shape or type, text and nested dicts: equal infos."""
    _compare([ShiftingInfoEnv] * 5, 25, transport, mode, shape_changes=True)
