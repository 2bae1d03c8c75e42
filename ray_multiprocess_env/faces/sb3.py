"""`SB3VecEnv`: a stable-baselines3 `VecEnv` backed by Ray worker actors.

Importing this module imports stable-baselines3 (and so torch); the package itself does not.
Each worker steps its envs with autoreset in the same step, as SB3's ``DummyVecEnv`` does:
a finished env's last observation is in ``info["terminal_observation"]``, the observation
returned is the first of its next episode, and ``info["TimeLimit.truncated"]`` tells a time
limit from a real termination.
"""

from __future__ import annotations

import numbers
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env import VecEnv

from ray_multiprocess_env._engine import Batch, Engine, Options
from ray_multiprocess_env._engine.options import check_base_seed, check_seed_list
from ray_multiprocess_env.batch import check_rows, copy_batch, stack
from ray_multiprocess_env.env_factories import made_from
from ray_multiprocess_env.runtime import ray_cpus

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ray_multiprocess_env.options import MakeOptions, WorkerOptions

__all__ = ["SB3VecEnv", "make_sb3_vec_env"]


class SB3VecEnv(VecEnv):
    """A stable-baselines3 `VecEnv` whose envs live in Ray worker actors.

    Gives the same observations, rewards, dones and infos as SB3's ``DummyVecEnv`` for the
    same seeds and actions, with the envs stepped in parallel by worker actors of
    `envs_per_worker` envs each. SB3's wrappers (``VecNormalize``,
    ``VecMonitor``, ``VecFrameStack``, ...) work on top.

    Args:
        env_fns: One picklable factory per env, called inside its worker.
        envs_per_worker: How many envs each worker actor holds, in env order (the last may
            hold fewer), or one count per worker (``[2, 2, 1, 1]``: 4 workers for 6 envs).
        seed: If given, as `seed` called right after construction (env ``i`` gets
            ``seed + i`` at the first reset; a `numpy.random.SeedSequence`, independent
            seeds as for `make_vector_env`).
        **options: `WorkerOptions` (``actor_options``, ``placement``, ``timeout``,
            ``on_actor_failure``, ``transport``, ``on_env_error``, ``max_restarts``). An env
            lost to a worker's restart or rebuilt after an error ends its episode as SB3
            reports a time limit (done, ``TimeLimit.truncated``), with ``env_crashed`` or
            ``env_error`` in its info, and comes back reset.

    Example:
        >>> import gymnasium as gym
        >>> envs = SB3VecEnv([lambda: gym.make("CartPole-v1")] * 4, envs_per_worker=2)
        >>> obs = envs.reset()
        >>> obs, rewards, dones, infos = envs.step(np.zeros(4, dtype=np.int64))
        >>> obs.shape, rewards.dtype, sorted(infos[0])
        ((4, 4), dtype('float32'), ['TimeLimit.truncated'])
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        *,
        envs_per_worker: int | Sequence[int] = 1,
        seed: int | np.random.SeedSequence | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        check_base_seed(seed)
        checked = Options.make(
            options,
            where=type(self).__name__,
            own=type(self).__init__,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
        self._engine = Engine.start(
            env_fns, envs_per_worker, checked, name=type(self).__name__, info_layout="per_env"
        )
        spec = self._engine.spec
        super().__init__(spec.num_envs, spec.observation_space, spec.action_space)
        self.metadata = spec.metadata
        if seed is not None:
            self.seed(seed)

    def seed(self, seed: int | np.random.SeedSequence | None = None) -> Sequence[int | None]:
        """Seed every env at its next reset: ``seed + i``, or a `SeedSequence`'s own seeds.

        A `numpy.random.SeedSequence` gives independent seeds, as for `make_vector_env`.
        """
        if isinstance(seed, np.random.SeedSequence):
            self._seeds = check_seed_list(seed, self.num_envs)
            return self._seeds
        return super().seed(seed)

    def reset(self) -> Any:
        """Reset every env (with the seeds and options set by `seed`/`set_options`)."""
        options = [opts or None for opts in self._options]
        return self._engine.reset(self._seeds, options, finish=self._reset_done)

    def _reset_done(self, batch: Batch) -> Any:
        """`reset`'s observations, its infos kept, its seeds and options used (in the hand-out)."""
        self.reset_infos = [dict(info) for info in batch.infos]
        self._reset_seeds()
        self._reset_options()
        return self._observations(batch.observations)

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step every env: `step_async` and `step_wait` as one call, which a Ctrl-C gives up."""
        return self._engine.step(self._action_batch(actions), finish=self._results)

    def step_async(self, actions: np.ndarray) -> None:
        """Send the actions to the workers; `step_wait` collects the results."""
        self._engine.step_async(self._action_batch(actions))

    def _action_batch(self, actions: np.ndarray) -> Any:
        # SB3 indexes actions by env: for a Dict or Tuple space, a list of one action per env,
        # stacked here into a batch of the space's dtypes
        per_env = isinstance(self.action_space, (gym.spaces.Dict, gym.spaces.Tuple))
        if per_env and isinstance(actions, Mapping):
            raise ValueError(
                f"`actions` is a dict of batches ({sorted(actions)}); SB3 takes one action per "
                f"env for a Dict space: pass a list of {self.num_envs} dicts (nothing was sent)."
            )
        check_rows(None if per_env else self.action_space, "actions", actions, self.num_envs, "env")
        if per_env:
            try:
                actions = stack(self.action_space, list(actions))
            except (KeyError, IndexError, TypeError, ValueError) as err:
                raise ValueError(
                    f"`actions` holds an action that does not fit `action_space` "
                    f"{self.action_space} ({type(err).__name__}: {err}); pass one action of "
                    "that space per env (nothing was sent)."
                ) from err
        return actions

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Wait for the step; finished envs are reset in the same step."""
        return self._engine.step_wait(None, self._results)

    def _results(self, batch: Batch) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        rewards, terminations, truncations = batch.arrays()
        dones = terminations | truncations
        time_limits = (truncations & ~terminations).tolist()
        # A list and dicts made for this batch (as `DummyVecEnv` writes into its envs' infos)
        infos: list[dict[str, Any]] = batch.infos
        if dones.any():
            for env in np.flatnonzero(dones).tolist():  # the info of the episode's end;
                info = infos[env]  # the reset's is kept in `reset_infos`
                final, observation = dict(info.pop("final_info", {})), info.pop("final_obs", None)
                self.reset_infos[env] = info
                if batch.old_api and final.get("TimeLimit.truncated"):  # (old gym's
                    time_limits[env] = True  # `TimeLimit`, read as SB3's shimmy reads it)
                final["TimeLimit.truncated"] = time_limits[env]
                final["terminal_observation"] = observation  # (DummyVecEnv's key order)
                infos[env] = final
        for info, time_limit in zip(infos, time_limits, strict=True):
            info["TimeLimit.truncated"] = time_limit
        rewards = rewards.astype(np.float32)
        return self._observations(batch.observations), rewards, dones, infos

    def close(self) -> None:
        """Close every env and kill the worker actors (within `timeout`, 30 s if None)."""
        self._engine.close()

    @property
    def remote_envs(self) -> tuple[Any, ...]:
        """The worker actors."""
        return tuple(worker.actor for worker in self._engine.workers)

    def node_ids(self) -> tuple[str, ...]:
        """The id (hex) of the Ray node each env runs on, by env index."""
        return self._engine.node_ids()

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` frame (``render_mode`` must be ``"rgb_array"``)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but `get_images` needs 'rgb_array'; "
                "make the envs with `render_mode='rgb_array'`.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return self._each("call", None, ("render",))

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        """Attribute `attr_name` of the envs at `indices` (all by default)."""
        return self._each("get_attr", indices, (attr_name,))

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has attribute `attr_name` (looking through its wrappers)."""
        return all(self._each("has_attr", None, (attr_name,)))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        """Set attribute `attr_name` of the envs at `indices` (all by default) to `value`.

        As SB3's own vector envs, on each env's outermost wrapper; use
        ``env_method("set_wrapper_attr", attr_name, value)`` to set it where it is defined.
        """
        self._each("set_attr", indices, (attr_name, value), {"outermost": True})

    def env_method(
        self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call method `method_name` of the envs at `indices` (all by default)."""
        return self._each("call", indices, (method_name, *method_args), method_kwargs)

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: Any = None
    ) -> list[bool]:
        """Whether each env at `indices` is wrapped in `wrapper_class`."""
        return self._each("is_wrapped", indices, (wrapper_class,))

    def _each(
        self,
        method: str,
        indices: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        chosen: list[int] = []
        for index in self._get_indices(indices):
            if isinstance(index, bool) or not isinstance(index, numbers.Integral):
                raise TypeError(f"`indices` must hold ints, got {index!r}.")
            if not -self.num_envs <= index < self.num_envs:
                raise ValueError(
                    f"`indices` contains {index} but there are {self.num_envs} envs "
                    f"(valid indices are {-self.num_envs}..{self.num_envs - 1}, as for a list)."
                )
            chosen.append(int(index) % self.num_envs)
        wanted = set(chosen)
        per_env = [args if i in wanted else None for i in range(self.num_envs)]
        results = self._engine.call(method, per_env, [kwargs or {}] * self.num_envs)
        return [results[i] for i in chosen]

    def _observations(self, batch: Any) -> Any:
        """The batch as SB3 hands it out: a copy; a Dict space's an `OrderedDict` in key order."""
        observations = copy_batch(batch)
        if isinstance(self.observation_space, gym.spaces.Dict):
            return OrderedDict((key, observations[key]) for key in self.observation_space)
        return observations


def make_sb3_vec_env(
    env: str | Callable[..., gym.Env[Any, Any]] | None = None,
    num_envs: int | None = None,
    *legacy: int,
    monitor: bool = False,
    seed: int | np.random.SeedSequence | None = None,
    make_env: Callable[[int], gym.Env[Any, Any]] | None = None,
    **options: Unpack[MakeOptions],
) -> SB3VecEnv:
    """Envs in Ray workers as one SB3 `VecEnv`: ``make_sb3_vec_env("CartPole-v1", 8)``.

    `env`, `num_envs`, `make_env` (the old name of `env`) and the `MakeOptions` (the counts,
    ``env_kwargs``, ``wrappers`` and the `WorkerOptions`) are as for `make_vector_env`; with
    `monitor`, each env is wrapped in SB3's ``Monitor`` first, as SB3's ``make_vec_env`` does
    (so ``ep_rew_mean`` is logged and ``evaluate_policy`` finds the episode statistics). With
    `seed`, env ``i`` is seeded ``seed + i`` at the first reset (a
    `numpy.random.SeedSequence`: independent seeds).
    """
    first_wrappers = []
    if monitor:
        from stable_baselines3.common.monitor import Monitor

        first_wrappers.append(Monitor)
    env_fns, layout, worker = made_from(
        make_sb3_vec_env,
        env,
        num_envs,
        options,
        cpus=ray_cpus,
        legacy=legacy,
        make_env=make_env,
        first_wrappers=first_wrappers,
    )
    return SB3VecEnv(env_fns, envs_per_worker=layout, seed=seed, **worker)
