"""The one-line constructor convention (`env_factories`) and every entry point that uses it.

``make_vector_env("CartPole-v1", 8)``, as ``gym.make_vec``, SB3's ``make_vec_env`` and envpool
are written: a gymnasium id or a factory (no argument, or the env index), any two counts or
``num_envs`` alone, ``env_kwargs``, ``wrappers``, and the engine's options on every entry point.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from ray_multiprocess_env import (
    GymnasiumVectorEnv,
    make_vector_env,
    rllib_env_creator,
    vector_entry_point,
)
from ray_multiprocess_env.env_factories import EnvBuilder, env_factories, takes_index
from ray_multiprocess_env.runtime import ray_cpus
from tests.envs import FlakyEnv
from tests.helpers import env_slices

pytestmark = pytest.mark.in_process  # the logic of arguments and faces: tests/conftest.py


def _indexed(index):
    env = FlakyEnv()
    env.count = 100 * index
    return env


def _two_cpus():
    return 2


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (lambda: None, False),
        (lambda index: None, True),
        (lambda index=0: None, False),
        (lambda *args: None, True),
        (FlakyEnv, False),
        (functools.partial(gym.make, "CartPole-v1"), False),  # `id` is bound
        (functools.partial(lambda index, size: None, size=3), True),
        (_indexed, True),
    ],
)
def test_a_factory_is_told_apart_by_its_signature(factory, expected):
    """A required positional parameter means the factory is called with the env index."""
    assert takes_index(factory) is expected


@pytest.mark.parametrize(
    ("counts", "layout"),
    [
        ({"num_envs": 8}, (4, 4)),  # workers: the 2 CPUs
        ({"num_envs": 1}, (1,)),
        ({"num_envs": 7}, (4, 3)),
        ({"num_envs": 8, "num_workers": 4}, (2, 2, 2, 2)),
        ({"num_envs": 10, "num_workers": 4}, (3, 3, 2, 2)),
        ({"num_envs": 8, "envs_per_worker": 3}, (3, 3, 2)),
        ({"num_workers": 3, "envs_per_worker": 5}, (5, 5, 5)),
        ({"num_envs": 6, "num_workers": 2, "envs_per_worker": 3}, (3, 3)),
        ({"num_envs": 5, "num_workers": 2, "envs_per_worker": 3}, (3, 2)),
    ],
)
def test_any_two_counts_or_num_envs_alone_give_the_third(counts, layout):
    """The counts that are not given are derived, as how many envs each worker holds."""
    builders, got = env_factories("CartPole-v1", **counts, cpus=_two_cpus)
    assert got == layout
    assert [b.index for b in builders] == list(range(sum(layout)))


@pytest.mark.parametrize(
    ("counts", "cpus", "layout"),
    [
        ({"num_envs": 6, "num_workers": 4}, 2, (2, 2, 1, 1)),
        ({"num_envs": 9, "num_workers": 6}, 2, (2, 2, 2, 1, 1, 1)),
        ({"num_envs": 8, "num_workers": 4}, 2, (2, 2, 2, 2)),
        ({"num_envs": 4, "num_workers": 4}, 2, (1, 1, 1, 1)),
        ({"num_envs": 6, "num_workers": 4, "envs_per_worker": 2}, 2, (2, 2, 1, 1)),
        ({"num_envs": 9, "num_workers": 3, "envs_per_worker": 4}, 2, (4, 4, 1)),  # as before
        ({"num_envs": 9}, 6, (2, 2, 2, 1, 1, 1)),  # 2 x 4 + 1 would leave a CPU idle
        ({"num_envs": 10}, 4, (3, 3, 3, 1)),  # today's layout: it uses every CPU
        ({"num_envs": 3}, 8, (1, 1, 1)),
    ],
)
def test_num_workers_gives_exactly_that_many_workers_spread_evenly(counts, cpus, layout):
    """`num_workers` workers hold envs differing by at most one, the first ones fuller."""
    _, got = env_factories("CartPole-v1", **counts, cpus=lambda: cpus)
    assert got == layout


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        (
            {"num_envs": 3, "num_workers": 4},
            r"`num_workers=4` is more than `num_envs=3`.*pass `num_workers` of at most 3, or "
            r"`num_envs` of at least 4",
        ),
        (
            {"num_envs": 3, "num_workers": 4, "envs_per_worker": 1},
            r"`num_workers=4` is more than `num_envs=3`",
        ),
        (
            {"num_envs": 6, "num_workers": 4, "envs_per_worker": 3},
            r"does not add up: 6 envs spread over 4 workers hold up to 2 each, and 3 envs per "
            r"worker need 2 workers for 6 envs\. Give two of the three",
        ),
    ],
)
def test_more_workers_than_envs_or_counts_that_disagree_are_named(counts, match):
    """More workers than envs, or three counts that disagree: a ValueError with the fix."""
    with pytest.raises(ValueError, match=match):
        env_factories("CartPole-v1", **counts, cpus=_two_cpus)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({}, ValueError, r"give `num_envs`.*got none"),
        ({"num_workers": 2}, ValueError, r"give `num_envs`.*num_workers"),
        (
            {"num_envs": 8, "num_workers": 3, "envs_per_worker": 2},
            ValueError,
            r"`num_envs=8` in `num_workers=3` workers of `envs_per_worker=2` envs does not add up",
        ),
        ({"num_envs": 0}, ValueError, r"`num_envs` must be a positive int, got 0"),
        ({"num_envs": 2.0}, TypeError, r"`num_envs` must be a positive int, got 2.0"),
        ({"num_envs": 2, "env": "NoSuchEnv-v9"}, ValueError, r"not a registered gymnasium id"),
        ({"num_envs": 2, "env": 3}, TypeError, r"`env` must be a gymnasium id or a factory"),
        (
            {"num_envs": 2, "env": FlakyEnv, "env_kwargs": {"a": 1}},
            TypeError,
            r"`env_kwargs` \{'a': 1\} is for a gymnasium id",
        ),
        ({"num_envs": 2, "env_kwargs": [1]}, TypeError, r"`env_kwargs` must be a dict"),
        ({"num_envs": 2, "wrappers": "x"}, TypeError, r"`wrappers` must be a list"),
        ({"num_envs": 2, "wrappers": [3]}, TypeError, r"`wrappers` holds 3"),
    ],
)
def test_bad_arguments_are_named(arguments, error, match):
    """Each bad argument is a TypeError/ValueError naming it, before anything starts."""
    arguments = {"env": "CartPole-v1", **arguments}
    with pytest.raises(error, match=match):
        env_factories(**arguments, cpus=_two_cpus)


def test_a_builder_makes_the_id_with_its_kwargs_and_applies_the_wrappers_in_order():
    """``gym.make(id, **env_kwargs)``, then each wrapper around the last."""
    order = []

    def tag(name):
        def wrap(env):
            order.append(name)
            return env

        return wrap

    builder = EnvBuilder("CartPole-v1", 3, {"max_episode_steps": 5}, [tag("a"), tag("b")])
    env = builder()
    assert env.spec.max_episode_steps == 5
    assert order == ["a", "b"]
    assert EnvBuilder(_indexed, 3, {}, [])().count == 300
    assert isinstance(EnvBuilder(FlakyEnv, 3, {}, [])(), FlakyEnv)


def test_make_vector_env_with_an_id_matches_make_vec():
    """``make_vector_env(id, n, seed=...)`` gives what ``gym.make_vec(id, n)`` gives."""
    expected = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync")
    with contextlib.closing(make_vector_env("CartPole-v1", 4, num_workers=2, seed=3)) as envs:
        np.testing.assert_array_equal(envs.reset()[0], expected.reset(seed=3)[0])
        for action in ([0, 1, 0, 1], [1, 1, 0, 0]):
            got = envs.step(np.array(action))
            want = expected.step(np.array(action))
            for mine, theirs in zip(got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(mine, theirs)
    expected.close()


def test_num_envs_alone_uses_the_cpus_ray_offers():
    """The workers default to the cluster's CPUs; env_kwargs and wrappers reach every env."""
    cpus = ray_cpus()
    with contextlib.closing(
        make_vector_env(
            "CartPole-v1",
            4,
            env_kwargs={"max_episode_steps": 2},
            wrappers=[gym.wrappers.RecordEpisodeStatistics],
        )
    ) as envs:
        assert len(env_slices(envs)) == min(4, cpus)
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        _, _, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert truncated.all()
        assert infos["_episode"].all()


