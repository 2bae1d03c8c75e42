"""`make_remote_class`: turn a plain class holding an env into a Ray actor class.

The generated class subclasses the user's class and gains one delegating method for every public
method of a target type (say `gymnasium.wrappers.TimeLimit`), plus ``call``, ``get_attr`` and
``set_attr`` so that properties such as ``action_space`` are reachable from the driver, and
``node_id`` (the Ray node the actor runs on).
"""

from __future__ import annotations

import contextlib
import inspect
import keyword
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import ray

from ray_multiprocess_env.compat import env_call, env_get_attr, env_set_attr
from ray_multiprocess_env.runtime import start_runtime_on_creation

__all__ = ["REMOTE_ENV_METHODS", "make_remote_class"]

#: The methods every generated class has on top of the delegated ones.
REMOTE_ENV_METHODS = ("call", "get_attr", "set_attr", "node_id")


def make_remote_class(
    cls: type,
    attr_name: str,
    target_type: type,
    *,
    actor_options: Mapping[str, Any] | None = None,
) -> Any:
    """Build a Ray actor class that delegates the methods of `target_type` to ``self.<attr_name>``.

    Args:
        cls: A plain class whose ``__init__`` builds the env into ``self.<attr_name>``. It may
            subclass anything and may live in ``__main__`` or a notebook cell; module-level
            imports are enough (Ray pickles the class by value). A method defined on `cls` (or
            its bases) wins over the generated one of the same name.
        attr_name: Name of the attribute holding the env, e.g. ``"env"``.
        target_type: The env's class (e.g. ``type(gymnasium.make("CartPole-v1"))``). Every
            public method of it, inherited ones included, becomes a delegating method with the
            same name, signature and docstring. Properties are reached through ``get_attr``.
        actor_options: Options passed to `ray.remote` (``num_cpus``, ``num_gpus``,
            ``resources``, ``max_restarts``, ...).

    Returns:
        A Ray actor class: create actors with ``.remote(*args)`` or ``.options(...).remote()``.

    Raises:
        TypeError: If `cls` or `target_type` is not a class, or `actor_options` is not a mapping.
        ValueError: If `attr_name` is not a valid Python identifier.

    Example:
        >>> import gymnasium as gym
        >>> class CartPole:
        ...     def __init__(self):
        ...         self.env = gym.make("CartPole-v1")
        >>> RemoteCartPole = make_remote_class(CartPole, "env", gym.wrappers.TimeLimit)
        >>> sorted(m for m in ("reset", "step", "get_attr") if hasattr(RemoteCartPole, m))
        ['get_attr', 'reset', 'step']
    """
    _check_arguments(cls, attr_name, target_type, actor_options)
    namespace: dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__init__": _checked_init(cls, attr_name),
    }
    for name, member in _public_methods(target_type):
        if name not in REMOTE_ENV_METHODS and not _user_defined(cls, name):
            namespace[name] = _delegate(cls, attr_name, name, member)
    for name, factory in _BUILTINS.items():
        if not _user_defined(cls, name):
            namespace[name] = _named(cls, name, factory(attr_name))
    generated = type(cls)(cls.__name__, (cls,), namespace)
    options = dict(actor_options or {})
    actor_class: Any = ray.remote(**options)(generated) if options else ray.remote(generated)
    return start_runtime_on_creation(actor_class)


def _check_arguments(cls: Any, attr_name: Any, target_type: Any, actor_options: Any) -> None:
    if not inspect.isclass(cls):
        raise TypeError(
            f"`cls` must be a class whose `__init__` builds the env, got {cls!r} "
            f"({type(cls).__name__}); pass the class itself, not an instance."
        )
    if not inspect.isclass(target_type):
        raise TypeError(
            f"`target_type` must be a class, got {target_type!r} ({type(target_type).__name__}); "
            "pass the env's type, e.g. `type(env)` or `gymnasium.wrappers.TimeLimit`."
        )
    if (
        not isinstance(attr_name, str)
        or not attr_name.isidentifier()
        or keyword.iskeyword(attr_name)
    ):
        raise ValueError(
            f"`attr_name` must be a Python identifier naming the attribute that holds the env, "
            f"got {attr_name!r}; e.g. `make_remote_class(MyEnv, 'env', TimeLimit)`."
        )
    if actor_options is not None and not isinstance(actor_options, Mapping):
        raise TypeError(
            f"`actor_options` must be a mapping of `ray.remote` options, got {actor_options!r}; "
            "e.g. `actor_options={'num_cpus': 1}`."
        )


