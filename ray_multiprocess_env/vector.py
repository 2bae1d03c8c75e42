"""`RayVectorEnv`: step many env actors as one vector env, with pfrl's interface.

This module is the one fan-out engine of the package: it launches one remote call per env, waits
once (with a timeout), re-orders the results by env index and unzips tuple results.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import ray
from ray.actor import ActorHandle
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from ray_multiprocess_env.errors import ClosedEnvError, EnvCrashedError, RemoteEnvError
from ray_multiprocess_env.integrations.pfrl import register_pfrl_vector_env

__all__ = ["RayVectorEnv", "unzip"]

logger = logging.getLogger(__name__)

_NO_OBS = object()
#: Seconds `close` waits for the envs to close before it kills their actors anyway.
_CLOSE_TIMEOUT_S = 30.0
#: Seconds a failed call waits for its other envs before raising (bounded by ``timeout``).
_ERROR_GRACE_S = 10.0


class _Call(NamedTuple):
    """One remote call of the fan-out: ``actors[env].<method>.remote(*args, **kwargs)``."""

    env: int
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = MappingProxyType({})


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
            envs that did not answer.
        kill_on_close: Whether `close` kills the actors after closing their envs.

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
        if timeout is not None and (
            not isinstance(timeout, numbers.Real) or isinstance(timeout, bool)
        ):
            raise TypeError(f"`timeout` must be a number of seconds or None, got {timeout!r}.")
        if timeout is not None and timeout <= 0:
            raise ValueError(
                f"`timeout` must be a positive number of seconds or None, got {timeout!r}."
            )
        self._actors: tuple[ActorHandle[Any], ...] = tuple(actors)
        self._timeout = None if timeout is None else float(timeout)
        self._kill_on_close = kill_on_close
        self._last_obs: list[Any] = [_NO_OBS] * len(actors)
        self._next_seeds: list[int | None] = [None] * len(actors)
        self._reset_gives_info = False
        self._attr_cache: dict[str, Any] = {}
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
        self._check_open("step")
        self._check_length("actions", actions, "one action per env")
        results = self._run(
            "step", [_Call(i, "step", (action,)) for i, action in enumerate(actions)]
        )
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
        self._check_open("reset")
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
        calls = []
        for index, skipped in enumerate(skip):
            if not skipped:
                seed = self._next_seeds[index]
                calls.append(_Call(index, "reset", (), {} if seed is None else {"seed": seed}))
        results = self._run("reset", calls)
        if results:
            self._reset_gives_info = all(
                isinstance(r, tuple) and len(r) == 2 and isinstance(r[1], dict) for r in results
            )
        infos: list[Any] = [{} for _ in range(self.num_envs)]
        for call, result in zip(calls, results, strict=True):
            index = call.env
            if "seed" in call.kwargs:
                self._next_seeds[index] = None
            if self._reset_gives_info:
                self._last_obs[index], infos[index] = result
            else:
                self._last_obs[index] = result
        observations = list(self._last_obs)
        return (observations, infos) if self._reset_gives_info else observations

    def seed(self, seeds: int | Sequence[int | None] | None = None) -> list[Any]:
        """Seed the envs: an int gives env ``i`` the seed ``seeds + i``; a list gives one each.

        An actor with a ``seed`` method (old gym, `GymAPIBridge`) is seeded at once. A gymnasium
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
        calls = [
            _Call(i, "seed", (s,))
            for i, s in enumerate(per_env)
            if hasattr(self._actors[i], "seed")
        ]
        returned = dict(zip([c.env for c in calls], self._run("seed", calls), strict=True))
        out: list[Any] = []
        for index, seed in enumerate(per_env):
            if index in returned:
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
        calls = [_Call(i, "close") for i, a in enumerate(self._actors) if hasattr(a, "close")]
        try:
            self._run("close", calls, timeout=self._timeout or _CLOSE_TIMEOUT_S)
        except (RemoteEnvError, TimeoutError) as err:
            if not self._kill_on_close:
                raise
            logger.warning("Killing the actors after a failed `close`: %s", err)
        finally:
            if self._kill_on_close:
                for actor in self._actors:
                    ray.kill(actor)

    # ----------------------------------------------------------------------------------------
    # gymnasium-style helpers
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method `name` on every env with the same arguments; one result per env.

        The actor's own method `name` is used if it has one (any ``@ray.remote`` class);
        otherwise the ``call`` method of `make_remote_class` actors, which also returns
        non-callable attributes.
        """
        self._check_open(name)
        return tuple(self.call_each(name, [args] * self.num_envs, **kwargs))

    def call_each(
        self, name: str, args_per_env: Sequence[Sequence[Any]], **kwargs: Any
    ) -> list[Any]:
        """Call method `name` on every env with its own positional arguments.

        The building block for subclasses that add per-env methods: one remote call per env,
        one wait, errors named by env index.

        Args:
            name: Method name.
            args_per_env: One tuple of positional arguments per env.
            **kwargs: Keyword arguments given to every env.

        Returns:
            One result per env, in env order.
        """
        self._check_open(name)
        self._check_length("args_per_env", args_per_env, "one argument tuple per env")
        calls = []
        for index, args in enumerate(args_per_env):
            if hasattr(self._actors[index], name):
                calls.append(_Call(index, name, tuple(args), kwargs))
            else:
                self._require_method(index, "call", f"a method `{name}`")
                calls.append(_Call(index, "call", (name, *args), kwargs))
        return self._run(name, calls)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return attribute `name` of every env (needs actors made by `make_remote_class`)."""
        self._check_open("get_attr")
        for index in range(self.num_envs):
            self._require_method(index, "get_attr", "`get_attr`")
        return tuple(
            self._run("get_attr", [_Call(i, "get_attr", (name,)) for i in range(self.num_envs)])
        )

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute `name` of every env: a list or tuple gives one value per env."""
        self._check_open("set_attr")
        if isinstance(values, (list, tuple)):
            self._check_length("values", values, "one value per env, or a single value")
            per_env = list(values)
        else:
            per_env = [values] * self.num_envs
        for index in range(self.num_envs):
            self._require_method(index, "set_attr", "`set_attr`")
        self._run("set_attr", [_Call(i, "set_attr", (name, v)) for i, v in enumerate(per_env)])
        self._attr_cache.pop(name, None)

    # ----------------------------------------------------------------------------------------
    # properties
    @property
    def num_envs(self) -> int:
        """The number of envs."""
        return len(self._actors)

    @property
    def remote_envs(self) -> tuple[ActorHandle[Any], ...]:
        """The actor handles, in env order (for ``ray.get([e.m.remote() for e in ...])``)."""
        return self._actors

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

    def __enter__(self) -> RayVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"{type(self).__name__}(num_envs={self.num_envs}{state})"

    # ----------------------------------------------------------------------------------------
    # the fan-out engine
    def _run(
        self, label: str, calls: Sequence[_Call], *, timeout: float | None = None
    ) -> list[Any]:
        """Launch one remote call per `calls` entry, wait once, return results in call order."""
        timeout = self._timeout if timeout is None else timeout
        refs = [self._submit(call) for call in calls]
        indices = [c.env for c in calls]
        if not refs:
            return []
        try:
            return list(ray.get(refs, timeout=timeout))
        except GetTimeoutError as err:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            late = [i for i, ref in zip(indices, refs, strict=True) if ref not in ready]
            raise TimeoutError(
                f"`{label}` timed out after {timeout} s: env(s) {late} did not answer. "
                "Raise `timeout` if the env is slow, or close this vector env."
            ) from err
        except RayError as err:
            raise self._remote_error(label, indices, refs, err) from err

    def _submit(self, call: _Call) -> Any:
        try:
            return getattr(self._actors[call.env], call.method).remote(*call.args, **call.kwargs)
        except TypeError as err:  # Ray checks the arguments against the method's signature
            hint = (
                " Its actor has no `seed` method and its `reset` takes no `seed`: add a "
                "`seed(seed)` method or a `reset(seed=None)` to the actor class, or do not seed."
                if call.method == "reset" and "seed" in call.kwargs
                else ""
            )
            raise TypeError(
                f"env {call.env}: `{call.method}` does not accept these arguments ({err}).{hint}"
            ) from err

    def _remote_error(
        self, label: str, indices: list[int], refs: list[Any], err: RayError
    ) -> RemoteEnvError:
        # Give the other envs of this call a bounded moment to finish, so every failure of the
        # call is named and no env is still busy with it when the error reaches the user.
        grace = _ERROR_GRACE_S if self._timeout is None else min(self._timeout, _ERROR_GRACE_S)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=grace)
        failed: list[tuple[int, BaseException]] = []
        for index, ref in zip(indices, refs, strict=True):
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except RayError as error:
                    failed.append((index, error))
        first_index, first_error = failed[0] if failed else (indices[0], err)
        kind = EnvCrashedError if isinstance(first_error, RayActorError) else RemoteEnvError
        return kind(first_index, label, first_error, env_indices=[i for i, _ in failed] or None)

    def _env0_attr(self, name: str) -> Any:
        if name not in self._attr_cache:
            self._check_open(name)
            if not hasattr(self._actors[0], "get_attr"):
                raise AttributeError(
                    f"`{name}` is unknown: env 0's actor has no `get_attr` method. Build the "
                    "actors with `make_remote_class`, or add `def get_attr(self, name)`."
                )
            self._attr_cache[name] = self._run("get_attr", [_Call(0, "get_attr", (name,))])[0]
        return self._attr_cache[name]

    def _require_method(self, index: int, method: str, what: str) -> None:
        if not hasattr(self._actors[index], method):
            raise ValueError(
                f"env {index}'s actor has no {what}; build the actors with `make_remote_class` "
                f"(which adds `call`, `get_attr` and `set_attr`) or define it on the actor class."
            )

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
