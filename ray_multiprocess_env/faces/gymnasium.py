"""`GymnasiumVectorEnv`: a real `gymnasium.vector.VectorEnv` backed by Ray worker actors.

Each worker holds several envs and steps them in one call with gymnasium's autoreset semantics;
the engine hands back whole batches (observations, rewards, flags and gymnasium's batched infos,
assembled by the workers, in shared memory on this node), and this face keeps only gymnasium's
conventions: ``copy``, ``reset_mask``, the DISABLED mode's check, ``env_id`` in a `recv`'s
infos. RLlib's new API stack uses it through gymnasium's ``vector_entry_point``
(`gymnasium_make.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_differing_spaces, batch_space, iterate

from ray_multiprocess_env._engine import Batch, Engine, Options
from ray_multiprocess_env._engine.options import (
    check_base_seed,
    check_env_ids,
    check_length,
    check_observation_mode,
    check_seed_list,
)
from ray_multiprocess_env.batch import check_rows, copy_batch, read_only
from ray_multiprocess_env.errors import RemoteEnvError, env_list

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ray_multiprocess_env.options import WorkerOptions

__all__ = ["GymnasiumVectorEnv"]

StepReturn = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class GymnasiumVectorEnv(VectorEnv[Any, Any, Any]):
    """A `gymnasium.vector.VectorEnv` whose envs live in Ray worker actors.

    Behaves like `gymnasium.vector.SyncVectorEnv` (same batched arrays, infos with ``_key``
    masks, ``reset_mask``, autoreset modes), with the envs stepped in parallel by worker
    actors of `envs_per_worker` envs each.

    Args:
        env_fns: One picklable factory per env, called inside its worker.
        envs_per_worker: How many envs each worker actor holds, in env order (the last may
            hold fewer), or one count per worker (``[2, 2, 1, 1]``: 4 workers for 6 envs).
        autoreset_mode: ``"next_step"`` (default; what RLlib needs), ``"same_step"`` or
            ``"disabled"``, or a `gymnasium.vector.AutoresetMode`.
        seed: If given, the first `reset` seeds env ``i`` with ``seed + i`` unless it brings
            seeds of its own (and the batched action space is seeded with ``seed``); a
            `numpy.random.SeedSequence` gives independent seeds instead (see
            `make_vector_env`).
        check_actions: Check each env's action against ``single_action_space`` on the driver
            before sending; an action outside it raises `ValueError` naming the env.
        copy: As gymnasium's `AsyncVectorEnv`: with True (default) `reset` and `step` return
            observations of their own; with False, read-only views of the engine's batch itself
            (the shared memory on this node), which the next `step` or `reset` overwrites: copy
            what you keep, and change nothing in place.
        observation_mode: As gymnasium's `SyncVectorEnv`: ``"same"`` (default: every env has
            the same observation space), ``"different"`` (spaces of one shape and dtype whose
            bounds differ, batched with `gymnasium.vector.utils.batch_differing_spaces`) or a
            ``(batched, single)`` pair of spaces, taken as the vector env's.
        **options: Where and how the workers run and what a failure does: `WorkerOptions`
            (``actor_options``, ``placement``, ``timeout``, ``on_actor_failure``,
            ``transport``, ``on_env_error``, ``max_restarts``).

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
        envs_per_worker: int | Sequence[int] = 1,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        seed: int | np.random.SeedSequence | None = None,
        check_actions: bool = False,
        copy: bool = True,
        observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]] = "same",
        **options: Unpack[WorkerOptions],
    ) -> None:
        super().__init__()
        action_seed = check_base_seed(seed)
        single, batched = check_observation_mode(observation_mode)
        checked = Options.make(
            options,
            where=type(self).__name__,
            own=type(self).__init__,
            autoreset_mode=autoreset_mode,
            check_actions=check_actions,
        )
        self.autoreset_mode = checked.autoreset_mode
        self._check_actions = checked.check_actions
        self._also = (  # (the end of a bad action batch's message)
            ""
            if self._check_actions
            else " With `check_actions=True`, each action is also checked against "
            "`single_action_space` before it is sent."
        )
        self._engine = Engine.start(
            env_fns, envs_per_worker, checked, name=type(self).__name__, observation_mode=single
        )
        spec = self._engine.spec
        self.num_envs = spec.num_envs
        self.observation_mode = observation_mode
        self.single_observation_space = spec.observation_space
        self.single_action_space = spec.action_space
        if batched is not None:
            self.observation_space = batched
        elif single == "different":
            self.observation_space = batch_differing_spaces(spec.observation_spaces)
        else:
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {**spec.metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = spec.render_mode
        self.copy = copy
        self._finished = np.zeros(self.num_envs, dtype=np.bool_)
        # (a SeedSequence is read now: spawning from it later must not change these seeds)
        self._initial_seed = None if seed is None else check_seed_list(seed, self.num_envs)
        if action_seed is not None:
            self.action_space.seed(action_seed)

    def reset(
        self,
        *,
        seed: int | np.random.SeedSequence | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all envs, or those with a True entry in ``options["reset_mask"]``.

        Args:
            seed: None, an int (env ``i`` gets ``seed + i``), a `numpy.random.SeedSequence`
                (independent seeds, see `make_vector_env`) or one seed per env.
            options: Passed to each env's reset; ``"reset_mask"`` (a bool array of shape
                ``(num_envs,)``) picks the envs to reset.

        Returns:
            The batched observations and the batched info dict.
        """
        seeds = self._seeds(seed)
        options = dict(options) if options is not None else None
        mask = None
        if options is not None and "reset_mask" in options:
            mask = self._check_reset_mask(options.pop("reset_mask"))
        return self._engine.reset(seeds, options, mask, finish=lambda b: self._reset_done(b, mask))

    def _reset_done(self, batch: Batch, mask: np.ndarray | None) -> tuple[Any, dict[str, Any]]:
        """`reset`'s results, and the face's note of the reset (in the hand-out)."""
        self._initial_seed = None
        self._finished[mask if mask is not None else slice(None)] = False
        return self._observations(batch), batch.infos

    def step(self, actions: Any) -> StepReturn:
        """Step every env with its action from the batched `actions`.

        Returns:
            Batched observations, rewards (float64), terminations, truncations and infos.
        """
        self._check_step(actions)
        return self._finish(lambda: self._engine.step(actions, finish=self._results))

    def step_async(self, actions: Any) -> None:
        """Send the batched `actions` and return at once; `step_wait` collects the results."""
        self._check_step(actions)
        self._engine.step_async(actions)

    def _check_step(self, actions: Any) -> None:
        check_rows(
            self.single_action_space, "actions", actions, self.num_envs, "env", also=self._also
        )
        if self.autoreset_mode is AutoresetMode.DISABLED:
            self._check_not_finished(range(self.num_envs))
        if self._check_actions:
            self._check_in_space(actions, range(self.num_envs))

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        """Wait for the results of `step_async` and return them as `step` does.

        On a `TimeoutError` the step stays pending: call `step_wait` again to wait longer.
        """
        return self._finish(lambda: self._engine.step_wait(timeout, self._results))

    def _finish(self, wait: Callable[[], StepReturn]) -> StepReturn:
        """A step's results from `wait`; a failed step's error carries them if all answered."""
        try:
            return wait()
        except RemoteEnvError as error:
            if error._batch is not None:  # every worker answered: what the step gave
                error.results = self._failed_results(error._batch, error.env_indices)
            raise

    def _failed_results(self, batch: Batch, failed_envs: Sequence[int]) -> StepReturn:
        """`RemoteEnvError.results`: what a failed step gave, with no lost-episode report in it.

        The step did not reach the user, so the reports in it stay owed and the next step of
        each env delivers them (the one rule, `lost_episodes.py`): such an env is shown not
        done, marked in ``infos["lost_episode_pending"]``; ``infos["env_error"]`` marks the
        envs that failed.
        """
        observations, rewards, terminations, truncations, infos = self._results(batch)
        every = np.ones(self.num_envs, dtype=np.bool_)
        failed = np.isin(np.arange(self.num_envs), failed_envs)
        pending = np.zeros(self.num_envs, dtype=np.bool_)
        for key in ("env_crashed", "env_error"):
            infos.pop(key, None)
            pending |= np.asarray(infos.pop(f"_{key}", False), dtype=np.bool_)
        # (a report is a truncation with reward 0; an env rebuilt after its episode's end
        # raised in the autoreset carries `env_error` too, and its episode end is its own)
        pending &= ~failed & truncations & ~terminations & (rewards == 0)
        truncations[pending] = False
        for key in ("_final_obs", "_final_info"):  # (same-step autoreset: no episode ended)
            if key in infos:
                infos[key] = infos[key] & ~pending
        self._finished = terminations | truncations
        infos["env_error"], infos["_env_error"] = failed, every
        infos["lost_episode_pending"], infos["_lost_episode_pending"] = pending, every.copy()
        return observations, rewards, terminations, truncations, infos

    def _results(self, batch: Batch) -> StepReturn:
        rewards, terminations, truncations = batch.arrays()
        rewards, terminations, truncations = (  # (their own)
            np.array(rewards),
            np.array(terminations),
            np.array(truncations),
        )
        self._finished = terminations | truncations
        return self._observations(batch), rewards, terminations, truncations, batch.infos

    def _observations(self, batch: Batch) -> Any:
        """The batched observations, handed out once.

        Arrays of their own (``copy=True``), else read-only views of the engine's batch, valid
        until its next call.
        """
        if not batch.shared:
            return batch.observations
        return copy_batch(batch.observations) if self.copy else read_only(batch.observations)

    # -- first-ready stepping (envpool's send/recv) -----------------------------------------
    def async_reset(
        self, *, seed: int | np.random.SeedSequence | Sequence[int | None] | None = None
    ) -> None:
        """Reset every env without waiting; `recv` then returns them as they finish."""
        self._engine.async_reset(self._seeds(seed), noted=self._async_reset_sent)

    def _async_reset_sent(self) -> None:
        """The face's note of an `async_reset`: made in the block that sends it."""
        self._initial_seed = None
        self._finished[:] = False

    def send(self, actions: Any, env_ids: Sequence[int]) -> None:
        """Step the envs `env_ids` with the batched `actions` (row i for env ``env_ids[i]``).

        Returns at once; `recv` collects the results of the envs that finish first.
        """
        env_ids = check_env_ids(env_ids, self.num_envs)
        check_rows(
            self.single_action_space, "actions", actions, len(env_ids), "env id", also=self._also
        )
        self._check_not_finished(env_ids)
        self._check_in_space(actions, env_ids)
        self._engine.send(actions, env_ids)

    def recv(self, batch_size: int | None = None, timeout: float | None = None) -> StepReturn:
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
        return self._engine.recv(batch_size, timeout, self._received)

    def _received(self, batch: Batch) -> StepReturn:
        rewards, terminations, truncations = batch.arrays()
        if self.autoreset_mode is AutoresetMode.DISABLED:  # (only that mode checks it)
            self._finished[batch.env_ids] = terminations | truncations
        infos = batch.infos
        infos["env_id"] = batch.env_ids
        return batch.observations, rewards, terminations, truncations, infos

    # -- calls on every env -------------------------------------------------------------------
    def render(self) -> tuple[Any, ...]:
        """Return the frame of each env (its ``render()``)."""
        return self.call("render")

    def call(self, name: str, /, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method `name` of every env (or read a non-callable attribute); one per env."""
        per_env: list[tuple[Any, ...] | None] = [(name, *args)] * self.num_envs
        return tuple(self._engine.call("call", per_env, [kwargs] * self.num_envs, label=name))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return attribute `name` of every env."""
        return tuple(self._engine.call("get_attr", [(name,)] * self.num_envs))

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute `name` of every env: a list or tuple gives one value per env."""
        if isinstance(values, (list, tuple)):
            check_length("values", values, self.num_envs, "one value per env, or a single value")
            per_env = list(values)
        else:
            per_env = [values] * self.num_envs
        self._engine.call("set_attr", [(name, v) for v in per_env])

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
        return tuple(worker.actor for worker in self._engine.workers)

    def node_ids(self) -> tuple[str, ...]:
        """The id (hex) of the Ray node each env runs on, by env index."""
        return self._engine.node_ids()

    def close_extras(self, **kwargs: Any) -> None:
        """Close every env and kill the worker actors (within `timeout`, 30 s if None)."""
        engine = getattr(self, "_engine", None)  # None if __init__ failed (gymnasium 1.2
        if engine is not None:  # closes in __del__)
            engine.close()

    # -- helpers ------------------------------------------------------------------------------
    def _seeds(self, seed: Any) -> list[int | None]:
        """One seed per env; the constructor's `seed` if this is the first reset and has none.

        A reset sets ``_initial_seed = None`` once it returned (`_reset_done`; `async_reset`:
        once sent, `_async_reset_sent`): the constructor's seed is for the first reset only,
        whether or not that reset brought its own.
        """
        return check_seed_list(self._initial_seed if seed is None else seed, self.num_envs)

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
                f"env(s) {env_list(finished)} finished their episode and `autoreset_mode` is "
                "DISABLED; reset them first with `reset(options={'reset_mask': mask})`."
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
