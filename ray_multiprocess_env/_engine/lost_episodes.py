"""Lost-episode reports the driver still owes the user, until a call hands them over.

When a worker is lost and restarted, each of its envs reports its lost episode as truncated
(``info["env_crashed"]``) at its next step; an env rebuilt in its worker after it raised
(``on_env_error="restart"``) reports its episode so at the step that rebuilt it
(``info["env_error"]``). That report belongs to the env, not to the call that first carried
it: the call may still fail for another env's error, be interrupted, or see another restart
fail, and then the report never reaches the user. The one rule: a report reaches the user once,
in the results of a call that returns (a failed step's ``error.results`` mark it as pending,
`RemoteEnvError`). So the pool marks every env of a restarted worker as owed
(`LostEpisodes.owe`), a step given up before its results reached the user marks its envs
(`LostEpisodes.owe_again`: the driver need not know whether a report was in it), a verb that
returns an env's step (or resets it) settles it (`LostEpisodes.deliver`), and until then every
step sent to an owed env is preceded by a ``rearm`` operation, on which the worker restores the
report its last step of that env sent, if any (`WorkerBatch.rearm`). A worker runs its
operations in order, so the step that follows reports the lost episode again, never an env
stepped past it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ray_multiprocess_env._engine.transports.base import Ticket, Transport, method_of

__all__ = ["LostEpisodes"]


class LostEpisodes:
    """Which of `num_envs` envs still owe the user a lost-episode report (module docstring)."""

    __slots__ = ("_owed", "_since", "any")

    def __init__(self, num_envs: int) -> None:
        self._owed = np.zeros(num_envs, dtype=np.bool_)
        self._since = np.zeros(num_envs, dtype=np.int64)  # the worker generation that owes
        self.any = False  # whether any env is owed (read on the hot path: one attribute)

    def owe(self, envs: range, generation: int) -> None:
        """The envs `envs` lost their episodes; their worker's `generation` reports them."""
        self._owed[envs.start : envs.stop] = True
        self._since[envs.start : envs.stop] = generation
        self.any = True

    def owe_again(self, envs: Iterable[int] | None) -> None:
        """A step of `envs` (None: every env) was given up before the user had its results.

        Whatever report it carried is owed (the worker keeps it until the env's next step);
        an env owed already keeps the worker generation that owes it.
        """
        if envs is None:
            self._owed[:] = True
        else:
            positions = np.fromiter(envs, dtype=np.int64)
            if not positions.size:  # (nothing owed: `any` would send the next step the slow way)
                return
            self._owed[positions] = True
        self.any = True

    def owe_tickets(self, tickets: Iterable[Ticket]) -> None:
        """The steps of `tickets` that were sent were given up: `owe_again` their envs."""
        envs = [
            env
            for t in tickets
            if t.transport is not None and method_of(t) == "step"
            for env in t.envs
        ]
        if envs:
            self.owe_again(envs)

    def deliver(
        self, envs: Iterable[int] | None = None, tickets: Sequence[Ticket] = ()
    ) -> np.ndarray | None:
        """A verb hands the user these envs' steps or resets (None: every env's).

        With `tickets` (first-ready results), their envs instead, each only if its ticket ran
        on the worker that owes the report or a later one: an answer of the lost worker
        itself carries no report. Returns what `restore` needs to undo it (None: nothing was
        owed).
        """
        if not self.any:
            return None
        owed = self._owed
        before: np.ndarray = owed.copy()
        if tickets:
            since = self._since
            for ticket in tickets:
                for env in ticket.envs:
                    if ticket.generation >= since[env]:
                        owed[env] = False
        elif envs is None:
            owed[:] = False
        else:
            owed[np.fromiter(envs, dtype=np.int64)] = False
        self.any = bool(owed.any())
        return before

    def restore(self, before: np.ndarray | None) -> None:
        """Undo a `deliver` (its result) whose call did not reach the user after all."""
        if before is not None:
            self._owed[:] = before
            self.any = bool(before.any())

    def is_owed(self, env: int) -> bool:
        """Whether env `env` still owes its report."""
        return bool(self._owed[env])

    def rearm(self, transport: Transport, ticket: Ticket, first_env: int) -> None:
        """Before `ticket` (a step), have its worker report again what its envs still owe.

        `first_env` is the worker's first env. Nothing is sent when none of them is owed.
        """
        if not self.any or method_of(ticket) != "step":
            return
        owed = self._owed
        positions = [env - first_env for env in ticket.envs if owed[env]]
        if positions:
            rearm = Ticket(ticket.worker, ticket.generation, "rearm", (positions,), ticket.envs)
            transport.submit(rearm)
            transport.forget(rearm)  # (its reply, None, is of no interest)
