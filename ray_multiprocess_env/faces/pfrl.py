"""`RayVectorEnv`: many env actors stepped as one vector env, with pfrl's interface.

Besides pfrl's ``step``/``reset(mask)``/``seed``/``close`` it has ``call``/``get_attr``/
``set_attr``, ``step_async``/``step_wait``, first-ready ``send``/``recv`` (envpool's) and
``reset_env`` (RLlib's ``try_reset``). It is a thin face over the private engine: the engine
hands back whole batches (in shared memory for workers on this node) and this face hands out
pfrl's per-env tuples (`pfrl_results.py`). The constructors that start workers,
`from_env_fns` and `from_remote_class`, are written in `pfrl_make.py`; the old gym API that
pfrl speaks is `pfrl_bridge.py`'s `GymAPIBridge`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from ray.actor import ActorHandle

from ray_multiprocess_env._engine import Batch, Engine, Options
from ray_multiprocess_env._engine.options import check_env_ids, check_length, check_seed_list
from ray_multiprocess_env._worker.env_worker import WORKER_ENV_METHODS
from ray_multiprocess_env.batch import unzip
from ray_multiprocess_env.compat import announce_vector_env, reset_obs
from ray_multiprocess_env.faces import (
    pfrl_bridge,  # noqa: F401 (its hook: pfrl's VectorEnv)
    pfrl_make,
    pfrl_results,
)

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["RayVectorEnv", "unzip"]


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
            envs that did not answer. The first call also waits for the actors to start
            (for `timeout`, but at least 30 s).
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
        options = Options.make(
            {"timeout": timeout, "transport": "ray"}, check_actions=check_actions
        )
        engine = Engine.of_actors(pfrl_make.check_actors(actors), options, name=type(self).__name__)
        self._setup(engine, options, kill_on_close=kill_on_close)

    def _setup(
        self, engine: Engine, options: Options, *, kill_on_close: bool = True, copy: bool = True
    ) -> None:
        self._engine = engine
        self._check_actions = options.check_actions
        self._kill_on_close, self._copy = kill_on_close, copy
        self._last_obs: list[Any] = [None] * engine.spec.num_envs
        self._has_obs = np.zeros(engine.spec.num_envs, dtype=np.bool_)
        self._reset_gives_info = False
        self._attr_cache: dict[str, Any] = {}
        announce_vector_env(RayVectorEnv)  # pfrl's `VectorEnv` registers it (`pfrl_bridge`)

    # -- constructors that start the actors (written in pfrl_make.py) ------------------------
    from_env_fns = classmethod(pfrl_make.from_env_fns)
    from_remote_class = classmethod(pfrl_make.from_remote_class)

    # -- pfrl's VectorEnv interface -----------------------------------------------------------
    def step(self, actions: Sequence[Any]) -> tuple[Any, ...]:
        """Step every env with its action and return the unzipped results.

        Args:
            actions: One action per env, in env order.

        Returns:
            For gymnasium envs ``(obs, rewards, terminated, truncated, infos)``; for old-gym envs
            ``(obs, rewards, dones, infos)``; each a tuple with one entry per env. An env whose
            ``step`` returns a non-tuple gives a tuple of those results.
        """
        return self._engine.step(self._action_batch(actions), finish=self._results)

    def step_async(self, actions: Sequence[Any]) -> None:
        """Send one action per env and return at once; `step_wait` collects the results."""
        self._engine.step_async(self._action_batch(actions))

    def _action_batch(self, actions: Sequence[Any]) -> Any:
        check_length("actions", actions, self.num_envs, "one action per env")
        self._check_in_space(actions, range(self.num_envs))
        return pfrl_results.action_batch(actions, self._engine.spec)

    def step_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the results of `step_async` and return them as `step` does.

        Args:
            timeout: Seconds to wait; None uses the vector env's `timeout`. On expiry the
                `TimeoutError` leaves the call pending: call `step_wait` again to wait longer.
        """
        return self._engine.step_wait(timeout, self._results)

    def _results(self, batch: Batch) -> tuple[Any, ...]:
        fields = self._fields(batch)
        self._last_obs[:] = pfrl_results.observations(batch, fields)
        return fields

    def reset(self, mask: Sequence[Any] | None = None) -> Any:
        """Reset the envs, skipping those whose `mask` entry is truthy (pfrl's convention).

        Args:
            mask: One flag per env; a truthy flag keeps that env as it is and returns its last
                observation (a `ValueError` if it has none: never reset, or its last reset
                given up by a Ctrl-C or an error). None resets every env. (gymnasium's
                ``reset_mask`` is the inverse.)

        Returns:
            A list of observations for envs whose ``reset`` returns only the observation (old
            gym, pfrl); for gymnasium envs a pair ``(observations, infos)`` of lists, where a
            skipped env's info is ``{}``.
        """
        keep = pfrl_results.kept(mask, self._has_obs)
        infos: list[Any] = [{} for _ in range(self.num_envs)]
        if not keep.all():  # (pfrl calls this after every step: nothing to do most times)
            reset = ~keep
            self._has_obs &= keep  # (until the reset is noted: a reset given up leaves none)
            finish = lambda batch: self._reset_done(batch, reset, infos)  # noqa: E731
            self._engine.reset(mask=None if mask is None else reset, finish=finish)
        observations = list(self._last_obs)
        return (observations, infos) if self._reset_gives_info else observations

    def _reset_done(self, batch: Batch, reset: np.ndarray, infos: list[Any]) -> None:
        """Note the observations of the envs `reset` (their infos into `infos`): in the hand-out."""
        self._reset_gives_info = pfrl_results.gives_info(batch)
        observations, reset_infos = self._fields(batch, reset=True)
        for env in np.flatnonzero(reset).tolist():
            self._last_obs[env], infos[env] = observations[env], reset_infos[env]
        self._has_obs |= reset

    def seed(
        self, seeds: int | np.random.SeedSequence | Sequence[int | None] | None = None
    ) -> list[Any]:
        """Seed the envs: an int gives env ``i`` the seed ``seeds + i``; a list gives one each.

        A `numpy.random.SeedSequence` gives independent seeds (see `make_vector_env`).

        An env with a ``seed`` method (old gym, `GymAPIBridge`) is seeded at once. A gymnasium
        env has no ``seed`` method, so its seed is passed to its next ``reset(seed=...)``.

        Returns:
            One entry per env: what the env's ``seed`` returned, or the seed kept for its next
            reset.
        """
        return self._engine.seed(check_seed_list(seeds, self.num_envs, "seeds"))

    def close(self) -> None:
        """Close every env and (by default) kill its actor; calling it again does nothing.

        It returns within `timeout` (30 s if None) plus the time to kill the actors: an env
        whose ``close`` fails or does not answer by then is logged and killed anyway. With
        ``kill_on_close=False`` the failure is raised, since the actor lives on.
        """
        self._engine.close(kill=self._kill_on_close)

    # -- first-ready: envpool's send/recv, RLlib's try_reset ----------------------------------
    def async_reset(self) -> None:
        """Reset every env without waiting; `recv` then returns them as they finish."""
        self._engine.async_reset()

    def send(self, actions: Sequence[Any], env_ids: Sequence[int]) -> None:
        """Step the envs `env_ids` with `actions` (one each) without waiting for them.

        Raises:
            ValueError: If an env id is out of range, repeated, or has a call in flight
                (`recv` its result first), or `actions` and `env_ids` differ in length.
        """
        env_ids = check_env_ids(env_ids, self.num_envs)
        if len(actions) != len(env_ids):
            raise ValueError(
                f"`actions` has {len(actions)} entries but `env_ids` has {len(env_ids)}; "
                "pass one action per env id."
            )
        self._check_in_space(actions, env_ids)
        self._engine.send(pfrl_results.action_batch(actions, self._engine.spec), env_ids)

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
        return self._engine.recv(batch_size, timeout, self._received)

    def _received(self, batch: Batch) -> tuple[list[int], tuple[Any, ...]]:
        assert batch.env_ids is not None
        env_ids = batch.env_ids.tolist()
        fields = self._fields(batch)
        for env, obs in zip(env_ids, pfrl_results.observations(batch, fields), strict=True):
            self._last_obs[env] = obs
        self._has_obs[env_ids] = True
        return env_ids, fields

    def reset_env(self, env_id: int, **kwargs: Any) -> Any:
        """Reset one env now, while others may be in flight (RLlib's ``try_reset``).

        Args:
            env_id: The env to reset; it must not have a call in flight.
            **kwargs: The env's ``reset`` arguments: ``seed=`` and ``options=``.

        Returns:
            What the env's ``reset`` returns.
        """
        (env,) = check_env_ids([env_id], self.num_envs, argument="env_id")
        mask = np.zeros(self.num_envs, dtype=np.bool_)
        mask[env] = True
        seeds: list[Any] = [None] * self.num_envs
        seeds[env] = kwargs.pop("seed", None)
        options = kwargs.pop("options", None)
        if kwargs:
            raise TypeError(
                f"`reset_env` got {sorted(kwargs)}; it passes only `seed` and `options` to the "
                "env's `reset`."
            )
        per_env = None if options is None else [options] * self.num_envs
        self._has_obs[env] = False  # (until the reset is noted: a reset given up leaves none)
        finish = lambda batch: self._env_reset_done(batch, env)  # noqa: E731
        return self._engine.reset(
            seeds, per_env, mask, label="reset_env", in_flight_ok=True, finish=finish
        )

    def _env_reset_done(self, batch: Batch, env: int) -> Any:
        """`reset_env`'s result, with env `env`'s observation noted: in the hand-out."""
        if batch.rows is not None:  # (what the env's own `reset` returned)
            result = batch.rows[env]
            self._last_obs[env] = reset_obs(result)
        else:  # (an old gym env's observation may be a tuple itself: kept whole)
            observations, infos = self._fields(batch, reset=True)
            result = observations[env] if batch.old_api else (observations[env], infos[env])
            self._last_obs[env] = observations[env]
        self._has_obs[env] = True
        return result

    # -- gymnasium-style helpers --------------------------------------------------------------
    def call(self, name: str, /, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method `name` on every env with the same arguments; one result per env.

        The actor's own method `name` is used if it has one (any ``@ray.remote`` class);
        otherwise the ``call`` method of `make_remote_class` actors, which also returns
        non-callable attributes.
        """
        return tuple(self.call_each(name, [args] * self.num_envs, **kwargs))

    def call_each(
        self, name: str, args_per_env: Sequence[Sequence[Any] | None], /, **kwargs: Any
    ) -> list[Any]:
        """Call method `name` on every env with its own positional arguments.

        The building block for subclasses that add per-env methods: one remote call per
        worker, one wait, errors named by env index.

        Args:
            name: Method name.
            args_per_env: One tuple of positional arguments per env; None skips that env.
            **kwargs: Keyword arguments given to every env called.

        Returns:
            One result per env, in env order (None for a skipped env).
        """
        check_length("args_per_env", args_per_env, self.num_envs, "one argument tuple per env")
        method = name if name in WORKER_ENV_METHODS else "call"
        prefix = () if method == name else (name,)
        per_env = [None if a is None else (*prefix, *a) for a in args_per_env]
        kwargs_per_env = [kwargs] * self.num_envs
        return self._engine.call(method, per_env, kwargs_per_env, label=name, in_flight_ok=True)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return attribute `name` of every env (needs actors made by `make_remote_class`)."""
        return tuple(self.call_each("get_attr", [(name,)] * self.num_envs))

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute `name` of every env: a list or tuple gives one value per env."""
        if isinstance(values, (list, tuple)):
            check_length("values", values, self.num_envs, "one value per env, or a single value")
            per_env = list(values)
        else:
            per_env = [values] * self.num_envs
        self.call_each("set_attr", [(name, v) for v in per_env])
        self._attr_cache.pop(name, None)

    def node_ids(self) -> tuple[str, ...]:
        """The id (hex) of the Ray node each env runs on, by env index.

        Compare with ``ray.nodes()`` or ``ray.get_runtime_context().get_node_id()``. Actors
        made by `make_remote_class` and worker actors have the ``node_id`` method this needs.
        """
        return self._engine.node_ids()

    # -- properties ---------------------------------------------------------------------------
    @property
    def num_envs(self) -> int:
        """The number of envs."""
        return self._engine.spec.num_envs

    @property
    def remote_envs(self) -> tuple[ActorHandle[Any], ...]:
        """The actor handles: one per env, or one per worker for `from_env_fns`."""
        return tuple(worker.actor for worker in self._engine.workers)

    @property
    def env_slices(self) -> tuple[slice, ...]:
        """The envs each actor of `remote_envs` holds, as slices of env indices."""
        return tuple(slice(w.envs.start, w.envs.stop) for w in self._engine.workers)

    @property
    def closed(self) -> bool:
        """Whether `close` has been called."""
        return self._engine.closed

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
        state = ", closed" if self.closed else ""
        return f"{type(self).__name__}(num_envs={self.num_envs}{state})"

    # -- helpers ------------------------------------------------------------------------------
    def _fields(self, batch: Batch, reset: bool = False) -> tuple[Any, ...]:
        return pfrl_results.fields(batch, self._engine.spec, self._copy, reset)

    def _env0_attr(self, name: str) -> Any:
        return pfrl_results.env0_attr(self._engine, self._attr_cache, name)

    def _check_in_space(self, actions: Sequence[Any], env_ids: Iterable[int]) -> None:
        if self._check_actions:
            pfrl_results.check_in_space(self.action_space, actions, env_ids)
