"""`RayVectorEnv`: many env actors stepped as one vector env, with pfrl's interface.

Besides pfrl's ``step``/``reset(mask)``/``seed``/``close`` it has ``call``/``get_attr``/
``set_attr``, ``step_async``/``step_wait`` and first-ready ``send``/``recv``. Every remote call
goes through the fan-out engine in `fanout.py` (one call per actor, one wait, errors by env
index); results are unzipped into per-field tuples.
"""

from __future__ import annotations

import functools
import logging
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ray
from gymnasium.vector import AutoresetMode
from ray.actor import ActorHandle

from ray_multiprocess_env.errors import ClosedEnvError, RemoteEnvError
from ray_multiprocess_env.fanout import TRANSPORTS, ActorGroup, Call, FanOut, user_name
from ray_multiprocess_env.inflight import InFlight
from ray_multiprocess_env.integrations.pfrl import register_pfrl_vector_env
from ray_multiprocess_env.placement import PlacementPlan, plan_placement
from ray_multiprocess_env.workers import (
    WORKER_ENV_METHODS,
    check_env_fns,
    check_positive_int,
    start_workers,
)

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["RayVectorEnv", "unzip"]

logger = logging.getLogger(__name__)

_NO_OBS = object()
#: The environment variable that sets the default `transport` of `from_env_fns`.
TRANSPORT_VARIABLE = "RAY_MULTIPROCESS_ENV_TRANSPORT"
#: Seconds `close` waits for the envs to close before it kills their actors anyway.
_CLOSE_TIMEOUT_S = 30.0


def unzip(results: Sequence[Any]) -> tuple[Any, ...]:
    """Turn per-env results into per-field tuples when every result is a tuple of one length.

    Example:
        >>> unzip([(1, "a"), (2, "b")])
        ((1, 2), ('a', 'b'))
        >>> unzip([1, 2])
        (1, 2)
    """
    lengths = {len(r) for r in results if isinstance(r, tuple)}
    if results and len(lengths) == 1 and all(isinstance(r, tuple) for r in results):
        return tuple(zip(*results, strict=True))
    return tuple(results)


