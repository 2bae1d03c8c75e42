"""The guard that holds Ctrl-C back (`deferred_interrupts`): a Ctrl-C in it is never lost.

A real SIGINT is raised at each line of the guard's own ``__enter__``, ``__exit__``, ``poll`` and
handler in turn, for a block alone and for a block nested in another: exactly one
`KeyboardInterrupt` must come out (held back to the end of the outermost block once the guard
holds it, or let through at its ``poll``), and the guard must be left as it was found: the same
SIGINT handler, no block counted as open. Each line of ``poll`` is hit again while it waits in
slices (`POLL_SLICE_MS`), and a Ctrl-C that lands just before it blocks must come out after
one slice, not when a worker answers.
"""

from __future__ import annotations

import inspect
import select
import signal
import time

import pytest

from ray_multiprocess_env._engine.interrupts import (
    DEFERRED,
    POLL_SLICE_MS,
    _deliver,
    _run,
    deferred_interrupts,
)
from tests.interrupts import interrupt_at_line, lines_of

GUARD = type(DEFERRED)
LINES = [
    (method, line)
    for method in (GUARD.__enter__, GUARD.__exit__, GUARD._end, GUARD.poll, GUARD._record)
    for line in lines_of(method)
]


#: How long the block's poll may wait: not at all, or three slices (two and a bit's deadline).
WAITS = {"at-once": 0, "in-slices": 2 * POLL_SLICE_MS + 7}
#: Each line alone and nested, waiting at once; and each line of `poll` alone, in slices (the
#: only case where the loop of `poll` goes round).
CASES = [
    pytest.param(method, line, nested, wait, id=f"{method.__name__}:{line}-{kind}-{wait}")
    for method, line in LINES
    for nested, kind in ((False, "alone"), (True, "nested"))
    for wait in WAITS
    if wait == "at-once" or (method is GUARD.poll and not nested)
]


@pytest.mark.parametrize(("method", "line", "nested", "wait"), CASES)
def test_a_ctrl_c_at_any_line_of_the_guard_comes_out_once(method, line, nested, wait):
    handler = signal.getsignal(signal.SIGINT)
    poller = select.poll()
    ran: list[str] = []
    raised = 0
    try:
        with interrupt_at_line(method, line) as fired:
            with deferred_interrupts():
                if nested:
                    with deferred_interrupts():
                        ran.append("inner")
                        DEFERRED.poll(poller, 0)  # (nested: a plain poll, held back)
                else:
                    DEFERRED.poll(poller, WAITS[wait])  # (let through here)
                ran.append("body")
    except KeyboardInterrupt:
        raised += 1
    if not fired:  # (a line for other threads, or for a handler set from C)
        assert raised == 0
        return
    assert raised == 1, "the Ctrl-C was lost"
    assert signal.getsignal(signal.SIGINT) is handler
    assert DEFERRED._depth == 0  # (private) no block is counted as still open
    with pytest.raises(KeyboardInterrupt):  # and the next block holds a Ctrl-C back again
        _held_back(ran)
    assert ran[-1] == "held"


def test_a_ctrl_c_held_back_comes_out_at_the_poll_and_not_again():
    """A SIGINT recorded before `poll` is raised there, once; the block's end raises none."""
    ran: list[str] = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():  # noqa: PT012
        signal.raise_signal(signal.SIGINT)
        ran.append("held")
        DEFERRED.poll(select.poll(), 0)
        ran.append("after the poll")
    assert ran == ["held"]
    assert DEFERRED._depth == 0  # (private)
    with deferred_interrupts():  # (nothing left over)
        ran.append("next")


class _SignallingPoller:
    """A poller whose `poll` raises two SIGINTs, as if two Ctrl-Cs came while it blocked."""

    def poll(self, timeout: int | None) -> list[tuple[int, int]]:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        return []


