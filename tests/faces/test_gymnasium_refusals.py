"""GymnasiumVectorEnv refuses what gymnasium refuses, naming the argument, before any env moves.

Bad masks, seeds, actions and timeouts, calls while a step is pending, and a finished env with
autoreset disabled; each leaves the vector env usable. On in-process workers (`in_process`,
tests/conftest.py), as tests/faces/test_gymnasium.py.
"""

from __future__ import annotations

import contextlib
import functools
import re

import gymnasium as gym
import numpy as np
import pytest

from ray_multiprocess_env import ClosedEnvError, GymnasiumVectorEnv
from ray_multiprocess_env.batch import check_rows
from tests.envs import FlakyEnv

pytestmark = pytest.mark.in_process


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        ([True, False], TypeError, r"must be a numpy bool array"),
        (np.array([1, 0]), TypeError, r"must be a numpy bool array"),
        (np.array([True]), ValueError, r"must have shape \(2,\)"),
        (np.array([False, False]), ValueError, r"at least one True"),
    ],
)
def test_bad_reset_mask(mask, error, match):
    """A bad reset_mask names the option and the fix."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=2)
    envs.reset()
    with pytest.raises(error, match=match):
        envs.reset(options={"reset_mask": mask})
    envs.close()


def test_disabled_autoreset_refuses_to_step_a_finished_env():
    """With autoreset disabled, stepping a finished env asks for a reset_mask reset."""
    envs = GymnasiumVectorEnv(
        [functools.partial(gym.make, "CartPole-v1", max_episode_steps=2)] * 2,
        autoreset_mode="disabled",
    )
    envs.reset(seed=0)
    envs.step(np.array([0, 0]))
    _, _, _, truncated, _ = envs.step(np.array([0, 0]))
    assert truncated.all()
    with pytest.raises(ValueError, match=r"env\(s\) \[0, 1\] finished their episode"):
        envs.step(np.array([0, 0]))
    envs.reset(options={"reset_mask": np.array([True, True])})
    envs.step(np.array([0, 0]))
    envs.close()


def test_optional_action_space_check():
    """check_actions=True refuses a batched action row outside single_action_space."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=2, check_actions=True)
    envs.reset()
    with pytest.raises(ValueError, match=r"row 2 \(np.int64\(5\)\) for env 2 is outside"):
        envs.step(np.array([0, 1, 5]))
    with pytest.raises(ValueError, match=r"row 0 .* for env 1 is outside"):
        envs.send(np.array([9]), [1])
    envs.step(np.array([0, 1, 2]))
    envs.close()


def test_reset_mask_needs_every_worker_reset_once():
    """A reset_mask that skips a worker never reset asks for a full reset first."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1)
    with pytest.raises(ValueError, match=r"envs 1\.\.1 were never reset; reset them all first"):
        envs.reset(options={"reset_mask": np.array([True, False])})
    envs.close()


def test_calls_while_a_step_is_pending_are_refused_as_gymnasium_does():
    """reset/async_reset/send/call/get_attr during a pending step_async: AlreadyPendingCallError."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1)
    envs.reset()
    envs.step_async(np.array([1, 1]))
    for call in (
        envs.reset,
        envs.async_reset,
        lambda: envs.send(np.array([1]), [0]),
        lambda: envs.call("render"),
        lambda: envs.get_attr("count"),
    ):
        with pytest.raises(gym.error.AlreadyPendingCallError, match=r"while a `step_async`"):
            call()
    assert envs.step_wait()[0][:, 0].tolist() == [1.0, 1.0]
    envs.close()
    with pytest.raises(ClosedEnvError, match=r"`step` was called on a closed GymnasiumVectorEnv"):
        envs.step(np.array([1, 1]))


