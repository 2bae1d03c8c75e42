"""Faults a long run meets (issue #23): the six defects, restart budgets, envs that raise, seeds.

Each defect's test failed before its fix; the transport-specific ones run over every transport.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest

from ray_multiprocess_env import (
    EnvCrashedError,
    GymAPIBridge,
    GymnasiumVectorEnv,
    RayVectorEnv,
    RemoteEnvError,
    SB3VecEnv,
    make_sb3_vec_env,
    make_vector_env,
)
from ray_multiprocess_env._engine import ray_launcher
from ray_multiprocess_env._engine.options import MIN_START_S
from tests.envs import FlakyEnv, InPlaceEnv
from tests.envs_faults import DyingEnv, RaisingEnv, raising_env_built_once, raising_env_one
from tests.helpers import assert_killed, memory_files, worker_pids

TRANSPORTS = ["auto", "pipe", "tcp", "ray"]


def _counts(obs):
    return obs[:, 0].tolist()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_masked_reset_after_first_ready_steps_returns_the_latest_rows(transport):
    """Defect 1: after send/recv, a masked reset hands out the rows the envs reached."""
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport)
    with contextlib.closing(envs):
        envs.reset()
        for _ in range(3):
            envs.send(np.array([1, 1]), [0, 2])
            envs.recv()
        obs, _ = envs.reset(options={"reset_mask": np.array([False, True, False, True])})
        assert _counts(obs) == [3.0, 0.0, 3.0, 0.0]
        envs.async_reset()
        envs.recv()
        obs, _ = envs.reset(options={"reset_mask": np.array([True, False, False, False])})
        assert _counts(obs) == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_env_gets_arrays_it_may_change_and_keep(transport):
    """Defect 2: actions and call/set_attr arrays arrive writable on every transport."""
    with contextlib.closing(
        GymnasiumVectorEnv([InPlaceEnv] * 2, envs_per_worker=1, transport=transport)
    ) as envs:
        envs.reset()
        obs, *_ = envs.step(np.array([[2.0, 0.1], [-3.0, 0.2]], dtype=np.float32))
        np.testing.assert_allclose(_counts(obs), [0.6, -0.3], rtol=1e-6)
        doubled = envs.call("double", np.ones(3))
        assert [d.tolist() for d in doubled] == [[2.0, 2.0, 2.0]] * 2
        envs.set_attr("weights", np.zeros(2))
        assert [w.tolist() for w in envs.call("bump")] == [[1.0, 1.0]] * 2
    vec = RayVectorEnv.from_env_fns([InPlaceEnv] * 2, envs_per_worker=2, transport=transport)
    with vec:
        vec.reset()
        vec.step(np.array([[2.0, 0.1], [-3.0, 0.2]], dtype=np.float32))


def test_close_releases_the_shared_memory_after_a_restart():
    """Defect 3: after a worker died and was restarted, close() releases every memory file."""
    before = set(memory_files())
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, on_actor_failure="restart")
    envs.reset()
    os.kill(worker_pids(envs)[1], signal.SIGKILL)
    assert_killed(envs.remote_envs[1])
    envs.step(np.ones(4, dtype=np.int64))
    envs.close()
    assert set(memory_files()) == before


@pytest.mark.parametrize("timeout", [float("inf"), 1e9])
@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_an_infinite_or_huge_timeout_is_accepted(timeout, transport):
    """Defect 4: timeout=inf means no timeout; one of decades waits as long as needed."""
    with contextlib.closing(
        GymnasiumVectorEnv([FlakyEnv] * 2, timeout=timeout, transport=transport)
    ) as envs:
        envs.reset()
        assert _counts(envs.step(np.ones(2, dtype=np.int64))[0]) == [1.0, 1.0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("asked", "timeout"),
    [
        ({"num_gpus": 1}, None),
        ({"num_cpus": 3}, None),
        pytest.param({"num_gpus": 1}, 1, marks=pytest.mark.long),  # waits the start's 30 s
    ],
)
def test_resources_no_node_has_fail_the_constructor_in_bounded_time(asked, timeout, monkeypatch):
    """Defect 5: workers that can never be placed fail in bounded time, naming what is missing.

    Without a timeout within seconds (`ray_launcher._INFEASIBLE_S`: 10 s, shortened here to
    2 s); with one, at the start's deadline (a cluster may add nodes until then), with the same
    ValueError rather than a bare TimeoutError.
    """
    monkeypatch.setattr(ray_launcher, "_INFEASIBLE_S", 2.0)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"ask for \{.*\} each .*which no node of the cluster has"):
        GymnasiumVectorEnv([FlakyEnv], actor_options=asked, timeout=timeout)
    assert time.monotonic() - start < (2.0 if timeout is None else MIN_START_S) + 20


@pytest.mark.in_process
def test_independent_seeds_from_a_seed_sequence_equal_the_formula():
    """A SeedSequence gives env i int(seq.spawn(n)[i].generate_state(1)[0]), every entry point."""
    n = 4

    def expected_of(seq):
        return [int(child.generate_state(1)[0]) for child in seq.spawn(n)]

    expected = expected_of(np.random.SeedSequence(7))
    reference = gym.vector.SyncVectorEnv([FlakyEnv] * n)
    want = _counts(reference.reset(seed=expected)[0])
    seq = np.random.SeedSequence(7)
    with contextlib.closing(make_vector_env(FlakyEnv, n, num_workers=2, seed=seq)) as envs:
        assert _counts(envs.reset()[0]) == want
        assert _counts(envs.reset(seed=seq)[0]) == want  # the same sequence, the same seeds
    with RayVectorEnv.from_env_fns([FlakyEnv] * n, envs_per_worker=2, seed=seq) as vec:
        assert [o.item() for o in vec.reset()[0]] == want
    sb3 = make_sb3_vec_env(FlakyEnv, n, num_workers=2, seed=seq)
    assert sb3.reset()[:, 0].tolist() == want
    sb3.close()
    other = np.random.SeedSequence(8)
    with contextlib.closing(make_vector_env(FlakyEnv, n, num_workers=2, seed=other)) as envs:
        envs.reset()
        assert envs.np_random_seed == tuple(expected_of(other))
        assert not set(envs.np_random_seed) & set(expected)  # another base: no seed shared


@pytest.mark.slow
def test_a_crash_loop_stops_at_the_restart_budget():
    """max_restarts: a worker that keeps dying raises EnvCrashedError saying how many restarts."""
    envs = GymnasiumVectorEnv(
        [DyingEnv] * 2, envs_per_worker=1, on_actor_failure="restart", max_restarts=2
    )
    start = time.monotonic()

    def step_until_it_fails():
        for _ in range(20):
            envs.step(np.ones(2, dtype=np.int64))

    with contextlib.closing(envs):
        envs.reset()
        with pytest.raises(EnvCrashedError, match=r"after 2 restart\(s\).*`max_restarts=2`"):
            step_until_it_fails()
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_envs_that_raise_are_rebuilt_and_the_others_lose_nothing(transport):
    """on_env_error='restart': env 1 is rebuilt at each error; the others lose nothing.

    Its episode is truncated with env_error; the other envs equal a SyncVectorEnv of healthy
    envs for 200 steps.
    """
    envs = make_vector_env(
        raising_env_one,
        4,
        num_workers=2,
        transport=transport,
        on_env_error="restart",
        max_restarts=None,
    )
    reference = gym.vector.SyncVectorEnv([RaisingEnv] * 4)
    rng = np.random.default_rng(0)
    errors = 0
    with contextlib.closing(envs):
        np.testing.assert_array_equal(
            envs.reset(seed=3)[0][[0, 2, 3]], reference.reset(seed=3)[0][[0, 2, 3]]
        )
        for _ in range(200):
            actions = rng.integers(0, 3, 4)
            obs, rewards, terms, truncs, infos = envs.step(actions)
            want = reference.step(actions)
            for mine, theirs in zip((obs, rewards, terms, truncs), want[:4], strict=True):
                np.testing.assert_array_equal(mine[[0, 2, 3]], theirs[[0, 2, 3]])
            if "env_error" in infos:
                assert infos["_env_error"].tolist() == [False, True, False, False]
                assert "ValueError: boom" in infos["env_error"][1]
                assert truncs[1]
                assert rewards[1] == 0.0
                errors += 1
    assert errors >= 20


@pytest.mark.in_process
def test_envs_that_raise_are_rebuilt_through_sb3_and_pfrl():
    """SB3: done with env_error in that env's info; pfrl (old gym): needs_reset and env_error."""
    sb3 = SB3VecEnv(
        [functools.partial(RaisingEnv, 3)] * 2, envs_per_worker=2, on_env_error="restart"
    )
    sb3.reset()
    for _ in range(2):
        sb3.step(np.ones(2, dtype=np.int64))
    _, _, dones, infos = sb3.step(np.ones(2, dtype=np.int64))
    assert dones.tolist() == [True, True]
    assert all("boom" in info["env_error"] and info["TimeLimit.truncated"] for info in infos)
    sb3.close()
    vec = RayVectorEnv.from_env_fns(
        [lambda: GymAPIBridge(RaisingEnv(3))] * 2, envs_per_worker=2, on_env_error="restart"
    )
    with vec:
        vec.reset()
        for _ in range(2):
            vec.step([1, 1])
        _, _, dones, infos = vec.step([1, 1])
        assert dones == (False, False)
        assert all(info["needs_reset"] for info in infos)
        assert all("boom" in info["env_error"] for info in infos)


