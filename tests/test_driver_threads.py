"""torch's threads in the driver fitted to the cores the env workers leave, and given back."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap

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
    monkeypatch.setattr(driver_threads, "_warned", False)  # (as in a fresh process)
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
    """`torch.set_num_threads(n)` after making the envs (the README's advice) is not undone."""
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
    counted = driver_threads._workers_here
    with pytest.raises(ValueError, match=rf"{TORCH_THREADS_VARIABLE}='off'.*'auto'.*'keep'"):
        _vector_env()
    assert driver_threads._workers_here == counted


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
