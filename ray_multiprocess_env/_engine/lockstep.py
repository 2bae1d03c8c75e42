"""The lockstep verbs of the `Engine`: `step` (one verb), `step_async`/`step_wait`, `step_envs`.

Each sends a step and waits for every env it steps: first-ready with the whole batch
(`Lanes.read` waiting for every ticket), where `first_ready.py` waits for the first envs in.

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
from ray_multiprocess_env._engine.failures import partial_replies
from ray_multiprocess_env._engine.first_ready import FirstReadyVerbs
from ray_multiprocess_env._engine.interrupts import DEFERRED, deferred_interrupts
from ray_multiprocess_env._engine.options import check_wait
from ray_multiprocess_env._engine.results import Batch
from ray_multiprocess_env._engine.splits import ticket_positions
from ray_multiprocess_env._engine.transports.base import deadline_in
from ray_multiprocess_env.errors import RemoteEnvError

__all__ = ["LockstepVerbs"]


class LockstepVerbs(FirstReadyVerbs):
    """The lockstep verbs of `Engine` (which provides the attributes of `FirstReadyVerbs`)."""

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
        deadline = deadline_in(self._pool.options.timeout)
        call = None
        try:
            with DEFERRED:  # sent, read and handed out in one block (`_read`)
                call = self._send_step(actions, None, "step")
                batch = self._read(call, deadline)
                if batch is not None:
                    return hand_out(
                        self._state, self._pool.lost_episodes, (), None, lambda: finish(batch)
                    )
            return self._wait_slow(call, None, deadline, finish)
        except KeyboardInterrupt:
            self._given_up(call)
            raise

    def step_async(self, actions: Any, *, label: str = "step_async") -> None:
        """Send one action per env (a batch of the action space, or a sequence); don't wait."""
        self._state.check_idle(label)
        with deferred_interrupts():  # sent and pending, or neither
            self._state.begin_step(self._send_step(actions, None, "step"))

    def step_wait(
        self,
        timeout: float | None = None,
        finish: Callable[[Batch], T] = as_is,
    ) -> T:
        """The results of `step_async` (on a `TimeoutError` it stays pending: call again)."""
        if timeout is not None:  # (checked before the step is taken: a typo loses nothing)
            timeout = check_wait(timeout)
        deadline = deadline_in(self._pool.options.timeout if timeout is None else timeout)
        call = None
        try:
            with DEFERRED:  # taken, read and handed out in one block, as `step` does (`_read`)
                call = self._state.take_pending()
                batch = self._read(call, deadline)
                if batch is not None:
                    return hand_out(
                        self._state, self._pool.lost_episodes, (), None, lambda: finish(batch)
                    )
            return self._wait_slow(call, timeout, deadline, finish)
        except KeyboardInterrupt:
            self._given_up(call)
            raise

    def _given_up(self, call: Call | None) -> None:
        """A Ctrl-C ended a step verb after `call` was sent (or taken): the step is given up.

        Its envs owe what it carried (`Failures.abandon`), wherever the Ctrl-C landed: in the
        verb's guarded block (where `_read` has it abandoned already: once more does
        nothing), between that block and the failures branch's wait, after the wait, or
        after the hand-out returned; the user has no results. Not a step that a timeout made
        pending again (`_wait_slow`, for `step` and `step_wait`): it stays waitable.
        """
        if call is not None and self._state.pending is not call:
            self._failures.abandon(call)

    def _read(self, call: Call, deadline: float | None, env_ids: Any = None) -> Batch | None:
        """`call`'s step's batch if every worker answered in place (None: the failures branch's).

        One road for every step, however it was sent: while every worker is on its lane (not
        while lost-episode reports are owed: `Lanes.now`), the answers are read there
        (`Lanes.read`, then `Lanes.batch`); anything else (an env error, a death, a timeout,
        infos off the columns, an earlier answer still due, a transport with no lanes) leaves
        the call to the failures branch, which waits on the same tickets and judges them
        (`_wait_slow`, `Calls.wait`). Call it in the caller's block that holds interrupts back
        (the outermost one), where the step was sent or taken and its batch is handed out: a
        Ctrl-C gives the step up, its envs owing what it carried (`Failures.abandon`), and so does
        anything raised out of the read.
        """
        DEFERRED.undo_on_interrupt(self._failures.abandon, call)
        lanes = self._lanes
        try:
            if lanes is None or lanes.now() is None or not lanes.read(call.tickets, None, deadline):
                return None
            return lanes.batch(call.tickets, env_ids)
        except BaseException:  # (what a SIGINT handler of the user's own raises, say)
            self._failures.abandon(call)
            raise

    def _wait_slow(
        self,
        call: Call,
        timeout: float | None,
        deadline: float | None,
        finish: Callable[[Batch], T],
    ) -> T:
        """The batch of `call`, a step of every env, on the failures branch (`_read` left it).

        After a `TimeoutError` the step stays pending (`step_wait` waits again).
        """
        try:
            replies = self._calls.wait(call, timeout, resumable=True, deadline=deadline)
        except TimeoutError:
            self._state.keep_pending(call)
            raise
        except RemoteEnvError as error:
            self._attach_results(error, call)
            raise
        return hand_out(
            self._state, self._pool.lost_episodes, (), None, self._made(call, replies, finish)
        )

    def _made(
        self,
        call: Call,
        replies: list[Any],
        finish: Callable[[Batch], T],
        envs: Any = None,
        every_env: bool = False,
    ) -> Callable[[], T]:
        """What makes the face's result of a step or reset `call` from its workers' `replies`.

        `envs`: the envs it ran, if not all (`step_envs`, a masked reset); the batch has
        only their rows, unless `every_env` (a reset's batch has every env's rows). For the
        hand-out (`hand_out`) of a call `Calls.wait` waited for (and `Failures.judge` judged): the
        result is made in its block
        (a Ctrl-C before it has returned owes the reports it carried again).
        """
        if self._store is None:
            return lambda: finish(
                Batch(None, None, None, None, None, rows=self._calls.spread(replies))
            )
        ids = None if every_env else envs
        return lambda: finish(self._assemble(replies, _positions(call, replies), envs, ids))

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
        ids = np.array(sorted(env_ids), dtype=np.int64)
        deadline = deadline_in(self._pool.options.timeout)
        call = None
        try:
            with DEFERRED:  # sent, read and handed out in one block, as `step` does (`_read`)
                call = self._send_step(actions, env_ids, label)
                batch = self._read(call, deadline, ids)
                if batch is not None:
                    return hand_out(self._state, lost_episodes, (), ids, lambda: finish(batch))
            replies = self._calls.wait(call, deadline=deadline)
            make = self._made(call, replies, finish, ids)
            return hand_out(self._state, lost_episodes, (), ids, make)
        except KeyboardInterrupt:
            self._given_up(call)
            raise

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


def _positions(call: Call, replies: list[Any]) -> list[Any]:
    """Where each worker's envs ran in `call` (`ticket_positions`; None: all, or not called)."""
    positions: list[Any] = [None] * len(replies)
    for ticket in call.tickets:
        positions[ticket.worker] = ticket_positions(ticket)
    return positions
