"""gymnasium's `observation_mode` ("same", "different", a (batched, single) pair) as theirs.

Envs whose observation spaces share a shape and dtype but not their bounds are batched with
gymnasium's own `batch_differing_spaces` in "different" mode; their rows keep one layout, so
they travel over every transport, shared memory included.
"""

from __future__ import annotations

import contextlib
import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env import (
    GymnasiumVectorEnv,
    SB3VecEnv,
    SpacesMismatchError,
    make_vector_env,
)
from ray_multiprocess_env._protocol.space_match import equivalent
from tests.envs_spaces import BoundedEnv
from tests.helpers import assert_same, transport_kinds

TRANSPORTS = ["auto", "pipe", "tcp", "ray"]
KINDS = {"auto": "shared_memory", "pipe": "pipe", "tcp": "tcp", "ray": "ray"}
_fns = [functools.partial(BoundedEnv, i) for i in range(4)]


def _run(envs: gym.vector.VectorEnv) -> tuple:
    """What a short seeded run of `envs` returns: the reset and 7 steps (autoresets included)."""
    out = [envs.reset(seed=3)]
    for t in range(7):
        out.append(envs.step(np.array([t % 2, 1, 0, t % 2])))
    return tuple(out)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_different_equals_sync_vector_env_over_every_transport(transport):
    """In "different" mode the spaces and every result equal `SyncVectorEnv`'s."""
    theirs = SyncVectorEnv(_fns, observation_mode="different")
    with contextlib.closing(
        GymnasiumVectorEnv(
            _fns, envs_per_worker=2, observation_mode="different", transport=transport
        )
    ) as ours:
        assert transport_kinds(ours) == [KINDS[transport]] * 2
        assert ours.observation_mode == "different"
        assert ours.single_observation_space == theirs.single_observation_space
        assert ours.observation_space == theirs.observation_space
        assert ours.observation_space.low[3, 0] == -4.0  # (env 3's own bounds)
        assert_same(_run(ours), _run(theirs))
    theirs.close()


def test_a_given_pair_of_spaces_is_the_vector_envs():
    """A (batched, single) pair is taken as given, as by `SyncVectorEnv`, and results agree."""
    single = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
    pair = (batch_space(single, 4), single)
    theirs = SyncVectorEnv(_fns, observation_mode=pair)
    with contextlib.closing(
        make_vector_env(BoundedEnv, 4, num_workers=2, observation_mode=pair)
    ) as ours:
        assert ours.single_observation_space is single
        assert ours.observation_space is pair[0]
        assert ours.observation_space == theirs.observation_space
        assert_same(_run(ours), _run(theirs))
    theirs.close()


def test_same_refuses_differing_bounds_and_names_the_fix():
    """The default, "same", refuses envs whose bounds differ, as gymnasium's; it names the fix."""
    with pytest.raises(AssertionError, match="observation_mode='different'"):
        SyncVectorEnv(_fns)
    with pytest.raises(
        SpacesMismatchError, match=r'env 1 has observation_space .* pass `observation_mode="diff'
    ) as refused:
        GymnasiumVectorEnv(_fns, envs_per_worker=2)
    # (a ValueError, and the RuntimeError gymnasium's AsyncVectorEnv raises for such envs)
    assert isinstance(refused.value, ValueError)
    assert isinstance(refused.value, RuntimeError)
    with pytest.raises(ValueError, match=r"env 2 has observation_space .* pass `observation_mode"):
        GymnasiumVectorEnv(  # (each worker's envs alike: the workers differ)
            [_fns[0], _fns[0], _fns[2], _fns[2]], envs_per_worker=2, observation_mode="same"
        )
    with pytest.raises(ValueError, match="needs the same observation space") as refused:
        SB3VecEnv(_fns, envs_per_worker=2)  # (SB3 has no such mode: none is suggested)
    assert "observation_mode" not in str(refused.value)


def test_spaces_gymnasium_cannot_compare_are_not_equivalent():
    """Tuples of two lengths (gymnasium's check raises for them) are simply not equivalent."""
    one = gym.spaces.Tuple((gym.spaces.Discrete(2),))
    two = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))
    assert not equivalent(one, two)
    assert not equivalent(two, one)
    assert not equivalent(None, one)
    assert equivalent(gym.spaces.Discrete(2), gym.spaces.Discrete(5, start=1))


def test_different_refuses_another_shape_or_action_space():
    """The "different" mode still needs one shape and dtype and one action space (env named)."""
    fns = [*_fns[:3], functools.partial(BoundedEnv, 3, shape=(2,))]
    with pytest.raises(AssertionError, match="shape to be equal"):
        SyncVectorEnv(fns, observation_mode="different")
    with pytest.raises(
        ValueError,
        match=r"env 3 has observation_space .*, whose shape or dtype differs from that of env 2",
    ):
        GymnasiumVectorEnv(fns, envs_per_worker=2, observation_mode="different")
    fns = [*_fns[:3], functools.partial(BoundedEnv, 3, actions=3)]
    with pytest.raises(ValueError, match=r"env 3 has action_space Discrete\(3\) but env 2 has"):
        GymnasiumVectorEnv(fns, envs_per_worker=2, observation_mode="different")
    single = gym.spaces.Box(-1.0, 1.0, shape=(5,), dtype=np.float32)
    with pytest.raises(
        ValueError, match=r"env 0 has .* differs from that of the given single observation space"
    ):
        GymnasiumVectorEnv(
            _fns, envs_per_worker=2, observation_mode=(batch_space(single, 4), single)
        )


@pytest.mark.parametrize(
    ("mode", "error", "match"),
    [
        (
            "differing",
            ValueError,
            r"`observation_mode` must be 'same', 'different' or a .* got 'differing'",
        ),
        (
            (1, 2),
            TypeError,
            r"`observation_mode` as a pair must be \(batched space, single space\)",
        ),
        (gym.spaces.Discrete(2), ValueError, r"`observation_mode` must be"),
    ],
)
def test_a_bad_mode_is_named_before_any_worker_starts(mode, error, match):
    """A bad `observation_mode` is a TypeError/ValueError naming it; no worker is started."""

    def never():  # (a factory that would fail the test if a worker called it)
        raise AssertionError("a worker was started")

    with pytest.raises(error, match=match):
        GymnasiumVectorEnv([never], observation_mode=mode)


def test_make_vec_passes_the_mode_to_vector_entry_point():
    """A registered id's `observation_mode` reaches our face through `gymnasium.make_vec`."""
    gym.register(
        "RayCartPoleDifferent-v1",
        vector_entry_point="ray_multiprocess_env:vector_entry_point",
        kwargs={"env_id": "CartPole-v1", "observation_mode": "different", "num_workers": 1},
    )
    try:
        with contextlib.closing(
            gym.make_vec(
                "RayCartPoleDifferent-v1", num_envs=2, vectorization_mode="vector_entry_point"
            )
        ) as envs:
            theirs = gym.make_vec(
                "CartPole-v1", 2, "sync", vector_kwargs={"observation_mode": "different"}
            )
            assert isinstance(envs, GymnasiumVectorEnv)
            assert envs.observation_mode == "different"
            assert envs.observation_space == theirs.observation_space
            theirs.close()
    finally:
        gym.registry.pop("RayCartPoleDifferent-v1")
