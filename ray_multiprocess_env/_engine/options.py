"""The engine's options, validated once, and the package's argument checks of values.

Each face (`RayVectorEnv`, `GymnasiumVectorEnv`, `SB3VecEnv`, `TianshouVectorEnv`) turns the
user's `WorkerOptions` (their names are declared and checked in ``ray_multiprocess_env/options.py``)
and its own settings into one frozen `Options`; the checks here name the argument, the bad value
and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from gymnasium import Space
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env._engine.worker_spin import check_spin
from ray_multiprocess_env.compat import as_autoreset_mode
from ray_multiprocess_env.options import WORKER_KEYS, check_names

__all__ = [
    "DEFAULT_MAX_RESTARTS",
    "FAILURE_POLICIES",
    "TRANSPORTS",
    "TRANSPORT_VARIABLE",
    "Options",
    "check_base_seed",
    "check_env_fns",
    "check_env_ids",
    "check_length",
    "check_observation_mode",
    "check_positive_int",
    "check_seed_list",
    "check_wait",
    "check_worker_options",
    "envs_per_worker_argument",
    "seconds_of",
]

#: The values of `transport`.
TRANSPORTS = ("auto", "pipe", "tcp", "ray")
#: The values of `on_actor_failure` and `on_env_error`.
FAILURE_POLICIES = ("raise", "restart")
#: How many times a worker may be restarted, and an env rebuilt, unless told otherwise.
DEFAULT_MAX_RESTARTS = 100
#: The environment variable that sets the default `transport`.
TRANSPORT_VARIABLE = "RAY_MULTIPROCESS_ENV_TRANSPORT"
#: Seconds a restart or a `close` may take when `timeout` is None.
DEFAULT_BOUND_S = 60.0
#: Seconds a worker's start is given at least: a process start takes seconds on a busy machine.
MIN_START_S = 30.0


@dataclasses.dataclass(frozen=True)
class Options:
    """How a vector env runs its workers; made once by `Options.make`, never changed.

    Attributes:
        timeout: Seconds any one call may take, or None (wait as long as the envs take).
        on_actor_failure: ``"raise"`` or ``"restart"``.
        transport: ``"auto"`` (pipes and shared memory to workers on the driver's node, a
            TCP stream to the others), ``"pipe"`` (pipes only, no shared memory),
            ``"tcp"`` (the TCP stream everywhere) or ``"ray"`` (Ray calls only).
        autoreset_mode: gymnasium's autoreset mode of the batched ``step``.
        check_actions: Whether actions are checked against the action space on the driver.
        actor_options: ``ray.remote`` options of every worker.
        placement: Where the workers run (see `plan_placement`).
        on_env_error: ``"raise"`` or ``"restart"`` (an env that raises is rebuilt in its
            worker and its episode reported as truncated).
        max_restarts: How many times each worker may be restarted and each env rebuilt
            (None: no limit); one more is an error.
        worker_spin: Microseconds a worker polls for its next message before it sleeps, or
            None: by the cores of its node (`worker_spin.check_spin`).
    """

    timeout: float | None = None
    on_actor_failure: str = "raise"
    transport: str = "auto"
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    check_actions: bool = False
    actor_options: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    placement: Any = None
    on_env_error: str = "raise"
    max_restarts: int | None = DEFAULT_MAX_RESTARTS
    worker_spin: int | None = None

    @classmethod
    def make(
        cls,
        options: Mapping[str, Any] = MappingProxyType({}),
        /,
        *,
        where: str = "Options.make",
        own: Callable[..., Any] | None = None,
        autoreset_mode: Any = AutoresetMode.NEXT_STEP,
        check_actions: Any = False,
    ) -> Options:
        """Validate every option; a `TypeError`/`ValueError` names the first bad one.

        `options` are the user's `WorkerOptions` (any other key is a `TypeError` naming `where`,
        the entry point `own` that took them); a key left out takes its default.
        `autoreset_mode` and `check_actions` are the face's own settings.
        """
        check_names(where, options, WORKER_KEYS, own)
        timeout = options.get("timeout")
        on_actor_failure = options.get("on_actor_failure", "raise")
        transport = options.get("transport")
        actor_options = options.get("actor_options")
        placement = options.get("placement")
        on_env_error = options.get("on_env_error", "raise")
        max_restarts = options.get("max_restarts", DEFAULT_MAX_RESTARTS)
        if actor_options is not None and not isinstance(actor_options, Mapping):
            raise TypeError(
                f"`actor_options` must be a mapping of `ray.remote` options, got "
                f"{actor_options!r}; e.g. `actor_options={{'num_cpus': 1}}`."
            )
        if on_actor_failure not in FAILURE_POLICIES:
            raise ValueError(
                f"`on_actor_failure` must be 'raise' or 'restart', got {on_actor_failure!r}."
            )
        if on_env_error not in FAILURE_POLICIES:
            raise ValueError(f"`on_env_error` must be 'raise' or 'restart', got {on_env_error!r}.")
        if max_restarts is not None:
            if isinstance(max_restarts, bool) or not isinstance(max_restarts, numbers.Integral):
                raise TypeError(f"`max_restarts` must be an int or None, got {max_restarts!r}.")
            if max_restarts < 0:
                raise ValueError(
                    f"`max_restarts` must be 0 or more (or None: no limit), got {max_restarts!r}."
                )
        if not isinstance(check_actions, bool):
            raise TypeError(f"`check_actions` must be True or False, got {check_actions!r}.")
        return cls(
            timeout=check_timeout(timeout),
            on_actor_failure=on_actor_failure,
            transport=check_transport(transport),
            autoreset_mode=as_autoreset_mode(autoreset_mode),
            check_actions=check_actions,
            actor_options=MappingProxyType(dict(actor_options or {})),
            placement=placement,
            on_env_error=on_env_error,
            max_restarts=None if max_restarts is None else int(max_restarts),
            worker_spin=check_spin(),
        )

    def worker_args(self, info_layout: str, autoreset: bool = True) -> dict[str, Any]:
        """The keyword arguments every `EnvWorker` of these options is built with.

        `autoreset` False: the workers never reset an env by themselves (pfrl's way).
        """
        mode = self.autoreset_mode if autoreset else AutoresetMode.DISABLED
        return {
            "autoreset_mode": mode.value,
            "info_layout": info_layout,
            "on_env_error": self.on_env_error,
            "max_restarts": self.max_restarts,
        }

    @property
    def bound(self) -> float:
        """Seconds a restart or a `close` may take: `timeout`, or 60 s if it is None."""
        return DEFAULT_BOUND_S if self.timeout is None else self.timeout

    @property
    def restart_bound(self) -> float:
        """Seconds a replacement worker's start may take: `bound`, at least `MIN_START_S`.

        A replacement is a process start like the first, on a machine that may be busy.
        """
        return max(self.bound, MIN_START_S)

    @property
    def start_bound(self) -> float | None:
        """Seconds the workers' first start may take: `timeout`, at least 30 s; None: no bound."""
        return None if self.timeout is None else max(self.timeout, MIN_START_S)


def check_worker_options(actor_options: Mapping[str, Any]) -> None:
    """A ValueError if `actor_options` would make a worker run envs on several threads."""
    if "concurrency_groups" in actor_options or actor_options.get("max_concurrency", 1) != 1:
        key = "concurrency_groups" if "concurrency_groups" in actor_options else "max_concurrency"
        raise ValueError(
            f"`actor_options` sets {key!r} = {actor_options[key]!r}, but a worker runs every env "
            "method on the one thread that built its envs; remove it (more workers give more "
            "parallelism)."
        )


def check_timeout(timeout: Any) -> float | None:
    """`timeout` as float seconds or None (infinity too); a TypeError/ValueError otherwise."""
    if timeout is None:
        return None
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool):
        raise TypeError(f"`timeout` must be a number of seconds or None, got {timeout!r}.")
    seconds = seconds_of(timeout)
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(
            f"`timeout` must be a positive number of seconds or None, got {timeout!r}."
        )
    return None if math.isinf(seconds) else seconds