def test_a_wrong_number_of_actions_steps_nothing():
    """An action batch of the wrong length is refused on the driver before any env steps."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2)
    envs.reset()
    for actions in (np.ones(3, dtype=np.int64), np.ones(5, dtype=np.int64)):
        with pytest.raises(ValueError, match=r"`actions` holds \d actions but 4 are needed"):
            envs.step(actions)
    with pytest.raises(ValueError, match=r"`actions` holds 2 actions but 1 are needed"):
        envs.send(np.ones(2, dtype=np.int64), [0])
    with pytest.raises(TypeError, match=r"`actions` must be a batch of 4 .* single value 0"):
        envs.step(0)  # as gymnasium's AsyncVectorEnv, a TypeError
    assert envs.get_attr("count") == (0, 0, 0, 0)
    envs.close()


def test_an_action_batch_of_the_wrong_shape_names_the_shape_and_check_actions():
    """An (n, 1) batch for a Discrete space is refused on the driver, naming the fix.

    (An env given ``array([0])`` for a Discrete action fails its own assertion, in a worker.)
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2)
    with contextlib.closing(envs):
        envs.reset()
        column = np.ones((4, 1), dtype=np.int64)
        expected = (
            r"`actions` has shape \(4, 1\), but 4 actions of Discrete\(3\) \(one per env, each "
            r"of shape \(\)\) make an array of shape \(4,\); `actions.reshape\(\(4,\)\)` "
            r"makes it one; nothing was sent. With `check_actions=True`, each action"
        )
        with pytest.raises(ValueError, match=expected):
            envs.step(column)
        with pytest.raises(ValueError, match=r"has shape \(2, 1\).*\(one per env id,"):
            envs.send(column[:2], [0, 1])
        with pytest.raises(ValueError, match=r"needed \(one per env: an array of shape \(4,\)"):
            envs.step(np.ones((2, 2), dtype=np.int64))
        assert envs.get_attr("count") == (0, 0, 0, 0)  # nothing stepped
        assert envs.step(np.ones(4, dtype=np.int64))[0].shape == (4, 1)
    checked = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1, check_actions=True)
    with contextlib.closing(checked):
        checked.reset()
        with pytest.raises(ValueError, match=r"makes it one; nothing was sent\.$"):
            checked.step(column[:2])  # (the check is on already: not suggested)


def test_a_box_action_array_is_checked_by_its_size():
    """A Box batch of another shape but of the same size passes; another size is refused.

    RLlib sends ``(n, 1)`` for a Box of shape ``()``, as CleanRL-style loops do.
    """
    check_rows(gym.spaces.Box(-1, 1, shape=()), "actions", np.zeros((4, 1)), 4, "env")
    check_rows(gym.spaces.Box(-1, 1, shape=(1,)), "actions", np.zeros(4), 4, "env")
    with pytest.raises(ValueError, match=r"has shape \(4, 2\), but 4 actions of Box.*\(4, 3\);"):
        check_rows(gym.spaces.Box(-1, 1, shape=(3,)), "actions", np.zeros((4, 2)), 4, "env")


def test_async_reset_checks_its_seed_before_changing_anything():
    """A bad seed in async_reset raises and leaves nothing in flight."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 2, envs_per_worker=1)
    with pytest.raises(TypeError, match=r"`seed` must be None, an int or a list"):
        envs.async_reset(seed="x")
    envs.reset()
    assert envs.step(np.array([1, 1]))[0][:, 0].tolist() == [1.0, 1.0]
    envs.close()


@pytest.mark.parametrize(
    ("bad", "error"),
    [("5", TypeError), (True, TypeError), (-1, ValueError), (float("nan"), ValueError),
     (float("inf"), ValueError), (10**400, ValueError)],
    ids=["str", "bool", "negative", "nan", "inf", "past-floats"],
)  # fmt: skip
def test_a_wait_with_a_bad_timeout_names_it_and_loses_no_call(bad, error):
    """`step_wait` and `recv` refuse a `timeout` that is not seconds before touching anything.

    The step stays pending for the next `step_wait`, and the envs sent stay in flight.
    """
    envs = GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=2)
    with contextlib.closing(envs):
        envs.reset()
        envs.step_async(np.ones(3, dtype=np.int64))
        with pytest.raises(error, match=rf"`timeout` must be .*, got {re.escape(repr(bad))}\."):
            envs.step_wait(timeout=bad)
        assert envs.step_wait()[0][:, 0].tolist() == [1.0, 1.0, 1.0]
        envs.send(np.ones(2, dtype=np.int64), [0, 2])
        with pytest.raises(error, match=rf"`timeout` must be .*, got {re.escape(repr(bad))}\."):
            envs.recv(timeout=bad)
        obs, *_, infos = envs.recv()
        got = dict(zip(infos["env_id"].tolist(), obs[:, 0].tolist(), strict=True))
        assert got == {0: 2.0, 2: 2.0}
