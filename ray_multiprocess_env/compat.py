"""Conventions that differ between env APIs, decided in one place.

gymnasium >= 1.0 wrappers no longer forward unknown attributes to the env inside them;
gymnasium's own vector envs use ``get_wrapper_attr``/``set_wrapper_attr`` instead. Every remote
env of this package reads and writes attributes the same way, old-gym envs and plain objects
included.
"""

from __future__ import annotations

from typing import Any

from gymnasium.vector import AutoresetMode

__all__ = ["as_autoreset_mode", "env_call", "env_get_attr", "env_is_wrapped", "env_set_attr"]


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


def env_set_attr(env: Any, name: str, value: Any) -> None:
    """Set attribute `name` of `env` (on the wrapper or env that has it, for gymnasium)."""
    if hasattr(env, "set_wrapper_attr"):
        env.set_wrapper_attr(name, value)
    else:
        setattr(env, name, value)


def env_call(env: Any, name: str, *args: Any, **kwargs: Any) -> Any:
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