@pytest.mark.in_process
def test_an_env_that_keeps_raising_stops_at_the_budget():
    """An env rebuilt max_restarts times: its next error is raised, saying so."""
    envs = GymnasiumVectorEnv(  # (same_step: the step after a truncation is no reset)
        [functools.partial(RaisingEnv, 1)],
        on_env_error="restart",
        max_restarts=3,
        autoreset_mode="same_step",
    )
    with contextlib.closing(envs):
        envs.reset()
        for _ in range(3):
            assert envs.step(np.ones(1, dtype=np.int64))[3].tolist() == [True]
        with pytest.raises(RemoteEnvError, match=r"rebuilt 3 times already: `max_restarts=3`"):
            envs.step(np.ones(1, dtype=np.int64))


def test_a_rebuild_that_fails_is_named_and_the_others_keep_their_step():
    """The factory fails when env 1 is rebuilt: a RemoteEnvError saying so; env 0 stepped."""
    envs = GymnasiumVectorEnv(
        [RaisingEnv, raising_env_built_once], envs_per_worker=2, on_env_error="restart"
    )
    reference = gym.vector.SyncVectorEnv([RaisingEnv])
    actions = np.array([1, 2])
    with contextlib.closing(envs):
        np.testing.assert_array_equal(envs.reset(seed=0)[0][:1], reference.reset(seed=0)[0])
        envs.step(actions)
        reference.step(actions[:1])
        failed = r"env 1 failed in `step`.*rebuilding it from its factory"
        with pytest.raises(RemoteEnvError, match=failed):
            envs.step(actions)  # env 1 raises; its factory raises OSError
        reference.step(actions[:1])  # env 0 stepped in that call all the same
        obs = envs.step(actions)[0]
        np.testing.assert_array_equal(obs[:1], reference.step(actions[:1])[0])


