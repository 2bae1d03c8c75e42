"""GymnasiumVectorEnv against gymnasium's SyncVectorEnv, step by step, in every autoreset mode.

The face's logic, on in-process workers (`in_process`, tests/conftest.py); the same face over
each Ray transport is in tests/test_transports.py.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from ray_multiprocess_env import (
    GymnasiumVectorEnv,
    RemoteEnv,
    RemoteEnvError,
    make_vector_env,
)
from tests.envs import DictObsEnv, EndOnTwoEnv, FlakyEnv, NamedCallEnv
from tests.envs_spaces import GraphActionEnv
from tests.helpers import assert_same

pytestmark = pytest.mark.in_process

NUM_ENVS = 5  # workers of 2, 2 and 1 envs
ENV_FNS = {
    "CartPole": functools.partial(gym.make, "CartPole-v1"),
    "Pendulum": functools.partial(gym.make, "Pendulum-v1", max_episode_steps=15),
    "DictObs": DictObsEnv,
}


def _rollout(envs, mode, steps, seed):
    """Reset with `seed`, then step with seeded random actions; yields every output."""
    actions_space = envs.action_space
    actions_space.seed(seed)
    yield envs.reset(seed=seed)
    for _ in range(steps):
        out = envs.step(actions_space.sample())
        yield out
        finished = np.logical_or(out[2], out[3])
        if mode == AutoresetMode.DISABLED and finished.any():
            yield envs.reset(options={"reset_mask": finished})


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("env_name", list(ENV_FNS))
def test_matches_sync_vector_env(env_name, mode):
    """Observations, rewards, terminations, truncations and infos equal SyncVectorEnv's."""
    env_fns = [ENV_FNS[env_name]] * NUM_ENVS
    ours = GymnasiumVectorEnv(env_fns, envs_per_worker=2, autoreset_mode=mode)
    theirs = SyncVectorEnv(env_fns, autoreset_mode=mode)
    assert ours.single_observation_space == theirs.single_observation_space
    assert ours.observation_space == theirs.observation_space
    assert ours.action_space == theirs.action_space
    assert ours.metadata["autoreset_mode"] == theirs.metadata["autoreset_mode"] == mode
    episodes = 0
    for step, (a, b) in enumerate(
        zip(_rollout(ours, mode, 60, 7), _rollout(theirs, mode, 60, 7), strict=True)
    ):
        assert_same(a, b, f"output {step}")
        if len(b) == 5:
            episodes += int(np.logical_or(b[2], b[3]).sum())
    assert episodes >= NUM_ENVS  # several episodes ended, so autoreset was exercised
    ours.close()
    theirs.close()


def test_vector_wrappers_run_on_top():
    """Gymnasium's vector wrappers give the same results on ours as on SyncVectorEnv."""
    wrappers = [
        gym.wrappers.vector.RecordEpisodeStatistics,
        gym.wrappers.vector.NormalizeObservation,
        gym.wrappers.vector.DictInfoToList,
    ]
    env_fns = [ENV_FNS["CartPole"]] * 4
    ours, theirs = GymnasiumVectorEnv(env_fns, envs_per_worker=2), SyncVectorEnv(env_fns)
    episodes = 0
    for wrapper in wrappers:
        ours, theirs = wrapper(ours), wrapper(theirs)
    for step, (a, b) in enumerate(
        zip(_rollout(ours, None, 80, 3), _rollout(theirs, None, 80, 3), strict=True)
    ):
        np.testing.assert_allclose(a[0], b[0], err_msg=f"obs {step}")
        assert [set(info) for info in a[-1]] == [set(info) for info in b[-1]], f"infos {step}"
        for ours_info, their_info in zip(a[-1], b[-1], strict=True):
            if "episode" in their_info:  # its "t" is wall time, which differs
                episodes += 1
                for key in ("r", "l"):
                    assert ours_info["episode"][key] == their_info["episode"][key]
    assert episodes >= 4
    ours.close()
    theirs.close()


def _make_indexed(index):
    env = FlakyEnv()
    env.index = index
    return env


def test_make_vector_env_passes_indices_and_seeds_each_env():
    """make_env gets the global index; env i is seeded seed + i, so no two envs share a seed."""
    envs = make_vector_env(_make_indexed, num_workers=2, envs_per_worker=3, seed=10)
    assert envs.num_envs == 6
    assert envs.get_attr("index") == (0, 1, 2, 3, 4, 5)
    obs, _ = envs.reset()
    assert envs.np_random_seed == tuple(range(10, 16))
    expected, _ = SyncVectorEnv([FlakyEnv] * 6).reset(seed=10)
    np.testing.assert_array_equal(obs, expected)
    assert len({o.item() for o in obs}) > 1
    envs.close()
    assert envs.closed


