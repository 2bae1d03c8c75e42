"""`EnvWorker`: the actor that holds K envs and steps them all in one call.

One Ray call costs far more than a cheap env step, so a worker steps its K envs per call and
returns their observations stacked. Seeds, autoreset (gymnasium's three modes) and per-env
exception capture happen here, so an autoreset costs no extra round trip and a failure still
names the global env index.
"""

from __future__ import annotations

import functools
import numbers
import os
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import ray
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env.batch import stack, unstack
from ray_multiprocess_env.channel import WorkerEnd
from ray_multiprocess_env.compat import (
    as_autoreset_mode,
    env_call,
    env_get_attr,
    env_is_wrapped,
    env_set_attr,
)
from ray_multiprocess_env.errors import _EnvFailures
from ray_multiprocess_env.fanout import ActorGroup
from ray_multiprocess_env.placement import PlacementPlan
from ray_multiprocess_env.runtime import ensure_runtime

__all__ = ["WORKER_ENV_METHODS", "EnvWorker", "start_workers"]

#: The methods `EnvWorker.apply` maps to `compat` instead of the env's own attribute.
_ATTRIBUTE_METHODS: dict[str, Callable[..., Any]] = {
    "call": env_call,
    "get_attr": env_get_attr,
    "set_attr": env_set_attr,
    "is_wrapped": env_is_wrapped,
}
#: The names `EnvWorker.apply` runs as functions of the env rather than as env methods.
WORKER_ENV_METHODS = tuple(_ATTRIBUTE_METHODS)

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _exclusive(method: _Method) -> _Method:
    """Run `method` holding the worker's lock (the pipe transport's thread steps envs too)."""

    @functools.wraps(method)
    def locked(self: EnvWorker, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class EnvWorker:
    """Holds the envs ``env_indices`` (built by `env_fns`) inside one Ray actor.

    Args:
        env_fns: One factory per env; each is called once, in the actor.
        env_indices: The global index of each env, used in error messages.
        autoreset_mode: gymnasium's autoreset mode for `step_batch`.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        env_indices: Sequence[int],
        autoreset_mode: str = AutoresetMode.NEXT_STEP.value,
    ) -> None:
        self._lock = threading.RLock()
        self.env_indices = list(env_indices)
        self.envs = []
        for index, env_fn in zip(self.env_indices, env_fns, strict=True):
            try:
                self.envs.append(env_fn())
            except Exception as err:
                raise RuntimeError(
                    f"env {index}: its factory raised {type(err).__name__}: {err}"
                ) from err
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        count = len(self.envs)
        self._obs: list[Any] = [None] * count
        self._obs_batch: Any = None
        self._rewards = np.zeros(count, dtype=np.float64)
        self._terminations = np.zeros(count, dtype=np.bool_)
        self._truncations = np.zeros(count, dtype=np.bool_)
        self._autoreset = np.zeros(count, dtype=np.bool_)
        self._action_batch_space = batch_space(self.envs[0].action_space, count)

    # -- per-env calls (the pfrl-style RayVectorEnv) -----------------------------------------
    @_exclusive
    def apply(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[dict[str, Any]],
    ) -> list[Any]:
        """Call `method` on each env whose args are not None; None marks a skipped env."""
        results: list[Any] = [None] * len(self.envs)
        failures = []
        for k, (env, args, kwargs) in enumerate(
            zip(self.envs, args_per_env, kwargs_per_env, strict=True)
        ):
            if args is None:
                continue
            try:
                if method in _ATTRIBUTE_METHODS:
                    results[k] = _ATTRIBUTE_METHODS[method](env, *args, **kwargs)
                else:
                    results[k] = getattr(env, method)(*args, **kwargs)
            except Exception as err:
                failures.append(self._failure(k, err))
        if failures:
            raise _EnvFailures(method, failures)
        return results

    @_exclusive
    def has_method(self, name: str) -> list[bool]:
        """Whether each env has a callable attribute `name` (e.g. old gym's ``seed``)."""
        return [callable(getattr(env, name, None)) for env in self.envs]

    @_exclusive
    def describe(self) -> dict[str, Any]:
        """The spaces, metadata and render mode of the first env, checked against the others."""
        first = self.envs[0]
        for index, env in zip(self.env_indices, self.envs, strict=True):
            for space in ("observation_space", "action_space"):
                if getattr(env, space) != getattr(first, space):
                    raise ValueError(
                        f"env {index} has {space} {getattr(env, space)} but env "
                        f"{self.env_indices[0]} has {getattr(first, space)}; every env of a "
                        "vector env needs the same spaces."
                    )
        return {
            "observation_space": first.observation_space,
            "action_space": first.action_space,
            "metadata": dict(getattr(first, "metadata", {}) or {}),
            "render_mode": getattr(first, "render_mode", None),
        }

    # -- batched calls (GymnasiumVectorEnv) --------------------------------------------------
    @_exclusive
    def reset_batch(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None,
        mask: Sequence[bool] | None,
    ) -> tuple[Any, dict[int, list[dict[str, Any]]]]:
        """Reset the envs (those with a True `mask` entry only, if given), like gymnasium.

        `options` is one dict for every env, or one (dict or None) per env.

        Returns:
            The stacked observations of all K envs (unreset envs keep their last one) and, for
            each env (by position in this worker) with a non-empty info, the info dicts to add
            to the vector info in order.
        """
        infos: dict[int, list[dict[str, Any]]] = {}
        failures = []
        for k, env in enumerate(self.envs):
            if mask is not None and not mask[k]:
                continue
            self._terminations[k] = self._truncations[k] = self._autoreset[k] = False
            try:
                env_options = (
                    options if options is None or isinstance(options, dict) else options[k]
                )
                self._obs[k], info = env.reset(seed=seeds[k], options=env_options)
            except Exception as err:
                failures.append(self._failure(k, err))
                continue
            if info:
                infos[k] = [info]
        if failures:
            raise _EnvFailures("reset", failures)
        return self._stacked_obs(), infos

    @_exclusive
    def step_batch(
        self, actions: Any, positions: Sequence[int] | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[int, list[dict[str, Any]]]]:
        """Step the K envs (or those at `positions`) with gymnasium's autoreset semantics.

        Args:
            actions: A batch of actions, one per env stepped (in `positions` order).
            positions: The envs of this worker to step (0..K-1); None steps all K.

        Returns:
            Stacked observations, rewards, terminations and truncations of the envs stepped,
            and the info dicts of those that have any, by position (as `reset_batch`).
        """
        if positions is None:
            positions = range(len(self.envs))
            single_actions = unstack(self._action_batch_space, actions)
        else:
            positions = list(positions)
            single_actions = unstack(
                batch_space(self.envs[0].action_space, len(positions)), actions
            )
        infos: dict[int, list[dict[str, Any]]] = {}
        failures = []
        mode = self.autoreset_mode
        for k, action in zip(positions, single_actions, strict=True):
            env = self.envs[k]
            try:
                if mode == AutoresetMode.NEXT_STEP and self._autoreset[k]:
                    self._obs[k], info = env.reset()
                    self._rewards[k] = 0.0
                    self._terminations[k] = self._truncations[k] = False
                else:
                    (
                        self._obs[k],
                        self._rewards[k],
                        self._terminations[k],
                        self._truncations[k],
                        info,
                    ) = env.step(action)
                    if mode == AutoresetMode.SAME_STEP and (
                        self._terminations[k] or self._truncations[k]
                    ):
                        infos[k] = [{"final_obs": self._obs[k], "final_info": info}]
                        self._obs[k], info = env.reset()
            except Exception as err:
                failures.append(self._failure(k, err))
                continue
            if info:
                infos.setdefault(k, []).append(info)
        if failures:
            raise _EnvFailures("step", failures)
        self._autoreset = np.logical_or(self._terminations, self._truncations)
        return self._step_result(positions, infos)

    @_exclusive
    def recover_step(
        self, positions: Sequence[int] | None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[int, list[dict[str, Any]]]]:
        """A `step_batch` result for this fresh worker standing in for one that died.

        Resets every env, and reports the envs at `positions` (all if None) as truncated with
        reward 0 and ``info["env_crashed"] = True``, in the shape `autoreset_mode` asks for
        (``final_obs``/``final_info`` in SAME_STEP; in NEXT_STEP the next step resets them).
        """
        index = list(range(len(self.envs)) if positions is None else positions)
        reset_infos = {}
        for k, env in enumerate(self.envs):
            self._obs[k], reset_infos[k] = env.reset()
        infos: dict[int, list[dict[str, Any]]] = {}
        for k in index:
            self._rewards[k] = 0.0
            self._terminations[k], self._truncations[k] = False, True
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                final = {"final_obs": self._obs[k], "final_info": {"env_crashed": True}}
                infos[k] = [final, reset_infos[k]] if reset_infos[k] else [final]
            else:
                infos[k] = [{**reset_infos[k], "env_crashed": True}]
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._autoreset[index] = True
        return self._step_result(index, infos)

    def pid(self) -> int:
        """The worker's process id (for monitoring, and for tests that kill it)."""
        return os.getpid()

    def node_id(self) -> str:
        """The id of the Ray node this worker runs on (hex)."""
        return str(ray.get_runtime_context().get_node_id())

    def open_channel(self, go: str, done: str) -> None:
        """Serve `step_batch` over the named pipes `go` and `done` (see `channel.py`)."""
        self._channel = WorkerEnd(go, done, self.step_batch, self._lock)

    # -- helpers ------------------------------------------------------------------------------
    def _step_result(
        self, positions: Sequence[int], infos: dict[int, list[dict[str, Any]]]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[int, list[dict[str, Any]]]]:
        """Observations (stacked), rewards, terminations and truncations of `positions`."""
        index = list(positions)
        if index == list(range(len(self.envs))):
            observations = self._stacked_obs()  # all envs: reuse the batch buffer
        else:
            observations = stack(self.envs[0].observation_space, [self._obs[k] for k in index])
        return (
            observations,
            self._rewards[index],
            self._terminations[index],
            self._truncations[index],
            infos,
        )

    def _stacked_obs(self) -> Any:
        self._obs_batch = stack(self.envs[0].observation_space, self._obs, self._obs_batch)
        return self._obs_batch

    def _failure(self, k: int, err: Exception) -> tuple[int, str, str, str]:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return (self.env_indices[k], type(err).__name__, str(err), text)


def start_workers(
    env_fns: Sequence[Callable[[], Any]],
    envs_per_worker: int,
    *,
    plan: PlacementPlan | None = None,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    argument: str = "envs_per_worker",
    first_index: int = 0,
    first_worker: int = 0,
) -> list[ActorGroup]:
    """Start `EnvWorker` actors holding `envs_per_worker` envs each (the last may hold fewer).

    Starts a local Ray runtime first if none is running. Worker ``w`` (counting from
    `first_worker`) is created with ``plan.options(w)``. `argument` is the name the caller's
    users know `envs_per_worker` by, for error messages; `first_index` is the global index of
    the first env (when restarting one worker of a vector env).

    Raises:
        TypeError: If `env_fns` is not a list of callables, or a factory cannot be pickled (the
            message names its env indices).
        ValueError: If `env_fns` is empty, `envs_per_worker` is not positive, or Ray rejects
            the actor options.
    """
    factories = check_env_fns(env_fns)
    per_worker = check_positive_int(argument, envs_per_worker)
    mode = as_autoreset_mode(autoreset_mode)
    ensure_runtime()
    worker_class: Any = ray.remote(EnvWorker)
    groups: list[ActorGroup] = []
    for worker, start in enumerate(range(0, len(factories), per_worker), first_worker):
        stop = min(start + per_worker, len(factories))
        options = plan.options(worker) if plan is not None else {}
        try:
            actor = worker_class.options(**options).remote(
                factories[start:stop],
                list(range(first_index + start, first_index + stop)),
                mode.value,
            )
        except Exception as err:
            for group in groups:
                ray.kill(group.actor)
            lines = str(err).splitlines() or [""]
            reason = next((line for line in lines if "cannot pickle" in line), None)
            if reason is None and "serialize" not in str(err):
                raise ValueError(
                    f"the worker of envs {start}..{stop - 1} could not be created with the "
                    f"options {options!r}: {lines[0]} Fix `actor_options` or `placement` (a "
                    "`runtime_env` with local directories goes to `ray.init(runtime_env=...)`)."
                ) from err
            reason = (reason or lines[0]).replace("\x1b[31m", "").replace("\x1b[39m", "").strip()
            raise TypeError(
                f"the env factories of envs {start}..{stop - 1} could not be sent to a Ray "
                f"worker ({reason}). Env factories must be picklable: use a module-level "
                "function or `functools.partial`, with no open files, locks or sockets in "
                "closures. Ray's diagnosis is in this error's `__cause__`."
            ) from err
        groups.append(ActorGroup(actor, first_index + start, first_index + stop, batched=True))
    return groups


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