def test_a_handler_that_returns_gets_every_ctrl_c_while_the_poll_blocks():
    """A user's SIGINT handler that does not raise: each SIGINT in `poll` runs it at once."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with deferred_interrupts():
            DEFERRED.poll(_SignallingPoller(), 0)
            assert len(calls) == 2  # (both at once, none held back to the block's end)
        assert len(calls) == 2
    finally:
        signal.signal(signal.SIGINT, previous)


class _IdlePoller:
    """A real poller of nothing: it only ever waits out its timeout.

    It notes each timeout it was given, and whether a Ctrl-C was held back then (recorded by
    the guard, not raised yet).
    """

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, bool]] = []
        self._poller = select.poll()

    def poll(self, timeout: int | None) -> list[tuple[int, int]]:
        self.calls.append((timeout, bool(DEFERRED._received)))  # (private)
        assert timeout is not None, "asked to block for good"
        return self._poller.poll(timeout)  # type: ignore[no-any-return]


def test_a_ctrl_c_that_lands_as_the_poll_begins_comes_out_after_one_slice():
    """A SIGINT whose handler runs just before `poll` blocks is raised after one slice.

    That is where a Ctrl-C from another thread most often lands: as the main thread lets go of
    the GIL to block. Blocking for good (no deadline) with it held back kept a call waiting
    until a worker answered, which for a step stuck in a hung env is never.
    """
    source, first = inspect.getsourcelines(GUARD.poll)
    line = first + next(i for i, text in enumerate(source) if "self._open = True" in text)
    poller, ran = _IdlePoller(), []
    with pytest.raises(KeyboardInterrupt), interrupt_at_line(GUARD.poll, line) as fired:  # noqa: PT012
        with deferred_interrupts():
            DEFERRED.poll(poller, None)  # (no deadline)
            ran.append("after the poll")
    assert fired
    assert poller.calls == [(POLL_SLICE_MS, True)]  # one slice, and raised from the poll
    assert ran == []
    assert DEFERRED._depth == 0  # (private)


def test_a_wait_with_a_deadline_is_cut_into_slices_and_ends_at_it_not_before():
    """After two slices the last one waits what is left by the clock, and never ends early."""
    poller, timeout = _IdlePoller(), 2 * POLL_SLICE_MS + 7
    start = time.monotonic()
    with deferred_interrupts():
        assert DEFERRED.poll(poller, timeout) == []
    waited = time.monotonic() - start
    slices = [t for t, _ in poller.calls]
    assert slices[:2] == [POLL_SLICE_MS, POLL_SLICE_MS]
    assert len(slices) == 3
    assert 0 <= slices[2] <= 7  # (less by as much as the first two ran late)
    assert waited >= timeout / 1000  # (a poll never ends before its timeout)


def _hand_out(log: list[str]) -> None:
    """What a hand-out does (`call_state.hand_out`): take, have the guard undo it, make."""
    try:
        with deferred_interrupts():
            log.append("taken")
            DEFERRED.undo_on_interrupt(_put_back, log)
            return log.append("made")
    except KeyboardInterrupt:
        _put_back(log)  # (done already, as a rule: then nothing)
        raise


def _put_back(log: list[str]) -> None:
    """All or nothing, and once (as `call_state.put_back`)."""
    with deferred_interrupts():
        if "taken" in log and "put back" not in log:
            log.append("put back")
            log.append("owed again")


#: A hand-out and the guard's code it runs.
HAND_OUT = [
    _hand_out,
    GUARD.__enter__,
    GUARD.undo_on_interrupt,
    GUARD.__exit__,
    GUARD._end,
    _run,
    _put_back,
]
#: Where the first Ctrl-C lands: every line of those.
UNDO_LINES = [
    pytest.param(method, line, id=f"{method.__name__}:{line}")
    for method in HAND_OUT
    for line in lines_of(method)
]
#: Where a key held down sends Ctrl-C again, at every line, once the first one is out.
HELD_DOWN = [*HAND_OUT, _deliver]


@pytest.mark.parametrize(("method", "line"), UNDO_LINES)
@pytest.mark.parametrize("held", [False, True], ids=["once", "held-down"])
def test_a_hand_outs_undo_runs_in_full_exactly_when_its_ctrl_c_comes_out(method, line, held):
    """A Ctrl-C held back in a hand-out is raised after its undo, which a second cannot cut.

    One `KeyboardInterrupt` comes out. Out of the hand-out, after the undo ran in full, once:
    with the key held down too, since the guard still holds SIGINT back while the undo runs.
    One before the hand-out takes anything, or after it returned, has nothing to undo. (The key
    is held down only after a Ctrl-C the guard held back: one it did not is raised in the
    trace function, which that unsets. So the window where a second Ctrl-C can cut the
    caller's undo, after a first that lands as the guard lets go, is not reached here.)
    """
    handler = signal.getsignal(signal.SIGINT)
    log: list[str] = []
    raised = 0
    try:
        with interrupt_at_line(method, line, HELD_DOWN if held else ()) as fired:
            _hand_out(log)
            log.append("returned")
    except KeyboardInterrupt:
        raised += 1
    assert signal.getsignal(signal.SIGINT) is handler
    assert DEFERRED._depth == 0  # (private)
    if not fired:  # (a line for other threads, or for a handler set from C)
        assert (raised, log) == (0, ["taken", "made", "returned"])
        return
    assert raised == 1, "the Ctrl-C was lost"
    if "returned" in log or not log:  # (after the hand-out, or before it took anything)
        assert log in ([], ["taken", "made", "returned"]), log
    else:
        assert log == ["taken", "made", "put back", "owed again"]
    with pytest.raises(KeyboardInterrupt):  # and the next block holds a Ctrl-C back again
        _held_back(log)
    assert log[-1] == "held"


def test_an_undo_runs_when_the_block_raises_keyboard_interrupt_under_a_handler_that_returns():
    """A `KeyboardInterrupt` raised inside the block comes out of it: its undo runs.

    Even when a Ctrl-C was held back too and the user's own SIGINT handler, run for it at the
    block's end, returns instead of raising.
    """
    calls: list[int] = []
    log: list[str] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with pytest.raises(KeyboardInterrupt), deferred_interrupts():  # noqa: PT012
            log.append("taken")
            DEFERRED.undo_on_interrupt(_put_back, log)
            signal.raise_signal(signal.SIGINT)  # (held back)
            raise KeyboardInterrupt  # (as one let through at a `poll` would be)
        assert calls == [signal.SIGINT]
        assert log == ["taken", "put back", "owed again"]
        assert DEFERRED._depth == 0  # (private)
    finally:
        signal.signal(signal.SIGINT, previous)


def _held_back(ran: list[str]) -> None:
    with deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        ran.append("held")
