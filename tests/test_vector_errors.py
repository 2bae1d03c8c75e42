"""RayVectorEnv's errors: arguments refused before any remote call, env errors, timeouts.

Each names the argument or the env and the method, keeps the remote traceback, and leaves the
vector env usable (or, for a timeout, closable); tests/test_vector.py has the rest.
"""

from __future__ import annotations

import re

import pytest
import ray

from ray_multiprocess_env import RayVectorEnv, RemoteEnvError
from ray_multiprocess_env.errors import RemoteFailure
from tests.envs import FlakyEnv, PlainStepEnv
from tests.helpers import LAYOUTS, RemoteFlaky, assert_killed, flaky_vec, wait_until_ready


@pytest.fixture(scope="module")
def two_actors():
    """Two env actors under one RayVectorEnv, for the tests of arguments refused before a call."""
    with RayVectorEnv([RemoteFlaky.remote() for _ in range(2)]) as vec:
        yield vec


@pytest.mark.in_process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_wrong_number_of_actions_fails_before_any_remote_call(layout):
    """A wrong action count raises ValueError and leaves every env untouched."""
    with flaky_vec(2, layout) as vec:
        vec.reset()
        with pytest.raises(ValueError, match=r"`actions` has 3 entries but there are 2 envs"):
            vec.step([1, 1, 1])
        with pytest.raises(TypeError, match=r"`actions` must be a sequence"):
            vec.step(1)
        assert vec.get_attr("count") == (0, 0)


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        ([True], ValueError, r"`mask` has 1 entries but there are 2 envs"),
        (1, TypeError, r"`mask` must be a sequence with one flag per env"),
        ("ab", TypeError, r"`mask` must be a sequence"),
    ],
)
def test_bad_mask(two_actors, mask, error, match):
    """A mask of the wrong length or type raises before any remote call."""
    two_actors.reset()
    with pytest.raises(error, match=match):
        two_actors.reset(mask)


@pytest.mark.in_process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mask_before_first_reset(layout):
    """Skipping an env that never had an observation names the env and the fix."""
    with flaky_vec(2, layout) as vec:
        with pytest.raises(ValueError, match=r"env 1 has no observation yet"):
            vec.reset([False, True])


@pytest.mark.parametrize(
    ("seeds", "error", "match"),
    [
        ([1], ValueError, r"`seeds` has 1 entries but there are 2 envs"),
        (1.5, TypeError, r"`seeds` must be None, an int or a list"),
        ([1, "a"], TypeError, r"`seeds\[1\]` must be an int or None"),
    ],
)
def test_bad_seeds(two_actors, seeds, error, match):
    """Seeds of the wrong type or length raise a clear error."""
    with pytest.raises(error, match=match):
        two_actors.seed(seeds)


@pytest.mark.parametrize(
    ("actors", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, "`actors` is empty"),
        ("abc", {}, TypeError, "`actors` must be a list of Ray actor handles"),
        ([1], {}, TypeError, r"`actors\[0\]` must be a Ray actor handle"),
        (None, {"timeout": 0}, ValueError, "`timeout` must be a positive number"),
        (None, {"timeout": "1"}, TypeError, "`timeout` must be a number of seconds"),
    ],
)
def test_bad_constructor_arguments(actors, kwargs, error, match):
    """Bad constructor arguments name the argument and the fix."""
    if actors is None:
        actors = [PlainStepEnv.remote()]
    with pytest.raises(error, match=match):
        RayVectorEnv(actors, **kwargs)


@pytest.mark.in_process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_env_exception_names_env_and_method_and_keeps_traceback(layout):
    """An exception in env 1 names env 1 and `step`, keeps the remote traceback; env 1 recovers."""
    with flaky_vec(3, layout) as vec:
        vec.reset()
        vec.step([1, 1, 1])
        with pytest.raises(RemoteEnvError, match=r"env 1 failed in `step`: ValueError") as info:
            vec.step([1, -1, 1])
        error = info.value
        assert (error.env_index, error.method, error.env_indices) == (1, "step", (1,))
        assert "negative action -1" in error.remote_traceback
        assert "tests/envs.py" in error.remote_traceback
        assert isinstance(error.__cause__, (ray.exceptions.RayTaskError, RemoteFailure))
        assert vec.get_attr("count") == (2, 1, 2)
        vec.reset([True, False, True])
        assert vec.get_attr("count") == (2, 0, 2)
        obs = vec.step([1, 1, 1])[0]
        assert [o.item() for o in obs] == [3.0, 1.0, 3.0]


@pytest.mark.in_process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_several_failing_envs_are_all_named(layout):
    """When several envs fail in one call the error lists all of them."""
    with flaky_vec(3, layout) as vec:
        vec.reset()
        with pytest.raises(RemoteEnvError, match=r"env 0 failed in `step` \(env\(s\) \[2\]"):
            vec.step([-1, 0, -2])


