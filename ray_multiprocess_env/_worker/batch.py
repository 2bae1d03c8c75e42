"""`WorkerBatch`: a worker's batched ``reset`` and ``step`` of its envs, into its rows.

It steps the worker's envs one after the other with gymnasium's autoreset semantics (or none,
for pfrl), writes each env's observation, reward and flags into the worker's rows
(`WorkerRows`) and hands its infos to the worker's `InfoBatcher` (gymnasium's layout) or keeps
them per env. An env that raises keeps its state and the others go on; the failures are
raised together afterwards with the reply of the others, unless the env is to be rebuilt
(``on_env_error="restart"``): then it is built again from its factory and reset, and its
episode is reported as truncated with ``info["env_error"]``. A worker that replaced a lost one
reports each lost episode at that env's next step. A report stays with the env after it is sent,
until the env's next step or reset (`WorkerBatch.reported`): if the step that carried it never
reached the user (another env's error, an interrupt, a restart that failed), the driver has it
sent again (`WorkerBatch.rearm`) before the env's next step, for a lost worker's report
(``env_crashed``) and a rebuilt env's (``env_error``) alike.

A plain class, not the actor: Ray wraps every method of an actor class for tracing, which
would cost a little on each env of each step. This module imports nothing of the driver side.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from ray_multiprocess_env._protocol.infos import InfoBatcher
from ray_multiprocess_env._protocol.status import Reply
from ray_multiprocess_env._worker.rows import WorkerRows
from ray_multiprocess_env.batch import unstack
from ray_multiprocess_env.compat import from_step, reset_env, restart_seed
from ray_multiprocess_env.errors import _EnvFailures

__all__ = ["Rebuild", "WorkerBatch"]


class Rebuild:
    """What rebuilding envs that raise needs (``on_env_error="restart"``).

    Their factories, their last seeds, and how many times each was rebuilt (against
    `max_restarts`, None: no limit).
    """

    def __init__(self, env_fns: Sequence[Any], max_restarts: int | None) -> None:
        self.env_fns, self.max_restarts = list(env_fns), max_restarts
        self.seeds: list[int | None] = [None] * len(self.env_fns)
        self.counts = [0] * len(self.env_fns)


class _NotRebuilt(Exception):
    """An env's autoreset raised and it could not be rebuilt: `reported` says why."""

    def __init__(self, reported: Exception) -> None:
        super().__init__(str(reported))
        self.reported = reported