@pytest.mark.in_process
@pytest.mark.parametrize("mode", ["same_step", "next_step"])
def test_an_autoreset_that_raises_keeps_the_episode_that_ended(mode):
    """The reset after a truncation raises: the truncation step is kept as it was.

    The rebuilt env's first observation starts the next episode (no extra episode).
    """
    envs = GymnasiumVectorEnv(
        [functools.partial(RaisingEnv, 0, 2)],
        on_env_error="restart",
        autoreset_mode=mode,
    )
    one = np.ones(1, dtype=np.int64)
    with contextlib.closing(envs):
        start = envs.reset(seed=0)[0][0, 0]
        for _ in range(19):
            envs.step(one)
        obs, rewards, terms, truncs, infos = envs.step(one)  # the 20th step: truncated
        assert (rewards[0], terms[0], truncs[0]) == (1.0, False, True)
        if mode == "same_step":
            assert infos["final_obs"][0].tolist() == [start + 20, 20]
            assert obs[0, 1] == 0
            assert "boom at reset 2" in infos["env_error"][0]
        else:
            assert obs[0].tolist() == [start + 20, 20]
            obs, rewards, terms, truncs, infos = envs.step(one)  # the autoreset step
            assert obs[0, 1] == 0
            assert "boom at reset 2" in infos["env_error"][0]
            assert (rewards[0], terms[0], truncs[0]) == (0.0, False, False)
        assert envs.step(one)[0][0, 1] == 1  # the next episode goes on


@pytest.mark.in_process
def test_a_reset_that_raises_rebuilds_with_its_seed_and_options():
    """reset(seed, options) raises: the rebuilt env is reset with that seed and those options."""
    envs = GymnasiumVectorEnv(
        [functools.partial(RaisingEnv, 0, 2)] * 2, envs_per_worker=2, on_env_error="restart"
    )
    with contextlib.closing(envs):
        envs.reset(seed=0)
        obs, infos = envs.reset(seed=5, options={"start": 50})
        assert obs[:, 0].tolist() == [50, 50]
        assert infos["_env_error"].tolist() == [True, True]
        assert envs.np_random_seed == (5, 6)
        assert envs.reset(seed=5)[0][1].tolist() == RaisingEnv().reset(seed=6)[0].tolist()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"on_env_error": "retry"}, ValueError, r"`on_env_error` must be 'raise' or 'restart'"),
        ({"max_restarts": -1}, ValueError, r"`max_restarts` must be 0 or more"),
        ({"max_restarts": 1.5}, TypeError, r"`max_restarts` must be an int or None"),
        ({"timeout": float("nan")}, ValueError, r"`timeout` must be a positive number"),
    ],
)
def test_bad_fault_options_are_named(options, error, match):
    """The new options are checked like the others, before any worker starts."""
    with pytest.raises(error, match=match):
        make_vector_env(FlakyEnv, 1, **options)
