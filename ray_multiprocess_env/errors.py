"""The exceptions raised by `ray_multiprocess_env`.

User errors (bad arguments) are plain `TypeError`/`ValueError`; the classes here are for what goes
wrong on the remote side. Each names the env index and the method, and is chained
(`raise ... from err`) to Ray's own error so the remote traceback stays attached.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError

__all__ = [
    "ClosedEnvError",
    "EnvCrashedError",
    "NoPendingCallError",
    "PendingCallError",
    "RemoteEnvError",
    "SpacesMismatchError",
]


def env_list(indices: Iterable[int]) -> str:
    """Env indices as a message shows them: runs of three or more as ranges.

    Example:
        >>> env_list([0, 1, 2, 3, 5, 7, 8])
        '[0-3, 5, 7, 8]'
    """
    parts: list[str] = []
    run: list[int] = []
    for index in [*indices, None]:
        if run and index is not None and index == run[-1] + 1:
            run.append(index)
            continue
        if len(run) >= 3:
            parts.append(f"{run[0]}-{run[-1]}")
        else:
            parts.extend(str(i) for i in run)
        run = [] if index is None else [index]
    return f"[{', '.join(parts)}]"


class RemoteEnvError(RuntimeError):
    """An env raised an exception inside its actor.

    Attributes:
        env_index: The index (``0..num_envs-1``) of the first env that failed.
        method: The name of the env method that was called.
        env_indices: Every env index that failed in the same call, in order.
        remote_traceback: Ray's report of the failure, with the traceback from the actor.
        worker_results: For a batched ``step``, ``(observations, rewards, terminations,
            truncations)`` of each worker's envs by worker index, copies, where every worker
            answered: the raw rows, lost-episode reports included (`results` leaves them out).
        results: For a batched ``step`` of `GymnasiumVectorEnv`, what ``step`` would have
            returned: the envs that did not fail as they stepped (a terminal transition
            included), a failed env with its last observation, reward 0, not done and
            ``infos["env_error"]`` (True for the envs that failed); None where not every
            worker answered. This step was not handed out, so a lost-episode report it
            carried (a restarted worker's or a rebuilt env's) is not in it: that env is shown
            not done, with its new first observation and ``infos["lost_episode_pending"]``,
            and its next step reports the lost episode (docs/failures.md: each report
            reaches the user once).
    """

    def __init__(
        self,
        env_index: int,
        method: str,
        cause: BaseException,
        *,
        env_indices: Sequence[int] | None = None,
        num_envs: int | None = None,
        next_step: str | None = None,
    ) -> None:
        self._num_envs = num_envs  # (of the vector env, where known: for the hint)
        self._next_step = next_step  # (what an `EnvCrashedError` says to do; None: its default)
        self.env_index = env_index
        self.method = method
        self.env_indices = tuple(env_indices) if env_indices is not None else (env_index,)
        self.remote_traceback = _ANSI_ESCAPE.sub("", str(cause))
        self.worker_results: dict[int, Any] = {}
        self.results: Any = None
        self._batch: Any = None  # the engine's record of what a failed step gave
        others = [i for i in self.env_indices if i != env_index]
        also = f" (env(s) {env_list(others)} failed in the same call too)" if others else ""
        super().__init__(
            f"env {env_index} failed in `{method}`{also}: {_describe(cause)}\n"
            f"{self._hint()} The remote traceback is in this error's `__cause__`."
        )

    def _hint(self) -> str:
        failed = sorted(set(self.env_indices))
        reset = (
            f"reset env {failed[0]} to use it again."
            if len(failed) == 1
            else f"reset envs {env_list(failed)} to use them again."
        )
        if self._num_envs is None or len(failed) >= self._num_envs:
            return reset[0].upper() + reset[1:]
        return f"The other envs keep their state; {reset}"


class EnvCrashedError(RemoteEnvError):
    """The actor holding an env died (its process crashed, was killed, or its `__init__` failed)."""

    def _hint(self) -> str:
        if "its factory raised" in self.remote_traceback:
            hint = (
                "An env factory raised in its worker: fix the factory, or what it needs where "
                "the worker runs (files, a display, modules); "
            )
            if self.method == "start":
                return hint + f"{self._none_started()}. Then make the vector env again."
            return hint + "the next call tries to restart the worker again."
        gone = sorted(set(self.env_indices))
        what = f"env {gone[0]}, and its" if len(gone) == 1 else f"envs {env_list(gone)}, and their"
        hint = f"The worker of {what} state, are gone; " + (
            self._next_step or "create a new actor (or a new vector env) to continue."
        )
        if "ModuleNotFoundError" in self.remote_traceback:
            hint += (
                " The worker could not import a module the driver has: install it on every "
                "node, or ship it with `ray.init(runtime_env={'py_modules': [module]})` (or "
                "`{'working_dir': '.'}`) before the first env is made."
            )
        return hint

    def _none_started(self) -> str:
        """The envs a failed start leaves unmade: all of them (the workers are stopped)."""
        every = f" {env_list(range(self._num_envs))}" if self._num_envs is not None else ""
        return f"none of the envs{every} started (every worker was stopped)"


class ClosedEnvError(RuntimeError):
    """A method was called on a vector env after `close()`."""


class SpacesMismatchError(ValueError, RuntimeError):
    """The envs' spaces do not fit one vector env (the env that differs is named).

    A `ValueError`, as for any bad argument, and the `RuntimeError` that gymnasium's
    `AsyncVectorEnv` raises for such envs, so that code written for either catches it.
    """


class PendingCallError(AlreadyPendingCallError, RuntimeError):
    """A call was made while another one (`step_async`, `send`, ...) waits to be collected."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message, name)


