"""RayVectorEnv against plain in-process envs, and its conventions (errors: test_vector_errors)."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
import ray

from ray_multiprocess_env import (
    ClosedEnvError,
    GymAPIBridge,
    RayVectorEnv,
    make_remote_class,
    unzip,
)
from tests.envs import (
    BridgeHolder,
    FlakyEnv,
    GymHolder,
    PlainStepEnv,
    SeedStyleEnv,
)
from tests.helpers import LAYOUTS, RemoteFlaky, assert_killed, flaky_vec

RemoteGym = make_remote_class(GymHolder, "env", gym.Env)
RemoteBridge = make_remote_class(BridgeHolder, "env", GymAPIBridge)


def _sample_actions(envs, seed):
    for i, env in enumerate(envs):
        env.action_space.seed(seed + i)
    return [env.action_space.sample() for env in envs]


@pytest.mark.in_process  # (the workers-of-2 layout; the actors of actor-per-env are the user's)
@pytest.mark.parametrize("num_envs", [1, 3], scope="class")
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"], scope="class")
@pytest.mark.parametrize("api", ["gymnasium", "old-gym"], scope="class")
@pytest.mark.parametrize("layout", LAYOUTS, scope="class")
class TestAgainstInProcessEnvs:
    """pfrl's vector-env test pattern: seed, reset, step and masked reset equal plain envs.

    The same for one actor per env and for workers holding two envs each. The tests of one
    parameter set share its vector env and plain envs (each test seeds both first).
    """

    @pytest.fixture(scope="class")
    @classmethod
    def shared(cls, num_envs, env_id, api, layout):
        """The vector env and the plain envs of one parameter set."""
        remote_class = RemoteGym if api == "gymnasium" else RemoteBridge
        make = (
            (lambda: gym.make(env_id))
            if api == "gymnasium"
            else (lambda: GymAPIBridge(gym.make(env_id)))
        )
        if layout == "actor-per-env":
            vec = RayVectorEnv([remote_class.remote(env_id) for _ in range(num_envs)])
        else:
            vec = RayVectorEnv.from_env_fns([make] * num_envs, envs_per_worker=2)
        yield vec, [make() for _ in range(num_envs)]
        vec.close()

    @pytest.fixture(autouse=True)
    def _envs(self, shared, num_envs, api):
        self.vec, self.envs = shared
        self.api, self.num_envs = api, num_envs

    def _reset_plain(self, env, seed=None):
        kwargs = {} if seed is None else {"seed": seed}
        if self.api == "gymnasium":
            return env.reset(**kwargs)[0]
        if seed is not None:
            env.seed(seed)
        return env.reset()

    def _obs(self, reset_result):
        return reset_result[0] if self.api == "gymnasium" else reset_result

    def test_num_envs_and_spaces(self):
        """num_envs and the spaces match the plain envs."""
        assert self.vec.num_envs == self.num_envs
        assert self.vec.action_space == self.envs[0].action_space
        assert self.vec.observation_space == self.envs[0].observation_space

    def test_seed_reset_step_and_masked_reset(self):
        """Seeded reset, a step, a full mask and a partial mask all equal the plain envs."""
        seeds = [100 + i for i in range(self.num_envs)]
        self.vec.seed(seeds)
        real_obss = [self._reset_plain(env, s) for env, s in zip(self.envs, seeds, strict=True)]
        np.testing.assert_allclose(self._obs(self.vec.reset()), real_obss)

        actions = _sample_actions(self.envs, 7)
        real = unzip([env.step(a) for env, a in zip(self.envs, actions, strict=True)])
        got = self.vec.step(actions)
        assert len(got) == (5 if self.api == "gymnasium" else 4)
        np.testing.assert_allclose(got[0], real[0])
        assert got[1:] == real[1:]

        full = self.vec.reset(np.ones(self.num_envs))
        np.testing.assert_allclose(self._obs(full), real[0])

        mask = np.zeros(self.num_envs)
        mask[-1] = 1
        expected = list(real[0])
        for i in range(self.num_envs - 1):
            expected[i] = self._reset_plain(self.envs[i])
        np.testing.assert_allclose(self._obs(self.vec.reset(mask)), expected)

    def test_int_seed_gives_consecutive_seeds(self):
        """``seed(s)`` gives env i the seed s + i."""
        self.vec.seed(5)
        real = [self._reset_plain(env, 5 + i) for i, env in enumerate(self.envs)]
        np.testing.assert_allclose(self._obs(self.vec.reset()), real)


def test_gymnasium_reset_returns_observations_and_infos():
    """A gymnasium env's reset gives lists (obs, infos); a skipped env's info is {}."""
    with RayVectorEnv([RemoteGym.remote("CartPole-v1") for _ in range(2)]) as vec:
        obs, infos = vec.reset()
        assert isinstance(obs, list)
        assert len(obs) == len(infos) == 2
        obs2, infos2 = vec.reset([True, False])
        np.testing.assert_array_equal(obs2[0], obs[0])
        assert infos2[0] == {}


def test_seed_notebook_style_plain_actors():
    """Plain @ray.remote actors (no seed/get_attr) reset to a list and step to unzipped tuples."""
    vec = RayVectorEnv([SeedStyleEnv.remote(i) for i in range(3)])
    obs = vec.reset()
    assert isinstance(obs, list)
    assert [o.tolist() for o in obs] == [[0], [0], [0]]
    obs, rewards, dones, infos = vec.step([10, 20, 30])
    assert [o.tolist() for o in obs] == [[10], [20], [30]]
    assert rewards == (0, 0, 0)
    assert dones == (False, False, False)
    assert infos == (None, None, None)
    assert vec.seed(3) == [3, 4, 5]
    with pytest.raises(TypeError, match=r"env 0: `reset` does not accept .* add a `seed\(seed\)`"):
        vec.reset()
    vec.seed(None)
    assert [o.tolist() for o in vec.reset()] == [[0], [0], [0]]
    vec.close()


def test_non_tuple_step_gives_tuple_of_results():
    """A step that returns a bare value gives one value per env, as a tuple."""
    with RayVectorEnv([PlainStepEnv.remote() for _ in range(2)]) as vec:
        vec.reset()
        assert vec.step([1, 2]) == (1, 2)
        assert vec.step([1, 2]) == (2, 4)
        assert vec.reset([True, False]) == [2, 0]


def test_plain_actor_without_get_attr_has_no_spaces():
    """Spaces need ``get_attr``; a plain actor gives an AttributeError naming the fix."""
    with RayVectorEnv([PlainStepEnv.remote()]) as vec:
        with pytest.raises(AttributeError, match="make_remote_class"):
            _ = vec.action_space
        with pytest.raises(ValueError, match="env 0's actor has no `get_attr`"):
            vec.get_attr("x")


def test_call_get_attr_set_attr_and_spec():
    """call, get_attr and set_attr reach each env; spec and unwrapped behave as in pfrl."""
    with RayVectorEnv([RemoteGym.remote("CartPole-v1") for _ in range(2)]) as vec:
        assert vec.spec.id == "CartPole-v1"
        assert vec.unwrapped is vec
        vec.set_attr("gravity", [1.0, 2.0])
        assert vec.get_attr("gravity") == (1.0, 2.0)
        vec.set_attr("gravity", 3.0)
        assert vec.call("gravity") == (3.0, 3.0)
        assert vec.call("class_name") == ("TimeLimit", "TimeLimit")
        with pytest.raises(ValueError, match="`values` has 3 entries but there are 2 envs"):
            vec.set_attr("gravity", [1.0, 2.0, 3.0])


class RenderingVec(RayVectorEnv):
    """The documented subclass shape: fan-out methods built on `call` and `remote_envs`."""

    def render_all(self):
        return self.call("render")

    def render_direct(self):
        return ray.get([env.render.remote() for env in self.remote_envs])

    def set_gravities(self, values):
        return self.call_each("set_attr", [("gravity", v) for v in values])


@pytest.mark.in_process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_subclass_adds_fan_out_methods(layout):
    """A subclass adds fan-out methods through call, call_each and remote_envs."""
    with flaky_vec(2, layout, RenderingVec) as vec:
        vec.reset()
        vec.step([1, 2])
        frames = vec.render_all()
        assert [f.shape for f in frames] == [(8, 8, 3), (8, 8, 3)]
        assert [f[0, 0, 0] for f in frames] == [1, 2]
        if layout == "actor-per-env":  # workers are EnvWorker actors, not env actors
            np.testing.assert_array_equal(vec.render_direct()[1], frames[1])
        vec.set_gravities([4.0, 5.0])
        assert vec.get_attr("gravity") == (4.0, 5.0)


def test_close_is_idempotent_and_later_calls_fail():
    """close() twice is fine, kills the actors, and later calls raise ClosedEnvError."""
    actors = [RemoteFlaky.remote() for _ in range(2)]
    vec = RayVectorEnv(actors)
    vec.reset()
    vec.close()
    vec.close()
    assert vec.closed
    assert "closed" in repr(vec)
    for call in (lambda: vec.step([0, 0]), vec.reset, vec.seed, lambda: vec.call("render")):
        with pytest.raises(ClosedEnvError, match="called on a closed RayVectorEnv"):
            call()
    assert_killed(actors[0])


def test_close_can_keep_actors():
    """kill_on_close=False leaves the actors usable after close()."""
    actors = [RemoteFlaky.remote()]
    with RayVectorEnv(actors, kill_on_close=False) as vec:
        vec.reset()
    obs, _ = ray.get(actors[0].reset.remote(), timeout=30)
    assert obs.tolist() == [0.0]
    ray.kill(actors[0])


@pytest.mark.in_process
def test_a_reset_that_sends_nothing_leaves_the_seeds_kept():
    """Seeds `seed` keeps for gymnasium envs are used up only by a reset that was sent.

    A `reset_env` whose options cannot be serialized sends nothing: the next reset of each
    env still gets the seed kept for it.
    """
    vec = RayVectorEnv.from_env_fns([FlakyEnv] * 3, envs_per_worker=2)
    with vec:
        vec.reset()
        assert vec.seed([5, 6, 7]) == [5, 6, 7]  # (no `seed` method: kept for the next reset)
        with pytest.raises(TypeError, match=r"cannot be serialized.*nothing was sent"):
            vec.reset_env(0, options={"lock": threading.Lock()})
        expected = [FlakyEnv().reset(seed=seed)[0][0] for seed in (5, 6, 7)]
        observations, _ = vec.reset()
        assert [obs[0] for obs in observations] == expected
        observations, _ = vec.reset()
        assert [obs[0] for obs in observations] == [0.0, 0.0, 0.0]  # (used up: unseeded)
