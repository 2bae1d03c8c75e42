"""TorchRL over `make_vector_env`: the same collected data as over gymnasium's SyncVectorEnv.

TorchRL's `GymWrapper` takes a gymnasium vector env as a batched env; its `Collector` resets the
finished envs itself (``"disabled"``) or reads gymnasium's same-step autoreset.
"""

from __future__ import annotations

import contextlib
import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from torchrl.collectors import Collector  # noqa: E402
from torchrl.envs import GymWrapper  # noqa: E402
from torchrl.envs.utils import check_env_specs  # noqa: E402

from ray_multiprocess_env import make_vector_env  # noqa: E402

MODES = {"disabled": AutoresetMode.DISABLED, "same_step": AutoresetMode.SAME_STEP}


def _push_right_when_leaning_right(td):
    """A deterministic policy whose episodes end after a few dozen steps."""
    td["action"] = torch.nn.functional.one_hot((td["observation"][..., 2] > 0.05).long(), 2)
    return td


def _collect(vector_env, frames):
    env = GymWrapper(vector_env)  # (deleting a GymWrapper closes the env it wraps)
    check_env_specs(env)
    env.set_seed(0)
    collector = Collector(
        env, _push_right_when_leaning_right, frames_per_batch=64, total_frames=frames
    )
    try:
        return torch.cat(list(collector))
    finally:
        collector.shutdown()


@pytest.mark.in_process
@pytest.mark.parametrize("mode", sorted(MODES))
def test_collected_data_equals_sync_vector_env(mode):
    """Observations, actions, rewards and done flags, resets included, in both modes.

    `check_env_specs` passes on both first.
    """
    sync = gym.vector.SyncVectorEnv(
        [functools.partial(gym.make, "CartPole-v1")] * 8, autoreset_mode=MODES[mode]
    )
    ours = make_vector_env("CartPole-v1", 8, num_workers=2, autoreset_mode=mode)
    with contextlib.closing(ours), contextlib.closing(sync):
        mine, theirs = _collect(ours, 512), _collect(sync, 512)
    assert mine["next", "done"].sum() >= 8  # episodes ended and were reset on the way
    for key in ["observation", "action", ("next", "observation"), ("next", "reward")]:
        torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=0)
    for key in [("next", "done"), ("next", "terminated"), ("next", "truncated")]:
        assert torch.equal(mine[key], theirs[key])


@pytest.mark.in_process
def test_torchrl_refuses_next_step_autoreset():
    """Gymnasium's default mode is refused by TorchRL: docs/trainers.md says to pick another."""
    with contextlib.closing(make_vector_env("CartPole-v1", 2, num_workers=1)) as ours:
        with pytest.raises(RuntimeError):
            GymWrapper(ours).rollout(3)


def test_pixels_rendered_in_the_workers():
    """Gymnasium's AddRenderObservation applied in each worker: TorchRL gets the frames."""
    envs = make_vector_env(
        "CartPole-v1",
        2,
        num_workers=1,
        autoreset_mode="disabled",
        env_kwargs={"render_mode": "rgb_array"},
        wrappers=[functools.partial(gym.wrappers.AddRenderObservation, render_only=True)],
    )
    with contextlib.closing(envs):
        rollout = GymWrapper(envs).rollout(3)
    pixels = rollout["next", "observation"]
    assert pixels.shape == (2, 3, 400, 600, 3)
    assert pixels.dtype == torch.uint8
    assert np.unique(pixels.numpy()).size > 1
