"""The TCP stream to workers off the driver's node: who gets in, what a stranger can do, fallback.

The results and faults over the stream are the transport-differential suite's
(`test_transports.py` runs every test with ``transport="tcp"``); a real second node is
`test_cluster.py`'s. Here: the handshake (a wrong secret, garbage, a pickle, a silent
connection), the worker's listener as Ray runs it, rows as raw bytes, the port range and the
fallback to Ray calls with one warning.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import signal
import socket
import threading
import time
from collections import OrderedDict

import gymnasium as gym
import numpy as np
import pytest
import ray

from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env._engine.ray_launcher import _worker_class
from ray_multiprocess_env._engine.transports.tcp import PORTS_VARIABLE
from ray_multiprocess_env._protocol import stream
from ray_multiprocess_env._protocol.pipes import HEADER, dumps, loads
from tests.helpers import transport_kinds, worker_pids

_SECRET = b"s" * 32


class _Trap:
    """A pickle that creates a file when it is loaded: proof that something unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _cartpole():
    return gym.make("CartPole-v1")


# -- the handshake, without Ray ---------------------------------------------------------------
@pytest.fixture
def listener():
    """A worker's listener on this machine, and the driver it let in (once `accept` returned)."""
    sock = stream.listen("127.0.0.1", None)
    found: dict[str, socket.socket | None] = {}

    def accept(seconds=20.0):
        found["driver"] = stream.accept_driver(sock, _SECRET, time.monotonic() + seconds)

    yield sock.getsockname()[1], accept, found
    if found.get("driver") is not None:
        found["driver"].close()


def _driver(port, secret=_SECRET):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    stream.handshake_driver(sock, secret, time.monotonic() + 10)
    return sock


def test_the_driver_with_the_secret_gets_in_and_the_listener_closes(listener):
    port, accept, found = listener
    thread = threading.Thread(target=accept)
    thread.start()
    driver = _driver(port)
    thread.join(10)
    assert found["driver"] is not None
    found["driver"].sendall(b"ping")
    assert _recv(driver, 4) == b"ping"
    assert driver.getpeername() == found["driver"].getsockname()
    with pytest.raises(ConnectionRefusedError):  # one driver: the worker stops listening
        socket.create_connection(("127.0.0.1", port), timeout=5)
    driver.close()


def test_a_wrong_secret_is_refused_both_ways(listener, caplog):
    """A driver with another secret is closed by the worker; the real one still gets in."""
    port, accept, found = listener
    thread = threading.Thread(target=accept)
    thread.start()
    with caplog.at_level(logging.WARNING), pytest.raises(stream.HandshakeError):
        _driver(port, secret=b"x" * 32)
    driver = _driver(port)
    thread.join(10)
    assert found["driver"] is not None
    assert "did not prove that it is the driver" in caplog.text
    driver.close()


