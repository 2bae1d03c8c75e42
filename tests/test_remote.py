"""make_remote_class: generated methods, built-ins, options and error paths."""

from __future__ import annotations

import inspect

import gymnasium as gym
import pytest
import ray

from ray_multiprocess_env import (
    REMOTE_ENV_METHODS,
    EnvCrashedError,
    RayVectorEnv,
    make_remote_class,
)
from tests.envs import GymHolder

TimeLimit = gym.wrappers.TimeLimit


def _public_callables(cls):
    return {
        name
        for name in dir(cls)
        if not name.startswith("_")
        and callable(getattr(cls, name, None))
        and not isinstance(inspect.getattr_static(cls, name), property)
    }


def _signature(function):
    """The signature without the ``_ray_trace_ctx`` keyword that Ray's tracing hook adds."""
    signature = inspect.signature(function)
    params = [p for p in signature.parameters.values() if p.name != "_ray_trace_ctx"]
    return signature.replace(parameters=params)


def _generated_class(actor_class):
    return actor_class.__ray_metadata__.modified_class.__ray_actor_class__


def test_one_delegating_method_per_public_callable():
    """Every public callable of the target, inherited ones included, gets a method."""
    generated = _generated_class(make_remote_class(GymHolder, "env", TimeLimit))
    expected = _public_callables(TimeLimit) | set(REMOTE_ENV_METHODS)
    assert {"step", "reset", "render", "close", "get_wrapper_attr", "class_name"} <= expected
    assert expected <= {n for n in dir(generated) if not n.startswith("_")}
    assert not any(n.startswith("_") and n in vars(generated) for n in ("_np_random",))


def test_generated_methods_keep_name_signature_and_docstring():
    """Each generated method has the target's name, signature and docstring."""
    generated = _generated_class(make_remote_class(GymHolder, "env", TimeLimit))
    for name in ("step", "reset", "render", "close"):
        method = getattr(generated, name)
        target = getattr(TimeLimit, name)
        assert method.__name__ == name
        assert method.__doc__ == target.__doc__
        assert _signature(method) == inspect.signature(target)
        assert method.__qualname__ == f"GymHolder.{name}"
    wrapper_spec = _signature(generated.wrapper_spec)
    assert next(iter(wrapper_spec.parameters)) == "self"
    assert list(wrapper_spec.parameters)[1:] == list(
        inspect.signature(TimeLimit.wrapper_spec).parameters
    )


def test_remote_signature_is_checked_on_the_caller():
    """Wrong arguments to a generated method fail at `.remote()`, as Ray checks signatures."""
    actor = make_remote_class(GymHolder, "env", TimeLimit).remote("CartPole-v1")
    with pytest.raises(TypeError):
        actor.reset.remote(1, 2, 3)
    ray.kill(actor)


class Base:
    """A base class with a helper, to show that the user's class may subclass anything."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id

    def describe(self) -> str:
        return f"holder of {self.env_id}"


class CustomHolder(Base):
    """Subclasses `Base`, defines its own `render` and a method using Ray inside the actor."""

    def __init__(self, env_id: str) -> None:
        super().__init__(env_id)
        self.env = gym.make(env_id)

    def render(self) -> str:
        return "my render"

    def assigned_resources(self) -> dict:
        return ray.get_runtime_context().get_assigned_resources()


def test_user_methods_win_and_base_classes_work():
    """A method defined on the class wins; inherited user methods and super() work."""
    RemoteCustom = make_remote_class(CustomHolder, "env", TimeLimit)
    actor = RemoteCustom.remote("CartPole-v1")
    assert ray.get(actor.render.remote(), timeout=60) == "my render"
    assert ray.get(actor.describe.remote(), timeout=60) == "holder of CartPole-v1"
    obs, _ = ray.get(actor.reset.remote(seed=3), timeout=60)
    assert obs.shape == (4,)
    ray.kill(actor)


def test_call_get_attr_set_attr_reach_env_properties():
    """call/get_attr/set_attr reach properties and attributes of wrapped envs."""
    actor = make_remote_class(GymHolder, "env", TimeLimit).remote("CartPole-v1")
    space = ray.get(actor.get_attr.remote("action_space"), timeout=60)
    assert space == gym.spaces.Discrete(2)
    ray.get(actor.reset.remote(seed=1), timeout=60)
    assert ray.get(actor.get_attr.remote("np_random_seed"), timeout=60) == 1
    ray.get(actor.set_attr.remote("gravity", 12.5), timeout=60)
    assert ray.get(actor.call.remote("gravity"), timeout=60) == 12.5
    assert ray.get(actor.call.remote("class_name"), timeout=60) == "TimeLimit"
    ray.kill(actor)


def test_actor_options_pass_through():
    """actor_options reach Ray: the actor is scheduled with the CPUs asked for."""
    RemoteCustom = make_remote_class(
        CustomHolder, "env", TimeLimit, actor_options={"num_cpus": 0.5, "max_restarts": 1}
    )
    actor = RemoteCustom.remote("CartPole-v1")
    assert ray.get(actor.assigned_resources.remote(), timeout=60) == {"CPU": 0.5}
    options = RemoteCustom.__ray_metadata__
    assert options.max_restarts == 1
    ray.kill(actor)


class NoEnvHolder:
    """Forgets to set ``self.env``."""

    def __init__(self) -> None:
        self.environment = gym.make("CartPole-v1")


def test_init_that_does_not_set_the_attribute():
    """An __init__ that does not set attr_name fails on the first call, naming both."""
    RemoteNoEnv = make_remote_class(NoEnvHolder, "env", TimeLimit)
    actor = RemoteNoEnv.remote()
    with pytest.raises(ray.exceptions.RayActorError, match=r"`NoEnvHolder` has no attribute `env`"):
        ray.get(actor.reset.remote(), timeout=60)
    with pytest.raises(
        EnvCrashedError, match=r"env 0 failed in `reset`.*`NoEnvHolder` has no attribute `env`"
    ):
        RayVectorEnv([RemoteNoEnv.remote()]).reset()


class BrokenHolder:
    """Its env's constructor raises."""

    def __init__(self) -> None:
        self.env = gym.make("NoSuchEnv-v0")


def test_init_failure_shows_the_env_error():
    """An __init__ that raises reaches the user with the env's own exception."""
    vec = RayVectorEnv([make_remote_class(BrokenHolder, "env", TimeLimit).remote()])
    with pytest.raises(EnvCrashedError, match=r"env 0 failed in `step`.*NameNotFound") as info:
        vec.step([0])
    assert "NoSuchEnv" in info.value.remote_traceback
    assert "NameNotFound" in info.value.remote_traceback


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((GymHolder, "env", "TimeLimit"), TypeError, r"`target_type` must be a class"),
        ((GymHolder("CartPole-v1"), "env", TimeLimit), TypeError, r"`cls` must be a class"),
        ((GymHolder, "1env", TimeLimit), ValueError, r"`attr_name` must be a Python identifier"),
        ((GymHolder, "class", TimeLimit), ValueError, r"got 'class'"),
        ((GymHolder, 3, TimeLimit), ValueError, r"`attr_name` must be a Python identifier"),
    ],
)
def test_bad_arguments(args, error, match):
    """Bad arguments raise TypeError/ValueError naming the argument and the fix."""
    with pytest.raises(error, match=match):
        make_remote_class(*args)


def test_actor_options_must_be_a_mapping():
    """actor_options that is not a mapping is a TypeError."""
    with pytest.raises(TypeError, match=r"`actor_options` must be a mapping"):
        make_remote_class(GymHolder, "env", TimeLimit, actor_options=[("num_cpus", 1)])
