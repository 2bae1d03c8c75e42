"""A worker polls for its next message a while before it sleeps, when its node has the cores.

`serve_fds` polls for at least `spin_us` after each answer (longer when its messages came
later, up to ten times), then blocks in ``read``; the driver sets `spin_us` per node
(`worker_spin`): ``auto`` by the node's cores and workers, or the
``RAY_MULTIPROCESS_ENV_WORKER_SPIN_US`` environment variable for every worker. Whether a process
spins is read from the kernel: its main thread's CPU time (``/proc/.../schedstat``, in ns) and
whether it sleeps in a system call other than a futex (the GIL), never from a timer in the test.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time

import gymnasium as gym
import pytest
import ray

from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env._engine.driver_threads import usable_cores
from ray_multiprocess_env._engine.worker_spin import (
    DEFAULT_SPIN_US,
    MAX_SPIN_US,
    SPIN_VARIABLE,
    auto_spins,
    check_spin,
    spin_by_node,
)
from ray_multiprocess_env._protocol.pipes import HEADER
from ray_multiprocess_env._worker.serve_loop import poll_plan
from tests.helpers import assert_killed, worker_pids

needs_proc = pytest.mark.skipif(
    not os.path.exists(f"/proc/{os.getpid()}/schedstat"), reason="reads Linux's /proc"
)

LONG_SPIN_US = 100_000  # long enough to see in a process's CPU time
_cartpole = functools.partial(gym.make, "CartPole-v1")


# -- the setting ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "setting"),
    [
        (None, None),
        ("auto", None),
        (" AUTO ", None),
        ("", None),
        ("0", 0),
        ("250", 250),
        (str(MAX_SPIN_US), MAX_SPIN_US),
    ],
)
def test_the_variable_reads_auto_or_microseconds(monkeypatch, value, setting):
    if value is None:
        monkeypatch.delenv(SPIN_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(SPIN_VARIABLE, value)
    assert check_spin() == setting


@pytest.mark.parametrize("value", [" Fast", "-1", "1.5", str(MAX_SPIN_US + 1)])
def test_a_bad_variable_is_a_value_error_naming_it_the_value_and_the_fix(monkeypatch, value):
    monkeypatch.setenv(SPIN_VARIABLE, value)
    with pytest.raises(ValueError, match=SPIN_VARIABLE) as caught:
        check_spin()
    assert repr(value) in str(caught.value)
    assert f"{SPIN_VARIABLE}=0" in str(caught.value)
    with pytest.raises(ValueError, match=SPIN_VARIABLE):  # before any worker starts
        GymnasiumVectorEnv([_cartpole], transport="ray")


def test_auto_spins_only_where_each_worker_has_a_core():
    workers = {"a": 2, "b": 3, "c": 1}
    cores = {"a": 2, "b": 2}  # ("c": a node Ray no longer counts)
    assert auto_spins(workers, cores) == {"a": DEFAULT_SPIN_US, "b": 0, "c": 0}


def _cores_here() -> int:
    """The cores `auto` counts on the driver's node: the fewer of this process's and Ray's."""
    here = ray.get_runtime_context().get_node_id()
    ray_cpus = next(n["Resources"]["CPU"] for n in ray.nodes() if n["NodeID"] == here)
    return min(usable_cores(), int(ray_cpus))


def test_spin_by_node_counts_the_driver_nodes_other_workers():
    here = ray.get_runtime_context().get_node_id()
    cores = _cores_here()
    assert spin_by_node(None, [here] * cores, 0) == {here: DEFAULT_SPIN_US}
    assert spin_by_node(None, [here] * cores, 1) == {here: 0}  # another vector env's worker
    assert spin_by_node(None, [here] * (cores + 1), 0) == {here: 0}
    assert spin_by_node(None, [here, None], 0) == {here: DEFAULT_SPIN_US}  # (not connected)
    assert spin_by_node(7, [here] * (cores + 1), 5) == {here: 7}  # the variable: everywhere


# -- the worker's loop ---------------------------------------------------------------------------
_ECHO = """
import sys
from ray_multiprocess_env._protocol.pipes import HEADER
from ray_multiprocess_env._worker.serve_loop import serve_fds
fd, spin_us = int(sys.argv[1]), int(sys.argv[2])
serve_fds(fd, fd, lambda seq, payload: [HEADER.pack(seq, len(payload)), payload], spin_us)
"""


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