class RayVectorEnv:
    """A vector env over Ray actors, with the interface of pfrl's ``MultiprocessVectorEnv``.

    Works for any list of actors that have ``reset`` and ``step``: classes made by
    `make_remote_class` as well as plain ``@ray.remote`` classes. Results are unzipped: a
    gymnasium env's ``step`` gives ``(obs, rewards, terminated, truncated, infos)``, an old-gym
    env's gives ``(obs, rewards, dones, infos)``, each a tuple with one entry per env.

    Subclass it to add fan-out methods; use `call` (same arguments to every env) or `call_each`
    (one argument tuple per env) so errors and timeouts are handled as for ``step``::

        class MyVec(RayVectorEnv):
            def render_all(self):
                return self.call("render")

    Args:
        actors: One actor handle per env. The vector env owns them: `close` closes their envs
            and kills the actors (pass ``kill_on_close=False`` to keep them alive).
        timeout: Seconds to wait for any one call on all envs; None waits until every env
            answers (a dead actor is still detected). On expiry a `TimeoutError` names the
            envs that did not answer. The first call also waits for the actors to start.
        kill_on_close: Whether `close` kills the actors after closing their envs.
        check_actions: Check every action against the env's action space on the driver before
            sending it; an action outside it raises `ValueError` naming the env (costs one
            ``contains`` per action, so off by default).

    Example:
        >>> import gymnasium as gym
        >>> from ray_multiprocess_env import RayVectorEnv, make_remote_class
        >>> class CartPole:
        ...     def __init__(self):
        ...         self.env = gym.make("CartPole-v1")
        >>> RemoteCartPole = make_remote_class(CartPole, "env", gym.wrappers.TimeLimit)
        >>> with RayVectorEnv([RemoteCartPole.remote() for _ in range(2)]) as vec:
        ...     _ = vec.seed(0)
        ...     obs, infos = vec.reset()
        ...     obs, rewards, terminated, truncated, infos = vec.step([0, 1])
        >>> rewards
        (1.0, 1.0)
    """

    def __init__(
        self,
        actors: Sequence[ActorHandle[Any]],
        *,
        timeout: float | None = None,
        kill_on_close: bool = True,
        check_actions: bool = False,
    ) -> None:
        if isinstance(actors, (str, bytes)) or not isinstance(actors, Iterable):
            raise TypeError(
                f"`actors` must be a list of Ray actor handles, got {actors!r}; "
                "e.g. `RayVectorEnv([RemoteEnv.remote() for _ in range(8)])`."
            )
        actors = list(actors)
        if not actors:
            raise ValueError("`actors` is empty; pass at least one Ray actor handle.")
        for index, actor in enumerate(actors):
            if not isinstance(actor, ActorHandle):
                raise TypeError(
                    f"`actors[{index}]` must be a Ray actor handle, got {actor!r} "
                    f"({type(actor).__name__}); create it with `.remote()` on a Ray actor class."
                )
        groups = [ActorGroup(actor, i, i + 1, batched=False) for i, actor in enumerate(actors)]
        self._setup(groups, timeout=timeout, kill_on_close=kill_on_close)
        self._check_actions = check_actions

    @classmethod
    def from_env_fns(
        cls,
        env_fns: Sequence[Callable[[], Any]],
        *,
        envs_per_actor: int = 1,
        actor_options: Mapping[str, Any] | None = None,
        placement: Any = None,
        timeout: float | None = None,
        autoreset_mode: str | AutoresetMode = "next_step",
        on_actor_failure: str = "raise",
        check_actions: bool = False,
        transport: str | None = None,
    ) -> Self:
        """Build the envs from factories inside worker actors holding `envs_per_actor` each.

        The result behaves exactly like a `RayVectorEnv` over one actor per env (same return
        values, masks, seeds and errors), but each Ray call steps a whole worker's envs, which
        is much faster for cheap envs. `remote_envs` are then the worker actors.

        Args:
            env_fns: One picklable factory per env, called once inside its worker.
            envs_per_actor: How many envs each worker actor holds (the last may hold fewer).
            actor_options: Options for `ray.remote` of each worker (``num_cpus``,
                ``num_gpus``, ``memory``, ``resources``, ``runtime_env``, ...).
            placement: Where the workers run: None (Ray's default), ``"SPREAD"``, ``"PACK"``,
                ``"STRICT_PACK"``, ``"STRICT_SPREAD"``, a placement group, ``(placement_group,
                bundle_indices)`` or a Ray scheduling strategy; see `plan_placement`. A
                placement group made here is removed by `close`; `timeout` (60 s if None) also
                bounds the wait for it.
            timeout: As for the constructor.
            check_actions: As for the constructor.
            autoreset_mode: Used by the gymnasium adapter's batched stepping only.
            on_actor_failure: ``"raise"`` (an actor that dies raises `EnvCrashedError` naming
                its envs) or ``"restart"`` (a new worker is started from the same factories,
                its envs come back freshly reset, and the call returns them as truncated:
                gymnasium envs with ``truncated=True``, old-gym envs with ``done=True`` and
                ``info["needs_reset"] = True``; ``info["env_crashed"] = True`` either way).
            transport: How batched steps (`GymnasiumVectorEnv`, `SB3VecEnv`) reach the
                workers: ``"auto"`` (named pipes to workers on the driver's node, Ray calls to
                the others; about 4x less overhead per call) or ``"ray"`` (Ray calls only).
                None reads the ``RAY_MULTIPROCESS_ENV_TRANSPORT`` environment variable
                (``"auto"`` if unset). Everything else is a Ray call either way.

        Example:
            >>> import gymnasium as gym
            >>> fns = [lambda: gym.make("CartPole-v1") for _ in range(4)]
            >>> with RayVectorEnv.from_env_fns(fns, envs_per_actor=2) as vec:
            ...     obs, infos = vec.reset()
            ...     print(vec.num_envs, len(vec.remote_envs))
            4 2
        """
        _check_timeout(timeout)
        transport = _check_transport(transport)
        if on_actor_failure not in ("raise", "restart"):
            raise ValueError(
                f"`on_actor_failure` must be 'raise' or 'restart', got {on_actor_failure!r}."
            )
        env_fns = check_env_fns(env_fns)
        per_actor = check_positive_int("envs_per_actor", envs_per_actor)
        plan = plan_placement(
            placement, -(-len(env_fns) // per_actor), actor_options, timeout=timeout
        )
        start = functools.partial(
            start_workers, plan=plan, autoreset_mode=autoreset_mode, argument="envs_per_actor"
        )
        try:
            groups = start(env_fns, per_actor)
        except BaseException:
            plan.release()
            raise
        vec = cls.__new__(cls)
        vec._setup(groups, timeout=timeout, kill_on_close=True)
        vec._placement = plan
        vec._check_actions = check_actions
        if on_actor_failure == "restart":

            def respawn(group: ActorGroup) -> ActorGroup:
                (new,) = start(
                    env_fns[group.start : group.stop],
                    group.stop - group.start,
                    first_index=group.start,
                    first_worker=group.start // per_actor,
                )
                return new

            vec._respawn = respawn
            vec._fanout.recover = vec._recover
            vec._fanout.replace = vec._replace_hung
        if transport == "auto":
            vec._fanout.use_pipes()
        return vec

    @classmethod
    def from_remote_class(
        cls,
        actor_class: Any,
        num_envs: int,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        placement: Any = None,
        actor_options: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        check_actions: bool = False,
    ) -> Self:
        """Create `num_envs` actors of `actor_class` where `placement` says, as one vector env.

        The same as ``RayVectorEnv([actor_class.options(...).remote(*args, **kwargs) ...])``
        with each actor's options planned by `plan_placement`; a placement group made here is
        removed by `close`.

        Args:
            actor_class: A Ray actor class, e.g. one made by `make_remote_class`.
            num_envs: How many actors (one env each).
            args: Positional arguments of every actor's ``__init__``.
            kwargs: Keyword arguments of every actor's ``__init__``.
            placement: As for `from_env_fns`.
            actor_options: Extra ``.options(...)`` of every actor (``num_cpus``, ...).
            timeout: As for the constructor.
            check_actions: As for the constructor.

        Example:
            >>> import gymnasium as gym
            >>> from ray_multiprocess_env import make_remote_class
            >>> class CartPole:
            ...     def __init__(self):
            ...         self.env = gym.make("CartPole-v1")
            >>> RemoteCartPole = make_remote_class(CartPole, "env", gym.wrappers.TimeLimit)
            >>> with RayVectorEnv.from_remote_class(RemoteCartPole, 2, placement="SPREAD") as vec:
            ...     print(vec.num_envs, len(set(vec.node_ids())))
            2 1
        """
        if not hasattr(actor_class, "options") or not hasattr(actor_class, "remote"):
            raise TypeError(
                f"`actor_class` must be a Ray actor class (with `.options` and `.remote`), got "
                f"{actor_class!r}; make one with `make_remote_class` or `ray.remote`."
            )
        count = check_positive_int("num_envs", num_envs)
        plan = plan_placement(placement, count, actor_options, timeout=timeout)
        actors = []
        try:
            for index in range(count):
                created = actor_class.options(**plan.options(index))
                actors.append(created.remote(*args, **dict(kwargs or {})))
            vec = cls(actors, timeout=timeout, check_actions=check_actions)
        except BaseException:
            for actor in actors:
                ray.kill(actor)
            plan.release()
            raise
        vec._placement = plan
        return vec

    def _restart_worker(self, group_index: int) -> ActorGroup:
        """Kill the worker of group `group_index` and start it again; the old group."""
        assert self._respawn is not None
        old = self._groups[group_index]
        ray.kill(old.actor)
        self._groups[group_index] = self._respawn(old)
        self._fanout.reopen(group_index)  # the new worker gets new pipes at its next step
        return old

    def _replace_hung(self, group_index: int) -> None:
        """Kill a worker that outlived a timeout, start it again and reset its envs."""
        old = self._groups[group_index]
        logger.warning(
            "The worker of env(s) %s did not answer in time; restarting it.",
            list(range(old.start, old.stop)),
        )
        self._restart_worker(group_index)
        count = old.stop - old.start
        recover, self._fanout.recover = self._fanout.recover, None
        replace, self._fanout.replace = self._fanout.replace, None
        try:
            reset = Call(group_index, "apply", ("reset", [()] * count, [{}] * count))
            results = self._fanout.run("reset", [reset])[0]
        finally:
            self._fanout.recover, self._fanout.replace = recover, replace
        for k, result in enumerate(results):
            self._last_obs[old.start + k] = _reset_obs(result)

    def _recover(self, label: str, call: Call) -> Any:
        """Restart the dead worker of `call` from its factories; the call's result after that."""
        old = self._groups[call.group]
        logger.warning(
            "The worker of env(s) %s died in `%s`; restarting it.",
            list(range(old.start, old.stop)),
            label,
        )
        self._restart_worker(call.group)
        recover, self._fanout.recover = self._fanout.recover, None  # a second death raises
        try:
            if call.method == "apply" and call.args[0] == "step":
                env_args = call.args[1]
                count = len(env_args)  # reset them all: the new worker's envs start unreset
                retry = Call(call.group, "apply", ("reset", [()] * count, [{}] * count))
                resets = self._fanout.run(label, [retry])[0]
                for k, (a, r) in enumerate(zip(env_args, resets, strict=True)):
                    if a is None:  # not in this call: keep its fresh observation for masks
                        self._last_obs[old.start + k] = _crashed_step(r)[0]
                return [
                    None if a is None else _crashed_step(r)
                    for a, r in zip(env_args, resets, strict=True)
                ]
            if call.method == "step_batch":
                positions = call.args[1] if len(call.args) > 1 else None
                return self._fanout.run(label, [Call(call.group, "recover_step", (positions,))])[0]
            return self._fanout.run(label, [call])[0]
        finally:
            self._fanout.recover = recover

    def _setup(
        self, groups: list[ActorGroup], *, timeout: float | None, kill_on_close: bool
    ) -> None:
        _check_timeout(timeout)
        self._groups = list(groups)
        self._num_envs = groups[-1].stop
        self._fanout = FanOut(self._groups, None if timeout is None else float(timeout))
        self._respawn: Callable[[ActorGroup], ActorGroup] | None = None
        self._kill_on_close = kill_on_close
        self._last_obs: list[Any] = [_NO_OBS] * self._num_envs
        self._next_seeds: list[int | None] = [None] * self._num_envs
        self._reset_gives_info = False
        self._attr_cache: dict[str, Any] = {}
        self._check_actions = False
        self._pending_step: tuple[list[Call], list[Any]] | None = None
        self._in_flight = InFlight(self._fanout)
        self._placement: PlacementPlan | None = None
        self._closed = False
        register_pfrl_vector_env(RayVectorEnv)

    # ----------------------------------------------------------------------------------------
    # pfrl's VectorEnv interface
    def step(self, actions: Sequence[Any]) -> tuple[Any, ...]:
        """Step every env with its action and return the unzipped results.

        Args:
            actions: One action per env, in env order.

        Returns:
            For gymnasium envs ``(obs, rewards, terminated, truncated, infos)``; for old-gym envs
            ``(obs, rewards, dones, infos)``; each a tuple with one entry per env. An env whose
            ``step`` returns a non-tuple gives a tuple of those results.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Sequence[Any]) -> None:
        """Send one action per env and return at once; `step_wait` collects the results."""
        self._check_open("step_async")
        self._check_length("actions", actions, "one action per env")
        self._check_idle("step_async")
        self._check_in_space(actions, range(self.num_envs))
        calls = self._fanout.per_env_calls("step", [(action,) for action in actions])
        self._pending_step = (calls, self._fanout.launch(calls))

    def step_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the results of `step_async` and return them as `step` does.

        Args:
            timeout: Seconds to wait; None uses the vector env's `timeout`.
        """
        self._check_open("step_wait")
        if self._pending_step is None:
            raise RuntimeError("`step_wait` was called without a `step_async` before it.")
        calls, refs = self._pending_step
        self._pending_step = None
        results = self._fanout.per_env_results(
            calls, self._fanout.gather("step", calls, refs, timeout=timeout)
        )
        for index, result in enumerate(results):
            self._last_obs[index] = result[0] if isinstance(result, tuple) else result
        return unzip(results)

    # ----------------------------------------------------------------------------------------
    # first-ready stepping (envpool's send/recv, RLlib's RemoteVectorEnv)
    def async_reset(self) -> None:
        """Reset every env without waiting; `recv` then returns them as they finish."""
        self._check_open("async_reset")
        self._check_idle("async_reset")
        kwargs = [{} if s is None else {"seed": s} for s in self._next_seeds]
        self._next_seeds = [None] * self.num_envs
        self._in_flight.launch("reset", "reset", [()] * self.num_envs, kwargs)

    def send(self, actions: Sequence[Any], env_ids: Sequence[int]) -> None:
        """Step the envs `env_ids` with `actions` (one each) without waiting for them.

        Raises:
            ValueError: If an env id is out of range, repeated, or has a call in flight
                (`recv` its result first), or `actions` and `env_ids` differ in length.
        """
        self._check_open("send")
        if self._pending_step is not None:
            raise RuntimeError(
                "`send` was called while a `step_async` is pending; call `step_wait`."
            )
        env_ids = self._check_env_ids(env_ids)
        if len(actions) != len(env_ids):
            raise ValueError(
                f"`actions` has {len(actions)} entries but `env_ids` has {len(env_ids)}; "
                "pass one action per env id."
            )
        for env in env_ids:
            if self._in_flight.busy(env):
                raise ValueError(
                    f"env {env} already has an action in flight; `recv` its result before "
                    "sending it another."
                )
        self._check_in_space(actions, env_ids)
        args: list[tuple[Any, ...] | None] = [None] * self.num_envs
        for env, action in zip(env_ids, actions, strict=True):
            args[env] = (action,)
        self._in_flight.launch("step", "step", args)

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[list[int], tuple[Any, ...]]:
        """Receive the results of the first envs to finish what `send`/`async_reset` started.

        Args:
            batch_size: Wait until at least this many envs have finished (all envs of an actor
                finish together, so more may come back); None waits for every env in flight.
            timeout: Seconds to wait; None uses the vector env's `timeout`. On expiry a
                `TimeoutError` names the envs that did not answer; they stay in flight.

        Returns:
            ``(env_ids, results)``: the env ids in ascending order and their results unzipped as
            `step` returns them. An env coming back from `async_reset` looks like a step with
            reward 0 and not done: ``(obs, 0.0, False, False, info)`` for gymnasium envs,
            ``(obs, 0.0, False, {})`` for old-gym envs.
        """
        received = self._in_flight.receive("recv", self._check_recv(batch_size), timeout)
        env_ids, results = [], []
        for env, op, result in received:
            if op == "reset":
                result = self._reset_as_step(result)
            self._last_obs[env] = result[0] if isinstance(result, tuple) else result
            env_ids.append(env)
            results.append(result)
        return env_ids, unzip(results)

    def reset_env(self, env_id: int, **kwargs: Any) -> Any:
        """Reset one env now, while others may be in flight (RLlib's ``try_reset``).

        Args:
            env_id: The env to reset; it must not have a call in flight.
            **kwargs: Passed to the env's ``reset`` (e.g. ``seed=``, ``options=``).

        Returns:
            What the env's ``reset`` returns.
        """
        self._check_open("reset_env")
        (env,) = self._check_env_ids([env_id], argument="env_id")
        if self._in_flight.busy(env):
            raise ValueError(
                f"env {env} has a call in flight; `recv` its result before resetting it."
            )
        args: list[tuple[Any, ...] | None] = [None] * self.num_envs
        args[env] = ()
        kwargs_per_env = [dict(kwargs)] * self.num_envs
        if self._next_seeds[env] is not None and "seed" not in kwargs:
            kwargs_per_env[env] = {**kwargs, "seed": self._next_seeds[env]}
        result = self._fanout.per_env("reset", "reset", args, kwargs_per_env)[env]
        self._next_seeds[env] = None
        self._last_obs[env] = _reset_obs(result)
        return result

    def reset(self, mask: Sequence[Any] | None = None) -> Any:
        """Reset the envs, skipping those whose `mask` entry is truthy (pfrl's convention).

        Args:
            mask: One flag per env; a truthy flag keeps that env as it is and returns its last
                observation. None resets every env. (gymnasium's ``reset_mask`` is the inverse.)

        Returns:
            A list of observations for envs whose ``reset`` returns only the observation (old
            gym, pfrl); for gymnasium envs a pair ``(observations, infos)`` of lists, where a
            skipped env's info is ``{}``.
        """
        self._check_open("reset")
        self._check_idle("reset")
        if mask is None:
            skip = [False] * self.num_envs
        else:
            self._check_length("mask", mask, "one flag per env (truthy = keep that env)")
            skip = [bool(m) for m in mask]
        for index, skipped in enumerate(skip):
            if skipped and self._last_obs[index] is _NO_OBS:
                raise ValueError(
                    f"`mask[{index}]` is truthy but env {index} has no observation yet; "
                    "call `reset()` without a mask first."
                )
        seeds = self._next_seeds
        kwargs = [{} if seed is None else {"seed": seed} for seed in seeds]
        args: list[tuple[Any, ...] | None] = [None if s else () for s in skip]
        results = self._fanout.per_env("reset", "reset", args, kwargs)
        reset_results = [r for r, s in zip(results, skip, strict=True) if not s]
        if reset_results:
            self._reset_gives_info = all(_is_obs_and_info(r) for r in reset_results)
        infos: list[Any] = [{} for _ in range(self.num_envs)]
        for index, (result, skipped) in enumerate(zip(results, skip, strict=True)):
            if skipped:
                continue
            self._next_seeds[index] = None
            if self._reset_gives_info:
                self._last_obs[index], infos[index] = result
            else:
                self._last_obs[index] = result
        observations = list(self._last_obs)
        return (observations, infos) if self._reset_gives_info else observations

    def seed(self, seeds: int | Sequence[int | None] | None = None) -> list[Any]:
        """Seed the envs: an int gives env ``i`` the seed ``seeds + i``; a list gives one each.

        An env with a ``seed`` method (old gym, `GymAPIBridge`) is seeded at once. A gymnasium
        env has no ``seed`` method, so its seed is passed to its next ``reset(seed=...)``.

        Args:
            seeds: None (no explicit seed), an int, or one int (or None) per env.

        Returns:
            One entry per env: what the env's ``seed`` returned, or the seed kept for its next
            reset.
        """
        self._check_open("seed")
        if seeds is None:
            per_env: list[int | None] = [None] * self.num_envs
        elif isinstance(seeds, numbers.Integral) and not isinstance(seeds, bool):
            per_env = [int(seeds) + i for i in range(self.num_envs)]
        elif isinstance(seeds, Sequence) and not isinstance(seeds, (str, bytes)):
            self._check_length("seeds", seeds, "one seed per env, or one int")
            per_env = [None if s is None else self._check_seed(i, s) for i, s in enumerate(seeds)]
        else:
            raise TypeError(
                f"`seeds` must be None, an int or a list of ints with one per env, got {seeds!r}."
            )
        has_seed = self._fanout.env_has_method("seed")
        args = [(s,) if has else None for s, has in zip(per_env, has_seed, strict=True)]
        returned = self._fanout.per_env("seed", "seed", args)
        out: list[Any] = []
        for index, seed in enumerate(per_env):
            if has_seed[index]:
                out.append(returned[index])
            else:
                self._next_seeds[index] = seed
                out.append(seed)
        return out

    def close(self) -> None:
        """Close every env and (by default) kill its actor; calling it again does nothing.

        When killing the actors, an env whose ``close`` fails or does not answer within
        `timeout` (30 s if None) is logged and killed anyway. With ``kill_on_close=False`` the
        failure is raised, since the actor lives on.
        """
        if self._closed:
            return
        self._closed = True
        self._fanout.close_pipes()
        if not ray.is_initialized():  # Ray is gone (e.g. at interpreter exit), and the actors too
            return
        try:
            # Envs built by factories are env objects and have `close`; a plain actor may not.
            args: list[tuple[Any, ...] | None] = [
                () if group.batched or hasattr(group.actor, "close") else None
                for group in self._groups
                for _ in range(group.start, group.stop)
            ]
            self._fanout.per_env(
                "close", "close", args, timeout=self._fanout.timeout or _CLOSE_TIMEOUT_S
            )
        except (RemoteEnvError, TimeoutError) as err:
            if not self._kill_on_close:
                raise
            logger.warning("Killing the actors after a failed `close`: %s", err)
        finally:
            if self._kill_on_close:
                for group in self._groups:
                    ray.kill(group.actor)
                if self._placement is not None:
                    self._placement.release()

    def node_ids(self) -> tuple[str, ...]:
        """The id (hex) of the Ray node each env runs on, by env index.

        Compare with ``ray.nodes()`` or ``ray.get_runtime_context().get_node_id()``. Actors
        made by `make_remote_class` and worker actors have the ``node_id`` method this needs.
        """
        self._check_open("node_ids")
        self._require_method_everywhere("node_id")
        per_actor = self._fanout.per_actor("node_id", [()] * len(self._groups))
        return tuple(
            node
            for group, node in zip(self._groups, per_actor, strict=True)
            for _ in range(group.start, group.stop)
        )

    # ----------------------------------------------------------------------------------------
    # gymnasium-style helpers
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method `name` on every env with the same arguments; one result per env.

        The actor's own method `name` is used if it has one (any ``@ray.remote`` class);
        otherwise the ``call`` method of `make_remote_class` actors, which also returns
        non-callable attributes.
        """
        return tuple(self.call_each(name, [args] * self.num_envs, **kwargs))

    def call_each(
        self, name: str, args_per_env: Sequence[Sequence[Any] | None], **kwargs: Any
    ) -> list[Any]:
        """Call method `name` on every env with its own positional arguments.

        The building block for subclasses that add per-env methods: one remote call per actor,
        one wait, errors named by env index.

        Args:
            name: Method name.
            args_per_env: One tuple of positional arguments per env; None skips that env.
            **kwargs: Keyword arguments given to every env called.

        Returns:
            One result per env, in env order (None for a skipped env).
        """
        self._check_open(name)
        self._check_length("args_per_env", args_per_env, "one argument tuple (or None) per env")
        calls = []
        for g, group in enumerate(self._groups):
            envs = range(group.start, group.stop)
            if all(args_per_env[i] is None for i in envs):
                continue
            if group.batched:
                builtin = name in WORKER_ENV_METHODS  # call/get_attr/set_attr/is_wrapped
                env_args: list[tuple[Any, ...] | None] = []
                for i in envs:
                    args_i = args_per_env[i]
                    if args_i is None:
                        env_args.append(None)
                    else:
                        env_args.append(tuple(args_i) if builtin else (name, *args_i))
                calls.append(
                    self._fanout.apply_call(g, name if builtin else "call", env_args, kwargs)
                )
                continue
            args = tuple(args_per_env[group.start] or ())
            if hasattr(group.actor, name):
                calls.append(Call(g, name, args, kwargs))
            else:
                self._require_method(group, "call", f"a method `{name}`")
                calls.append(Call(g, "call", (name, *args), kwargs))
        return self._fanout.per_env_results(calls, self._fanout.run(name, calls))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return attribute `name` of every env (needs actors made by `make_remote_class`)."""
        self._check_open("get_attr")
        self._require_method_everywhere("get_attr")
        return tuple(self._fanout.per_env("get_attr", "get_attr", [(name,)] * self.num_envs))

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute `name` of every env: a list or tuple gives one value per env."""
        self._check_open("set_attr")
        if isinstance(values, (list, tuple)):
            self._check_length("values", values, "one value per env, or a single value")
            per_env = list(values)
        else:
            per_env = [values] * self.num_envs
        self._require_method_everywhere("set_attr")
        self._fanout.per_env("set_attr", "set_attr", [(name, v) for v in per_env])
        self._attr_cache.pop(name, None)

    # ----------------------------------------------------------------------------------------
    # properties
    @property
    def num_envs(self) -> int:
        """The number of envs."""
        return self._num_envs

    @property
    def remote_envs(self) -> tuple[ActorHandle[Any], ...]:
        """The actor handles: one per env, or one per worker for `from_env_fns`."""
        return tuple(group.actor for group in self._groups)

    @property
    def env_slices(self) -> tuple[slice, ...]:
        """The envs each actor of `remote_envs` holds, as slices of env indices."""
        return tuple(slice(group.start, group.stop) for group in self._groups)

    @property
    def closed(self) -> bool:
        """Whether `close` has been called."""
        return self._closed

    @property
    def unwrapped(self) -> RayVectorEnv:
        """This vector env itself (pfrl's ``VectorEnv.unwrapped``)."""
        return self

    @property
    def action_space(self) -> Any:
        """The action space of one env (env 0's, fetched once)."""
        return self._env0_attr("action_space")

    @property
    def observation_space(self) -> Any:
        """The observation space of one env (env 0's, fetched once)."""
        return self._env0_attr("observation_space")

    @property
    def spec(self) -> Any:
        """The ``EnvSpec`` of one env (env 0's, fetched once), or None."""
        return self._env0_attr("spec")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"{type(self).__name__}(num_envs={self.num_envs}{state})"

    # ----------------------------------------------------------------------------------------
    # for adapters
    def _call_actors(
        self, method: str, args_per_actor: Sequence[tuple[Any, ...] | None]
    ) -> list[Any]:
        """Call `method` once per actor of `remote_envs` (None skips that actor).

        For adapters that use the worker actors' batched methods: one wait, errors named by env
        index. Returns one result per actor (None where skipped).
        """
        self._check_open(method)
        return self._fanout.per_actor(method, args_per_actor)

    def _launch_actors(
        self, method: str, args_per_actor: Sequence[tuple[Any, ...] | None]
    ) -> tuple[list[Call], list[Any]]:
        """Like `_call_actors`, without waiting; give the result to `_gather_actors`."""
        self._check_open(method)
        calls = [Call(g, method, a) for g, a in enumerate(args_per_actor) if a is not None]
        return calls, self._fanout.launch(calls)

    def _gather_actors(
        self, method: str, launched: tuple[list[Call], list[Any]], timeout: float | None = None
    ) -> list[Any]:
        """Wait for what `_launch_actors` launched; one result per actor (None where skipped)."""
        self._check_open(method)
        calls, refs = launched
        results: list[Any] = [None] * len(self._groups)
        gathered = self._fanout.gather(user_name(method), calls, refs, timeout=timeout)
        for call, result in zip(calls, gathered, strict=True):
            results[call.group] = result
        return results

    def _describe_workers(self) -> dict[str, Any]:
        """Spaces, metadata and render mode of the envs, checked to be the same in every worker.

        Raises:
            ValueError: If two workers' envs have different spaces (names the env).
        """
        descriptions = self._call_actors("describe", [()] * len(self._groups))
        first: dict[str, Any] = descriptions[0]
        for group, description in zip(self._groups, descriptions, strict=True):
            for space in ("observation_space", "action_space"):
                if description[space] != first[space]:
                    raise ValueError(
                        f"env {group.start} has {space} {description[space]} but env 0 has "
                        f"{first[space]}; every env of a vector env needs the same spaces."
                    )
        return first

    def _send_actors(
        self,
        op: str,
        method: str,
        args_per_actor: Sequence[tuple[Any, ...] | None],
        envs_per_actor: Sequence[Sequence[int]],
    ) -> None:
        """Launch one call per actor for the first-ready API; ``envs_per_actor`` it answers for."""
        self._check_open(method)
        for envs in envs_per_actor:
            for env in envs:
                if self._in_flight.busy(env):
                    raise ValueError(
                        f"env {env} already has an action in flight; `recv` its result before "
                        "sending it another."
                    )
        pairs = [(g, args) for g, args in enumerate(args_per_actor) if args is not None]
        calls = [Call(g, method, args) for g, args in pairs]
        self._in_flight.launch_calls(op, calls, [envs_per_actor[g] for g, _ in pairs])

    def _recv_actors(
        self, min_envs: int | None, timeout: float | None
    ) -> list[tuple[int, tuple[int, ...], str, Any]]:
        """First-ready results per actor call: ``(actor index, envs, op, result)``."""
        received = self._in_flight.receive_calls("recv", self._check_recv(min_envs), timeout)
        return [(call.group, envs, op, result) for call, envs, op, result in received]

    def _env0_attr(self, name: str) -> Any:
        if name not in self._attr_cache:
            self._check_open(name)
            if not self._groups[0].batched and not hasattr(self._groups[0].actor, "get_attr"):
                raise AttributeError(
                    f"`{name}` is unknown: env 0's actor has no `get_attr` method. Build the "
                    "actors with `make_remote_class`, or add `def get_attr(self, name)`."
                )
            args: list[tuple[Any, ...] | None] = [None] * self.num_envs
            args[0] = (name,)
            self._attr_cache[name] = self._fanout.per_env("get_attr", "get_attr", args)[0]
        return self._attr_cache[name]

    def _require_method_everywhere(self, method: str) -> None:
        for group in self._groups:
            self._require_method(group, method, f"`{method}`")

    @staticmethod
    def _require_method(group: ActorGroup, method: str, what: str) -> None:
        if not group.batched and not hasattr(group.actor, method):
            raise ValueError(
                f"env {group.start}'s actor has no {what}; build the actors with "
                "`make_remote_class` (which adds `call`, `get_attr` and `set_attr`) or define "
                "it on the actor class."
            )

    def _check_in_space(self, actions: Sequence[Any], env_ids: Iterable[int]) -> None:
        if not self._check_actions:
            return
        space = self.action_space
        for position, (env, action) in enumerate(zip(env_ids, actions, strict=True)):
            if not space.contains(action):
                raise ValueError(
                    f"`actions[{position}]` = {action!r} for env {env} is outside the action "
                    f"space {space}; pass an action that `action_space.contains`."
                )

    def _check_idle(self, method: str) -> None:
        if self._pending_step is not None:
            raise RuntimeError(
                f"`{method}` was called while a `step_async` is pending; call `step_wait`."
            )
        if len(self._in_flight):
            raise RuntimeError(
                f"`{method}` was called while env(s) {self._in_flight.envs} have calls in flight; "
                "`recv` them first."
            )

    def _check_env_ids(self, env_ids: Any, argument: str = "env_ids") -> list[int]:
        if isinstance(env_ids, (numbers.Integral, str, bytes)) or not isinstance(env_ids, Iterable):
            raise TypeError(f"`{argument}` must be a list of env indices, got {env_ids!r}.")
        ids = list(env_ids)
        for env in ids:
            if isinstance(env, bool) or not isinstance(env, numbers.Integral):
                raise TypeError(f"`{argument}` must hold ints, got {env!r}.")
            if not 0 <= int(env) < self.num_envs:
                raise ValueError(
                    f"`{argument}` contains {env} but there are {self.num_envs} envs "
                    f"(valid ids are 0..{self.num_envs - 1})."
                )
        if len(set(ids)) != len(ids):
            raise ValueError(f"`{argument}` repeats an env: {ids}.")
        return [int(env) for env in ids]

    def _check_recv(self, batch_size: Any) -> int:
        """The number of envs `recv` waits for; errors if nothing is in flight."""
        self._check_open("recv")
        if not len(self._in_flight):
            raise RuntimeError(
                "`recv` was called with nothing in flight; `send` actions (or `async_reset`) first."
            )
        wanted = len(self._in_flight) if batch_size is None else batch_size
        if isinstance(wanted, bool) or not isinstance(wanted, numbers.Integral) or wanted < 1:
            raise ValueError(f"`batch_size` must be a positive int or None, got {batch_size!r}.")
        return int(wanted)

    @staticmethod
    def _reset_as_step(result: Any) -> tuple[Any, ...]:
        if _is_obs_and_info(result):
            return (result[0], 0.0, False, False, result[1])
        return (result, 0.0, False, {})

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise ClosedEnvError(
                f"`{method}` was called on a closed {type(self).__name__}; create a new one."
            )

    def _check_length(self, argument: str, value: Any, expected: str) -> None:
        try:
            length = len(value)
        except TypeError:
            raise TypeError(
                f"`{argument}` must be a sequence with {expected}, got {value!r} "
                f"({type(value).__name__})."
            ) from None
        if isinstance(value, (str, bytes)):
            raise TypeError(f"`{argument}` must be a sequence with {expected}, got {value!r}.")
        if length != self.num_envs:
            raise ValueError(
                f"`{argument}` has {length} entries but there are {self.num_envs} envs; "
                f"pass {expected}."
            )

    @staticmethod
    def _check_seed(index: int, seed: Any) -> int:
        if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
            return int(seed)
        raise TypeError(f"`seeds[{index}]` must be an int or None, got {seed!r}.")


def _check_transport(transport: Any) -> str:
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


def _check_timeout(timeout: Any) -> None:
    if timeout is None:
        return
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool):
        raise TypeError(f"`timeout` must be a number of seconds or None, got {timeout!r}.")
    if timeout <= 0:
        raise ValueError(
            f"`timeout` must be a positive number of seconds or None, got {timeout!r}."
        )


def _crashed_step(reset_result: Any) -> tuple[Any, ...]:
    """A step result for an env whose worker died and came back reset: truncated, reward 0."""
    if _is_obs_and_info(reset_result):
        obs, info = reset_result
        return (obs, 0.0, False, True, {**info, "env_crashed": True})
    return (reset_result, 0.0, True, {"needs_reset": True, "env_crashed": True})


def _is_obs_and_info(reset_result: Any) -> bool:
    """Whether a ``reset`` result is gymnasium's ``(obs, info)`` rather than old gym's obs."""
    return (
        isinstance(reset_result, tuple)
        and len(reset_result) == 2
        and isinstance(reset_result[1], dict)
    )


def _reset_obs(reset_result: Any) -> Any:
    """The observation of a ``reset`` result, gymnasium's or old gym's."""
    return reset_result[0] if _is_obs_and_info(reset_result) else reset_result