def test_make_vec_through_the_vector_entry_point():
    """gymnasium.make_vec with vectorization_mode='vector_entry_point' returns our vector env."""
    gym.register(
        "RayTestCartPole-v1",
        vector_entry_point="ray_multiprocess_env:vector_entry_point",
        kwargs={"env_id": "CartPole-v1", "envs_per_worker": 2},
    )
    envs = gym.make_vec("RayTestCartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    assert isinstance(envs, GymnasiumVectorEnv)
    assert len(envs.remote_envs) == 2
    obs, _ = envs.reset(seed=1)
    expected, _ = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync").reset(seed=1)
    np.testing.assert_array_equal(obs, expected)
    envs.close()


def test_call_get_attr_set_attr_and_render():
    """call, get_attr, set_attr and render reach every env."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 3, envs_per_worker=2)
    envs.reset(seed=0)
    envs.set_attr("delay", [0.0, 0.001, 0.0])
    assert envs.get_attr("delay") == (0.0, 0.001, 0.0)
    envs.step(np.array([1, 2, 0]))
    assert envs.call("count") == tuple(c for c in envs.get_attr("count"))
    frames = envs.render()
    assert [f.shape for f in frames] == [(8, 8, 3)] * 3
    envs.close()


def test_env_error_names_the_global_env_index():
    """An env raising inside a worker names its global index; the others step on."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2)
    envs.reset()
    with pytest.raises(RemoteEnvError, match=r"env 3 failed in `step`: ValueError") as info:
        envs.step(np.array([1, 1, 1, -1]))
    assert info.value.env_indices == (3,)
    assert "negative action -1" in info.value.remote_traceback
    assert envs.get_attr("count")[:3] == (1, 1, 1)
    envs.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"env": None, "make_env": 3}, TypeError, r"`make_env` must be a callable"),
        ({"env": 3}, TypeError, r"`env` must be a gymnasium id or a factory"),
        ({"num_workers": 0}, ValueError, r"`num_workers` must be a positive int, got 0"),
        ({"envs_per_worker": 1.5}, TypeError, r"`envs_per_worker` must be a positive int"),
        ({"autoreset_mode": "sometimes"}, ValueError, r"`autoreset_mode` must be one of"),
        ({"seed": "1"}, TypeError, r"`seed` must be an int or None"),
    ],
)
def test_make_vector_env_bad_arguments(kwargs, error, match):
    """Bad arguments to make_vector_env name the argument and the fix."""
    arguments = {"env": _make_indexed, "num_workers": 1, "envs_per_worker": 1, **kwargs}
    with pytest.raises(error, match=match):
        make_vector_env(**arguments)


def test_gymnasium_env_checker_passes_on_a_remote_env():
    """The gymnasium env checker passes on a `RemoteEnv` (its worker a thread here, `in_process`).

    Its doctest in `faces/remote_env.py` runs one over a Ray actor.
    """
    from gymnasium.utils.env_checker import check_env

    for env_fn in (ENV_FNS["CartPole"], DictObsEnv):
        env = RemoteEnv(env_fn)
        check_env(env, skip_render_check=True)
        env.close()


def test_step_async_step_wait_equal_step():
    """step_async + step_wait give what step gives; misuse is a clear error."""
    ours = GymnasiumVectorEnv([ENV_FNS["DictObs"]] * 3, envs_per_worker=2)
    theirs = SyncVectorEnv([ENV_FNS["DictObs"]] * 3)
    assert_same(ours.reset(seed=1), theirs.reset(seed=1))
    for _ in range(5):
        actions = np.array([0, 1, 2])
        ours.step_async(actions)
        with pytest.raises(RuntimeError, match=r"`step_async` was called while a `step_async`"):
            ours.step_async(actions)
        assert_same(ours.step_wait(), theirs.step(actions))
    with pytest.raises(RuntimeError, match=r"`step_wait` was called without a `step_async`"):
        ours.step_wait()
    ours.close()


