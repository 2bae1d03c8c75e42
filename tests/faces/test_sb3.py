"""SB3VecEnv against stable-baselines3's DummyVecEnv, SB3's wrappers on top, and PPO learning.

Besides the DummyVecEnv comparison, the face's logic runs on in-process workers (`in_process`,
tests/conftest.py); the same face over each Ray transport is in tests/test_transports.py, and
its restarts in tests/test_restart.py.
"""

from __future__ import annotations

import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest

from tests.envs import DictObsEnv, FlakyEnv, NamedCallEnv, OldTimeLimitEnv, RenderingFlakyEnv
from tests.envs_spaces import TupleObsDictActionEnv, UnsortedDictObsEnv

sb3 = pytest.importorskip("stable_baselines3")
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import (  # noqa: E402
    DummyVecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
)

from ray_multiprocess_env import SB3VecEnv, make_sb3_vec_env  # noqa: E402
from tests.helpers import assert_loaded_on_first_use, assert_same, engine_options  # noqa: E402

ENV_FNS = {
    "CartPole": functools.partial(gym.make, "CartPole-v1", max_episode_steps=30),
    "DictObs": DictObsEnv,
    "TupleObsDictAction": TupleObsDictActionEnv,
    "UnsortedDictObs": UnsortedDictObsEnv,
}


def _rollout(venv, steps, seed):
    venv.seed(seed)
    space = venv.action_space
    space.seed(seed)
    yield venv.reset()
    yield [dict(info) for info in venv.reset_infos]
    for _ in range(steps):
        yield venv.step(np.array([space.sample() for _ in range(venv.num_envs)]))
        yield [dict(info) for info in venv.reset_infos]


def _same(ours, theirs, path):
    if isinstance(theirs, list):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _same(a, b, f"{path}[{i}]")
    elif isinstance(theirs, dict) and not isinstance(ours, dict):
        raise AssertionError(f"{path}: {type(ours)}")
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"{path}: {list(ours)} != {list(theirs)}"
        assert type(ours) is type(theirs), f"{path}: {type(ours)} != {type(theirs)}"
        for key in theirs:
            _same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, tuple):
        assert isinstance(ours, tuple), f"{path}: {type(ours)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _same(a, b, f"{path}[{i}]")
    else:
        assert_same(ours, theirs, path)


@pytest.mark.parametrize("env_name", list(ENV_FNS))
def test_matches_dummy_vec_env(env_name):
    """Observations, rewards, dones, infos and reset_infos equal DummyVecEnv's, step by step."""
    env_fns = [ENV_FNS[env_name]] * 5
    ours, theirs = SB3VecEnv(env_fns, envs_per_worker=2), DummyVecEnv(env_fns)
    assert ours.observation_space == theirs.observation_space
    assert ours.action_space == theirs.action_space
    dones = 0
    for step, (a, b) in enumerate(zip(_rollout(ours, 60, 3), _rollout(theirs, 60, 3), strict=True)):
        _same(a, b, f"output {step}")
        if isinstance(b, tuple):
            dones += int(b[2].sum())
    assert dones >= 5
    ours.close()
    theirs.close()


@pytest.mark.in_process
@pytest.mark.parametrize(
    "wrap",
    [
        lambda v: VecNormalize(v, gamma=0.9),
        VecMonitor,
        lambda v: VecFrameStack(v, n_stack=3),
    ],
    ids=["VecNormalize", "VecMonitor", "VecFrameStack"],
)
def test_sb3_wrappers_run_on_top(wrap):
    """SB3's vec wrappers give the same outputs on ours as on DummyVecEnv."""
    env_fns = [ENV_FNS["CartPole"]] * 4
    ours, theirs = wrap(SB3VecEnv(env_fns, envs_per_worker=2)), wrap(DummyVecEnv(env_fns))
    for step, (a, b) in enumerate(zip(_rollout(ours, 40, 1), _rollout(theirs, 40, 1), strict=True)):
        if isinstance(b, tuple):  # VecMonitor's episode info holds wall time
            np.testing.assert_allclose(a[0], b[0], rtol=1e-6, err_msg=f"obs {step}")
            np.testing.assert_allclose(a[1], b[1], rtol=1e-6, err_msg=f"rewards {step}")
            np.testing.assert_array_equal(a[2], b[2])
            assert [set(i) for i in a[3]] == [set(i) for i in b[3]]
    ours.close()
    theirs.close()


