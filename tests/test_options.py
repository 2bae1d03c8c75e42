"""The options every entry point takes: declared once, every one of them reaching the engine."""

from __future__ import annotations

import dataclasses
import inspect

import gymnasium as gym
import pytest

from ray_multiprocess_env import (
    GymnasiumVectorEnv,
    RayVectorEnv,
    make_vector_env,
    vector_entry_point,
)
from ray_multiprocess_env._engine import Options
from ray_multiprocess_env._engine.options import check_timeout, check_wait
from ray_multiprocess_env.env_factories import env_factories
from ray_multiprocess_env.options import MAKE_KEYS, WORKER_KEYS, WorkerOptions
from tests.helpers import engine_options

pytestmark = pytest.mark.in_process  # the logic of arguments and faces: tests/conftest.py


def _cartpoles(count=2):
    return [lambda: gym.make("CartPole-v1")] * count


def _sb3():
    return pytest.importorskip("ray_multiprocess_env.faces.sb3")


def _tianshou():
    return pytest.importorskip("ray_multiprocess_env.faces.tianshou_make")


#: Every entry point that starts workers: (name, a call with the extra keywords given).
_MAKERS = {
    "make_vector_env": lambda **kw: make_vector_env("CartPole-v1", 2, num_workers=1, **kw),
    "vector_entry_point": lambda **kw: vector_entry_point(
        2, env_id="CartPole-v1", num_workers=1, **kw
    ),
    "GymnasiumVectorEnv": lambda **kw: GymnasiumVectorEnv(_cartpoles(), envs_per_worker=2, **kw),
    "RayVectorEnv.from_env_fns": lambda **kw: RayVectorEnv.from_env_fns(
        _cartpoles(), envs_per_worker=2, **kw
    ),
    "make_sb3_vec_env": lambda **kw: _sb3().make_sb3_vec_env("CartPole-v1", 2, num_workers=1, **kw),
    "SB3VecEnv": lambda **kw: _sb3().SB3VecEnv(_cartpoles(), envs_per_worker=2, **kw),
    "make_tianshou_vector_env": lambda **kw: _tianshou().make_tianshou_vector_env(
        "CartPole-v1", 2, num_workers=1, **kw
    ),
    "TianshouVectorEnv": lambda **kw: pytest.importorskip(
        "ray_multiprocess_env.faces.tianshou"
    ).TianshouVectorEnv(_cartpoles(), envs_per_worker=2, **kw),
}

_GIVEN: WorkerOptions = {
    "actor_options": {"num_cpus": 0.5},
    "placement": "PACK",
    "timeout": 45.0,
    "on_actor_failure": "restart",
    "transport": "pipe",
    "on_env_error": "restart",
    "max_restarts": 7,
}


def test_the_declared_options_are_the_engines_and_the_factories():
    """`WorkerOptions` are the engine's `Options` but the two each face sets itself.

    And `worker_spin`, which comes from the environment only (`worker_spin.check_spin`).
    """
    engine_fields = {field.name for field in dataclasses.fields(Options)}
    own = {"autoreset_mode", "check_actions", "worker_spin"}
    assert set(_GIVEN) == WORKER_KEYS == engine_fields - own
    factory_arguments = set(inspect.signature(env_factories).parameters) - {"env", "num_envs"}
    assert factory_arguments - {"cpus"} == MAKE_KEYS - WORKER_KEYS


@pytest.mark.parametrize("entry_point", list(_MAKERS))
def test_every_entry_point_hands_every_option_to_the_engine(entry_point):
    """Each of the seven `WorkerOptions` given to any entry point is the one the engine runs."""
    envs = _MAKERS[entry_point](**_GIVEN)
    try:
        made = engine_options(envs)
        for key, value in _GIVEN.items():
            assert getattr(made, key) == value, key
    finally:
        envs.close()


@pytest.mark.parametrize("entry_point", list(_MAKERS))
def test_a_misspelt_option_is_named_with_the_fix_before_any_worker_starts(entry_point):
    """`timout=` is a `TypeError` naming the entry point, the key and `timeout`, at once."""
    with pytest.raises(TypeError, match=r"'timout'.*Did you mean `timeout`"):
        _MAKERS[entry_point](timout=5)


@pytest.mark.parametrize(
    "entry_point",
    ["make_sb3_vec_env", "SB3VecEnv", "make_tianshou_vector_env", "TianshouVectorEnv"],
)
@pytest.mark.parametrize("setting", ["autoreset_mode", "check_actions", "copy", "where"])
def test_another_faces_own_setting_is_refused_not_ignored(entry_point, setting):
    """`check_actions=True` on the SB3 face (which has no such setting) is an error, not a no-op."""
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{setting}'"):
        _MAKERS[entry_point](**{setting: True})


@pytest.mark.parametrize(
    ("entry_point", "misspelt", "meant"),
    [
        ("TianshouVectorEnv", "wait_timout", "wait_timeout"),  # not `timeout`
        ("make_tianshou_vector_env", "wait_timout", "wait_timeout"),
        ("GymnasiumVectorEnv", "copi", "copy"),
        ("make_sb3_vec_env", "monitr", "monitor"),
        ("RayVectorEnv.from_env_fns", "envs_per_actr", "envs_per_actor"),
    ],
)
def test_the_fix_named_may_be_the_entry_points_own_argument(entry_point, misspelt, meant):
    """The closest name is looked for among the entry point's own arguments too."""
    with pytest.raises(TypeError, match=rf"'{misspelt}'\. Did you mean `{meant}`\?"):
        _MAKERS[entry_point](**{misspelt: 1})


def test_seconds_past_any_float_are_infinity_not_an_overflow_error():
    """An int past any float is a timeout like infinity: no bound, or refused by name."""
    assert check_timeout(10**400) is None  # (as `float("inf")`: no bound)
    with pytest.raises(ValueError, match=r"`timeout` must be a positive number .* got -1000"):
        check_timeout(-(10**400))
    for seconds in (10**400, -(10**400)):
        with pytest.raises(ValueError, match=r"`timeout` must be a finite number of seconds >= 0"):
            check_wait(seconds)