def _asleep(pid: int) -> bool:
    """Whether `pid`'s main thread sleeps, and not on a futex (waiting for the GIL).

    Its wait channel must name where it sleeps: a thread that woke between the two reads
    (a GIL wait ending) reads "0" there, and is running, not asleep.
    """
    with open(f"/proc/{pid}/task/{pid}/stat") as stat:
        state = stat.read().rsplit(")", 1)[1].split()[0]
    with open(f"/proc/{pid}/task/{pid}/wchan") as wchan:
        where = wchan.read().strip()
    return state == "S" and where not in ("", "0") and "futex" not in where


def _cpu_until_asleep(*pids: int) -> list[int]:
    """The CPU time (ns) each main thread of `pids` spends from now until it sleeps (10 s)."""
    start = [_cpu_ns(pid) for pid in pids]
    deadline = time.monotonic() + 10
    for pid in pids:
        while not _asleep(pid):
            assert time.monotonic() < deadline, f"process {pid} never went to sleep"
            os.sched_yield()
    return [_cpu_ns(pid) - before for pid, before in zip(pids, start, strict=True)]


def _round_trip(sock: socket.socket, seq: int, payload: bytes) -> None:
    sock.sendall(HEADER.pack(seq, len(payload)) + payload)
    want = HEADER.pack(seq, len(payload)) + payload
    got = b""
    while len(got) < len(want):
        chunk = sock.recv(len(want) - len(got))
        assert chunk, "the worker's end closed"
        got += chunk
    assert got == want


def _echo_worker(spin_us: int) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """`serve_fds` echoing each message in a process of its own: our end, and the process."""
    driver, worker = socket.socketpair()
    fd = worker.fileno()
    process = subprocess.Popen([sys.executable, "-c", _ECHO, str(fd), str(spin_us)], pass_fds=[fd])
    worker.close()
    return driver, process


@needs_proc
@pytest.mark.parametrize("spin_us", [0, LONG_SPIN_US])
def test_serve_fds_polls_for_spin_us_then_sleeps_and_answers_in_order(spin_us):
    """A worker's loop (echoing each message) in a process of its own, over a socket pair."""
    driver, process = _echo_worker(spin_us)
    with contextlib.ExitStack() as stack:
        stack.callback(process.kill)
        stack.callback(driver.close)
        _round_trip(driver, 1, b"first")
        [spent] = _cpu_until_asleep(process.pid)
        if spin_us:  # it polled (most of the spin, unless the machine is very busy), then slept
            assert spent >= spin_us * 1000 // 5, spent
        else:
            assert spent < 20_000_000, spent  # it went straight to ``read``
        _round_trip(driver, 2, b"after the spin: from a blocking read")
        _round_trip(driver, 3, b"during the spin" * 1000)
        driver.shutdown(socket.SHUT_WR)  # the end of the input, while it may be polling
        assert process.wait(10) == 0


@needs_proc
@pytest.mark.parametrize(
    ("spin_us", "gap_s", "stretched"),
    [
        (10_000, 0.04, True),  # messages 40 ms apart: it polls about 60 ms (up to 100)
        (2_000, 0.025, True),  # 25 ms: past its longest poll (20 ms), within two: to 35 ms
        (2_000, 0.06, False),  # 60 ms apart, beyond two longest polls (40 ms): 2 ms only
    ],
)
def test_serve_fds_polls_longer_when_its_messages_come_later(spin_us, gap_s, stretched):
    """The poll stretches to half as long again as the gaps seen, up to `POLL_STRETCH` x.

    Past that, for gaps of up to two longest polls, until half a longest poll after the next
    message is due (`poll_plan`); beyond, it polls its least.

    The gaps are the stimulus (this end waits `gap_s` between messages); what is checked is
    the CPU time the worker spends after its last answer until it sleeps, read from the kernel.
    """
    driver, process = _echo_worker(spin_us)
    with contextlib.ExitStack() as stack:
        stack.callback(process.kill)
        stack.callback(driver.close)
        for seq in range(32):
            _round_trip(driver, seq, b"x")
            time.sleep(gap_s)  # (the gap this test makes: no wait for an event)
        _round_trip(driver, 32, b"last")
        [spent] = _cpu_until_asleep(process.pid)
        if stretched:
            assert spent >= 2 * spin_us * 1000, spent  # (its floor alone: 1x)
        else:
            assert spent < 5 * spin_us * 1000, spent  # (stretched, it would be 10x or more)
        driver.shutdown(socket.SHUT_WR)
        assert process.wait(10) == 0