def test_num_workers_starts_exactly_that_many_workers():
    """``make_vector_env(env, 6, num_workers=4)`` starts 4 workers of 2, 2, 1 and 1 envs."""
    with contextlib.closing(make_vector_env(_indexed, 6, num_workers=4)) as envs:
        assert env_slices(envs) == [(0, 2), (2, 4), (4, 5), (5, 6)]
        assert envs.get_attr("count") == (0, 100, 200, 300, 400, 500)


def test_a_face_takes_one_count_per_worker_and_names_bad_ones():
    """`envs_per_worker` may be one count per worker; counts that do not fit are named."""
    with contextlib.closing(GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=[1, 2])) as envs:
        assert env_slices(envs) == [(0, 1), (1, 3)]
    with pytest.raises(ValueError, match=r"`envs_per_worker=\[2, 2\]` gives 4 envs in all, but"):
        GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=[2, 2])
    with pytest.raises(ValueError, match=r"one positive int per worker, got \[3, 0\]"):
        GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=[3, 0])
    with pytest.raises(TypeError, match=r"one positive int per worker, got \(1.5, 1.5\)"):
        GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=(1.5, 1.5))


def test_factories_with_and_without_the_index():
    """A factory taking the index gets it; one taking nothing is called without."""
    with contextlib.closing(make_vector_env(_indexed, 3, envs_per_worker=2)) as envs:
        assert envs.get_attr("count") == (0, 100, 200)
    with contextlib.closing(make_vector_env(FlakyEnv, num_workers=2, envs_per_worker=1)) as envs:
        assert envs.get_attr("count") == (0, 0)