@pytest.mark.in_process
def test_env_method_get_attr_set_attr_with_indices():
    """env_method, get_attr, set_attr and env_is_wrapped take `indices` like DummyVecEnv."""
    envs = SB3VecEnv([NamedCallEnv] * 4, envs_per_worker=3)
    envs.reset()
    envs.set_attr("delay", 0.001, indices=[1, 3])
    assert envs.get_attr("delay") == [0.0, 0.001, 0.0, 0.001]
    assert envs.get_attr("delay", indices=2) == [0.0]
    envs.step(np.array([1, 2, 0, 1]))
    assert envs.env_method("render", indices=[0, 1])[1][0, 0, 0] == 2
    assert envs.env_is_wrapped(gym.wrappers.TimeLimit) == [False] * 4
    wrapped = SB3VecEnv([ENV_FNS["CartPole"]] * 2)
    assert wrapped.env_is_wrapped(gym.wrappers.TimeLimit, indices=[1]) == [True]
    with pytest.raises(ValueError, match=r"`indices` contains 7 but there are 4 envs"):
        envs.get_attr("delay", indices=[7])
    assert envs.get_attr("delay", indices=[-1, -3]) == [0.001, 0.001]  # as DummyVecEnv allows
    with pytest.raises(TypeError, match=r"`indices` must hold ints, got 'a'"):
        envs.get_attr("delay", indices=["a"])
    assert envs.env_method("greet", name="ada", indices=[0]) == ["hello ada"]
    envs.close()
    wrapped.close()


@pytest.mark.in_process
def test_attributes_live_where_dummy_vec_env_puts_them():
    """has_attr looks through wrappers; set_attr sets on the outermost wrapper, as DummyVecEnv."""
    ours = SB3VecEnv([lambda: Monitor(NamedCallEnv())] * 3, envs_per_worker=2)
    theirs = DummyVecEnv([lambda: Monitor(NamedCallEnv())] * 3)
    for venv in (ours, theirs):
        assert venv.has_attr("delay")  # the env's, under the Monitor
        assert not venv.has_attr("dummy")
        venv.set_attr("dummy", 12)
        assert venv.has_attr("dummy")
        assert venv.get_attr("dummy") == [12] * 3
        venv.set_attr("delay", 0.5, indices=[0, 2])  # on the Monitor: the env keeps its own
        assert venv.get_attr("delay") == [0.5, 0.0, 0.5]
        assert [env.delay for env in venv.get_attr("unwrapped")] == [0.0] * 3
        assert venv.env_method("set_wrapper_attr", "count", 4, indices=[1]) == [True]
        assert [env.count for env in venv.get_attr("unwrapped")] == [0, 4, 0]
    ours.close()
    theirs.close()


def test_wrong_actions_are_refused_before_anything_steps():  # (a class-level space: on Ray)
    """A batch of another length is a ValueError, a single action a TypeError; none steps."""
    envs = SB3VecEnv([NamedCallEnv] * 3, envs_per_worker=2)
    envs.reset()
    with pytest.raises(ValueError, match=r"`actions` holds 2 actions but 3 are needed"):
        envs.step(np.array([1, 1]))
    with pytest.raises(TypeError, match=r"`actions` must be a batch of 3 .* single value 1"):
        envs.step(1)
    assert envs.get_attr("count") == [0, 0, 0]
    envs.close()
    spaces = SB3VecEnv([TupleObsDictActionEnv] * 2)
    spaces.reset()
    action = spaces.action_space.sample()
    with pytest.raises(ValueError, match=r"`actions` holds 1 actions but 2 are needed"):
        spaces.step([action])
    with pytest.raises(ValueError, match=r"`actions` is a dict of batches .* list of 2 dicts"):
        spaces.step({key: np.stack([value] * 2) for key, value in action.items()})
    with pytest.raises(ValueError, match=r"`actions` holds an action that does not fit"):
        spaces.step([action, {"move": action["move"]}])  # no "pick"
    spaces.close()


@pytest.mark.in_process
def test_get_images_and_render():
    """get_images gives one frame per env and render tiles them, in rgb_array mode."""
    envs = SB3VecEnv([RenderingFlakyEnv] * 4, envs_per_worker=2)
    envs.reset()
    frames = envs.get_images()
    assert [f.shape for f in frames] == [(8, 8, 3)] * 4
    assert envs.render(mode="rgb_array").shape == (16, 16, 3)
    envs.close()
    plain = SB3VecEnv([FlakyEnv])
    with pytest.warns(UserWarning, match="needs 'rgb_array'"):
        assert plain.get_images() == [None]
    plain.close()


