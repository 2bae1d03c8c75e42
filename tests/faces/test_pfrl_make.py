"""`RayVectorEnv.from_env_fns`: its arguments, its factories' errors, its workers."""

from __future__ import annotations

import threading

import gymnasium as gym
import pytest
import ray

from ray_multiprocess_env import EnvCrashedError, RayVectorEnv
from tests.envs import FlakyEnv


@pytest.mark.parametrize(
    ("env_fns", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, r"`env_fns` is empty"),
        ("CartPole-v1", {}, TypeError, r"`env_fns` must be a list of env factories"),
        ([FlakyEnv, 3], {}, TypeError, r"`env_fns\[1\]` must be a callable"),
        ([FlakyEnv], {"envs_per_actor": 0}, ValueError, r"`envs_per_actor` must be a positive"),
        ([FlakyEnv], {"envs_per_actor": 2.0}, TypeError, r"`envs_per_actor` must be a positive"),
        ([FlakyEnv], {"actor_options": 1}, TypeError, r"`actor_options` must be a mapping"),
    ],
)
@pytest.mark.filterwarnings("ignore:`envs_per_actor` is deprecated:DeprecationWarning")
def test_from_env_fns_bad_arguments(env_fns, kwargs, error, match):
    """Bad arguments to from_env_fns name the argument and the fix."""
    with pytest.raises(error, match=match):
        RayVectorEnv.from_env_fns(env_fns, **kwargs)


def test_from_env_fns_names_a_factory_that_cannot_be_pickled():
    """A factory that cannot be pickled is named by its env indices, with the fix."""
    lock = threading.Lock()

    def make_env():
        with lock:
            return FlakyEnv()

    with pytest.raises(
        TypeError, match=r"envs 0\.\.1 could not be sent .*cannot pickle '_thread.lock'.* picklable"
    ):
        RayVectorEnv.from_env_fns([make_env] * 3, envs_per_worker=2)


@pytest.mark.in_process
def test_from_env_fns_factory_error_names_the_env():
    """A factory that raises inside its worker is reported with its env index and the fix.

    The fix is the factory (not a new actor), and no env of the vector env started.
    """

    def broken():
        raise OSError("no display")

    with pytest.raises(EnvCrashedError, match=r"env 2: its factory raised OSError: no display"):
        RayVectorEnv.from_env_fns([FlakyEnv, FlakyEnv, broken], envs_per_worker=2)
    with pytest.raises(EnvCrashedError) as info:
        RayVectorEnv.from_env_fns([FlakyEnv, FlakyEnv, broken], envs_per_worker=2)
    message = str(info.value)
    assert "An env factory raised in its worker: fix the factory" in message
    assert "none of the envs [0-2] started (every worker was stopped)" in message
    assert "create a new actor" not in message


def test_a_factory_that_raises_gives_ray_no_traceback_of_its_own_to_print():
    """A worker whose factory raises answers its first call with the error; it does not die.

    An actor whose constructor raised would have Ray print that traceback on the console (about
    18 lines per worker) before the library's error says the same.
    """

    def broken():
        raise OSError("no display")

    with pytest.raises(EnvCrashedError, match=r"env 0: its factory raised OSError") as info:
        RayVectorEnv.from_env_fns([broken, broken], envs_per_worker=2)
    cause = info.value.__cause__
    assert isinstance(cause, ray.exceptions.RayTaskError), type(cause)
    assert not isinstance(cause, ray.exceptions.ActorDiedError)  # (a creation task's error)
    assert "no display" in info.value.remote_traceback  # (the factory's own traceback)


@pytest.mark.in_process
def test_workers_split_envs_and_report_their_slices():
    """Workers hold envs_per_actor envs each (the last fewer) and get/set attrs per env."""
    with RayVectorEnv.from_env_fns([FlakyEnv] * 5, envs_per_worker=2) as vec:
        assert vec.env_slices == (slice(0, 2), slice(2, 4), slice(4, 5))
        assert len(vec.remote_envs) == 3
        vec.reset()
        vec.set_attr("count", [0, 1, 2, 3, 4])
        assert vec.get_attr("count") == (0, 1, 2, 3, 4)
        assert vec.call("count") == (0, 1, 2, 3, 4)
        assert vec.action_space == gym.spaces.Discrete(3)


@pytest.mark.in_process
def test_envs_per_actor_is_a_deprecated_alias():
    """`envs_per_actor` still works, with a DeprecationWarning naming `envs_per_worker`."""
    with pytest.warns(DeprecationWarning, match=r"use `envs_per_worker`"):
        vec = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_actor=2)
    assert len(vec.remote_envs) == 1
    vec.close()
    with pytest.raises(ValueError, match=r"disagree; pass only `envs_per_worker`"):
        with pytest.warns(DeprecationWarning, match=r"`envs_per_actor` is deprecated"):
            RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_actor=2, envs_per_worker=1)