@pytest.mark.parametrize("envs_per_worker", [1, 2])
def test_first_ready_rows_match_each_env_stepped_alone(envs_per_worker):
    """send/recv rows, tagged with infos["env_id"], equal each env stepped on its own."""
    num_envs, rounds = 4, 8
    ours = GymnasiumVectorEnv([DictObsEnv] * num_envs, envs_per_worker=envs_per_worker)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 3, size=(num_envs, rounds))
    expected = []
    for env_id in range(num_envs):
        alone = SyncVectorEnv([DictObsEnv])
        rows = [alone.reset(seed=10 + env_id)]
        rows += [alone.step(actions[env_id, t : t + 1]) for t in range(rounds)]
        expected.append(rows)
    ours.async_reset(seed=10)
    got: list[list] = [[] for _ in range(num_envs)]
    sent = [0] * num_envs
    while any(len(g) < rounds + 1 for g in got):
        obs, rewards, terminated, truncated, infos = ours.recv(batch_size=1)
        ids = infos["env_id"]
        assert list(ids) == sorted(ids)
        for row, env_id in enumerate(ids):
            got[env_id].append(
                (obs["position"][row], rewards[row], terminated[row], truncated[row])
            )
        again = [int(e) for e in ids if sent[e] < rounds]
        if again:
            ours.send(np.array([actions[e, sent[e]] for e in again]), again)
            for e in again:
                sent[e] += 1
    for env_id in range(num_envs):
        reset_obs = expected[env_id][0][0]["position"][0]
        np.testing.assert_array_equal(got[env_id][0][0], reset_obs)
        assert got[env_id][0][1:] == (0.0, False, False)
        for t in range(rounds):
            obs, reward, term, trunc, _ = expected[env_id][t + 1]
            np.testing.assert_array_equal(got[env_id][t + 1][0], obs["position"][0])
            assert got[env_id][t + 1][1:] == (reward[0], term[0], trunc[0])
    with pytest.raises(RuntimeError, match=r"`recv` was called with nothing in flight"):
        ours.recv()
    ours.close()


def test_first_ready_infos_are_batched_per_row():
    """Infos of a recv batch are arrays over its rows with `_key` masks, like gymnasium's."""
    ours = GymnasiumVectorEnv([DictObsEnv] * 3, envs_per_worker=1)
    ours.reset(seed=0)
    ours.send(np.array([1, 1]), [2, 0])
    obs, _, _, _, infos = ours.recv()
    assert list(infos["env_id"]) == [0, 2]
    assert infos["distance"].shape == (2,)
    assert infos["_distance"].tolist() == [True, True]
    assert infos["nested"]["even"].dtype == np.bool_
    assert obs["position"].shape == (2, 2)
    ours.close()


def test_an_env_error_leaves_a_terminated_sibling_to_autoreset():
    """A sibling that terminated in a step where another env raised is autoreset next step."""
    envs = GymnasiumVectorEnv([EndOnTwoEnv] * 2, envs_per_worker=2)
    envs.reset()
    with pytest.raises(RemoteEnvError, match=r"env 1 failed in `step`") as info:
        envs.step(np.array([2, -1]))
    _, rewards, terminated, _, infos = info.value.results  # env 0's terminal transition
    assert terminated.tolist() == [True, False]
    assert rewards.tolist() == [1.0, 0.0]
    assert infos["env_error"].tolist() == [False, True]
    obs, rewards, terminated, _, _ = envs.step(np.array([1, 1]))
    assert rewards.tolist() == [0.0, 1.0]  # env 0 was reset (NEXT_STEP), not stepped past its end
    assert obs[:, 0].tolist() == [0.0, 1.0]
    assert terminated.tolist() == [False, False]
    envs.close()


def test_actions_of_spaces_without_a_fixed_shape_match_sync_vector_env():
    """(Graph, Discrete) actions, a tuple of graphs in the batch, step as in SyncVectorEnv."""
    ours = GymnasiumVectorEnv([GraphActionEnv] * 3, envs_per_worker=2)
    theirs = SyncVectorEnv([GraphActionEnv] * 3)
    ours.reset(seed=0)
    theirs.reset(seed=0)
    ours.action_space.seed(1)
    for _ in range(3):
        actions = ours.action_space.sample()
        assert_same(ours.step(actions)[0], theirs.step(actions)[0])
    ours.close()
    theirs.close()


def test_the_constructor_seed_gives_way_to_the_first_resets_own_seed():
    """`seed=` applies to the first reset only if that reset has none; never later."""
    ours = GymnasiumVectorEnv([ENV_FNS["CartPole"]] * 2, envs_per_worker=2, seed=3)
    theirs = SyncVectorEnv([ENV_FNS["CartPole"]] * 2)
    assert_same(ours.reset(seed=5), theirs.reset(seed=5))
    assert_same(ours.reset(), theirs.reset())
    ours.close()


def test_call_passes_a_keyword_named_name():
    """`call(name, ..., name=...)` gives the env its own `name` keyword."""
    envs = GymnasiumVectorEnv([NamedCallEnv] * 2, envs_per_worker=2)
    assert envs.call("greet", name="ada") == ("hello ada", "hello ada")
    envs.close()
