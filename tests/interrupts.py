"""Ctrl-C at a chosen moment: at a line of the library, or once a worker is inside a step.

`interrupt_inside` waits for both: a step inside its gate and the main thread inside a call.

A real SIGINT is raised in this process when the main thread reaches the chosen line; Python
runs its handler at the next bytecode boundary where it checks for signals, exactly as for a
Ctrl-C typed at that moment (`deferred_interrupts` holds it back where the library asks).
Nothing here waits a guessed number of seconds.
"""

from __future__ import annotations

import contextlib
import dis
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import CodeType
from typing import Any

__all__ = [
    "Gate",
    "interrupt_at_line",
    "interrupt_inside",
    "line_of",
    "lines_of",
    "rounds_of",
    "wait_at_gate",
]


def lines_of(function: Callable[..., Any]) -> list[int]:
    """The line numbers where `function`'s body has code, in order (its ``def`` line left out)."""
    code = function.__code__
    lines = sorted({line for _, line in dis.findlinestarts(code) if line is not None})
    return [line for line in lines if line > code.co_firstlineno]


def line_of(function: Callable[..., Any], text: str) -> int:
    """The first line of `function` whose source holds `text`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(k for k, line in enumerate(lines) if text in line)


def rounds_of(functions: list[Callable[..., Any]]) -> list[tuple[Callable[..., Any], int]]:
    """``(function, line)`` for every line of each of `functions` (`lines_of`): one per round."""
    return [(function, line) for function in functions for line in lines_of(function)]


@contextlib.contextmanager
def interrupt_at_line(
    function: Callable[..., Any],
    line: int,
    held: Sequence[Callable[..., Any]] = (),
    within: Sequence[Callable[..., Any]] = (),
) -> Iterator[list[bool]]:
    """Raise SIGINT the first time the main thread runs `line` of `function` in the block.

    With `within`, only a run of it called (at any depth) from one of those functions counts.

    With `held`, a key held down: once that Ctrl-C's `KeyboardInterrupt` is raised in one of
    those functions, SIGINT again at every line of them the main thread runs, until the block
    ends. (Python unsets a trace function that raises, as this one does when a handler raises
    for a SIGINT it sent; a profile function sets it again at the next call or return.)
    Yields a list that holds True once the first signal was raised (empty if the line never
    ran).
    """
    code: CodeType = function.__code__
    again = {f.__code__ for f in held}
    callers = {f.__code__ for f in within}
    fired: list[bool] = []
    out: list[bool] = []  # (the first KeyboardInterrupt is out)

    def local(frame: Any, event: str, arg: Any) -> Any:
        if fired:
            if frame.f_code not in again:
                return local
            if event == "exception" and issubclass(arg[0], KeyboardInterrupt):
                out.append(True)
            elif event == "line" and out:
                signal.raise_signal(signal.SIGINT)
        elif (
            event == "line"
            and frame.f_code is code
            and frame.f_lineno == line
            and (not callers or _on_stack(frame.f_back, callers))
        ):
            fired.append(True)
            signal.raise_signal(signal.SIGINT)
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code or frame.f_code in again else None

    def rearm(frame: Any, event: str, arg: Any) -> None:
        """Once a Ctrl-C raised in `local` unset the tracing, set it again (the key is down)."""
        if out and sys.gettrace() is None:
            sys.settrace(calls)
            while frame is not None:  # (the frames running: traced from their next line on)
                if frame.f_code in again:
                    frame.f_trace = local
                frame = frame.f_back

    previous, previous_profile = sys.gettrace(), sys.getprofile()
    sys.settrace(calls)
    if held:
        sys.setprofile(rearm)
    try:
        yield fired
    finally:
        sys.setprofile(previous_profile)  # (first: else it would set the tracing again)
        sys.settrace(previous)


def _on_stack(frame: Any, codes: set[CodeType]) -> bool:
    """Whether `frame` or one of the frames that called it runs one of `codes`."""
    while frame is not None and frame.f_code not in codes:
        frame = frame.f_back
    return frame is not None


class Gate:
    """A step that waits at a gate: the test sees it enter, then lets it through.

    Give ``str(gate)`` to an env's ``gate`` attribute (`tests.envs.FlakyEnv`): its next steps
    each create ``entered-<pid>-<n>`` in the gate's folder and then wait until ``open`` exists.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __str__(self) -> str:
        return self.folder

    def entered(self) -> int:
        """How many steps have entered the gate so far."""
        return sum(name.startswith("entered-") for name in os.listdir(self.folder))

    def wait_entered(
        self, count: int = 1, within: float = 60.0, stop: threading.Event | None = None
    ) -> bool:
        """Return True once `count` steps have entered (a worker is inside its step).

        False as soon as `stop` is set, if it is given, before they have.
        """
        ends = time.monotonic() + within
        while self.entered() < count:
            if stop is not None and stop.is_set():
                return False
            if time.monotonic() > ends:
                raise AssertionError(f"no step entered the gate {self.folder} in {within} s")
            time.sleep(0.005)
        return True

    def open(self) -> None:
        """Let every step waiting at the gate through (and every later one)."""
        with open(os.path.join(self.folder, "open"), "w"):
            pass

    def interrupt_when_entered(self, count: int = 1) -> AbstractContextManager[None]:
        """Send SIGINT to the main thread once `count` steps are inside the gate."""
        return _interrupt_when(lambda done: self.wait_entered(count))


@contextlib.contextmanager
def _interrupt_when(ready: Callable[[threading.Event], bool]) -> Iterator[None]:
    """Send SIGINT to the main thread once `ready(done)` returns True, if the block is on.

    `ready` runs in a thread of its own; `done` is set when the block ends.
    """
    main = threading.main_thread().ident
    assert main is not None
    done = threading.Event()

    def interrupt() -> None:
        if ready(done) and not done.is_set():
            signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=60)


def interrupt_inside(
    function: Callable[..., Any], gate: Gate, count: int = 1
) -> AbstractContextManager[None]:
    """Send SIGINT to the main thread once it runs `function` and `count` steps are in `gate`.

    For a call that cannot return before the gate opens (it waits for a step inside the gate):
    the Ctrl-C then lands inside `function`, wherever the main thread is in it. Nothing is sent
    if no step enters before the block ends, nor if the main thread is not seen in `function`
    within 60 s (the call then returns with no KeyboardInterrupt: the test's to see).
    """
    main = threading.main_thread().ident
    code: CodeType = function.__code__

    def inside() -> bool:
        return _on_stack(None if main is None else sys._current_frames().get(main), {code})

    def ready(done: threading.Event) -> bool:
        if not gate.wait_entered(count, stop=done):
            return False
        ends = time.monotonic() + 60.0
        while not done.is_set() and time.monotonic() < ends:
            if inside():
                return True
            time.sleep(0.001)
        return False

    return _interrupt_when(ready)


def wait_at_gate(folder: str) -> None:
    """In an env's step: say so in `folder`, then wait until the gate opens (at most 60 s).

    A step that waited the 60 s leaves ``timed-out-<pid>-<n>`` there too.
    """
    index = 0
    while True:
        try:
            os.close(
                os.open(
                    os.path.join(folder, f"entered-{os.getpid()}-{index}"), os.O_CREAT | os.O_EXCL
                )
            )
            break
        except FileExistsError:
            index += 1
    ends = time.monotonic() + 60.0
    while not os.path.exists(os.path.join(folder, "open")):
        if time.monotonic() > ends:
            os.close(os.open(os.path.join(folder, f"timed-out-{os.getpid()}-{index}"), os.O_CREAT))
            break
        time.sleep(0.002)