def test_a_worker_without_the_secret_is_refused_by_the_driver():
    """The driver checks the worker's proof before it reads anything else from it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def impostor():
        conn, _ = server.accept()
        conn.sendall(stream.MAGIC + os.urandom(32))
        conn.recv(64)
        conn.sendall(b"\0" * 32)  # a proof made without the secret
        conn.close()

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(stream.HandshakeError, match="does not hold"):
        _driver(server.getsockname()[1])
    thread.join(10)
    server.close()


@pytest.mark.parametrize("stranger", ["garbage", "pickle", "silent", "framed pickle"])
def test_a_stranger_gets_nothing_loaded_and_stops_nothing(listener, tmp_path, stranger, caplog):
    """Garbage, a pickle (bare or framed as a message) or silence: refused, never unpickled.

    The stranger connects first and keeps its connection open; the driver still gets in.
    """
    port, accept, found = listener
    trap = str(tmp_path / "loaded")
    payload = pickle.dumps(_Trap(trap))
    thread = threading.Thread(target=accept)
    thread.start()
    intruder = socket.create_connection(("127.0.0.1", port), timeout=10)
    assert intruder.recv(len(stream.MAGIC) + 32).startswith(stream.MAGIC)
    if stranger == "garbage":
        intruder.sendall(os.urandom(100))
    elif stranger == "pickle":
        intruder.sendall(payload)
    elif stranger == "framed pickle":
        intruder.sendall(HEADER.pack(1, len(payload)) + payload)
    with caplog.at_level(logging.WARNING):
        driver = _driver(port)
        thread.join(15)
    assert found["driver"] is not None
    assert not os.path.exists(trap)
    if stranger != "silent":
        assert "Closed a connection" in caplog.text
    intruder.close()
    driver.close()


def test_strangers_filling_every_place_do_not_keep_the_driver_out(listener, caplog):
    """More silent strangers than the worker handles at once: the oldest give way, the driver in.

    (Each new connection gets a place: refusing the newest instead left the driver, coming
    last, to fall back to Ray calls.)
    """
    port, accept, found = listener
    thread = threading.Thread(target=accept)
    thread.start()
    strangers = []
    for _ in range(2 * stream._PENDING_MAX):
        stranger = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert stranger.recv(len(stream.MAGIC) + 32).startswith(stream.MAGIC)  # (it has a place)
        strangers.append(stranger)
    with caplog.at_level(logging.WARNING):
        driver = _driver(port)
        thread.join(15)
    assert found["driver"] is not None
    assert "the oldest gave way" in caplog.text
    for stranger in strangers:
        stranger.close()
    driver.close()


# -- rows as raw bytes --------------------------------------------------------------------------
@pytest.mark.parametrize("positions", [None, [2], [0, 3]])
def test_rows_travel_as_raw_bytes_into_their_places(positions):
    """`pack_rows` of some rows fills exactly those rows of arrays of the same layout."""
    source = [
        np.arange(20, dtype=np.float32).reshape(4, 5),
        np.array([1.5, 2, 3, 4]),
        np.ones(4, bool),
    ]
    target = [np.zeros_like(a) for a in source]
    tail = memoryview(b"".join(bytes(part) for part in stream.pack_rows(source, positions)))
    filled = stream.unpack_rows(tail, [stream.RowTarget(a) for a in target])
    assert filled == 3
    rows = slice(None) if positions is None else positions
    for ours, theirs in zip(target, source, strict=True):
        assert np.array_equal(ours[rows], theirs[rows])
        others = np.ones(4, bool)
        others[rows] = False
        assert not ours[others].any()
    header = 4 if positions is None else 4 + 4 * len(positions)
    cut = tail[: header + 1]  # one byte into the first array's rows
    with pytest.raises(ValueError, match="does not end after a whole array"):
        stream.unpack_rows(cut, [stream.RowTarget(a) for a in target])
    without_last = tail[: len(tail) - (4 if positions is None else len(positions))]  # the flags
    assert stream.unpack_rows(without_last, [stream.RowTarget(a) for a in target]) == 2


# -- the worker's listener, as Ray runs it --------------------------------------------------------
def test_a_stranger_on_a_real_workers_port_changes_nothing(tmp_path):
    """A Ray worker that listens: a stranger's pickle is not loaded, the driver is served."""
    worker = _worker_class().remote([_cartpole], [0])
    host, port = ray.get(worker.listen.remote(_SECRET, None, 30.0))
    trap = str(tmp_path / "loaded")
    payload = dumps((_Trap(trap), ()))
    intruder = socket.create_connection((host, port), timeout=10)
    intruder.sendall(HEADER.pack(1, len(payload)) + payload)
    assert ray.get(worker.handle.remote("pid", ()), timeout=30)  # Ray calls go on meanwhile
    driver = socket.create_connection((host, port), timeout=10)
    stream.handshake_driver(driver, _SECRET, time.monotonic() + 10)
    serving = worker.serve_stream.remote()
    message = dumps(("pid", ())) + stream.trailer(0)
    driver.sendall(HEADER.pack(1, len(message)) + message)
    seq, size = HEADER.unpack(_recv(driver, HEADER.size))
    ok, pid = loads(_recv(driver, size))
    assert (seq, ok) == (1, True)
    assert pid != os.getpid()
    assert not os.path.exists(trap)
    intruder.close()
    driver.close()  # the worker's `serve_stream` returns; Ray calls work again
    ray.get(serving, timeout=30)
    assert ray.get(worker.handle.remote("pid", ()), timeout=30) == pid
    ray.kill(worker)


def _recv(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the worker closed the connection"
        data += chunk
    return data


# -- the port range and the fallback ------------------------------------------------------------
def test_workers_listen_in_the_port_range_given(monkeypatch):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    first = probe.getsockname()[1]
    probe.close()
    monkeypatch.setenv(PORTS_VARIABLE, f"{first}-{first + 20}")
    envs = GymnasiumVectorEnv([_cartpole] * 2, envs_per_worker=1, transport="tcp")
    try:
        assert transport_kinds(envs) == ["tcp", "tcp"]
        ports = []
        for worker in envs._engine._pool.workers:
            sock = socket.fromfd(worker.transport.fileno(), socket.AF_INET, socket.SOCK_STREAM)
            ports.append(sock.getpeername()[1])
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)  # a silent node's end
            sock.close()
        assert all(first <= port <= first + 20 for port in ports)
        envs.reset(seed=0)
        envs.step(np.array([0, 1]))
    finally:
        envs.close()


