"""`RayVectorEnv`: many env actors stepped as one vector env, with pfrl's interface.

Besides pfrl's ``step``/``reset(mask)``/``seed``/``close`` it has ``call``/``get_attr``/
``set_attr``, ``step_async``/``step_wait`` and first-ready ``send``/``recv``. It is a thin face
over the private engine (`ray_multiprocess_env._engine`): every remote call is one engine call
(one operation per worker, one wait, errors by env index); results are unzipped into per-field
tuples. Its constructors live in `vector_make.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ray.actor import ActorHandle

from ray_multiprocess_env._engine import Engine, Options, Pool
from ray_multiprocess_env._engine.options import check_length, check_seed_list
from ray_multiprocess_env.batch import unzip
from ray_multiprocess_env.compat import announce_vector_env, is_obs_and_info
from ray_multiprocess_env.vector_make import VectorConstructors
from ray_multiprocess_env.vector_ready import FirstReady
from ray_multiprocess_env.worker import WORKER_ENV_METHODS

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["RayVectorEnv", "unzip"]

_NO_OBS = object()


class RayVectorEnv(VectorConstructors, FirstReady):
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
        options = Options.make(timeout=timeout, check_actions=check_actions, transport="ray")
        self._setup(Engine(Pool.of_actors(actors, options)), kill_on_close=kill_on_close)

    def _setup(self, engine: Engine, *, kill_on_close: bool = True) -> None:
        self._engine = engine
        engine.name = type(self).__name__
        self._kill_on_close = kill_on_close
        self._last_obs: list[Any] = [_NO_OBS] * engine.num_envs
        self._next_seeds: list[int | None] = [None] * engine.num_envs
        self._reset_gives_info = False
        self._attr_cache: dict[str, Any] = {}
        announce_vector_env(RayVectorEnv)  # e.g. pfrl's `VectorEnv` registers it

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
        self._engine.check_open("step")
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Sequence[Any]) -> None:
        """Send one action per env and return at once; `step_wait` collects the results."""
        engine = self._engine
        engine.check_idle("step_async")
        check_length("actions", actions, self.num_envs, "one action per env")
        self._check_in_space(actions, range(self.num_envs))
        args = engine.apply_args("step", [(action,) for action in actions])
        engine.pending = engine.launch("apply", args, "step")

    def step_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the results of `step_async` and return them as `step` does.

        Args:
            timeout: Seconds to wait; None uses the vector env's `timeout`. On expiry the
                `TimeoutError` leaves the call pending: call `step_wait` again to wait longer.
        """
        results = self._engine.spread(self._engine.wait_pending(timeout))
        for index, result in enumerate(results):
            self._last_obs[index] = result[0] if isinstance(result, tuple) else result
        return unzip(results)

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
        self._engine.check_idle("reset")
        if mask is None:
            skip = [False] * self.num_envs
        else:
            check_length("mask", mask, self.num_envs, "one flag per env (truthy = keep that env)")
            skip = [bool(m) for m in mask]
        for index, skipped in enumerate(skip):
            if skipped and self._last_obs[index] is _NO_OBS:
                raise ValueError(
                    f"`mask[{index}]` is truthy but env {index} has no observation yet; "
                    "call `reset()` without a mask first."
                )
        seeds = [None if s else seed for s, seed in zip(skip, self._next_seeds, strict=True)]
        kwargs = [{} if seed is None else {"seed": seed} for seed in seeds]
        results = self._engine.apply("reset", [None if s else () for s in skip], kwargs)
        self._engine.note_seeds(seeds)
        reset_results = [r for r, s in zip(results, skip, strict=True) if not s]
        if reset_results:
            self._reset_gives_info = all(is_obs_and_info(r) for r in reset_results)
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

        Returns:
            One entry per env: what the env's ``seed`` returned, or the seed kept for its next
            reset.
        """
        self._engine.check_open("seed")
        per_env = check_seed_list(seeds, self.num_envs, "seeds")
        has_seed = self._engine.has_method("seed")
        args = [(s,) if has else None for s, has in zip(per_env, has_seed, strict=True)]
        returned = self._engine.apply("seed", args) if any(has_seed) else [None] * self.num_envs
        self._engine.note_seeds(per_env)
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

        It returns within `timeout` (30 s if None) plus the time to kill the actors: an env
        whose ``close`` fails or does not answer by then is logged and killed anyway. With
        ``kill_on_close=False`` the failure is raised, since the actor lives on.
        """
        self._engine.close(kill=self._kill_on_close)

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
        self._engine.check_open(name)
        check_length("args_per_env", args_per_env, self.num_envs, "one argument tuple per env")
        method = name if name in WORKER_ENV_METHODS else "call"
        prefix = () if method == name else (name,)
        per_env = [None if a is None else (*prefix, *a) for a in args_per_env]
        return self._engine.apply(method, per_env, [kwargs] * self.num_envs, name)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return attribute `name` of every env (needs actors made by `make_remote_class`)."""
        return tuple(self.call_each("get_attr", [(name,)] * self.num_envs))

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute `name` of every env: a list or tuple gives one value per env."""
        self._engine.check_open("set_attr")
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
        self._engine.check_open("node_ids")
        return self._engine.node_ids()

    # -- properties ---------------------------------------------------------------------------
    @property
    def num_envs(self) -> int:
        """The number of envs."""
        return self._engine.num_envs

    @property
    def remote_envs(self) -> tuple[ActorHandle[Any], ...]:
        """The actor handles: one per env, or one per worker for `from_env_fns`."""
        return tuple(slot.actor for slot in self._engine.pool.slots)

    @property
    def env_slices(self) -> tuple[slice, ...]:
        """The envs each actor of `remote_envs` holds, as slices of env indices."""
        return tuple(slice(start, stop) for start, stop in self._engine.bounds)

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
    def _env0_attr(self, name: str) -> Any:
        if name not in self._attr_cache:
            self._engine.check_open(name)
            slot = self._engine.pool.slots[0]
            if not slot.batched and not hasattr(slot.actor, "get_attr"):
                raise AttributeError(
                    f"`{name}` is unknown: env 0's actor has no `get_attr` method. Build the "
                    "actors with `make_remote_class`, or add `def get_attr(self, name)`."
                )
            args: list[tuple[Any, ...] | None] = [None] * self.num_envs
            args[0] = (name,)
            self._attr_cache[name] = self._engine.apply("get_attr", args)[0]
        return self._attr_cache[name]

    def _check_in_space(self, actions: Sequence[Any], env_ids: Iterable[int]) -> None:
        if not self._engine.options.check_actions:
            return
        space = self.action_space
        for position, (env, action) in enumerate(zip(env_ids, actions, strict=True)):
            if not space.contains(action):
                raise ValueError(
                    f"`actions[{position}]` = {action!r} for env {env} is outside the action "
                    f"space {space}; pass an action that `action_space.contains`."
                )
