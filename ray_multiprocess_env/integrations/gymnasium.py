"""`GymnasiumVectorEnv`: a real `gymnasium.vector.VectorEnv` backed by Ray worker actors.

Each worker holds several envs, steps them in one call with gymnasium's autoreset semantics, and
returns their observations stacked; this adapter joins the workers' batches. It composes a
`RayVectorEnv` (built with `RayVectorEnv.from_env_fns`) for every remote call, so timeouts and
errors naming the env index work as everywhere else. RLlib's new API stack uses it through
gymnasium's ``vector_entry_point``.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, iterate

from ray_multiprocess_env.batch import join_batches, split_batch, take
from ray_multiprocess_env.compat import as_autoreset_mode
from ray_multiprocess_env.vector import RayVectorEnv
from ray_multiprocess_env.workers import check_positive_int

__all__ = ["GymnasiumVectorEnv", "RemoteEnv", "make_vector_env", "vector_entry_point"]


class GymnasiumVectorEnv(VectorEnv[Any, Any, Any]):
    """A `gymnasium.vector.VectorEnv` whose envs live in Ray worker actors.

    Behaves like `gymnasium.vector.SyncVectorEnv` (same batched arrays, infos with ``_key``
    masks, ``reset_mask``, autoreset modes), with the envs stepped in parallel by
    ``ceil(len(env_fns) / envs_per_worker)`` actors.

    Args:
        env_fns: One picklable factory per env, called inside its worker.
        envs_per_worker: How many envs each worker actor holds.
        autoreset_mode: ``"next_step"`` (default; what RLlib needs), ``"same_step"`` or
            ``"disabled"``, or a `gymnasium.vector.AutoresetMode`.
        actor_options: Options for `ray.remote` of each worker (``num_cpus``, ``num_gpus``,
            ``memory``, ``resources``, ``runtime_env``, ...).
        placement: Where the workers run (None, ``"SPREAD"``, ``"PACK"``, a placement group,
            ...); see `plan_placement`. A placement group made here is removed by `close`.
        timeout: Seconds to wait for any one call, or None.
        seed: If given, the first `reset` without a seed seeds env ``i`` with ``seed + i``
            (and the batched action space with ``seed``).
        on_actor_failure: ``"raise"`` (default: `EnvCrashedError` naming the lost envs) or
            ``"restart"``: a dead worker is started again from the same factories, and its
            envs come back freshly reset, reported as truncated with reward 0 and
            ``infos["env_crashed"]``; the other envs lose nothing.
        check_actions: Check each env's action against ``single_action_space`` on the driver
            before sending; an action outside it raises `ValueError` naming the env.
        transport: ``"auto"`` (default: steps reach workers on the driver's node over named
            pipes, others over Ray) or ``"ray"``; see `RayVectorEnv.from_env_fns`.

    Example:
        >>> import gymnasium as gym
        >>> envs = GymnasiumVectorEnv([lambda: gym.make("CartPole-v1")] * 4, envs_per_worker=2)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape
        (4, 4)
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        *,
        envs_per_worker: int = 1,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        actor_options: Mapping[str, Any] | None = None,
        placement: Any = None,
        timeout: float | None = None,
        seed: int | None = None,
        on_actor_failure: str = "raise",
        check_actions: bool = False,
        transport: str | None = None,
    ) -> None:
        super().__init__()
        self._check_actions = check_actions
        self.autoreset_mode = as_autoreset_mode(autoreset_mode)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise TypeError(f"`seed` must be an int or None, got {seed!r}.")
        self._vec = RayVectorEnv.from_env_fns(
            env_fns,
            envs_per_actor=envs_per_worker,
            actor_options=actor_options,
            placement=placement,
            timeout=timeout,
            autoreset_mode=self.autoreset_mode,
            on_actor_failure=on_actor_failure,
            transport=transport,
        )
        try:
            self._describe_envs()
        except BaseException:
            self._vec.close()
            raise
        self._bounds = [(s.start, s.stop) for s in self._vec.env_slices]
        self._worker_obs: list[Any] = [None] * len(self._bounds)
        self._finished = np.zeros(self.num_envs, dtype=np.bool_)
        self._pending: tuple[list[Any], list[Any]] | None = None
        self._initial_seed = seed
        if seed is not None:
            self.action_space.seed(int(seed))

    def _describe_envs(self) -> None:
        first = self._vec._describe_workers()
        self.num_envs = self._vec.num_envs
        self.single_observation_space = first["observation_space"]
        self.single_action_space = first["action_space"]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {**first["metadata"], "autoreset_mode": self.autoreset_mode}
        self.render_mode = first["render_mode"]

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all envs, or those with a True entry in ``options["reset_mask"]``.

        Args:
            seed: None, an int (env ``i`` gets ``seed + i``) or one seed per env.
            options: Passed to each env's reset; ``"reset_mask"`` (a bool array of shape
                ``(num_envs,)``) picks the envs to reset.

        Returns:
            The batched observations and the batched info dict.
        """
        self._vec._check_idle("reset")
        seeds = self._seeds(seed)
        options = dict(options) if options is not None else None
        mask = None
        if options is not None and "reset_mask" in options:
            mask = self._check_reset_mask(options.pop("reset_mask"))
        args: list[tuple[Any, ...] | None] = []
        for g, (start, stop) in enumerate(self._bounds):
            worker_mask = None if mask is None else mask[start:stop].tolist()
            if worker_mask is not None and not any(worker_mask):
                args.append(None)
                if self._worker_obs[g] is None:
                    raise ValueError(
                        f"envs {start}..{stop - 1} were never reset; reset them all first "
                        "(call `reset()` without `reset_mask`)."
                    )
            else:
                args.append((seeds[start:stop], options, worker_mask))
        results = self._vec._call_actors("reset_batch", args)
        infos: dict[str, Any] = {}
        for g, result in enumerate(results):
            if result is None:
                continue
            self._worker_obs[g], worker_infos = result
            infos = self._add_infos(infos, g, worker_infos)
        self._finished[mask if mask is not None else slice(None)] = False
        return join_batches(self.single_observation_space, self._worker_obs), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action from the batched `actions`.

        Returns:
            Batched observations, rewards (float64), terminations, truncations and infos.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send the batched `actions` and return at once; `step_wait` collects the results."""
        if self._pending is not None:
            raise RuntimeError(
                "`step_async` was called while a `step_async` is pending; call `step_wait`."
            )
        self._vec._check_idle("step_async")
        self._check_not_finished(range(self.num_envs))
        self._check_in_space(actions, list(range(self.num_envs)))
        chunks = split_batch(self.single_action_space, actions, self._bounds)
        self._pending = self._vec._launch_actors("step_batch", [(chunk,) for chunk in chunks])

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the results of `step_async` and return them as `step` does."""
        if self._pending is None:
            raise RuntimeError("`step_wait` was called without a `step_async` before it.")
        launched, self._pending = self._pending, None
        results = self._vec._gather_actors("step_batch", launched, timeout)
        infos: dict[str, Any] = {}
        for g, result in enumerate(results):
            self._worker_obs[g] = result[0]
            infos = self._add_infos(infos, g, result[4])
        rewards = np.concatenate([r[1] for r in results])
        terminations = np.concatenate([r[2] for r in results])
        truncations = np.concatenate([r[3] for r in results])
        self._finished = np.logical_or(terminations, truncations)
        observations = join_batches(self.single_observation_space, self._worker_obs)
        return observations, rewards, terminations, truncations, infos

    # -- first-ready stepping (envpool's send/recv) -----------------------------------------
    def async_reset(self, *, seed: int | Sequence[int | None] | None = None) -> None:
        """Reset every env without waiting; `recv` then returns them as they finish."""
        seeds = self._seeds(seed)
        self._finished[:] = False
        self._vec._send_actors(
            "reset",
            "reset_batch",
            [(seeds[start:stop], None, None) for start, stop in self._bounds],
            [range(start, stop) for start, stop in self._bounds],
        )

    def send(self, actions: Any, env_ids: Sequence[int]) -> None:
        """Step the envs `env_ids` with the batched `actions` (row i for env ``env_ids[i]``).

        Returns at once; `recv` collects the results of the envs that finish first.
        """
        env_ids = self._vec._check_env_ids(env_ids)
        self._check_not_finished(env_ids)
        self._check_in_space(actions, env_ids)
        args: list[tuple[Any, ...] | None] = []
        envs: list[list[int]] = []
        for start, stop in self._bounds:
            rows = [row for row, env in enumerate(env_ids) if start <= env < stop]
            mine = [env_ids[row] for row in rows]
            envs.append(mine)
            if rows:
                chunk = take(self.single_action_space, actions, rows)
                args.append((chunk, [env - start for env in mine]))
            else:
                args.append(None)
        self._vec._send_actors("step", "step_batch", args, envs)

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The results of the first envs to finish what `send`/`async_reset` started.

        Args:
            batch_size: Wait until at least this many envs are done (a worker's envs come back
                together, so more may come); None waits for every env in flight.
            timeout: Seconds to wait; None uses the vector env's timeout.

        Returns:
            Batched ``(obs, rewards, terminated, truncated, infos)`` of the envs received, in
            ascending env order; ``infos["env_id"]`` holds their env ids (as envpool does). An
            env back from `async_reset` has reward 0 and is not done.
        """
        env_ids: list[int] = []
        obs_batches, rewards, terminated, truncated = [], [], [], []
        info_items: list[tuple[int, list[dict[str, Any]]]] = []
        for actor, envs, op, result in self._vec._recv_actors(batch_size, timeout):
            if op == "reset":
                obs, worker_infos = result
                none = np.zeros(len(envs), dtype=np.bool_)
                result = (obs, np.zeros(len(envs)), none, none.copy(), worker_infos)
            obs, reward, term, trunc, worker_infos = result
            env_ids.extend(envs)
            obs_batches.append(obs)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            start = self._bounds[actor][0]
            info_items.extend((start + k, parts) for k, parts in worker_infos.items())
            self._finished[list(envs)] = np.logical_or(term, trunc)
        order = np.argsort(env_ids, kind="stable")
        ids = np.asarray(env_ids, dtype=np.int64)[order]
        row_of = {int(env): row for row, env in enumerate(ids)}
        infos: dict[str, Any] = {}
        for env, parts in sorted(info_items, key=lambda item: item[0]):
            for part in parts:
                infos = _add_row_info(infos, part, row_of[env], len(ids))
        infos["env_id"] = ids
        observations = join_batches(self.single_observation_space, obs_batches)
        return (
            take(self.single_observation_space, observations, order.tolist()),
            np.concatenate(rewards)[order],
            np.concatenate(terminated)[order],
            np.concatenate(truncated)[order],
            infos,
        )

    def render(self) -> tuple[Any, ...]:
        """Return the frame of each env (its ``render()``)."""
        return self._vec.call("render")

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method `name` of every env (or read a non-callable attribute); one per env."""
        return self._vec.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return attribute `name` of every env."""
        return self._vec.get_attr(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute `name` of every env: a list or tuple gives one value per env."""
        self._vec.set_attr(name, values)

    @property  # gymnasium's SyncVectorEnv gives one per env as well
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The seed of each env's random generator."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Each env's random generator (copies: changing one does not change the env's)."""
        return self.get_attr("np_random")

    @property
    def remote_envs(self) -> tuple[Any, ...]:
        """The worker actors."""
        return self._vec.remote_envs

    def node_ids(self) -> tuple[str, ...]:
        """The id (hex) of the Ray node each env runs on, by env index."""
        return self._vec.node_ids()

    def close_extras(self, **kwargs: Any) -> None:
        """Close every env and kill the worker actors."""
        vec = getattr(
            self, "_vec", None
        )  # None if __init__ failed (gymnasium 1.2 closes in __del__)
        if vec is not None:
            vec.close()

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None and self._initial_seed is not None:
            seed, self._initial_seed = self._initial_seed, None
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(self.num_envs)]
        if isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)):
            if len(seed) != self.num_envs:
                raise ValueError(
                    f"`seed` has {len(seed)} entries but there are {self.num_envs} envs; pass "
                    "one seed per env, or one int."
                )
            return list(seed)
        raise TypeError(f"`seed` must be None, an int or one seed per env, got {seed!r}.")

    def _check_in_space(self, actions: Any, env_ids: Sequence[int]) -> None:
        if not self._check_actions:
            return
        rows = batch_space(self.single_action_space, len(env_ids))
        for row, (env, action) in enumerate(zip(env_ids, iterate(rows, actions), strict=True)):
            if not self.single_action_space.contains(action):
                raise ValueError(
                    f"the action in row {row} ({action!r}) for env {env} is outside "
                    f"`single_action_space` {self.single_action_space}."
                )

    def _check_not_finished(self, envs: Iterable[int]) -> None:
        if self.autoreset_mode != AutoresetMode.DISABLED:
            return
        finished = [env for env in envs if self._finished[env]]
        if finished:
            raise ValueError(
                f"env(s) {finished} finished their episode and `autoreset_mode` is DISABLED; "
                "reset them first with `reset(options={'reset_mask': mask})`."
            )

    def _check_reset_mask(self, mask: Any) -> np.ndarray:
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            raise TypeError(
                f"`options['reset_mask']` must be a numpy bool array, got {mask!r}; "
                "e.g. `np.array([True, False, ...])`."
            )
        if mask.shape != (self.num_envs,):
            raise ValueError(
                f"`options['reset_mask']` must have shape ({self.num_envs},), got {mask.shape}."
            )
        if not mask.any():
            raise ValueError("`options['reset_mask']` must have at least one True entry.")
        return mask

    def _add_infos(
        self, infos: dict[str, Any], worker: int, worker_infos: dict[int, list[dict[str, Any]]]
    ) -> dict[str, Any]:
        start = self._bounds[worker][0]
        for k, parts in sorted(worker_infos.items()):
            for part in parts:
                infos = self._add_info(infos, part, start + k)
        return infos


