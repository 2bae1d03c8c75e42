"""The options of every entry point that builds envs in workers, declared and documented once.

Each entry point (the ``make_*`` functions, `vector_entry_point`, the faces' constructors and
`RayVectorEnv.from_env_fns`) spells out only what is its own (`env`, `num_envs`, its ecosystem's
conventions such as `autoreset_mode` or `wait_num`) and takes the rest as ``**options``, typed
with `WorkerOptions` or `MakeOptions` (PEP 692), so that type checkers and IDEs still show every
keyword. `check_names` checks the names (Python would accept any keyword into ``**options``),
`Options.make` (the engine's) the values.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypedDict, cast

__all__ = [
    "MAKE_KEYS",
    "WORKER_KEYS",
    "MakeOptions",
    "WorkerOptions",
    "check_names",
    "did_you_mean",
    "own_keywords",
    "split_make_options",
]


class WorkerOptions(TypedDict, total=False):
    """Where and how the worker actors run, and what a failure does; every key optional.

    Attributes:
        actor_options: Options for ``ray.remote`` of each worker (``num_cpus``, ``num_gpus``,
            ``memory``, ``resources``, ``runtime_env``, ...).
        placement: Where the workers run: None (Ray's default), ``"SPREAD"``, ``"PACK"``,
            ``"STRICT_PACK"``, ``"STRICT_SPREAD"``, a placement group, ``(placement_group,
            bundle_indices)`` or a Ray scheduling strategy; see `plan_placement`. A placement
            group made here is removed by ``close``; `timeout` (60 s if None) also bounds the
            wait for it.
        timeout: Seconds any one call may take, the workers' start included (at least 30 s for
            that), or None (wait as long as the envs take). A late call raises `TimeoutError`
            (or, with ``on_actor_failure="restart"``, its late worker is replaced).
        on_actor_failure: ``"raise"`` (default: a worker that dies raises `EnvCrashedError`
            naming its envs) or ``"restart"``: a worker that dies, or does not answer within
            `timeout`, is replaced by a new one from the same factories (its envs reset with
            seeds derived from their last ones), and the call goes on; each of its envs reports
            its lost episode at its next ``step``: gymnasium envs as truncated, old-gym envs as
            not done with ``info["needs_reset"] = True``, both with reward 0 and
            ``info["env_crashed"] = True``.
        transport: How operations reach the workers: ``"auto"`` (workers on the driver's node
            share the batch with it in memory and get a few bytes on a named pipe per call,
            served on the envs' own thread; workers on other nodes are served the same way
            over an authenticated TCP connection, the rows as raw bytes), ``"pipe"`` (pipes that
            carry everything, the rows as raw bytes as over TCP, no shared memory; Ray calls
            off the driver's node), ``"tcp"``
            (the TCP stream for every worker, the driver's node too) or ``"ray"`` (Ray calls
            only). A worker that cannot be reached over TCP (a firewall) uses Ray calls, with
            one warning. None (default) reads the ``RAY_MULTIPROCESS_ENV_TRANSPORT``
            environment variable (``"auto"`` if unset).
        on_env_error: ``"raise"`` (default) or ``"restart"``: an env whose ``step`` or
            ``reset`` raises is built again from its factory in its worker; its episode is
            reported as cut short (gymnasium envs: truncated; old gym: ``info["needs_reset"]``)
            with ``info["env_error"]``, the error's text, and its next observation is the new
            env's first (seeded as a restarted env is); the other envs go on.
        max_restarts: How many times each worker may be restarted and each env rebuilt
            (default 100; None: no limit). One more raises `EnvCrashedError` (a worker) or
            `RemoteEnvError` (an env), saying how many restarts were made.
    """

    actor_options: Mapping[str, Any] | None
    placement: Any
    timeout: float | None
    on_actor_failure: str
    transport: str | None
    on_env_error: str
    max_restarts: int | None


class MakeOptions(WorkerOptions, total=False):
    """`WorkerOptions`, and how the ``make_*`` functions build the envs from `env`.

    Attributes:
        num_workers: How many worker actors (Ray processes): exactly that many, the envs
            spread as evenly as possible (6 envs in 4 workers: 2, 2, 1, 1).
        envs_per_worker: How many envs each worker steps per call, at most (the last
            workers may hold fewer). Give any two of `num_envs`, `num_workers` and
            `envs_per_worker` and the third is derived; `num_envs` alone gives as many workers
            as the CPUs Ray offers (on a local runtime, the machine's cores), or `num_envs` if
            fewer.
        env_kwargs: Keyword arguments of ``gymnasium.make`` (with an id only).
        wrappers: Callables applied in order to each env inside its worker, as
            ``gymnasium.make_vec`` does (e.g. ``[gymnasium.wrappers.RecordEpisodeStatistics]``).
    """

    num_workers: int | None
    envs_per_worker: int | None
    env_kwargs: Mapping[str, Any] | None
    wrappers: Sequence[Callable[[Any], Any]] | None


#: The keys of `WorkerOptions` and of `MakeOptions`.
WORKER_KEYS: frozenset[str] = WorkerOptions.__optional_keys__
MAKE_KEYS: frozenset[str] = MakeOptions.__optional_keys__
_FACTORY_KEYS = MAKE_KEYS - WORKER_KEYS


def check_names(
    where: str,
    options: Mapping[str, Any],
    accepted: Collection[str],
    own: Callable[..., Any] | None = None,
) -> None:
    """A `TypeError` naming the first key of `options` that `where` does not take, and the fix.

    Python accepts any keyword into ``**options``; this is the check it would have made. `own`:
    the entry point itself, whose own keyword arguments are suggested too (read only when a key
    is bad).
    """
    for key in options:
        if key not in accepted:
            names = [*accepted, *own_keywords(own)]
            raise TypeError(
                f"`{where}` got an unexpected keyword argument {key!r}."
                f"{did_you_mean(key, names)} Besides its own arguments it takes the options "
                f"{', '.join(sorted(accepted))}."
            )


def own_keywords(function: Callable[..., Any] | None) -> list[str]:
    """The names `function` takes as keywords of its own (not ``**options``)."""
    if function is None:
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.kind in kinds and p.name not in ("self", "cls")]


def did_you_mean(key: str, accepted: Collection[str]) -> str:
    """`` Did you mean `name`?`` for the accepted name closest to `key`, or nothing."""
    close = difflib.get_close_matches(key, list(accepted), n=1)
    return f" Did you mean `{close[0]}`?" if close else ""


def split_make_options(
    where: str, options: Mapping[str, Any], own: Callable[..., Any] | None = None
) -> tuple[dict[str, Any], WorkerOptions]:
    """``(factory arguments, worker options)`` of a ``make_*`` function's `MakeOptions`."""
    check_names(where, options, MAKE_KEYS, own)
    factory = {key: options.get(key) for key in _FACTORY_KEYS}
    worker = cast(WorkerOptions, {k: v for k, v in options.items() if k in WORKER_KEYS})
    return factory, worker