@pytest.mark.in_process
def test_make_sb3_vec_env_seeds_each_env():
    """make_sb3_vec_env passes indices and seeds env i with seed + i."""
    envs = make_sb3_vec_env(
        lambda i: gym.make("CartPole-v1"), num_workers=2, envs_per_worker=2, seed=5
    )
    expected = DummyVecEnv([ENV_FNS["CartPole"]] * 4)
    expected.seed(5)
    np.testing.assert_array_equal(envs.reset(), expected.reset())
    envs.close()
    with pytest.raises(ValueError, match=r"`envs_per_worker` must be a positive int"):
        make_sb3_vec_env(lambda i: gym.make("CartPole-v1"), num_workers=1, envs_per_worker=0)


def test_importing_the_package_does_not_import_sb3_or_torch():
    """SB3VecEnv is loaded on first use; importing the package imports neither SB3 nor torch."""
    assert_loaded_on_first_use("stable_baselines3", "SB3VecEnv")


@pytest.mark.in_process
def test_make_sb3_vec_env_one_line_with_monitor():
    """``make_sb3_vec_env(id, n, monitor=True)``: SB3's Monitor in each env, as make_vec_env."""
    from stable_baselines3.common.evaluation import evaluate_policy

    envs = make_sb3_vec_env("CartPole-v1", 2, monitor=True, env_kwargs={"max_episode_steps": 5})
    envs.reset()
    for _ in range(5):
        _, _, dones, infos = envs.step(np.zeros(2, dtype=np.int64))
    assert dones.all()
    assert [info["episode"]["l"] for info in infos] == [5, 5]

    class Zero:
        def predict(self, obs, state=None, episode_start=None, deterministic=True):
            return np.zeros(len(obs), dtype=np.int64), None

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not wrapped with a Monitor" warning
        mean, _ = evaluate_policy(Zero(), envs, n_eval_episodes=2)
    assert mean == 5.0
    envs.close()


@pytest.mark.in_process
def test_sb3_make_vec_env_builds_an_sb3_vec_env():
    """``make_vec_env(id, n_envs, vec_env_cls=SB3VecEnv, vec_env_kwargs=...)`` works."""
    from stable_baselines3.common.env_util import make_vec_env

    envs = make_vec_env(
        "CartPole-v1",
        n_envs=4,
        seed=2,
        vec_env_cls=SB3VecEnv,
        vec_env_kwargs={"envs_per_worker": 2, "transport": "pipe"},
    )
    expected = make_vec_env("CartPole-v1", n_envs=4, seed=2)
    assert isinstance(envs, SB3VecEnv)
    np.testing.assert_array_equal(envs.reset(), expected.reset())
    np.testing.assert_array_equal(
        envs.step(np.array([0, 1, 0, 1]))[0], expected.step(np.array([0, 1, 0, 1]))[0]
    )
    envs.close()
    expected.close()


@pytest.mark.in_process
def test_make_sb3_vec_env_takes_every_engine_option():
    """Every engine option (faults too) reaches the engine from the SB3 entry point."""
    envs = make_sb3_vec_env(
        FlakyEnv,
        num_workers=2,
        envs_per_worker=1,
        timeout=30.0,
        on_actor_failure="restart",
        on_env_error="restart",
        max_restarts=None,
        transport="pipe",
        actor_options={"num_cpus": 0.5},
        placement=None,
    )
    options = engine_options(envs)
    assert (options.timeout, options.on_actor_failure, options.transport) == (
        30.0,
        "restart",
        "pipe",
    )
    assert (options.on_env_error, options.max_restarts) == ("restart", None)
    assert dict(options.actor_options) == {"num_cpus": 0.5}
    envs.close()


def test_an_old_gym_time_limit_is_reported_as_sb3_reads_it():
    """An old gym env ended by its `TimeLimit` (done, ``TimeLimit.truncated``) is a time limit.

    SB3 converts old gym envs with shimmy, which reads that key as a truncation: its
    ``info["TimeLimit.truncated"]`` stays True, so SB3 bootstraps the value at the timeout. An
    old gym env's real end stays False.
    """
    fns = [OldTimeLimitEnv, functools.partial(OldTimeLimitEnv, ends_first=True)]
    venv = SB3VecEnv(fns, envs_per_worker=2)
    try:
        venv.reset()
        venv.step(np.array([1, 1]))
        _, _, dones, infos = venv.step(np.array([1, 1]))  # (env 0's time limit)
        assert dones.tolist() == [True, False]
        assert infos[0]["TimeLimit.truncated"] is True
        assert infos[0]["terminal_observation"].tolist() == [2.0]
        assert infos[1]["TimeLimit.truncated"] is False
        _, _, dones, infos = venv.step(np.array([1, 1]))  # (env 1's real end)
        assert dones.tolist() == [False, True]
        assert infos[1]["TimeLimit.truncated"] is False
        assert infos[1]["terminal_observation"].tolist() == [3.0]
    finally:
        venv.close()