@pytest.mark.parametrize(
    ("gap_us", "least_us", "most_us", "poll_us"),
    [
        (50, 100, 1_000, 100),  # a driver that answers at once: the least poll
        (400, 100, 1_000, 600),  # half as long again, within the longest poll
        (1_050, 100, 1_000, 1_550),  # past it, within two: half a longest poll after it is due
        (1_900, 100, 1_000, 2_400),
        (2_100, 100, 1_000, 100),  # beyond two longest polls: the least
        (150_000, 100_000, 100_000, 100_000),  # (never past `POLL_MOST_NS` but for the least)
        (150_000, 10_000, 100_000, 10_000),  # (a poll that `POLL_MOST_NS` would end too soon)
    ],
)
def test_poll_plan_stretches_to_the_gap_with_no_edge_just_past_the_longest_poll(
    gap_us, least_us, most_us, poll_us
):
    assert poll_plan(gap_us * 1000, least_us * 1000, most_us * 1000) == poll_us * 1000


# -- from the driver to each worker --------------------------------------------------------------
@needs_proc
@pytest.mark.parametrize("transport", ["auto", "pipe", "tcp"])
@pytest.mark.parametrize("spin_us", [0, LONG_SPIN_US])
def test_the_variable_reaches_every_worker(monkeypatch, transport, spin_us):
    """Set to `LONG_SPIN_US`, each worker polls after its answer; set to 0, it sleeps at once."""
    monkeypatch.setenv(SPIN_VARIABLE, str(spin_us))
    with contextlib.closing(
        GymnasiumVectorEnv([_cartpole] * 2, envs_per_worker=1, transport=transport)
    ) as envs:
        pids = worker_pids(envs)
        envs.reset(seed=0)
        _cpu_until_asleep(*pids)  # (after the reset's spin, if any)
        envs.step(envs.action_space.sample())
        spent = _cpu_until_asleep(*pids)
        if spin_us:
            assert min(spent) >= spin_us * 1000 // 5, spent
        else:
            assert max(spent) < 20_000_000, spent


@needs_proc
def test_a_restarted_worker_polls_too(monkeypatch):
    """A worker restarted after a SIGKILL gets its node's setting again."""
    monkeypatch.setenv(SPIN_VARIABLE, str(LONG_SPIN_US))
    with contextlib.closing(
        GymnasiumVectorEnv([_cartpole] * 2, envs_per_worker=1, on_actor_failure="restart")
    ) as envs:
        envs.reset(seed=0)
        old = worker_pids(envs)[0]
        os.kill(old, signal.SIGKILL)
        assert_killed(envs._engine._pool.workers[0].actor)
        envs.step(envs.action_space.sample())  # (the worker restarts within the step)
        pids = worker_pids(envs)
        assert pids[0] != old
        _cpu_until_asleep(*pids)
        envs.step(envs.action_space.sample())
        assert min(_cpu_until_asleep(*pids)) >= LONG_SPIN_US * 1000 // 5


def _spins(envs):
    """How long each worker of `envs` was told to poll (private engine)."""
    return [worker.transport.spin_us for worker in envs._engine._pool.workers]


@pytest.mark.parametrize("transport", ["auto", "pipe", "tcp"])
def test_auto_polls_while_the_driver_node_has_a_core_per_worker(monkeypatch, transport):
    """Counted over the vector envs open on the driver's node, as each one starts."""
    monkeypatch.delenv(SPIN_VARIABLE, raising=False)
    cores = _cores_here()
    make = functools.partial(GymnasiumVectorEnv, envs_per_worker=1, transport=transport)
    with contextlib.closing(make([_cartpole] * cores)) as first:
        assert _spins(first) == [DEFAULT_SPIN_US] * cores
        with contextlib.closing(make([_cartpole])) as second:  # one worker more than cores
            assert _spins(second) == [0]
    with contextlib.closing(make([_cartpole])) as third:  # the others closed
        assert _spins(third) == [DEFAULT_SPIN_US]
