"""`EnvWorker`: the actor that holds K envs and steps them all in one call.

One Ray call costs far more than a cheap env step, so a worker steps its K envs per call and
returns their observations stacked. Seeds, autoreset (gymnasium's three modes) and per-env
exception capture happen here, so an autoreset costs no extra round trip and a failure still
names the global env index.

Every env method runs on one thread: the actor's main thread, which built the envs. Ray runs
the calls of a plain (non-threaded) actor there, and the same-node pipe transport is served
there too (`serve` holds the main thread and dispatches each message exactly as a Ray call
would be), so envs bound to their thread (OpenGL/EGL contexts, pygame, ``signal.alarm``) work
with every transport. This module imports nothing of the driver side.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env._shared_memory import BatchViews, SharedBatch, read_actions
from ray_multiprocess_env._wire import HEADER, encode_reply, error_value, loads, read_exact
from ray_multiprocess_env._wire import write_all as _write_all
from ray_multiprocess_env.batch import copy_batch, stack, unstack
from ray_multiprocess_env.compat import (
    crashed_step,
    env_call,
    env_get_attr,
    env_has_attr,
    env_is_wrapped,
    env_set_attr,
    reset_obs,
    reset_with_seed,
)
from ray_multiprocess_env.errors import _EnvFailures

__all__ = ["WORKER_ENV_METHODS", "EnvWorker"]

#: The names `apply` runs as functions of the env (through gymnasium's wrapper-aware access).
_ATTRIBUTE_METHODS: dict[str, Callable[..., Any]] = {
    "call": env_call,
    "get_attr": env_get_attr,
    "has_attr": env_has_attr,
    "set_attr": env_set_attr,
    "is_wrapped": env_is_wrapped,
}
#: Those `RayVectorEnv.call_each` runs as such; SB3's ``has_attr`` is only for `SB3VecEnv`.
WORKER_ENV_METHODS = tuple(name for name in _ATTRIBUTE_METHODS if name != "has_attr")

#: Observations, rewards, terminations, truncations (None where shared memory holds them), infos.
StepResult = tuple[Any, Any, Any, Any, dict[int, list[dict[str, Any]]]]


class EnvWorker:
    """Holds the envs ``env_indices`` (built by `env_fns`) inside one Ray actor.

    Args:
        env_fns: One factory per env; each is called once, on the actor's main thread.
        env_indices: The global index of each env, used in error messages.
        autoreset_mode: gymnasium's autoreset mode (its value) for the batched ``step``.
        restart_seeds: Given when this worker replaces one that was lost: every env is reset
            at once with its seed, and its next ``step`` reports the lost episode as truncated
            with ``info["env_crashed"] = True`` instead of stepping.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        env_indices: Sequence[int],
        autoreset_mode: str = AutoresetMode.NEXT_STEP.value,
        restart_seeds: Sequence[int | None] | None = None,
    ) -> None:
        self._thread = threading.get_ident()
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
        self._autoreset = [False] * count
        self._next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
        self._same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        self._action_batch_space = batch_space(self.envs[0].action_space, count)
        self._lost: list[Any] = [None] * count  # reset results of envs whose episode was lost
        self._shared: BatchViews | None = None  # this worker's rows of the shared arrays
        if restart_seeds is not None:
            for k, env in enumerate(self.envs):
                self._lost[k] = reset_with_seed(env, restart_seeds[k])
                self._obs[k] = reset_obs(self._lost[k])

    # -- the two ways in: a Ray call, or the same-node pipe ------------------------------------
    def handle(self, op: str, args: tuple[Any, ...]) -> Any:
        """Run operation `op` (``step``, ``reset``, ``apply``, ...) with `args`."""
        if threading.get_ident() != self._thread:  # pragma: no cover - Ray's plain actors
            raise RuntimeError("EnvWorker was called off the thread that built its envs")
        method: Callable[..., Any] = getattr(self, f"_op_{op}")
        return method(*args)

    def serve(self, go: str, done: str) -> None:
        """Serve operations from the named pipe `go`, replies to `done`, until the driver leaves.

        Holds the main thread, so the envs stay on the thread that built them; every
        operation must then come over the pipe (Ray calls would wait behind this one).
        """
        done_fd = os.open(done, os.O_WRONLY)  # the driver holds the read end open already
        go_fd = os.open(go, os.O_RDONLY)  # returns once the driver opens its write end
        try:
            while True:
                header = read_exact(go_fd, HEADER.size)
                payload = None if header is None else read_exact(go_fd, HEADER.unpack(header)[1])
                if header is None or payload is None:
                    return  # the driver closed the pipe (or died)
                op = "?"
                try:
                    op, args = loads(payload)
                    ok, value = True, self.handle(op, args)
                except Exception as err:
                    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
                    ok, value = False, (error_value(err), text)
                seq = HEADER.unpack(header)[0]
                _write_all(done_fd, encode_reply(seq, ok, value, self.env_indices, op))
        except OSError:
            return  # the driver went away mid-message
        finally:
            os.close(go_fd)
            os.close(done_fd)
            self._unshare()  # Ray calls answer with arrays again

    # -- operations ---------------------------------------------------------------------------
    def _op_apply(
        self,
        method: str,
        args_per_env: Sequence[tuple[Any, ...] | None],
        kwargs_per_env: Sequence[dict[str, Any]],
    ) -> list[Any]:
        """Call `method` on each env whose args are not None; None marks a skipped env.

        ``call``, ``get_attr``, ``has_attr``, ``set_attr`` and ``is_wrapped`` look through
        gymnasium's wrappers (`compat`; ``set_attr`` with ``outermost`` sets on the env given);
        any other name is the env's own method.
        """
        results: list[Any] = [None] * len(self.envs)
        failures = []
        for k, (env, args, kwargs) in enumerate(
            zip(self.envs, args_per_env, kwargs_per_env, strict=True)
        ):
            if args is None:
                continue
            if method == "step" and self._lost[k] is not None:
                results[k], self._lost[k] = crashed_step(self._lost[k]), None
                continue
            try:
                function = _ATTRIBUTE_METHODS.get(method)
                if function is not None:
                    results[k] = function(env, *args, **kwargs)
                else:
                    results[k] = getattr(env, method)(*args, **kwargs)
            except Exception as err:
                failures.append(self._failure(k, err))
                continue
            if method == "reset":
                self._lost[k] = None
        if failures:
            raise _EnvFailures(method, failures)
        return results

    def _op_reset(
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
            self._lost[k] = None
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
        observations = self._stacked_obs()
        return (None if self._shared is not None else observations), infos

    def _op_step(self, actions: Any, positions: Sequence[int] | None = None) -> StepResult:
        """Step the K envs (or those at `positions`) with gymnasium's autoreset semantics.

        An env that raises keeps its state and the others step as usual (their autoreset state
        included); the failures are raised together afterwards, with the step result of the
        others attached.

        Returns:
            Stacked observations, rewards, terminations and truncations of the envs stepped,
            and the info dicts of those that have any, by position (as ``reset``).
        """
        if actions is None and self._shared is not None:  # the driver put them in shared memory
            actions = read_actions(self._shared, self.envs[0].action_space)
        if positions is None:
            positions = range(len(self.envs))
            single_actions = unstack(self._action_batch_space, actions)
        else:
            positions = list(positions)
            space = batch_space(self.envs[0].action_space, len(positions))
            single_actions = unstack(space, actions)
        infos: dict[int, list[dict[str, Any]]] = {}
        failures = []
        for k, action in zip(positions, single_actions, strict=True):
            if self._lost[k] is not None:
                infos[k] = self._report_lost(k)
                continue
            try:
                info = self._step_one(k, action, infos)
            except Exception as err:
                failures.append(self._failure(k, err))
                self._rewards[k], self._terminations[k], self._truncations[k] = 0.0, False, False
                continue
            if info:
                infos.setdefault(k, []).append(info)
        result = self._step_result(positions, infos)
        if failures:
            raise _EnvFailures("step", failures, partial=self._materialized(result))
        return result

    def _op_share(self, spec: dict[str, Any], start: int, stop: int) -> None:
        """Use rows ``start..stop-1`` of the driver's shared arrays (`_shared_memory`).

        From now on the actions of a ``step`` sent as None are read from them, and full steps
        and resets write their observations, rewards, terminations and truncations there and
        answer None in their place.
        """
        views = SharedBatch.attach(spec).views(start, stop)
        for mine, shared in (
            (self._rewards, views.rewards),
            (self._terminations, views.terminations),
            (self._truncations, views.truncations),
        ):
            shared[...] = mine
        self._rewards, self._terminations = views.rewards, views.terminations
        self._truncations = views.truncations
        self._obs_batch, self._shared = views.observations, views

    def _unshare(self) -> None:
        if self._shared is not None:
            self._rewards, self._terminations = self._rewards.copy(), self._terminations.copy()
            self._truncations, self._obs_batch = self._truncations.copy(), None
            self._shared = None

    def _op_describe(self) -> dict[str, Any]:
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

    def _op_has_method(self, name: str) -> list[bool]:
        """Whether each env has a callable attribute `name` (e.g. old gym's ``seed``)."""
        return [callable(getattr(env, name, None)) for env in self.envs]

    def _op_node_id(self) -> str:
        """The id of the Ray node this worker runs on (hex)."""
        return str(ray.get_runtime_context().get_node_id())

    def _op_pid(self) -> int:
        """The worker's process id (for monitoring, and for tests that kill it)."""
        return os.getpid()

    def _op_close(self) -> None:
        """Close every env; the failures are raised together after all were tried."""
        failures = []
        for k, env in enumerate(self.envs):
            try:
                env.close()
            except Exception as err:
                failures.append(self._failure(k, err))
        if failures:
            raise _EnvFailures("close", failures)

    # -- helpers ------------------------------------------------------------------------------
    def _step_one(self, k: int, action: Any, infos: dict[int, list[dict[str, Any]]]) -> Any:
        env = self.envs[k]  # (the hot path: mode flags and `_autoreset` are plain Python)
        if self._next_step and self._autoreset[k]:
            self._obs[k], info = env.reset()
            self._rewards[k], self._terminations[k], self._truncations[k] = 0.0, False, False
            self._autoreset[k] = False
            return info
        obs, reward, terminated, truncated, info = env.step(action)
        self._obs[k], self._rewards[k] = obs, reward
        self._terminations[k], self._truncations[k] = terminated, truncated
        self._autoreset[k] = bool(terminated or truncated)
        if self._same_step and (terminated or truncated):
            infos[k] = [{"final_obs": obs, "final_info": info}]
            self._obs[k], info = env.reset()
        return info

    def _report_lost(self, k: int) -> list[dict[str, Any]]:
        """Report env `k`'s episode, lost with the worker it ran in, as truncated (reward 0)."""
        reset_result, self._lost[k] = self._lost[k], None
        reset_info = reset_result[1] if isinstance(reset_result, tuple) else {}
        self._rewards[k], self._terminations[k], self._truncations[k] = 0.0, False, True
        self._autoreset[k] = self._next_step
        info = {**reset_info, "env_crashed": True}
        if self._same_step:
            final = {"final_obs": self._obs[k], "final_info": {"env_crashed": True}}
            return [final, info]
        return [info]

    def _step_result(
        self, positions: Sequence[int], infos: dict[int, list[dict[str, Any]]]
    ) -> StepResult:
        """Observations (stacked), rewards, terminations and truncations of `positions`."""
        index = list(positions)
        if index == list(range(len(self.envs))):
            observations = self._stacked_obs()  # all envs: reuse the batch buffer
            if self._shared is not None:  # all of it is in shared memory already
                return None, None, None, None, infos
        else:
            observations = stack(self.envs[0].observation_space, [self._obs[k] for k in index])
        return (
            observations,
            self._rewards[index],
            self._terminations[index],
            self._truncations[index],
            infos,
        )

    def _materialized(self, result: StepResult) -> StepResult:
        """`result` with arrays (copies) where shared memory answered None."""
        if result[0] is not None or self._shared is None:
            return result
        shared = self._shared
        arrays = (shared.observations, shared.rewards, shared.terminations, shared.truncations)
        return (*(copy_batch(a) for a in arrays), result[4])

    def _stacked_obs(self) -> Any:
        self._obs_batch = stack(self.envs[0].observation_space, self._obs, self._obs_batch)
        return self._obs_batch

    def _failure(self, k: int, err: Exception) -> tuple[int, str, str, str]:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return (self.env_indices[k], type(err).__name__, str(err), text)
