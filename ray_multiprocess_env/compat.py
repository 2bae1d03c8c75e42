"""Conventions that differ between env APIs, decided in one place.

gymnasium >= 1.0 wrappers no longer forward unknown attributes to the env inside them;
gymnasium's own vector envs use ``get_wrapper_attr``/``set_wrapper_attr`` instead. Every remote
env of this package reads and writes attributes the same way, old-gym envs and plain objects
included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

__all__ = [
    "add_vector_env_hook",
    "announce_vector_env",
    "as_autoreset_mode",
    "crashed_step",
    "env_call",
    "env_get_attr",
    "env_has_attr",
    "env_is_wrapped",
    "env_set_attr",
    "from_step",
    "is_obs_and_info",
    "reset_as_step",
    "reset_env",
    "reset_obs",
    "reset_with_seed",
    "restart_seed",
]


def as_autoreset_mode(value: Any) -> AutoresetMode:
    """Read an autoreset mode: an `AutoresetMode`, its value (``"NextStep"``) or its name.

    Names are matched without regard to case, so ``"next_step"`` and ``"NEXT_STEP"`` work.

    Raises:
        ValueError: For anything else, listing the modes.
    """
    if isinstance(value, AutoresetMode):
        return value
    if isinstance(value, str):
        for mode in AutoresetMode:
            if value in (mode.value, mode.name) or value.upper() == mode.name:
                return mode
    names = ", ".join(f"{m.name.lower()!r}" for m in AutoresetMode)
    raise ValueError(
        f"`autoreset_mode` must be one of {names} (or a `gymnasium.vector.AutoresetMode`), "
        f"got {value!r}."
    )


def env_get_attr(env: Any, name: str) -> Any:
    """Read attribute `name` of `env`, looking through gymnasium wrappers."""
    if hasattr(env, "get_wrapper_attr"):
        return env.get_wrapper_attr(name)
    return getattr(env, name)


def env_has_attr(env: Any, name: str) -> bool:
    """Whether `env_get_attr` finds attribute `name` of `env` (SB3's ``has_attr``)."""
    try:
        env_get_attr(env, name)
    except AttributeError:
        return False
    return True


def env_set_attr(env: Any, name: str, value: Any, *, outermost: bool = False) -> None:
    """Set attribute `name` of `env` (on the wrapper or env that has it, for gymnasium).

    With `outermost`, on `env` itself whatever the wrappers inside it have, as SB3's vector
    envs do (a wrapper's attribute of that name then hides the env's from ``get_attr``).
    """
    if hasattr(env, "set_wrapper_attr") and not outermost:
        env.set_wrapper_attr(name, value)
    else:
        setattr(env, name, value)


def env_call(env: Any, name: str, /, *args: Any, **kwargs: Any) -> Any:
    """Call method `name` of `env`; a non-callable attribute is returned as it is.

    This is the semantics of gymnasium's ``VectorEnv.call``.
    """
    value = env_get_attr(env, name)
    return value(*args, **kwargs) if callable(value) else value


def env_is_wrapped(env: Any, wrapper_class: type) -> bool:
    """Whether `env` or any env inside it (following ``.env``) is a `wrapper_class`."""
    while env is not None:
        if isinstance(env, wrapper_class):
            return True
        env = getattr(env, "env", None) if hasattr(env, "env") else None
    return False


def is_obs_and_info(reset_result: Any) -> bool:
    """Whether a ``reset`` result is gymnasium's ``(obs, info)`` rather than old gym's obs."""
    return (
        isinstance(reset_result, tuple)
        and len(reset_result) == 2
        and isinstance(reset_result[1], dict)
    )


def reset_obs(reset_result: Any) -> Any:
    """The observation of a ``reset`` result, gymnasium's or old gym's."""
    return reset_result[0] if is_obs_and_info(reset_result) else reset_result


def crashed_step(reset_result: Any) -> tuple[Any, ...]:
    """The step result that reports an env whose worker was lost and that came back reset.

    gymnasium: truncated with reward 0; old gym (pfrl): not done, ``info["needs_reset"]``, as
    pfrl's ``ContinuingTimeLimit`` reports a truncation. ``info["env_crashed"]`` is True.
    """
    if is_obs_and_info(reset_result):
        obs, info = reset_result
        return (obs, 0.0, False, True, {**info, "env_crashed": True})
    return (reset_result, 0.0, False, {"needs_reset": True, "env_crashed": True})


def reset_as_step(reset_result: Any) -> tuple[Any, ...]:
    """A ``reset`` result as a step (envpool's ``recv`` after ``async_reset``): reward 0, not done.

    gymnasium: ``(obs, 0.0, False, False, info)``; old gym: ``(obs, 0.0, False, {})``.
    """
    if is_obs_and_info(reset_result):
        return (reset_result[0], 0.0, False, False, reset_result[1])
    return (reset_result, 0.0, False, {})


def restart_seed(seed: int | None, restarts: int, *, rebuilt: bool = False) -> int | None:
    """The seed an env is reset with after its worker restarted, or after it was rebuilt.

    Derived from its last seed and how many times that happened (`rebuilt`: the env raised
    and was built again in its worker, counted apart), so a seeded run stays reproducible
    through failures; None (unseeded) if the env was never given a seed.
    """
    if seed is None:
        return None
    key = [seed, restarts, 1] if rebuilt else [seed, restarts]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


def reset_with_seed(env: Any, seed: int | None, options: Any = None) -> Any:
    """``env.reset(seed=seed, options=options)``, leaving out the arguments that are None.

    An old-gym env without a `seed` argument is seeded with its ``seed`` method instead.
    """
    kwargs = {} if options is None else {"options": options}
    if seed is None:
        return env.reset(**kwargs)
    try:
        return env.reset(seed=seed, **kwargs)
    except TypeError:
        if not callable(getattr(env, "seed", None)):
            raise
        env.seed(seed)
        return env.reset(**kwargs)


def reset_env(env: Any, seed: int | None = None, options: Any = None) -> tuple[Any, Any, bool]:
    """Reset `env`: ``(obs, info, old_api)``; an old-gym env (obs only) gives an empty info."""
    result = reset_with_seed(env, seed, options)
    if is_obs_and_info(result):
        return result[0], result[1], False
    return result, {}, True


def from_step(result: Any) -> tuple[Any, Any, bool, bool, Any, bool]:
    """The `result` of an env's ``step``: ``(obs, reward, terminated, truncated, info, old_api)``.

    An old-gym env's ``(obs, reward, done, info)`` counts as terminated when done.

    Raises:
        TypeError: If ``step`` returned neither 5 nor 4 items.
    """
    if isinstance(result, tuple) and len(result) == 5:
        return (*result, False)
    if isinstance(result, tuple) and len(result) == 4:
        obs, reward, done, info = result
        return obs, reward, bool(done), False, info, True
    raise TypeError(
        f"`step` returned {type(result).__name__} {result!r:.80}, not gymnasium's "
        "(obs, reward, terminated, truncated, info) or old gym's (obs, reward, done, info)."
    )


_VECTOR_ENV_HOOKS: list[Callable[[type], None]] = []


def add_vector_env_hook(hook: Callable[[type], None]) -> None:
    """Have `hook` called with each vector env class when its first instance is made.

    The pfrl integration uses it to make the class count as a ``pfrl.env.VectorEnv``.
    """
    if hook not in _VECTOR_ENV_HOOKS:
        _VECTOR_ENV_HOOKS.append(hook)


def announce_vector_env(cls: type) -> None:
    """Call every hook of `add_vector_env_hook` with `cls`."""
    for hook in _VECTOR_ENV_HOOKS:
        hook(cls)
