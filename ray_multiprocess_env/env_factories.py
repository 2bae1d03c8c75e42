"""From the one-line convention (``env``, ``num_envs``, ...) to one factory per env.

`make_vector_env` and `make_sb3_vec_env` take what users of ``gym.make_vec``, SB3's
``make_vec_env`` and envpool write: a gymnasium id or a factory, and counts of which any two of
``num_envs``, ``num_workers`` and ``envs_per_worker`` (or ``num_envs`` alone) are enough.
`env_factories` turns that into one picklable factory per env and the worker layout;
`made_from` does it for a ``make_*`` function's arguments (`MakeOptions`).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym

from ray_multiprocess_env.options import WorkerOptions, split_make_options

__all__ = [
    "EnvBuilder",
    "check_wrappers",
    "env_factories",
    "legacy_arguments",
    "made_from",
    "takes_index",
]


def takes_index(factory: Callable[..., Any]) -> bool:
    """Whether `factory` is called with the env index: it has a required positional parameter.

    A factory whose signature cannot be read (some builtins) is called without arguments.
    """
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for parameter in signature.parameters.values():
        if parameter.kind == inspect.Parameter.VAR_POSITIONAL:
            return True
        if parameter.kind in positional and parameter.default is inspect.Parameter.empty:
            return True
    return False


class EnvBuilder:
    """Builds env `index` in a worker: ``gym.make(id, **env_kwargs)`` or the factory, wrapped.

    Picklable when the factory and wrappers are (Ray pickles them with cloudpickle).
    """

    def __init__(
        self,
        env: str | Callable[..., Any],
        index: int,
        env_kwargs: Mapping[str, Any],
        wrappers: Sequence[Callable[[Any], Any]],
    ) -> None:
        self.env, self.index = env, index
        self.env_kwargs, self.wrappers = dict(env_kwargs), list(wrappers)
        self.with_index = not isinstance(env, str) and takes_index(env)

    def __call__(self) -> Any:
        """The env, built in the calling process (a worker)."""
        if isinstance(self.env, str):
            env = gym.make(self.env, **self.env_kwargs)
        elif self.with_index:
            env = self.env(self.index)
        else:
            env = self.env()
        for wrapper in self.wrappers:
            env = wrapper(env)
        return env

    def __repr__(self) -> str:
        return f"EnvBuilder({self.env!r}, index={self.index})"


def env_factories(
    env: Any,
    num_envs: Any = None,
    num_workers: Any = None,
    envs_per_worker: Any = None,
    env_kwargs: Any = None,
    wrappers: Any = None,
    *,
    cpus: Callable[[], int],
) -> tuple[list[EnvBuilder], tuple[int, ...]]:
    """One `EnvBuilder` per env and how many envs each worker holds, from the convention.

    Args:
        env: A gymnasium id (``"CartPole-v1"``) or a factory taking no argument or the env
            index (see `takes_index`).
        num_envs: How many envs in all.
        num_workers: How many worker actors: exactly that many, the envs spread as evenly as
            possible (the first workers hold one more: 6 envs in 4 workers are 2, 2, 1, 1).
        envs_per_worker: How many envs each worker holds, at most (the last workers may hold
            fewer). Give any two of the three counts, or `num_envs` alone (the workers are
            then ``min(num_envs, cpus())``; see `_counts`).
        env_kwargs: Keyword arguments of ``gym.make`` (with an id only).
        wrappers: Callables applied in order to each env in its worker.
        cpus: How many CPUs the workers may use (asked only when needed).

    Raises:
        TypeError: A bad `env`, `env_kwargs` or `wrappers`, naming it and the fix.
        ValueError: Missing, non-positive or inconsistent counts, or more workers than envs,
            naming which.
    """
    if isinstance(env, str):
        try:
            gym.spec(env)
        except gym.error.Error as err:
            raise ValueError(
                f"`env` {env!r} is not a registered gymnasium id ({err}); register it first "
                "(`gymnasium.register`), or pass a factory that returns the env."
            ) from err
    elif not callable(env):
        raise TypeError(
            f"`env` must be a gymnasium id or a factory (no argument, or the env index), got "
            f"{env!r}; e.g. `make_vector_env('CartPole-v1', 8)`."
        )
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise TypeError(f"`env_kwargs` must be a dict of `gym.make` arguments, got {env_kwargs!r}.")
    if env_kwargs and not isinstance(env, str):
        raise TypeError(
            f"`env_kwargs` {dict(env_kwargs)!r} is for a gymnasium id; bind a factory's "
            "arguments with `functools.partial` instead."
        )
    wrappers = check_wrappers(wrappers)
    layout = _counts(num_envs, num_workers, envs_per_worker, cpus)
    builders = [EnvBuilder(env, i, env_kwargs or {}, wrappers) for i in range(sum(layout))]
    return builders, layout


def check_wrappers(wrappers: Any) -> list[Callable[[Any], Any]]:
    """`wrappers` (None: none) as a list, or a TypeError saying what is wrong."""
    wrappers = [] if wrappers is None else wrappers
    if isinstance(wrappers, (str, bytes)) or not isinstance(wrappers, Sequence):
        raise TypeError(f"`wrappers` must be a list of callables env -> env, got {wrappers!r}.")
    for wrapper in wrappers:
        if not callable(wrapper):
            raise TypeError(f"`wrappers` holds {wrapper!r}, which is not callable.")
    return list(wrappers)


def _counts(
    num_envs: Any, num_workers: Any, envs_per_worker: Any, cpus: Callable[[], int]
) -> tuple[int, ...]:
    """How many envs each worker holds, in env order, from any two counts or `num_envs` alone.

    `num_workers` gives exactly that many workers, the envs spread evenly (`_spread`); with
    `envs_per_worker` as well, workers of that many envs if they make `num_workers`, the last
    holding fewer. `envs_per_worker` without `num_workers`: workers of that many envs, the
    last holding fewer. `num_envs` alone: workers of ``ceil(num_envs / w)`` envs for the
    ``w = min(num_envs, cpus())`` workers, or the envs spread over `w` workers where those
    would be fewer (9 envs on 6 CPUs: 2, 2, 2, 1, 1, 1, not 2, 2, 2, 2, 1).
    """
    # (imported here: a worker unpickling an `EnvBuilder` imports this module, not the engine)
    from ray_multiprocess_env._engine.options import check_positive_int
    from ray_multiprocess_env._engine.pool import worker_layout

    given = {
        name: check_positive_int(name, value)
        for name, value in (
            ("num_envs", num_envs),
            ("num_workers", num_workers),
            ("envs_per_worker", envs_per_worker),
        )
        if value is not None
    }
    n, w, k = (given.get(name) for name in ("num_envs", "num_workers", "envs_per_worker"))
    if n is None:
        if w is None or k is None:
            raise ValueError(
                "give `num_envs` (the workers then default to the CPUs Ray offers), or two of "
                f"`num_envs`, `num_workers` and `envs_per_worker`; got {given or 'none'}."
            )
        return (k,) * w
    if w is not None and w > n:
        raise ValueError(
            f"`num_workers={w}` is more than `num_envs={n}`, and each worker holds at least "
            f"one env; pass `num_workers` of at most {n}, or `num_envs` of at least {w}."
        )
    if k is None:
        if w is None:
            w = max(1, min(n, cpus()))
            chunks = worker_layout(n, math.ceil(n / w))
            if len(chunks) == w:
                return chunks
        return _spread(n, w)
    if w is None:
        return worker_layout(n, k)
    if math.ceil(n / w) == k:
        return _spread(n, w)
    if math.ceil(n / k) == w:
        return worker_layout(n, k)
    raise ValueError(
        f"`num_envs={n}` in `num_workers={w}` workers of `envs_per_worker={k}` envs does not "
        f"add up: {n} envs spread over {w} workers hold up to {math.ceil(n / w)} each, and "
        f"{k} envs per worker need {math.ceil(n / k)} workers for {n} envs. Give two of the "
        "three and the third is derived."
    )


def _spread(num_envs: int, num_workers: int) -> tuple[int, ...]:
    """`num_envs` envs over `num_workers` workers, as evenly as possible, the first fuller."""
    size, extra = divmod(num_envs, num_workers)
    return tuple(size + (index < extra) for index in range(num_workers))


def legacy_arguments(
    function: str,
    env: Any,
    num_envs: Any,
    legacy: tuple[Any, ...],
    num_workers: Any,
    envs_per_worker: Any,
    make_env: Any,
) -> tuple[Any, Any, Any, Any]:
    """``(env, num_envs, num_workers, envs_per_worker)`` from today's forms as well.

    Today's forms keep working, with a `DeprecationWarning`: ``make_env=`` (now `env`), and
    ``function(make_env, num_workers, envs_per_worker)`` with three positional arguments.
    """
    if make_env is not None:
        if env is not None:
            raise TypeError(f"`{function}`: give `env`, or its old name `make_env`, not both.")
        if not callable(make_env):
            raise TypeError(
                f"`make_env` must be a callable taking the env index, got {make_env!r}; "
                f"e.g. `{function}('CartPole-v1', 8)`."
            )
        warnings.warn(
            f"`{function}(make_env=...)` is deprecated; pass the factory (or a gymnasium id) "
            "as the first argument, `env`.",
            DeprecationWarning,
            stacklevel=4,
        )
        env = make_env
    if legacy:
        if len(legacy) > 1 or num_workers is not None or envs_per_worker is not None:
            raise TypeError(
                f"`{function}` takes `env` and `num_envs` positionally, then keywords; got "
                f"{2 + len(legacy)} positional arguments."
            )
        warnings.warn(
            f"`{function}(make_env, num_workers, envs_per_worker)` is the old form; write "
            f"`{function}(make_env, num_workers=..., envs_per_worker=...)`, or give `num_envs`.",
            DeprecationWarning,
            stacklevel=4,
        )
        return env, None, num_envs, legacy[0]
    return env, num_envs, num_workers, envs_per_worker


def made_from(
    entry_point: Callable[..., Any],
    env: Any,
    num_envs: Any,
    options: Mapping[str, Any],
    *,
    cpus: Callable[[], int],
    legacy: tuple[Any, ...] = (),
    make_env: Any = None,
    first_wrappers: Sequence[Callable[[Any], Any]] = (),
) -> tuple[list[EnvBuilder], tuple[int, ...], WorkerOptions]:
    """A ``make_*`` function's env factories, envs of each worker and `WorkerOptions`.

    `options` are the `MakeOptions` given to `entry_point` (any other key is a `TypeError`
    naming it); `legacy` and `make_env` its deprecated forms (see `legacy_arguments`);
    `first_wrappers` go before the user's `wrappers` (SB3's ``Monitor``).
    """
    where = entry_point.__name__
    factory, worker = split_make_options(where, options, entry_point)
    env, num_envs, num_workers, envs_per_worker = legacy_arguments(
        where, env, num_envs, legacy, factory["num_workers"], factory["envs_per_worker"], make_env
    )
    wrappers = factory["wrappers"]
    if first_wrappers:
        wrappers = [*first_wrappers, *check_wrappers(wrappers)]
    env_fns, layout = env_factories(
        env, num_envs, num_workers, envs_per_worker, factory["env_kwargs"], wrappers, cpus=cpus
    )
    return env_fns, layout, worker
