"""torch's threads in the driver fitted to the cores the env workers leave, and given back."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest

from ray_multiprocess_env import make_vector_env
from ray_multiprocess_env._engine import driver_threads
from ray_multiprocess_env._engine.driver_threads import TORCH_THREADS_VARIABLE

torch = pytest.importorskip("torch")

_CORES = len(os.sched_getaffinity(0))
_LOGGER = "ray_multiprocess_env._engine.driver_threads"


@pytest.fixture
def many_torch_threads():
    """Give torch more intra-op threads than this machine has cores; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(_CORES + 1)
    yield _CORES + 1
    torch.set_num_threads(before)


class _FakeTorch:
    """Torch's two thread calls; `during` (a call's name) runs `then` inside that call, once."""

    def __init__(self, threads):
        self.threads = threads
        self.during, self.then = None, None

    def get_num_threads(self):
        self._maybe("get_num_threads")
        return self.threads

    def set_num_threads(self, threads):
        self.threads = threads
        self._maybe("set_num_threads")

    def _maybe(self, name):
        if self.during == name:
            self.during = None
            self.then()


def _finishes(function):
    """Whether `function`, run in a thread, returns within 10 s (else it hangs: a deadlock)."""
    errors = []

    def run():
        try:
            function()
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)  # (daemon: a hung one ends with pytest)
    thread.start()
    thread.join(timeout=10)
    if errors:
        raise errors[0]
    return not thread.is_alive()