def _public_methods(target_type: type) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, raw member)`` for each public callable of `target_type`, bases included."""
    for name in dir(target_type):
        if name.startswith("_"):
            continue
        member = inspect.getattr_static(target_type, name)
        if isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member):
            yield name, member
        elif callable(member) and not inspect.isclass(member):
            yield name, member  # e.g. a builtin method descriptor


def _user_defined(cls: type, name: str) -> bool:
    return any(name in vars(base) for base in cls.__mro__ if base is not object)


def _env_of(obj: Any, attr_name: str) -> Any:
    try:
        return getattr(obj, attr_name)
    except AttributeError:
        raise _missing_env_error(type(obj), attr_name) from None


def _missing_env_error(cls: type, attr_name: str) -> TypeError:
    return TypeError(
        f"`{cls.__qualname__}` has no attribute `{attr_name}`: its `__init__` must build the env "
        f"into `self.{attr_name}` (the `attr_name` given to `make_remote_class`)."
    )


def _checked_init(cls: type, attr_name: str) -> Callable[..., None]:
    user_init: Callable[..., None] = cls.__init__  # type: ignore[misc]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        user_init(self, *args, **kwargs)
        if not hasattr(self, attr_name):
            raise _missing_env_error(cls, attr_name)

    __init__.__doc__ = user_init.__doc__
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    with contextlib.suppress(TypeError, ValueError):  # a builtin __init__ may have none
        __init__.__signature__ = inspect.signature(user_init)  # type: ignore[attr-defined]
    return __init__


def _delegate(cls: type, attr_name: str, name: str, member: Any) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(_env_of(self, attr_name), name)(*args, **kwargs)

    function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
    method.__doc__ = getattr(function, "__doc__", None)
    method.__signature__ = _method_signature(member)  # type: ignore[attr-defined]
    return _named(cls, name, method)


def _method_signature(member: Any) -> inspect.Signature:
    """The signature the delegating method shows: the target's, with ``self`` first."""
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        varargs = inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)
        varkw = inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)
        return inspect.Signature([self_param, varargs, varkw])
    params = list(signature.parameters.values())
    if isinstance(member, staticmethod):
        params.insert(0, self_param)
    elif params:
        params[0] = params[0].replace(name="self")
    else:  # pragma: no cover - a plain method always takes self
        params = [self_param]
    return signature.replace(parameters=params)


def _named(cls: type, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    function.__name__ = name
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    function.__module__ = cls.__module__
    return function


def _make_call(attr_name: str) -> Callable[..., Any]:
    def call(self: Any, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call method `name` of the env with the arguments and return its result.

        A non-callable attribute is returned as it is, like gymnasium's ``VectorEnv.call``.
        """
        return env_call(_env_of(self, attr_name), name, *args, **kwargs)

    return call


def _make_get_attr(attr_name: str) -> Callable[..., Any]:
    def get_attr(self: Any, name: str) -> Any:
        """Return the env's attribute `name` (properties such as ``action_space`` included)."""
        return env_get_attr(_env_of(self, attr_name), name)

    return get_attr


def _make_set_attr(attr_name: str) -> Callable[..., None]:
    def set_attr(self: Any, name: str, value: Any) -> None:
        """Set the env's attribute `name` to `value`."""
        env_set_attr(_env_of(self, attr_name), name, value)

    return set_attr


def _make_node_id(attr_name: str) -> Callable[..., str]:
    def node_id(self: Any) -> str:
        """The id of the Ray node this actor runs on (hex)."""
        return str(ray.get_runtime_context().get_node_id())

    return node_id


_BUILTINS: dict[str, Callable[[str], Callable[..., Any]]] = {
    "call": _make_call,
    "get_attr": _make_get_attr,
    "set_attr": _make_set_attr,
    "node_id": _make_node_id,
}