def seconds_of(number: Any) -> float:
    """A real number of seconds as a float: an int past any float is +/-infinity, no error."""
    try:
        return float(number)
    except OverflowError:
        return math.inf if number > 0 else -math.inf  # (an int)


def check_wait(timeout: Any) -> float:
    """A wait's own `timeout` given (`step_wait`, `recv`; None, not checked, is the options')."""
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool):
        raise TypeError(
            f"`timeout` must be a number of seconds, or None for the vector env's own "
            f"`timeout`, got {timeout!r}."
        )
    seconds = seconds_of(timeout)
    if not 0 <= seconds < math.inf:  # (NaN too)
        raise ValueError(
            f"`timeout` must be a finite number of seconds >= 0, or None for the vector env's "
            f"own `timeout` (make the vector env with ``timeout=None`` to wait as long as the "
            f"envs take), got {timeout!r}."
        )
    return seconds


def check_transport(transport: Any) -> str:
    """`transport`, or the environment's default when None; a ValueError naming it if bad."""
    source = "`transport`"
    if transport is None:
        transport = os.environ.get(TRANSPORT_VARIABLE, "auto")
        source = f"the {TRANSPORT_VARIABLE} environment variable"
    if transport not in TRANSPORTS:
        raise ValueError(
            f"{source} must be one of {', '.join(map(repr, TRANSPORTS))}, got {transport!r}."
        )
    return str(transport)


