"""pfrl: the gym API bridge, VectorEnv membership and a real pfrl training loop."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

from ray_multiprocess_env import GymAPIBridge, RayVectorEnv, make_remote_class
from tests.envs import BridgeHolder

pfrl = pytest.importorskip("pfrl")
torch = pytest.importorskip("torch")

RemoteBridge = make_remote_class(BridgeHolder, "env", GymAPIBridge)


def test_bridge_presents_the_old_gym_api():
    """Reset gives obs only; step gives 4 values, a time limit as pfrl's `needs_reset`.

    pfrl's convention (its `ContinuingTimeLimit`): a truncated episode is not done (the agent
    bootstraps from its last state) and `info["needs_reset"]` tells the loop to reset it.
    """
    env = GymAPIBridge(gym.make("CartPole-v1", max_episode_steps=3))
    plain = gym.make("CartPole-v1", max_episode_steps=3)
    assert env.seed(4) == [4]
    np.testing.assert_array_equal(env.reset(), plain.reset(seed=4)[0])
    for _ in range(3):
        obs, reward, done, info = env.step(0)
        p_obs, p_reward, terminated, truncated, _ = plain.step(0)
        np.testing.assert_array_equal(obs, p_obs)
        assert reward == p_reward
        assert done == terminated
        assert info["needs_reset"] == truncated
    assert truncated
    assert not done
    assert info["needs_reset"]
    assert env.action_space == plain.action_space
    assert env.spec.id == "CartPole-v1"
    assert "GymAPIBridge" in repr(env)
    env.close()


def test_bridge_seeds_only_the_next_reset():
    """A seed applies to the next reset only, like old gym's seed-then-reset."""
    env = GymAPIBridge(gym.make("CartPole-v1"))
    env.seed(1)
    first = env.reset()
    second = env.reset()
    env.seed(1)
    np.testing.assert_array_equal(env.reset(), first)
    assert not np.array_equal(first, second)


def test_ray_vector_env_is_a_pfrl_vector_env():
    """With pfrl imported, isinstance(vec, pfrl.env.VectorEnv) is true (subclasses too)."""

    class Sub(RayVectorEnv):
        pass

    with Sub([RemoteBridge.remote("CartPole-v1")]) as vec:
        assert isinstance(vec, pfrl.env.VectorEnv)


def test_import_does_not_import_pfrl_and_registration_waits_for_it(ray_address):
    """Importing the package imports neither pfrl nor torch; pfrl imported later still sees it."""
    script = textwrap.dedent(
        """
        import sys
        import ray
        import ray_multiprocess_env
        from ray_multiprocess_env import RayVectorEnv
        assert "pfrl" not in sys.modules and "torch" not in sys.modules, "eager import"

        @ray.remote
        class Env:
            def reset(self):
                return 0

        vec = RayVectorEnv([Env.remote()])
        assert "pfrl" not in sys.modules, "RayVectorEnv imported pfrl"
        import pfrl
        assert isinstance(vec, pfrl.env.VectorEnv)
        print("ok")
        """
    )
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def _ppo_agent(obs_size: int, n_actions: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(obs_size, 32),
        torch.nn.Tanh(),
        pfrl.nn.Branched(
            torch.nn.Sequential(
                torch.nn.Linear(32, n_actions), pfrl.policies.SoftmaxCategoricalHead()
            ),
            torch.nn.Linear(32, 1),
        ),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    return pfrl.agents.PPO(model, optimizer, update_interval=64, minibatch_size=32, epochs=2)


def test_pfrl_train_agent_batch_runs_on_gymnasium_envs(tmp_path):
    """Pfrl's batched training and evaluation loops run on RayVectorEnv through the bridge."""
    num_envs = 2
    env, eval_env = (
        RayVectorEnv([RemoteBridge.remote("CartPole-v1") for _ in range(num_envs)])
        for _ in range(2)
    )
    env.seed(0)
    eval_env.seed(100)
    agent = _ppo_agent(env.observation_space.low.size, env.action_space.n)
    pfrl.experiments.train_agent_batch_with_evaluation(
        agent=agent,
        env=env,
        eval_env=eval_env,
        steps=300,
        eval_n_steps=None,
        eval_n_episodes=2,
        eval_interval=300,
        outdir=str(tmp_path),
        max_episode_len=50,
        logger=logging.getLogger("pfrl-test"),
    )
    scores = (tmp_path / "scores.txt").read_text().splitlines()
    assert len(scores) >= 2
    mean = float(scores[-1].split("\t")[3])
    assert 5 <= mean <= 50
    result = pfrl.experiments.evaluator.eval_performance(
        env=eval_env, agent=agent, n_steps=None, n_episodes=3, max_episode_len=20
    )
    assert result["episodes"] == 3
    env.close()
    eval_env.close()


def _bridged_blackjack() -> GymAPIBridge:
    """Blackjack through the old gym API: observations are tuples of three ints."""
    return GymAPIBridge(gym.make("Blackjack-v1"))


def test_a_reset_env_tuple_observation_comes_back_whole_from_a_masked_reset():
    """`reset_env` of an old gym env with tuple observations notes the whole tuple.

    A masked `reset` after it hands the kept env's last observation back, as pfrl's own vector
    env does: the tuple, not its first entry.
    """
    vec = RayVectorEnv.from_env_fns([_bridged_blackjack] * 2, envs_per_worker=2)
    try:
        vec.reset()
        obs = vec.reset_env(0)
        assert isinstance(obs, tuple)
        assert len(obs) == 3
        kept = vec.reset(np.array([True, False]))[0]  # (pfrl's mask: True keeps env 0)
        assert tuple(kept) == obs
    finally:
        vec.close()


def _bridged_cartpole() -> GymAPIBridge:
    return GymAPIBridge(gym.make("CartPole-v1"))


def test_call_and_get_attr_reach_the_bridges_old_gym_api_first():
    """`call` on bridged envs runs the bridge's own `seed`, `reset` and `step` (old gym's).

    As a gymnasium wrapper's methods are found before the env's: `seed` exists only on the
    bridge, its `reset` gives the observation alone (seeded by that `seed`), its `step` four
    values with `needs_reset`; an attribute of the env inside is still found.
    """
    vec = RayVectorEnv.from_env_fns([_bridged_cartpole] * 2, envs_per_worker=2)
    try:
        assert vec.call("seed", 3) == ([3], [3])
        first = vec.call("reset")
        np.testing.assert_array_equal(first[0], gym.make("CartPole-v1").reset(seed=3)[0])
        stepped = vec.call("step", 0)
        assert len(stepped[0]) == 4
        assert "needs_reset" in stepped[0][3]
        assert vec.get_attr("spec")[0].id == "CartPole-v1"
    finally:
        vec.close()
