"""`TianshouVectorEnv`: a Tianshou 2.x vector env whose envs live in Ray worker actors.

Importing this module imports Tianshou (and so torch); the package itself does not. Tianshou's
``Collector`` steps any subset of its envs (``step(action, id)``), resets the envs that finished
itself (``reset(env_id)``) and wants one info dict per env with its ``env_id``; this face hands
it exactly that, from the engine's batches (observations copied out of the shared memory). With
`wait_num` or `wait_timeout` it is asynchronous as Tianshou's own envs are: `step` returns the
envs that finished first, on the engine's first-ready ``send``/``recv``.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from tianshou.env import BaseVectorEnv

from ray_multiprocess_env._engine import Batch, Engine, Options
from ray_multiprocess_env._engine.call_state import InFlightWords
from ray_multiprocess_env._engine.options import (
    check_env_ids,
    check_positive_int,
    check_seed_list,
    seconds_of,
)
from ray_multiprocess_env.batch import stack
from ray_multiprocess_env.faces.tianshou_results import reset_result, step_result

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ray_multiprocess_env.options import WorkerOptions

__all__ = ["TianshouVectorEnv"]

_SPACES = ("action_space", "observation_space")
_DERIVED = "`{}` follows the calls in flight and cannot be set; `step(None)` collects them."

_STEPPING = "is still stepping (it is in `waiting_id`); collect it with `step(None)` before"
#: Tianshou's asynchronous `step` sends and collects; `step(None)` only collects.
_WORDS = InFlightWords(
    send="step",
    recv="step",
    busy_send=f"env {{env}} in `id` {_STEPPING} stepping it again.",
    busy_reset=f"env {{env}} in `env_id` {_STEPPING} resetting it.",
    busy_all=(
        "env(s) {envs} are still stepping (in `waiting_id`); collect them with `step(None)` "
        "before `{verb}`."
    ),
    nothing=(
        "`step` got `action` None, which collects envs still stepping, but none is "
        "(`waiting_id` is empty); pass one action per env in `id`."
    ),
    again="`step(None)` waits for them again",
)


class TianshouVectorEnv(BaseVectorEnv):
    """A Tianshou ``BaseVectorEnv`` over Ray worker actors: ``Collector(policy, envs)``.

    Gives the same observations, rewards, flags and infos as Tianshou's ``DummyVectorEnv``
    for the same seeds and actions (an env's spaces, `get_env_attr` and `set_env_attr` look
    through gymnasium's wrappers, where Tianshou's own envs read ``env.unwrapped``). Every
    env belongs to one worker, of `envs_per_worker` envs; no env is ever reset by its
    worker: Tianshou's ``Collector`` resets finished envs itself.

    Args:
        env_fns: One picklable factory per env, called inside its worker.
        envs_per_worker: How many envs each worker actor holds, in env order (the last may
            hold fewer), or one count per worker (``[2, 2, 1, 1]``: 4 workers for 6 envs).
        wait_num: Tianshou's asynchronous mode: `step` returns once at least this many of the
            envs it waits for have finished (all envs of a worker finish together, so more
            may come back). None: every env.
        wait_timeout: Tianshou's ``timeout`` of its asynchronous mode: `step` returns what has
            finished after this many seconds (at least one env). Not this package's
            `timeout`, after which a call that has not answered is an error.
        seed: If given, as `seed` called right after construction.
        **options: `WorkerOptions` (``actor_options``, ``placement``, ``timeout``,
            ``on_actor_failure``, ``transport``, ``on_env_error``, ``max_restarts``); an env
            lost to a restart or rebuilt after an error reports its episode as truncated with
            ``env_crashed`` or ``env_error`` in its info.

    Example:
        >>> import gymnasium as gym
        >>> envs = TianshouVectorEnv([lambda: gym.make("CartPole-v1")] * 4, envs_per_worker=2)
        >>> obs, infos = envs.reset()
        >>> obs, rew, terminated, truncated, infos = envs.step(np.zeros(2, np.int64), [1, 3])
        >>> len(envs), obs.shape, [info["env_id"] for info in infos]
        (4, (2, 4), [1, 3])
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        *,
        envs_per_worker: int | Sequence[int] = 1,
        wait_num: int | None = None,
        wait_timeout: float | None = None,
        seed: int | np.random.SeedSequence | Sequence[int | None] | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        # Not BaseVectorEnv.__init__: it would make one Tianshou worker per env.
        num_envs = len(env_fns) if isinstance(env_fns, Sequence) else 0
        if wait_num is not None:
            check_positive_int("wait_num", wait_num)
            if num_envs and wait_num > num_envs:
                raise ValueError(
                    f"`wait_num` is {wait_num} but there are {num_envs} envs; pass at most "
                    f"{num_envs}, or None to wait for every env."
                )
        if wait_timeout is not None and (
            isinstance(wait_timeout, bool)
            or not isinstance(wait_timeout, numbers.Real)
            or not 0 < seconds_of(wait_timeout) < math.inf  # (10**400: refused here, by name)
        ):
            raise ValueError(
                f"`wait_timeout` must be a positive number of seconds (finite) or None, got "
                f"{wait_timeout!r}."
            )
        checked = Options.make(options, where=type(self).__name__, own=type(self).__init__)
        self._engine = Engine.start(
            env_fns,
            envs_per_worker,
            checked,
            name=type(self).__name__,
            info_layout="per_env",
            uniform="prefer",  # Tianshou's envs may differ in their spaces
            autoreset=False,
            words=_WORDS,
        )
        self.env_num = self._engine.spec.num_envs
        self.wait_num = wait_num or self.env_num
        self.wait_timeout = wait_timeout
        self.is_async = self.wait_num != self.env_num or wait_timeout is not None
        self.is_closed = False
        self._spaces: dict[str, list[Any]] = {}
        if seed is not None:
            try:
                self.seed(seed)
            except BaseException as error:
                self._engine.abort(error)
                self.is_closed = True
                raise

    # -- Tianshou's vector env interface --------------------------------------------------------
    def reset(
        self, env_id: int | Sequence[int] | np.ndarray | None = None, **kwargs: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reset the envs `env_id` (all if None); their observations and infos, in that order.

        Args:
            env_id: An env index or indices; none of them may be waiting in `step`.
            **kwargs: ``seed=`` and ``options=``, given to each env's ``reset`` as they are
                (as Tianshou's own envs do: one int seed seeds every env alike; use `seed`
                for a seed per env).
        """
        ids = self._ids(env_id, "env_id")
        seed, options = kwargs.pop("seed", None), kwargs.pop("options", None)
        if kwargs:
            raise TypeError(
                f"`reset` got {sorted(kwargs)}; it passes only `seed` and `options` to the "
                "envs' `reset`."
            )
        mask = np.zeros(self.env_num, dtype=np.bool_)
        mask[ids] = True
        seeds: list[int | None] = [seed if chosen else None for chosen in mask.tolist()]
        everything = mask.all() and not self.is_async  # (else: refused for envs in flight)
        batch: Batch = self._engine.reset(
            seeds,
            options,
            None if everything else mask,
            in_flight_ok=self.is_async,
            others_reset=False,  # (Tianshou resets any envs first; only theirs are returned)
        )
        return reset_result(batch, ids, self._engine.spec)

    def step(
        self, action: Any, id: int | Sequence[int] | np.ndarray | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step the envs `id` (all if None), action ``action[i]`` for env ``id[i]``.

        Synchronous (no `wait_num` nor `wait_timeout`): the results of exactly those envs, in
        that order. Asynchronous: the results of the envs that finished first among those
        waiting (each info's ``env_id`` says which); `action` None only collects them.

        Returns:
            ``(obs, rewards, terminated, truncated, infos)``, one row per env; each info dict
            holds its ``env_id``.
        """
        ids = self._ids(id, "id")
        if action is None:
            if not self.is_async:
                raise ValueError(
                    "`action` is None, which only a vector env with `wait_num` or "
                    "`wait_timeout` accepts (to collect envs still stepping); pass one action "
                    "per env in `id`."
                )
        else:
            if hasattr(action, "detach"):  # a torch tensor (Tianshou allows one)
                action = action.detach().cpu().numpy()
            if len(action) != len(ids):
                raise ValueError(
                    f"`action` has {len(action)} entries for {len(ids)} env(s) in `id`; pass "
                    "one action per env."
                )
            if not ids:
                raise ValueError(
                    f"`id` is {id!r}, which names no env; pass the ids of the envs to step "
                    "(None: all)."
                )
            if not self.is_async:
                spec = self._engine.spec
                return self._engine.step_envs(
                    self._action_batch(action), ids, finish=lambda b: step_result(b, ids, spec)
                )
            self._engine.send(self._action_batch(action), ids)
        return self._recv_first()  # (a Ctrl-C leaves what was sent in flight: `waiting_id`)

    @property
    def waiting_id(self) -> list[int]:
        """The envs sent to and not yet returned by `step` (the engine's calls in flight)."""
        return self._engine.busy_envs()

    @waiting_id.setter
    def waiting_id(self, value: list[int]) -> None:
        raise AttributeError(_DERIVED.format("waiting_id"))

    @property
    def ready_id(self) -> list[int]:
        """The envs not waiting in `step`."""
        waiting = set(self._engine.busy_envs())
        return [env for env in range(self.env_num) if env not in waiting]

    @ready_id.setter
    def ready_id(self, value: list[int]) -> None:
        raise AttributeError(_DERIVED.format("ready_id"))

    def seed(
        self, seed: int | np.random.SeedSequence | Sequence[int | None] | None = None
    ) -> list[list[int] | None]:
        """Seed every env now, as Tianshou's envs do: each env is reset with its seed.

        An int gives env ``i`` the seed ``seed + i``, a list one seed per env, a
        `numpy.random.SeedSequence` independent seeds (as for `make_vector_env`). The action
        space of each env (``action_space[i]``, for Tianshou's random actions) is seeded too.

        Returns:
            ``[seed]`` for each env (None where the seed is None).
        """
        seeds = check_seed_list(seed, self.env_num, "seed")
        action_spaces = self._space_list("action_space")  # (fetched first: it may ask the envs)
        self._engine.reset(list(seeds), label="seed")  # (refused while envs are stepping)
        for space, env_seed in zip(action_spaces, seeds, strict=True):
            space.seed(env_seed)
        return [None if s is None else [s] for s in seeds]

    def get_env_attr(
        self, key: str, id: int | Sequence[int] | np.ndarray | None = None
    ) -> list[Any]:
        """Attribute `key` of the envs `id` (all if None), looking through their wrappers."""
        ids = self._ids(id, "id")
        if key in _SPACES:
            every = self._space_list(key)
            return [every[env] for env in ids]
        return self._each("get_attr", ids, (key,))

    def set_env_attr(
        self, key: str, value: Any, id: int | Sequence[int] | np.ndarray | None = None
    ) -> None:
        """Set attribute `key` of the envs `id` (all if None) to `value`, as gymnasium does.

        As gymnasium's ``set_wrapper_attr``: where a wrapper or the env defines `key`, else on
        the outermost wrapper.
        """
        self._each("set_attr", self._ids(id, "id"), (key, value))
        self._spaces.pop(key, None)

    def render(self, **kwargs: Any) -> list[Any]:
        """Each env's ``render(**kwargs)`` (make the envs with a ``render_mode``)."""
        every = [("render",)] * self.env_num  # (not `in_flight_ok`: refused while envs step)
        return self._engine.call("call", every, [kwargs] * self.env_num, label="render")

    def close(self) -> None:
        """Close every env and kill the workers (within `timeout`, 30 s if None); idempotent."""
        self._engine.close()
        self.is_closed = True

    # -- more ------------------------------------------------------------------------------------
    @property
    def remote_envs(self) -> tuple[Any, ...]:
        """The worker actors."""
        return tuple(worker.actor for worker in self._engine.workers)

    def node_ids(self) -> tuple[str, ...]:
        """The id (hex) of the Ray node each env runs on, by env index."""
        return self._engine.node_ids()

    def __repr__(self) -> str:
        state = ", closed" if self.is_closed else ""
        return f"{type(self).__name__}(env_num={self.env_num}{state})"

    # -- helpers ---------------------------------------------------------------------------------
    def _ids(self, ids: Any, argument: str) -> list[int]:
        """Tianshou's env ids (None: all; an int: that env) as a checked list."""
        if ids is None:
            return list(range(self.env_num))
        if isinstance(ids, numbers.Integral) and not isinstance(ids, bool):
            ids = [ids]
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        return check_env_ids(ids, self.env_num, argument)

    def _recv_first(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tianshou's asynchronous wait: `wait_num` envs, or what finished by `wait_timeout`."""
        wanted = self.wait_num  # (more than are in flight: all of them)
        if self.wait_timeout is None:
            return self._engine.recv(wanted, None, self._received)
        try:
            return self._engine.recv(wanted, self.wait_timeout, self._received)
        except TimeoutError:  # the envs still out stay in flight
            # (what finished meanwhile, or the next to finish)
            return self._engine.recv(1, None, self._received)

    def _received(self, batch: Batch) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        assert batch.env_ids is not None
        return step_result(batch, batch.env_ids.tolist(), self._engine.spec)

    def _action_batch(self, actions: Any) -> Any:
        """Actions as the engine takes them: a Dict or Tuple space's stacked into a batch."""
        space = self._engine.spec.action_space
        if isinstance(space, (spaces.Dict, spaces.Tuple)) and self._engine.spec.uniform:
            return stack(space, list(actions))
        return actions

    def _space_list(self, key: str) -> list[Any]:
        """Each env's space `key`: copies of the common one, or each env's own; seedable."""
        if key not in self._spaces:
            common = getattr(self._engine.spec, key)
            if self._engine.spec.uniform and common is not None:
                self._spaces[key] = [copy.deepcopy(common) for _ in range(self.env_num)]
            else:  # (None for an env without one, as Tianshou's subprocess envs give)
                every = list(range(self.env_num))
                has = self._each("has_attr", every, (key,))
                found = iter(self._each("get_attr", [e for e in every if has[e]], (key,)))
                self._spaces[key] = [next(found) if has[e] else None for e in every]
        return self._spaces[key]

    def _each(
        self,
        method: str,
        ids: list[int],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        chosen = set(ids)
        per_env = [args if env in chosen else None for env in range(self.env_num)]
        results = self._engine.call(
            method, per_env, [kwargs or {}] * self.env_num, in_flight_ok=self.is_async
        )
        return [results[env] for env in ids]