def check_env_fns(env_fns: Any) -> list[Callable[[], Any]]:
    """`env_fns` as a list of callables, or a TypeError/ValueError saying what is wrong."""
    if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Iterable):
        raise TypeError(
            f"`env_fns` must be a list of env factories (callables), got {env_fns!r}; "
            "e.g. `[lambda: gymnasium.make('CartPole-v1')] * 8`."
        )
    factories: list[Callable[[], Any]] = list(env_fns)
    if not factories:
        raise ValueError("`env_fns` is empty; pass at least one env factory.")
    for index, env_fn in enumerate(factories):
        if not callable(env_fn):
            raise TypeError(
                f"`env_fns[{index}]` must be a callable that returns an env, got {env_fn!r}."
            )
    return factories


def check_positive_int(name: str, value: Any) -> int:
    """`value` as an int, or a TypeError/ValueError naming the argument `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be a positive int, got {value!r}.")
    if value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    return int(value)


def envs_per_worker_argument(envs_per_worker: Any, envs_per_actor: Any, default: int = 1) -> int:
    """`envs_per_worker`, or the deprecated `envs_per_actor` (with a `DeprecationWarning`)."""
    if envs_per_actor is not None:
        warnings.warn(
            "`envs_per_actor` is deprecated; use `envs_per_worker` (the same meaning).",
            DeprecationWarning,
            stacklevel=3,
        )
        if envs_per_worker is not None and envs_per_worker != envs_per_actor:
            raise ValueError(
                f"`envs_per_worker={envs_per_worker!r}` and `envs_per_actor="
                f"{envs_per_actor!r}` disagree; pass only `envs_per_worker`."
            )
        return check_positive_int("envs_per_actor", envs_per_actor)
    if envs_per_worker is None:
        return default
    return check_positive_int("envs_per_worker", envs_per_worker)


def check_length(argument: str, value: Any, num_envs: int, expected: str) -> None:
    """A TypeError/ValueError unless `value` is a sequence of `num_envs` entries."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"`{argument}` must be a sequence with {expected}, got {value!r}.")
    try:
        length = len(value)
    except TypeError:
        raise TypeError(
            f"`{argument}` must be a sequence with {expected}, got {value!r} "
            f"({type(value).__name__})."
        ) from None
    if length != num_envs:
        raise ValueError(
            f"`{argument}` has {length} entries but there are {num_envs} envs; pass {expected}."
        )