class NoPendingCallError(NoAsyncCallError, RuntimeError):
    """`step_wait` or `recv` was called with nothing to collect."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message, name)


class _WorkerError(Exception):
    """An exception from a worker that could not be sent as it is (it does not pickle)."""

    def __init__(self, type_name: str, message: str, text: str) -> None:
        super().__init__(type_name, message, text)
        self.type_name, self.message, self.text = type_name, message, text

    def __str__(self) -> str:
        return self.text


class RemoteFailure(Exception):
    """A failure reported by a worker over a pipe; `cause` holds it, as Ray's errors do."""

    def __init__(self, cause: BaseException, text: str) -> None:
        super().__init__(text)
        self.cause = cause


class _EnvFailures(Exception):
    """Raised inside a worker actor when some of its envs failed in one call.

    ``failures`` holds ``(env_index, exception type name, message, traceback text)`` for each
    env that raised; the worker steps its other envs before raising this.
    """

    def __init__(
        self, method: str, failures: Sequence[tuple[int, str, str, str]], partial: Any = None
    ) -> None:
        super().__init__(method, list(failures), partial)
        self.method = method
        self.failures = list(failures)
        self.partial = partial  # the result of the envs that did not fail, where there is one

    @property
    def env_indices(self) -> list[int]:
        """The global indices of the envs that failed."""
        return [failure[0] for failure in self.failures]

    def __str__(self) -> str:
        return "\n".join(
            f"env {index} failed in `{self.method}`:\n{text}" for index, _, _, text in self.failures
        )


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*: \S")
#: What Ray's `ActorDiedError` says of an actor whose process ended unasked, and its pid line.
_PROCESS_DIED = "because its worker process has died"
_PID_LINE = re.compile(r"^\s*pid: (\d+)", re.M)
_EXIT_TYPE = re.compile(r"Worker exit type: (\w+)")


def process_ended(error: BaseException) -> bool:
    """Whether `error` (Ray's, as a transport kept it) says the worker's process has ended."""
    return _PROCESS_DIED in str(error)


def _describe(cause: BaseException) -> str:
    """One line saying what went wrong: the env's own exception where Ray kept it."""
    original = getattr(cause, "cause", None)  # a RayTaskError keeps the env's exception here
    if isinstance(original, _EnvFailures):
        _, type_name, message, _ = original.failures[0]
        return f"{type_name}: {_first_line(message)}"
    if isinstance(original, _WorkerError):
        return f"{original.type_name}: {_first_line(original.message)}"
    if isinstance(original, BaseException):
        return f"{type(original).__name__}: {_first_line(str(original))}"
    text = _ANSI_ESCAPE.sub("", str(cause))
    if process_ended(cause):
        pid = _PID_LINE.search(text)
        which = f" (pid {pid.group(1)})" if pid is not None else ""
        kind = _EXIT_TYPE.search(text)
        exit_type = kind.group(1) if kind is not None else "SYSTEM_ERROR"
        if exit_type == "SYSTEM_ERROR":  # (Ray's guesses of why follow: it knows only that)
            return f"its worker process{which} is gone: it ended without raising an error"
        if exit_type == "NODE_OUT_OF_MEMORY":
            return f"its worker process{which} was killed by Ray: its node ran low on memory"
        return f"its worker process{which} is gone (Ray's exit type: {exit_type})"
    summary = f"{type(cause).__name__}: {_first_line(text).split(' (pid=')[0]}"
    raised = [line for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
    return f"{summary}; it raised {raised[-1]}" if raised else summary


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else "(no message)"
