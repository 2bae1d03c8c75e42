"""The guard that holds Ctrl-C back (`deferred_interrupts`): a Ctrl-C in it is never lost.

A real SIGINT is raised at each line of the guard's own ``__enter__`` and ``__exit__`` in turn,
for a block alone and for a block nested in another: exactly one `KeyboardInterrupt` must come
out (held back to the end of the outermost block once the guard holds it), and the guard must be
left as it was found: the same SIGINT handler, no block counted as open.
"""

from __future__ import annotations

import signal

import pytest

from ray_multiprocess_env._engine.interrupts import DEFERRED, deferred_interrupts
from tests.interrupts import interrupt_at_line, lines_of

GUARD = type(DEFERRED)
LINES = [
    (method, line) for method in (GUARD.__enter__, GUARD.__exit__) for line in lines_of(method)
]


@pytest.mark.parametrize("nested", [False, True], ids=["alone", "nested"])
@pytest.mark.parametrize(("method", "line"), LINES, ids=[f"{m.__name__}:{n}" for m, n in LINES])
def test_a_ctrl_c_at_any_line_of_the_guard_comes_out_once(method, line, nested):
    handler = signal.getsignal(signal.SIGINT)
    ran: list[str] = []
    raised = 0
    try:
        with interrupt_at_line(method, line) as fired:
            with deferred_interrupts():
                if nested:
                    with deferred_interrupts():
                        ran.append("inner")
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


def _held_back(ran: list[str]) -> None:
    with deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        ran.append("held")