@pytest.mark.in_process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_hint_speaks_of_other_envs_only_where_there_are_some(layout):
    """One env of three failed: the others keep their state; all failed: only the reset."""
    with flaky_vec(3, layout) as vec:
        vec.reset()
        with pytest.raises(RemoteEnvError) as one:
            vec.step([1, -1, 1])
        assert "The other envs keep their state; reset env 1 to use it again." in str(one.value)
        with pytest.raises(RemoteEnvError) as every:
            vec.step([-1, -1, -1])
        message = str(every.value)
        assert "(env(s) [1, 2] failed in the same call too)" in message
        assert "Reset envs [0-2] to use them again." in message
        assert "other envs" not in message


def test_many_failed_envs_are_listed_as_ranges():
    """Envs 1 to 6 and 8 of ten failed in one step: the message shows ``[2-6, 8]``."""
    with RayVectorEnv.from_env_fns([FlakyEnv] * 10, envs_per_worker=5) as vec:
        vec.reset()
        actions = [1, -1, -1, -1, -1, -1, -1, 1, -1, 1]
        with pytest.raises(RemoteEnvError) as info:
            vec.step(actions)
        assert info.value.env_indices == (1, 2, 3, 4, 5, 6, 8)
        assert "env 1 failed in `step` (env(s) [2-6, 8] failed in the same call too)" in str(
            info.value
        )
        assert "reset envs [1-6, 8] to use them again." in str(info.value)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_timeout_names_the_slow_env(caplog, layout):
    """A call that outlives `timeout` raises TimeoutError naming the env; close() still works.

    With workers, the whole worker of the slow env is named: its envs answer together.
    """
    vec = flaky_vec(2, layout, timeout=0.5)
    actors = vec.remote_envs
    wait_until_ready(vec)
    late = "[1]" if layout == "actor-per-env" else "[0, 1]"
    vec.reset()
    vec.set_attr("delay", [0.0, 60.0])
    with pytest.raises(
        TimeoutError, match=rf"`step` timed out after 0.5 s: env\(s\) {re.escape(late)}"
    ):
        vec.step([0, 0])
    vec.close()
    assert "Killing the actors after a failed `close`" in caplog.text
    assert f"`close` timed out after 0.5 s: env(s) {late}" in caplog.text
    assert_killed(actors[-1])


def test_close_without_killing_raises_a_failed_close():
    """With kill_on_close=False a hung close is raised, since the actor lives on."""
    actors = [RemoteFlaky.remote()]
    vec = RayVectorEnv(actors, timeout=0.5, kill_on_close=False)
    wait_until_ready(vec)
    vec.reset()
    vec.set_attr("delay", [60.0])
    with pytest.raises(TimeoutError, match=r"`step` timed out"):
        vec.step([0])
    with pytest.raises(TimeoutError, match=r"`close` timed out after 0.5 s: env\(s\) \[0\]"):
        vec.close()
    assert vec.closed
    ray.kill(actors[0])


@pytest.mark.in_process
@pytest.mark.parametrize("layout", LAYOUTS)
def test_optional_action_space_check(layout):
    """check_actions=True refuses an action outside the action space, naming the env."""
    if layout == "actor-per-env":
        vec = RayVectorEnv([RemoteFlaky.remote() for _ in range(2)], check_actions=True)
    else:
        vec = RayVectorEnv.from_env_fns([FlakyEnv] * 2, envs_per_worker=2, check_actions=True)
    with vec:
        vec.reset()
        with pytest.raises(ValueError, match=r"`actions\[1\]` = 7 for env 1 is outside"):
            vec.step([0, 7])
        with pytest.raises(ValueError, match=r"`actions\[0\]` = -1 for env 1 is outside"):
            vec.send([-1], [1])
        assert [o.item() for o in vec.step([1, 2])[0]] == [1.0, 2.0]


_RAY_DEATH = (
    "The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: EnvWorker\n"
    "\tpid: 4242\n"
    "The actor is dead because its worker process has died. Worker exit type: {kind} Worker "
    "exit detail: ... (1) the process was killed by the OOM killer ..."
)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        (
            "SYSTEM_ERROR",
            "its worker process (pid 4242) is gone: it ended without raising an error",
        ),
        ("NODE_OUT_OF_MEMORY", "its worker process (pid 4242) was killed by Ray: its node ran low"),
        ("INTENDED_USER_EXIT", "its worker process (pid 4242) is gone (Ray's exit type: INTENDED"),
    ],
)
def test_a_worker_process_that_ended_is_described_by_what_ray_knows(kind, said):
    """Ray's exit type decides the words; its guesses of why a process ended stay out."""
    from ray_multiprocess_env import EnvCrashedError

    error = EnvCrashedError(
        2, "step", RuntimeError(_RAY_DEATH.format(kind=kind)), env_indices=[2, 3]
    )
    assert said in str(error)
    assert "OOM killer" not in str(error)
    assert "The worker of envs [2, 3], and their state, are gone; create a new actor" in str(error)