def test_todays_calls_keep_working():
    """``make_vector_env(make_env, num_workers, envs_per_worker)`` and ``make_env=`` still work."""
    with pytest.warns(DeprecationWarning, match=r"old form"):
        envs = make_vector_env(_indexed, 2, 3)
    with contextlib.closing(envs):
        assert envs.num_envs == 6
        assert env_slices(envs) == [(0, 3), (3, 6)]
    with pytest.warns(DeprecationWarning, match=r"make_env=\.\.\.\)` is deprecated"):
        envs = make_vector_env(make_env=_indexed, num_workers=1, envs_per_worker=2)
    envs.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the keyword form is the new API: no warning
        make_vector_env(_indexed, num_workers=1, envs_per_worker=2).close()


def test_vector_entry_point_refuses_unknown_keys_before_starting_workers():
    """A misspelt option is a TypeError naming it and the accepted keys, not an env error."""
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['on_actor_falure'\].*Accepted:"):
        vector_entry_point(2, env_id="CartPole-v1", on_actor_falure="restart")


def test_vector_entry_point_through_make_vec():
    """Env kwargs under `env_kwargs`; make_vec's own `render_mode` reaches gym.make."""
    gym.register(
        "RayCartPoleConvention-v1",
        vector_entry_point="ray_multiprocess_env:vector_entry_point",
        kwargs={
            "env_id": "CartPole-v1",
            "envs_per_worker": 2,
            "env_kwargs": {"max_episode_steps": 1},
        },
    )
    envs = gym.make_vec(
        "RayCartPoleConvention-v1",
        num_envs=4,
        vectorization_mode="vector_entry_point",
        render_mode="rgb_array",
    )
    with contextlib.closing(envs):
        assert isinstance(envs, GymnasiumVectorEnv)
        assert envs.render_mode == "rgb_array"
        envs.reset(seed=0)
        assert envs.step(np.zeros(4, dtype=np.int64))[3].all()  # max_episode_steps=1


def test_sync_vector_env_is_the_reference_for_a_factory_too():
    """A zero-argument factory: the same results as SyncVectorEnv over the same factories."""
    expected = SyncVectorEnv([FlakyEnv] * 3)
    with contextlib.closing(make_vector_env(FlakyEnv, 3, envs_per_worker=2, seed=1)) as envs:
        np.testing.assert_array_equal(envs.reset()[0], expected.reset(seed=1)[0])
        np.testing.assert_array_equal(
            envs.step(np.array([1, 2, 0]))[0], expected.step(np.array([1, 2, 0]))[0]
        )
    expected.close()


def test_the_rllib_creator_builds_the_vector_env_and_says_what_it_needs():
    """`rllib_env_creator` is `vector_entry_point` over env_config; without num_envs, why."""
    with contextlib.closing(
        rllib_env_creator({"env_id": "CartPole-v1", "envs_per_worker": 2, "num_envs": 4})
    ) as envs:
        assert isinstance(envs, GymnasiumVectorEnv)
        assert envs.num_envs == 4
    with pytest.raises(ValueError, match=r"gym_env_vectorize_mode='vector_entry_point'"):
        rllib_env_creator({"env_id": "CartPole-v1"})


def test_mixing_the_old_and_new_forms_is_named():
    """`env` with `make_env`, or the old positional form with count keywords: TypeError."""
    with pytest.raises(TypeError, match=r"give `env`, or its old name `make_env`, not both"):
        make_vector_env("CartPole-v1", 2, make_env=_indexed)
    with pytest.raises(TypeError, match=r"takes `env` and `num_envs` positionally.*got 4"):
        make_vector_env(_indexed, 2, 3, 4)
    with pytest.raises(TypeError, match=r"takes `env` and `num_envs` positionally.*got 3"):
        make_vector_env(_indexed, 2, 3, num_workers=2)