def _add_row_info(
    infos: dict[str, Any], info: dict[str, Any], row: int, size: int
) -> dict[str, Any]:
    """Add one env's `info` at `row` of a batch of `size`, as gymnasium's ``_add_info`` does."""
    for key, value in info.items():
        if key == "final_obs":
            array = infos.get(key)
            if array is None:
                array = np.full(size, fill_value=None, dtype=object)
            array[row] = value
        elif isinstance(value, dict):
            array = _add_row_info(infos.get(key, {}), value, row, size)
        else:
            array = infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(size, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((size, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(size, fill_value=None, dtype=object)
            array[row] = value
        mask = infos.get(f"_{key}", np.zeros(size, dtype=np.bool_))
        mask[row] = True
        infos[key], infos[f"_{key}"] = array, mask
    return infos


def make_vector_env(
    make_env: Callable[[int], gym.Env[Any, Any]],
    num_workers: int,
    envs_per_worker: int,
    *,
    seed: int | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    actor_options: Mapping[str, Any] | None = None,
    placement: Any = None,
    timeout: float | None = None,
    on_actor_failure: str = "raise",
    transport: str | None = None,
) -> GymnasiumVectorEnv:
    """Make ``num_workers * envs_per_worker`` envs in Ray workers, as one gymnasium vector env.

    Args:
        make_env: Called as ``make_env(index)`` inside a worker, with the env's global index
            ``0..num_envs-1``; returns a gymnasium env. Must be picklable.
        num_workers: How many worker actors (Ray processes).
        envs_per_worker: How many envs each worker steps per call.
        seed: If given, env ``i`` is seeded ``seed + i`` at the first `reset` (no two envs
            share a seed).
        autoreset_mode: ``"next_step"``, ``"same_step"`` or ``"disabled"``.
        actor_options: Options for `ray.remote` of each worker (``num_cpus``, ...).
        placement: As for `GymnasiumVectorEnv`, e.g. ``"SPREAD"`` over a cluster's nodes.
        timeout: Seconds to wait for any one call, or None.
        on_actor_failure: ``"raise"`` or ``"restart"``, as for `GymnasiumVectorEnv`.
        transport: ``"auto"`` or ``"ray"``, as for `GymnasiumVectorEnv`.

    Example:
        >>> import gymnasium as gym
        >>> def make_env(index):
        ...     return gym.make("CartPole-v1")
        >>> envs = make_vector_env(make_env, num_workers=2, envs_per_worker=3, seed=0)
        >>> obs, infos = envs.reset()
        >>> obs.shape, envs.num_envs
        ((6, 4), 6)
        >>> envs.close()
    """
    if not callable(make_env):
        raise TypeError(
            f"`make_env` must be a callable taking the env index, got {make_env!r}; e.g. "
            "`make_vector_env(lambda i: gymnasium.make('CartPole-v1'), 2, 8)`."
        )
    num_workers = check_positive_int("num_workers", num_workers)
    envs_per_worker = check_positive_int("envs_per_worker", envs_per_worker)
    env_fns = [functools.partial(make_env, i) for i in range(num_workers * envs_per_worker)]
    return GymnasiumVectorEnv(
        env_fns,
        envs_per_worker=envs_per_worker,
        autoreset_mode=autoreset_mode,
        actor_options=actor_options,
        placement=placement,
        timeout=timeout,
        seed=seed,
        on_actor_failure=on_actor_failure,
        transport=transport,
    )


def vector_entry_point(
    num_envs: int,
    *,
    env_id: str,
    envs_per_worker: int | None = None,
    num_workers: int | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    actor_options: Mapping[str, Any] | None = None,
    placement: Any = None,
    **env_kwargs: Any,
) -> GymnasiumVectorEnv:
    """Gymnasium's ``vector_entry_point`` for Ray vector envs of a registered env id.

    Register an id with it and `gymnasium.make_vec` returns a `GymnasiumVectorEnv`::

        gymnasium.register(
            "RayCartPole-v1",
            vector_entry_point="ray_multiprocess_env:vector_entry_point",
            kwargs={"env_id": "CartPole-v1", "envs_per_worker": 4},
        )
        envs = gymnasium.make_vec("RayCartPole-v1", num_envs=8,
                                  vectorization_mode="vector_entry_point")

    Args:
        num_envs: The number of envs (given by `gymnasium.make_vec`).
        env_id: The id of the single env, made with ``gymnasium.make(env_id, **env_kwargs)``.
        envs_per_worker: Envs per worker actor; by default ``num_envs / num_workers``.
        num_workers: Worker actors, used when `envs_per_worker` is not given (default 2).
        autoreset_mode: As for `GymnasiumVectorEnv`.
        actor_options: As for `GymnasiumVectorEnv`.
        placement: As for `GymnasiumVectorEnv`.
        **env_kwargs: Keyword arguments of ``gymnasium.make`` for each env.
    """
    if envs_per_worker is None:
        envs_per_worker = max(1, math.ceil(num_envs / (num_workers or 2)))
    env_fn = functools.partial(gym.make, env_id, **env_kwargs)
    return GymnasiumVectorEnv(
        [env_fn] * num_envs,
        envs_per_worker=envs_per_worker,
        autoreset_mode=autoreset_mode,
        actor_options=actor_options,
        placement=placement,
    )


class RemoteEnv(gym.Env[Any, Any]):
    """One env in a Ray actor, seen as a plain `gymnasium.Env` (e.g. for gymnasium's checker).

    Args:
        env_fn: A picklable factory of the env, called inside the actor.
        actor_options: Options for `ray.remote` of the actor.
        timeout: Seconds to wait for any one call, or None.

    Example:
        >>> import gymnasium as gym
        >>> env = RemoteEnv(lambda: gym.make("CartPole-v1"))
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(0)
        >>> env.close()
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env[Any, Any]],
        *,
        actor_options: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        self._vec = RayVectorEnv.from_env_fns(
            [env_fn], actor_options=actor_options, timeout=timeout
        )
        self.observation_space = self._vec.observation_space
        self.action_space = self._vec.action_space
        self.metadata = self._vec.get_attr("metadata")[0]
        self.render_mode = self._vec.get_attr("render_mode")[0]
        self.spec = self._vec.spec

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the remote env."""
        super().reset(seed=seed)
        result: tuple[Any, dict[str, Any]] = self._vec.call_each(
            "reset", [()], seed=seed, options=options
        )[0]
        return result

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the remote env."""
        result: tuple[Any, SupportsFloat, bool, bool, dict[str, Any]] = self._vec.call_each(
            "step", [(action,)]
        )[0]
        return result

    def render(self) -> Any:
        """Render the remote env."""
        return self._vec.call("render")[0]

    def close(self) -> None:
        """Close the remote env and kill its actor."""
        self._vec.close()