class WorkerBatch:
    """Resets and steps `envs` (global indices `env_indices`) into `rows` (module docstring)."""

    def __init__(
        self,
        envs: list[Any],
        env_indices: list[int],
        rows: WorkerRows,
        autoreset_mode: AutoresetMode,
        batched_infos: bool,
        rebuild: Rebuild | None = None,
    ) -> None:
        self.envs, self.env_indices, self.rows = envs, env_indices, rows
        self._rebuild = rebuild
        self._next_step = autoreset_mode == AutoresetMode.NEXT_STEP
        self._same_step = autoreset_mode == AutoresetMode.SAME_STEP
        self._batched_infos = batched_infos
        self.batcher = InfoBatcher()
        self._env_infos: dict[int, dict[str, Any]] = {}
        self._autoreset = [False] * len(envs)
        # (obs, reset info, old_api, why) of a lost episode, until it is reported; then kept in
        # `reported` until the env's next step or reset (the driver may ask for it: `rearm`)
        self.lost: list[Any] = [None] * len(envs)
        self.reported: list[Any] = [None] * len(envs)
        self.any_reported = False  # whether `reported` holds any (read once per step)
        self._action_space: Any = getattr(envs[0], "action_space", None)
        self._action_batches: dict[int, Any] = {}

    def restarted(self, seeds: Sequence[int | None]) -> None:
        """These envs replace envs whose worker was lost: reset them now with `seeds`."""
        for k, env in enumerate(self.envs):
            obs, info, old_api = reset_env(env, seeds[k])
            self.lost[k] = (obs, info, old_api, {"env_crashed": True})
            self.rows.write_obs(k, obs)
            if self._rebuild is not None and seeds[k] is not None:
                self._rebuild.seeds[k] = seeds[k]

    def rearm(self, positions: Sequence[int]) -> None:
        """Report again the lost episodes that the last step of the envs at `positions` sent.

        The driver asks this before the next step of envs whose last step did not reach the
        user; an env whose last step sent no report, or that was reset since, has none to
        give (nor one still to send: it is kept).
        """
        for k in positions:
            if self.lost[k] is None and self.reported[k] is not None:
                self.lost[k] = self.reported[k]

    def take_lost(self, k: int) -> tuple[Any, dict[str, Any], bool, dict[str, Any]]:
        """Env `k`'s lost episode, reported now (and kept in `reported`)."""
        report = self.reported[k] = self.lost[k]
        self.lost[k] = None
        self.any_reported = True
        return report  # type: ignore[no-any-return]

    def forget_reports(self, positions: Sequence[int] | None) -> None:
        """The envs at `positions` (None: all) step again: their last reports reached the user.

        (The driver sends a `rearm` first where one did not.)
        """
        reported = self.reported
        for k in range(len(reported)) if positions is None else positions:
            reported[k] = None
        self.any_reported = any(report is not None for report in reported)

    def note_seed(self, k: int, seed: Any) -> None:
        """Env `k` was seeded with `seed` by its own ``seed`` method (old gym): rebuilds use it."""
        if self._rebuild is not None and isinstance(seed, int) and not isinstance(seed, bool):
            self._rebuild.seeds[k] = seed

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None,
        mask: Sequence[bool] | None,
    ) -> Reply:
        """Reset the envs (those with a True `mask` entry only), as gymnasium does.

        `options` is one dict for every env, or one (dict or None) per env. An env reset has
        reward 0 and is not done.
        """
        positions = None if mask is None else [k for k, m in enumerate(mask) if m]
        self._start(positions)
        failures, old_api, rows = [], False, self.rows
        for k in range(len(self.envs)) if positions is None else positions:
            rows.terminations[k] = rows.truncations[k] = self._autoreset[k] = False
            rows.rewards[k], self.lost[k], self.reported[k] = 0.0, None, None
            env_options = options if options is None or isinstance(options, dict) else options[k]
            if self._rebuild is not None and seeds[k] is not None:
                self._rebuild.seeds[k] = seeds[k]
            try:
                obs, info, old = reset_env(self.envs[k], seeds[k], env_options)
            except Exception as err:
                rebuilt, reported = self._rebuilt(k, err, seeds[k], env_options)
                if rebuilt is None:
                    failures.append(self.failure(k, reported))
                    continue
                obs, info, old = rebuilt
            old_api |= old
            rows.write_obs(k, obs)
            self._add_info(k, info)
        return self._reply("reset", positions, old_api, failures)

    def step(self, actions: Any, positions: Sequence[int] | None) -> Reply:
        """Step the envs (those at `positions` only) with gymnasium's autoreset.

        `actions` holds a batch for those envs, or is None: they are in shared memory.
        """
        count = len(self.envs) if positions is None else len(positions)
        rows = self.rows
        if actions is None:
            actions = rows.actions(positions)
        if self.any_reported:
            self.forget_reports(positions)
        self._start(positions)
        failures, old_api = [], False
        add = self.batcher.add if self._batched_infos else self._add_info  # (once per call)
        ks = range(count) if positions is None else positions
        for k, action in zip(ks, unstack(self._action_batch(count), actions), strict=True):
            try:
                old_api |= self._step_one(k, action, add)
            except _NotRebuilt as err:  # its autoreset raised and it could not be rebuilt
                rows.rewards[k], rows.terminations[k], rows.truncations[k] = 0.0, False, False
                failures.append(self.failure(k, err.reported))
            except Exception as err:
                rows.rewards[k], rows.terminations[k], rows.truncations[k] = 0.0, False, False
                rebuilt, reported = self._rebuilt(k, err)
                if rebuilt is None:
                    failures.append(self.failure(k, reported))
                    continue
                obs, info, old = rebuilt  # reported now, as an episode lost with its worker
                self.lost[k] = (obs, info, old, {"env_error": info.pop("env_error")})
                old_api |= self._report_lost(k)
        return self._reply("step", positions, old_api, failures)

    def _step_one(self, k: int, action: Any, add: Callable[[int, dict[str, Any]], None]) -> bool:
        """Step env `k` (the hot path); whether it spoke old gym's API. `add` takes its infos.

        The common case (no report owed, no autoreset due, gymnasium's 5 items) is written
        out here, without a call per step beyond the env's own, its observation's row and its
        infos' (`add`: the batcher's own, when batched): it runs once per env and step.
        """
        if self.lost[k] is not None:
            return self._report_lost(k)
        rows, autoreset = self.rows, self._autoreset
        if autoreset[k] and self._next_step:
            obs, info, old_api = self._autoreset_env(k)
            rows.rewards[k], rows.terminations[k], rows.truncations[k] = 0.0, False, False
            autoreset[k] = False
        else:
            result = self.envs[k].step(action)
            if type(result) is tuple and len(result) == 5:
                obs, reward, terminated, truncated, info = result
                old_api = False
            else:
                obs, reward, terminated, truncated, info, old_api = from_step(result)
            rows.rewards[k], rows.terminations[k], rows.truncations[k] = (
                reward,
                terminated,
                truncated,
            )
            autoreset[k] = done = bool(terminated or truncated)
            if done and self._same_step:
                self._add_info(k, {"final_obs": obs, "final_info": info})
                obs, info, _ = self._autoreset_env(k)
        rows.write_obs(k, obs)
        if info:
            add(k, info)
        return old_api

    def _report_lost(self, k: int) -> bool:
        """Report env `k`'s lost episode as truncated (reward 0), its new first observation.

        Its info says why (``env_crashed``: its worker was lost; ``env_error``: it raised and
        was rebuilt). Old gym (pfrl): not done, with ``info["needs_reset"]``.
        """
        obs, reset_info, old_api, why = self.take_lost(k)
        rows = self.rows
        rows.rewards[k], rows.terminations[k], rows.truncations[k] = 0.0, False, True
        self._autoreset[k] = self._next_step
        rows.write_obs(k, obs)
        if self._same_step:
            self._add_info(k, {"final_obs": obs, "final_info": dict(why)})
        if old_api:
            self._add_info(k, {"needs_reset": True, **why})
        else:
            self._add_info(k, {**reset_info, **why})
        return bool(old_api)

    def _autoreset_env(self, k: int) -> tuple[Any, dict[str, Any], bool]:
        """Reset env `k` after its episode ended; rebuilt (not raised) if that reset raises.

        The episode's end was already reported, so a rebuilt env only starts the next one
        (with ``info["env_error"]``). Raises `_NotRebuilt` if it cannot be rebuilt.
        """
        try:
            return reset_env(self.envs[k])
        except Exception as err:
            rebuilt, reported = self._rebuilt(k, err)
            if rebuilt is None:
                raise _NotRebuilt(reported) from err
            return rebuilt

    def _rebuilt(
        self, k: int, err: Exception, seed: int | None = None, options: Any = None
    ) -> tuple[tuple[Any, dict[str, Any], bool] | None, Exception]:
        """Env `k` built again and reset after it raised `err`, if policy and budget allow.

        Returns ``((obs, info with "env_error", old_api), err)``, or ``(None, the error to
        report)``: `err` itself without ``on_env_error="restart"``, else an error that says
        the budget is spent or the rebuild failed, chained to `err`. The new env is reset with
        `seed` and `options` (a reset that raised), or with a seed derived from its last.
        """
        rebuild = self._rebuild
        if rebuild is None:
            return None, err
        index, done = self.env_indices[k], rebuild.counts[k]
        if rebuild.max_restarts is not None and done >= rebuild.max_restarts:
            budget = RuntimeError(
                f"env {index} raised {type(err).__name__}: {err}, and was rebuilt {done} times "
                f"already: `max_restarts={rebuild.max_restarts}` allows no more (raise it, or "
                "pass None for no limit)"
            )
            budget.__cause__ = err
            return None, budget
        with contextlib.suppress(Exception):
            self.envs[k].close()
        rebuild.counts[k] += 1
        if seed is None:
            seed = restart_seed(rebuild.seeds[k], rebuild.counts[k], rebuilt=True)
        try:
            self.envs[k] = rebuild.env_fns[k]()
            obs, info, old_api = reset_env(self.envs[k], seed, options)
        except Exception as failed:
            why = RuntimeError(
                f"env {index} raised {type(err).__name__}: {err}, and rebuilding it from its "
                f"factory failed: {type(failed).__name__}: {failed}; reset it to try again"
            )
            why.__cause__ = failed
            return None, why
        self._autoreset[k] = False
        self.rows.write_obs(k, obs)
        return (obs, {**info, "env_error": f"{type(err).__name__}: {err}"}, old_api), err

    def _action_batch(self, count: int) -> Any:
        batched = self._action_batches.get(count)
        if batched is None:
            batched = self._action_batches[count] = batch_space(self._action_space, count)
        return batched

    def _start(self, positions: Sequence[int] | None) -> None:
        """Begin a call of the envs at `positions` (all if None): no infos yet."""
        if self._batched_infos:
            self.batcher.start(slice(None) if positions is None else positions)
        else:
            self._env_infos = {}

    def _add_info(self, k: int, info: dict[str, Any]) -> None:
        if not info:
            return
        if self._batched_infos:
            self.batcher.add(k, info)
        elif k in self._env_infos:
            self._env_infos[k] = {**self._env_infos[k], **info}
        else:
            self._env_infos[k] = info

    def _reply(
        self,
        op: str,
        positions: Sequence[int] | None,
        old_api: bool,
        failures: list[tuple[int, str, str, str]],
    ) -> Reply:
        infos = self.batcher.finish() if self._batched_infos else self._env_infos
        reply = self.rows.reply(positions, infos, old_api)
        if failures:
            raise _EnvFailures(op, failures, partial=reply)
        return reply

    def failure(self, k: int, err: Exception) -> tuple[int, str, str, str]:
        """How env `k`'s exception `err` is reported: its index, type, message, traceback."""
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        return (self.env_indices[k], type(err).__name__, str(err), text)