def _torch_being_fitted(monkeypatch, threads):
    """A `_FakeTorch` imported after one worker was counted: the next `fit_torch` lowers it."""
    monkeypatch.delenv(TORCH_THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fake = _FakeTorch(threads)
    with monkeypatch.context() as not_imported:
        not_imported.delitem(sys.modules, "torch")
        driver_threads.add_workers(1)
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def _assert_nothing_counted_or_changed(fake, threads, when=""):
    """Torch has `threads` and nothing stays counted: a new env's fit and give-back work again."""
    assert fake.threads == threads, f"torch not given back its threads{when}"
    driver_threads.add_workers(1)
    assert fake.threads == driver_threads.threads_left(1), f"no fit for a new env{when}"
    driver_threads.remove_workers(1)
    assert fake.threads == threads, f"no give-back at the new env's close{when}"


def _close(closed):
    """What a vector env's `close()` does here (its one worker uncounted); noted in `closed`."""
    driver_threads.remove_workers(1)
    closed.append(True)


def _vector_env():
    return make_vector_env("CartPole-v1", num_envs=2, num_workers=1)


def _notes(caplog, level=logging.INFO):
    """The library's notes that it changed torch's threads, at `level` or above."""
    records = caplog.records
    return [
        r.getMessage()
        for r in records
        if r.name == _LOGGER and r.levelno >= level and "intra-op threads from" in r.getMessage()
    ]


def test_torch_threads_are_lowered_while_workers_run_here_and_given_back(
    many_torch_threads, caplog, monkeypatch
):
    """More torch threads than cores left: lowered (logged once, with the opt-out), restored."""
    monkeypatch.delenv(TORCH_THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fresh = driver_threads._book._replace(warned=False)  # (as in a fresh process)
    monkeypatch.setattr(driver_threads, "_book", fresh)
    caplog.set_level(logging.INFO, logger=_LOGGER)
    env = _vector_env()
    try:
        lowered = torch.get_num_threads()
        assert 1 <= lowered <= max(1, _CORES - 1)
        (note,) = _notes(caplog, logging.WARNING)
        assert re.search(rf"from {many_torch_threads} to {lowered}\b", note), note
        assert f"{TORCH_THREADS_VARIABLE}=keep" in note
        env.reset(seed=0)  # nothing more to fit: no second note
        env.step(env.action_space.sample())
        assert len(_notes(caplog)) == 1
    finally:
        env.close()
    assert torch.get_num_threads() == many_torch_threads
    _vector_env().close()  # made again: the same change, now at INFO
    assert len(_notes(caplog, logging.WARNING)) == 1
    assert len(_notes(caplog)) == 2


def test_torch_imported_after_the_envs_is_fitted_at_reset(many_torch_threads, monkeypatch):
    """With torch not yet imported when the envs start, the first `reset` fits its threads."""
    monkeypatch.delenv(TORCH_THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with monkeypatch.context() as not_imported:
        not_imported.delitem(sys.modules, "torch")
        env = _vector_env()
    try:
        assert torch.get_num_threads() == many_torch_threads
        env.reset(seed=0)
        assert 1 <= torch.get_num_threads() <= max(1, _CORES - 1)
    finally:
        env.close()
    assert torch.get_num_threads() == many_torch_threads


def test_threads_the_user_sets_after_the_fit_stand_at_reset(many_torch_threads, monkeypatch):
    """`torch.set_num_threads(n)` after making the envs (docs/usage.md's advice) is not undone."""
    monkeypatch.delenv(TORCH_THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = _vector_env()
    try:
        torch.set_num_threads(many_torch_threads)
        env.reset(seed=0)
        env.step(env.action_space.sample())
        env.reset(seed=1)
        assert torch.get_num_threads() == many_torch_threads
    finally:
        env.close()


def test_a_user_who_changed_the_threads_keeps_them_at_close(many_torch_threads, monkeypatch):
    """Threads the user set while the envs ran are not overwritten by the give-back."""
    monkeypatch.delenv(TORCH_THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = _vector_env()
    try:
        torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2)
        chosen = torch.get_num_threads()
    finally:
        env.close()
    assert torch.get_num_threads() == chosen


@pytest.mark.parametrize(
    ("variable", "value"), [(TORCH_THREADS_VARIABLE, "keep"), ("OMP_NUM_THREADS", "3")]
)
def test_the_users_choice_of_threads_is_kept(
    many_torch_threads, caplog, monkeypatch, variable, value
):
    """With `..._TORCH_THREADS=keep` or `OMP_NUM_THREADS` set, the threads stay, nothing logged."""
    monkeypatch.delenv(TORCH_THREADS_VARIABLE, raising=False)
    monkeypatch.setenv(variable, value)
    env = _vector_env()
    try:
        env.reset(seed=0)
        assert torch.get_num_threads() == many_torch_threads
        assert not _notes(caplog)
    finally:
        env.close()


def test_threads_within_the_cores_left_are_not_touched(caplog, monkeypatch):
    """One torch thread already fits: unchanged, nothing logged."""
    monkeypatch.delenv(TORCH_THREADS_VARIABLE, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        env = _vector_env()
        env.reset(seed=0)
        env.close()
        assert torch.get_num_threads() == 1
        assert not _notes(caplog)
    finally:
        torch.set_num_threads(before)


def test_a_bad_value_of_the_variable_names_it_and_the_choices(many_torch_threads, monkeypatch):
    """A misspelt `RAY_MULTIPROCESS_ENV_TORCH_THREADS` is a `ValueError`; nothing stays counted."""
    monkeypatch.setenv(TORCH_THREADS_VARIABLE, "off")
    counted = driver_threads._book.workers
    with pytest.raises(ValueError, match=rf"{TORCH_THREADS_VARIABLE}='off'.*'auto'.*'keep'"):
        _vector_env()
    assert driver_threads._book.workers == counted


def test_the_library_never_imports_torch(ray_address):
    """Envs made and stepped in a process without torch leave torch unimported."""
    script = textwrap.dedent(
        """
        import sys
        from ray_multiprocess_env import make_vector_env
        env = make_vector_env("CartPole-v1", num_envs=2, num_workers=1)
        env.reset(seed=0)
        env.step(env.action_space.sample())
        env.close()
        print("torch imported:", "torch" in sys.modules)
        """
    )
    environ = dict(os.environ, RAY_ADDRESS=ray_address)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environ, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torch imported: False" in result.stdout


@pytest.mark.parametrize("call", ["get_num_threads", "set_num_threads"])
def test_a_close_inside_a_fit_returns_and_gives_torch_back(monkeypatch, call):
    """Envs closed inside a fit's torch call (by a SIGINT handler): it returns, torch given back."""
    fake = _torch_being_fitted(monkeypatch, _CORES + 1)
    closed = []
    fake.during = call
    fake.then = lambda: _close(closed)
    assert _finishes(driver_threads.fit_torch), "the close waits for the fit it interrupted"
    assert closed
    _assert_nothing_counted_or_changed(fake, _CORES + 1)


def test_a_close_at_any_bytecode_of_a_fit_returns_and_gives_torch_back(monkeypatch):
    """A close run between any two bytecodes of a fit (where handlers run): torch given back."""
    ours = vars(driver_threads)
    step = 0
    while True:
        fake = _torch_being_fitted(monkeypatch, _CORES + 1)
        closed, seen = [], [0]

        def close_at_step(frame, event, arg, step=step, closed=closed, seen=seen):
            if event == "call":
                if frame.f_globals is not ours:
                    return None
                frame.f_trace_opcodes = True
            if event == "opcode" and not closed:
                if seen[0] == step:  # (a trace function is not traced: the close runs whole)
                    _close(closed)
                seen[0] += 1
            return close_at_step

        def traced_fit(close_at_step=close_at_step):
            sys.settrace(close_at_step)
            try:
                driver_threads.fit_torch()
            finally:
                sys.settrace(None)

        assert _finishes(traced_fit), f"a close at bytecode {step} of the fit hangs"
        if not closed:  # (past the fit's last bytecode)
            driver_threads.remove_workers(1)
            break
        _assert_nothing_counted_or_changed(fake, _CORES + 1, f" (closed at bytecode {step})")
        step += 1
    assert step > 50  # (the fit's own bytecodes were traced)


def test_a_sigint_handler_that_closes_the_envs_inside_a_fit_returns():
    """A real SIGINT whose handler closes the envs, landing in a `reset`'s fit: it returns."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from ray_multiprocess_env._engine import driver_threads

        class FakeTorch:
            threads, interrupt = {_CORES + 1}, False
            def get_num_threads(self):
                return self.threads
            def set_num_threads(self, threads):
                self.threads = threads
                if self.interrupt:
                    self.interrupt = False
                    signal.raise_signal(signal.SIGINT)  # (Ctrl-C)

        for name in ("{TORCH_THREADS_VARIABLE}", "OMP_NUM_THREADS"):
            os.environ.pop(name, None)
        driver_threads.add_workers(1)  # (torch imported after the envs were made)
        sys.modules["torch"] = torch = FakeTorch()
        signal.signal(signal.SIGINT, lambda *_: driver_threads.remove_workers(1))  # envs.close()
        torch.interrupt = True
        driver_threads.fit_torch()  # (a reset's)
        print("threads after:", torch.threads)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"threads after: {_CORES + 1}" in result.stdout
