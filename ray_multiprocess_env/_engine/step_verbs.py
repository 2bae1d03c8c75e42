"""The step verbs of the `Engine`: `step` (one verb), `step_async`/`step_wait`, `step_envs`.

A face's `step` is one engine verb: it sends and waits, so a Ctrl-C can never split it into a
step left pending that the user did not start (a `TimeoutError` does leave it pending, as
gymnasium's `AsyncVectorEnv` does: `step_wait` waits again). Each verb hands its batch out
through `hand_out`, with the face's own conversion (`finish`) inside, so the lost-episode
reports in it count as delivered only once the face has its results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ray_multiprocess_env._engine.call_state import Call, T, as_is, hand_out
from ray_multiprocess_env._engine.calls import partial_replies
from ray_multiprocess_env._engine.first_ready import FirstReadyVerbs
from ray_multiprocess_env._engine.interrupts import DEFERRED, deferred_interrupts
from ray_multiprocess_env._engine.options import check_wait
from ray_multiprocess_env._engine.results import Batch
from ray_multiprocess_env._engine.transports.base import deadline_in
from ray_multiprocess_env.batch import split_batch
from ray_multiprocess_env.errors import RemoteEnvError

__all__ = ["StepVerbs"]


class StepVerbs(FirstReadyVerbs):
    """The step verbs of `Engine` (which provides the attributes of `FirstReadyVerbs`)."""

    def step(
        self,
        actions: Any,
        *,
        label: str = "step",
        finish: Callable[[Batch], T] = as_is,
    ) -> T:
        """Step every env and wait: `step_async` and `step_wait` as one verb.

        A Ctrl-C gives the step up (the next call of any verb works); a `TimeoutError` leaves
        it pending, as `step_wait`'s does: call `step_wait` again to wait longer. `finish`
        turns the batch into what the face returns, inside the hand-out (`hand_out`): the
        lost-episode reports in it count as delivered only once it has returned.
        """
        self._state.check_idle(label)
        lanes = self._lanes
        plan = None if lanes is None else lanes.plan(actions)
        deadline = deadline_in(self._pool.options.timeout)
        if lanes is None or plan is None:
            return self._wait_slow(self._launch_slow(actions), None, deadline, finish)
        # Rung, waited for and handed out in one block. A Ctrl-C held back while it rings, or
        # coming while it waits, comes through in `poll` (`Lanes.read`) and gives the step
        # up; one after the last `poll` is raised at the block's end, once the face has its
        # results made (its bookkeeping as the envs are). Nothing is taken out of the call
        # state on this road, and no report was owed (else `plan` leaves the step to the
        # slow path): a step given up owes only what its own replies carried.
        with DEFERRED:
            call = lanes.ring(plan, "step")
            batch = lanes.wait_batch(call, deadline)
            if batch is not None:
                return hand_out(
                    self._state, self._pool.lost_episodes, (), None, lambda: finish(batch)
                )
        return self._wait_slow(call, None, deadline, finish)

    def step_async(self, actions: Any, *, label: str = "step_async") -> None:
        """Send one action per env (a batch of the action space, or a sequence); don't wait."""
        self._state.check_idle(label)
        with deferred_interrupts():  # sent and pending, or neither
            self._state.begin_step(self._launch_step(actions))

    def step_wait(
        self,
        timeout: float | None = None,
        finish: Callable[[Batch], T] = as_is,
    ) -> T:
        """The results of `step_async` (on a `TimeoutError` it stays pending: call again)."""
        if timeout is not None:  # (checked before the step is taken: a typo loses nothing)
            timeout = check_wait(timeout)
        deadline = deadline_in(self._pool.options.timeout if timeout is None else timeout)
        lanes = self._lanes
        # Taken, waited for and handed out in one block, as `step` does on the lanes: a Ctrl-C
        # gives the step up whole, its envs owing what it carried (`Lanes.wait_batch`; on the
        # slow path, `Calls.abandon`).
        with DEFERRED:
            call = self._state.take_pending()
            if lanes is not None and call.lanes:
                batch = lanes.wait_batch(call, deadline)
                if batch is not None:
                    return hand_out(
                        self._state, self._pool.lost_episodes, (), None, lambda: finish(batch)
                    )
            else:
                DEFERRED.undo_on_interrupt(self._calls.abandon, call)
        return self._wait_slow(call, timeout, deadline, finish)

    def _launch_step(self, actions: Any) -> Call:
        """Send a step of every env (nothing is sent if it raises)."""
        lanes = self._lanes
        call = None if lanes is None else lanes.launch(actions, "step")
        return self._launch_slow(actions) if call is None else call

    def _launch_slow(self, actions: Any) -> Call:
        """`_launch_step` on the slow path (not the lanes')."""
        if self._store is None:
            return self._calls.launch_apply("step", [(a,) for a in actions], None, "step")
        bounds = [(w.envs.start, w.envs.stop) for w in self._pool.workers]
        chunks = split_batch(self.spec.action_space, actions, bounds)
        args = [(chunk, None) for chunk in chunks]
        return self._calls.launch("step", args, "step", shared_args=True)

    def _wait_slow(
        self,
        call: Call,
        timeout: float | None,
        deadline: float | None,
        finish: Callable[[Batch], T],
    ) -> T:
        """The batch of `call`, a step of every env, on the slow path; pending after a timeout.

        (The lanes did not take the step, or gave it over.)
        """
        try:
            replies = self._calls.wait(call, timeout, resumable=True, deadline=deadline)
        except TimeoutError:
            self._state.keep_pending(call)
            raise
        except RemoteEnvError as error:
            self._attach_results(error, call)
            raise
        if self._store is None:
            rows = self._calls.spread(replies)
            make = lambda: finish(Batch(None, None, None, None, None, rows=rows))  # noqa: E731
        else:
            make = lambda: finish(self._assemble(replies, [None] * len(replies)))  # noqa: E731
        return hand_out(self._state, self._pool.lost_episodes, (), None, make)

    def step_envs(
        self,
        actions: Any,
        env_ids: Sequence[int],
        *,
        label: str = "step",
        finish: Callable[[Batch], T] = as_is,
    ) -> T:
        """Step exactly the envs `env_ids` (row i of `actions` for env ``env_ids[i]``) and wait.

        A synchronous call of its own, with a full step's rules: all or an error, lost (and,
        with no per-call timeout, late) workers restarted, and after an error, a timeout or an
        interrupt the call is given up and the next call of any verb works.

        Returns:
            `finish` (as in `step`) of the batch of those envs, ascending by env
            (`Batch.env_ids`); for envs with no batch layout, `Batch.rows` holds a result per
            env (None for the others).
        """
        self._state.check_idle(label)
        lost_episodes = self._pool.lost_episodes
        if self._store is None:
            per_env: list[tuple[Any, ...] | None] = [None] * self.spec.num_envs
            for env, action in zip(env_ids, actions, strict=True):
                per_env[env] = (action,)
            rows = self._calls.apply("step", per_env, None, label)
            make = lambda: finish(Batch(None, None, None, None, None, rows=rows))  # noqa: E731
            return hand_out(self._state, lost_episodes, (), env_ids, make)
        ids = np.array(sorted(env_ids), dtype=np.int64)
        deadline = deadline_in(self._pool.options.timeout)
        lanes = self._lanes
        plan = None if lanes is None else lanes.plan(actions, env_ids)
        if lanes is not None and plan is not None:  # whole workers' envs, each worker rung
            with DEFERRED:  # rung, waited for and handed out in one block, as `step` does
                call = lanes.ring(plan, label)
                batch = lanes.wait_batch(call, deadline, ids)
                if batch is not None:
                    return hand_out(self._state, lost_episodes, (), ids, lambda: finish(batch))
            positions: list[Any] = [None] * len(self._pool.workers)
        else:
            args, envs = self._split(actions, env_ids)
            call = self._calls.launch("step", args, label, envs, shared_args=True)
            positions = [None if a is None else a[1] for a in args]
        replies = self._calls.wait(call, deadline=deadline)
        make = lambda: finish(self._assemble(replies, positions, ids, ids))  # noqa: E731
        return hand_out(self._state, lost_episodes, (), ids, make)

    def _attach_results(self, error: RemoteEnvError, call: Call) -> None:
        """Give a failed step's `error` what the step would have returned, if all answered."""
        replies = partial_replies(call)
        if replies is None or self._store is None:
            return
        workers = self._pool.workers
        batch = self._assemble([replies.get(w.index) for w in workers], [None] * len(workers))
        error._batch, rows = self._store.kept(batch, [w.envs for w in workers])
        error.worker_results.update(rows)

    def _assemble(
        self,
        replies: Sequence[Any],
        positions: Sequence[Any],
        envs: np.ndarray | None = None,
        ids: np.ndarray | None = None,
    ) -> Batch:
        """The batch after a call of every worker (None: not called) with these replies.

        `envs`: the envs that ran, if not all; `ids`: hand out only those envs' rows.
        """
        answered = [
            (worker.envs.start, reply, where)
            for worker, reply, where in zip(self._pool.workers, replies, positions, strict=True)
            if reply is not None
        ]
        return self._collect(answered, envs, ids)