def check_observation_mode(mode: Any) -> tuple[Any, Any]:
    """The `observation_mode` of gymnasium as ``(what the envs are checked by, batched space)``.

    ``"same"`` and ``"different"`` stay as they are (no batched space: it is made from the
    envs'); a ``(batched, single)`` pair gives ``(single, batched)``.
    """
    if isinstance(mode, str) and mode in ("same", "different"):
        return mode, None
    if isinstance(mode, tuple) and len(mode) == 2:
        if not all(isinstance(space, Space) for space in mode):
            raise TypeError(
                f"`observation_mode` as a pair must be (batched space, single space), both "
                f"`gymnasium.spaces.Space`, got {mode!r}."
            )
        return mode[1], mode[0]
    raise ValueError(
        f"`observation_mode` must be 'same', 'different' or a (batched space, single space) "
        f"pair, as for gymnasium's `SyncVectorEnv`, got {mode!r}."
    )


def check_env_ids(env_ids: Any, num_envs: int, argument: str = "env_ids") -> list[int]:
    """`env_ids` as a list of distinct ints in ``0..num_envs-1``, or an error naming it."""
    if type(env_ids) is np.ndarray and env_ids.ndim == 1 and env_ids.dtype.kind in "iu":
        fast: list[int] = env_ids.tolist()  # (what `recv` hands out: the hot path)
        if fast and min(fast) >= 0 and max(fast) < num_envs and len(set(fast)) == len(fast):
            return fast
    if isinstance(env_ids, (numbers.Integral, str, bytes)) or not isinstance(env_ids, Iterable):
        raise TypeError(f"`{argument}` must be a list of env indices, got {env_ids!r}.")
    ids = list(env_ids)
    for env in ids:
        if isinstance(env, bool) or not isinstance(env, numbers.Integral):
            raise TypeError(f"`{argument}` must hold ints, got {env!r}.")
        if not 0 <= int(env) < num_envs:
            raise ValueError(
                f"`{argument}` contains {env} but there are {num_envs} envs "
                f"(valid ids are 0..{num_envs - 1})."
            )
    if len(set(ids)) != len(ids):
        raise ValueError(f"`{argument}` repeats an env: {ids}.")
    return [int(env) for env in ids]


def check_base_seed(seed: Any, argument: str = "seed") -> int | None:
    """A constructor's `seed`: None, an int or a `SeedSequence`; the int it stands for."""
    if seed is None:
        return None
    if isinstance(seed, np.random.SeedSequence):
        return int(check_seed_list(seed, 1)[0] or 0)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"`{argument}` must be an int or None (or a `numpy.random.SeedSequence`), got {seed!r}."
        )
    return int(seed)


def check_seed_list(seed: Any, num_envs: int, argument: str = "seed") -> list[int | None]:
    """One seed (or None) per env from None, an int, a `SeedSequence` or one seed per env.

    An int gives env ``i`` the seed ``seed + i`` (gymnasium's convention); a
    `numpy.random.SeedSequence` gives env ``i`` ``int(seq.spawn(num_envs)[i].generate_state(1)[0])``
    (independent streams: two base seeds share no env seed), computed on a copy, so the same
    sequence gives the same seeds each time.
    """
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, np.random.SeedSequence):
        copy = np.random.SeedSequence(
            seed.entropy,
            spawn_key=seed.spawn_key,
            pool_size=seed.pool_size,
            n_children_spawned=seed.n_children_spawned,
        )
        return [int(child.generate_state(1)[0]) for child in copy.spawn(num_envs)]
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(num_envs)]
    if isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)):
        if len(seed) != num_envs:
            raise ValueError(
                f"`{argument}` has {len(seed)} entries but there are {num_envs} envs; pass "
                "one seed per env, or one int."
            )
        out: list[int | None] = []
        for index, item in enumerate(seed):
            if item is not None and (
                isinstance(item, bool) or not isinstance(item, numbers.Integral)
            ):
                raise TypeError(f"`{argument}[{index}]` must be an int or None, got {item!r}.")
            out.append(None if item is None else int(item))
        return out
    raise TypeError(
        f"`{argument}` must be None, an int or a list with one seed per env (or a "
        f"`numpy.random.SeedSequence`), got {seed!r}."
    )
