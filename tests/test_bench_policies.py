"""The torch policies that benchmarks put in the loop: actions of the env's space, seeded."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from ray_multiprocess_env.bench_policies import make_policy

pytest.importorskip("torch")

_CHEETAH_OBS = spaces.Box(-np.inf, np.inf, (17,), np.float64)
_CHEETAH_ACT = spaces.Box(-1.0, 1.0, (6,), np.float32)


def test_the_mlp_gives_box_actions_within_the_bounds_and_is_seeded():
    """A batch of observations gives one in-bounds action per row; the same seed, the same net."""
    act = make_policy("mlp", _CHEETAH_OBS, _CHEETAH_ACT)
    obs = np.random.default_rng(0).normal(size=(5, 17)) * 10
    actions = act(obs)
    assert actions.shape == (5, 6)
    assert actions.dtype == np.float32
    assert all(_CHEETAH_ACT.contains(a) for a in actions)
    assert np.array_equal(actions, make_policy("mlp", _CHEETAH_OBS, _CHEETAH_ACT)(obs))
    assert not np.array_equal(actions, make_policy("mlp", _CHEETAH_OBS, _CHEETAH_ACT, seed=1)(obs))


def test_the_conv_net_acts_on_atari_frame_stacks_in_a_discrete_space():
    """4 x 84 x 84 uint8 frames give Discrete actions, offset by the space's start."""
    frames = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    space = spaces.Discrete(6, start=2)
    actions = make_policy("conv", frames, space)(frames.sample()[None].repeat(3, axis=0))
    assert actions.shape == (3,)
    assert all(space.contains(int(a)) for a in actions)


@pytest.mark.parametrize(
    ("kind", "observation_space", "action_space", "match"),
    [
        ("transformer", _CHEETAH_OBS, _CHEETAH_ACT, r"`policy`='transformer' is not one of"),
        ("mlp", spaces.Dict({"x": _CHEETAH_OBS}), _CHEETAH_ACT, r"needs Box observations"),
        ("mlp", _CHEETAH_OBS, spaces.MultiBinary(3), r"acts in Box or Discrete action spaces"),
        ("conv", _CHEETAH_OBS, _CHEETAH_ACT, r"needs \(channels, height, width\).*use 'mlp'"),
    ],
)
def test_spaces_a_policy_cannot_act_on_are_named(kind, observation_space, action_space, match):
    """An unknown kind or a space the policy cannot handle is a `ValueError` saying what to do."""
    with pytest.raises(ValueError, match=match):
        make_policy(kind, observation_space, action_space)