def test_a_worker_that_cannot_listen_uses_ray_calls_with_one_warning(monkeypatch, caplog):
    """Its only port taken: Ray calls, and a warning that says why and how to open the ports."""
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    monkeypatch.setenv(PORTS_VARIABLE, str(port))
    with caplog.at_level(logging.WARNING):
        envs = GymnasiumVectorEnv([_cartpole] * 2, envs_per_worker=2, transport="tcp")
    try:
        assert transport_kinds(envs) == ["ray"]
        warnings = [r.getMessage() for r in caplog.records if "reached over TCP" in r.getMessage()]
        assert len(warnings) == 1
        assert PORTS_VARIABLE in warnings[0]
        assert "transport='ray'" in warnings[0]
        observations, _ = envs.reset(seed=0)
        reference = gym.vector.SyncVectorEnv([_cartpole] * 2)
        assert np.array_equal(observations, reference.reset(seed=0)[0])
    finally:
        envs.close()
        taken.close()


def test_a_malformed_port_range_is_named(monkeypatch):
    monkeypatch.setenv(PORTS_VARIABLE, "50000:50100")
    with pytest.raises(
        ValueError, match=f"the {PORTS_VARIABLE} environment variable.*'50000:50100'"
    ):
        GymnasiumVectorEnv([_cartpole], transport="tcp")


def test_a_stalled_connection_is_a_timeout_and_the_step_comes_later():
    """A worker that stops reading (SIGSTOP: as a network that stalls) times out, never hangs.

    Once it goes on, `step_wait` collects the step that timed out, with what plain envs give.
    """
    envs = GymnasiumVectorEnv([_cartpole] * 4, envs_per_worker=2, transport="tcp", timeout=2)
    reference = gym.vector.SyncVectorEnv([_cartpole] * 4)
    try:
        observations, _ = envs.reset(seed=3)
        assert np.array_equal(observations, reference.reset(seed=3)[0])
        pid = worker_pids(envs)[1]
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                envs.step(np.array([0, 1, 0, 1]))
            assert time.monotonic() - start < 10
        finally:
            os.kill(pid, signal.SIGCONT)
        got = envs.step_wait()
        want = reference.step(np.array([0, 1, 0, 1]))
        for ours, theirs in zip(got[:4], want[:4], strict=True):
            assert np.array_equal(ours, theirs)
    finally:
        envs.close()


class _KeyOrderEnv(gym.Env):
    """Dict spaces whose keys come in the order given: equal spaces, another layout.

    The observation echoes the action: ``obs["a"] = action["x"]``, ``obs["b"] = -action["y"]``
    (not symmetric, so that actions and observations swapped alike do not cancel out).
    """

    def __init__(self, flipped: bool = False) -> None:
        box = gym.spaces.Box(-10, 10, (2,), np.float32)
        obs_keys, act_keys = ("a", "b"), ("x", "y")
        if flipped:
            obs_keys, act_keys = obs_keys[::-1], act_keys[::-1]
        # (an OrderedDict keeps its order; gymnasium sorts the keys of a plain dict)
        self.observation_space = gym.spaces.Dict(OrderedDict((k, box) for k in obs_keys))
        self.action_space = gym.spaces.Dict(OrderedDict((k, box) for k in act_keys))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {k: np.zeros(2, np.float32) for k in self.observation_space}, {}

    def step(self, action):
        return {"a": action["x"], "b": -action["y"]}, 0.0, False, False, {}


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_dict_keys_in_another_order_keep_their_meaning(transport):
    """Workers whose Dict spaces list their keys in another order than the driver's.

    The spaces are equal, so the envs are uniform; the rows must still land by key, both the
    actions going out and the observations coming back (over shared memory and the stream).
    """
    fns = [_KeyOrderEnv] * 2 + [functools.partial(_KeyOrderEnv, flipped=True)] * 2
    envs = GymnasiumVectorEnv(fns, envs_per_worker=2, transport=transport)
    try:
        assert transport_kinds(envs) == [{"auto": "shared_memory"}.get(transport, transport)] * 2
        envs.reset(seed=0)
        actions = {"x": np.full((4, 2), 1.0, np.float32), "y": np.full((4, 2), 2.0, np.float32)}
        observations, *_ = envs.step(actions)
        assert (observations["a"] == 1.0).all(), observations
        assert (observations["b"] == -2.0).all(), observations
    finally:
        envs.close()
