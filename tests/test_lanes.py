"""The full step on the lanes, where the slow path takes it over.

A step on the lanes has no tickets until something needs them (`lanes.LaneStep.tickets`).
These are the moments when a reply could be read by nobody's ticket, or a step could wait for
an answer to a message not all written: a worker that answered and then died while the other
still steps, a verb that reads the workers' pipes while a `step_async` is pending, and a TCP
doorbell whose action rows the socket takes only part of. Each must give the step's own
results, as the slow path would.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket

import numpy as np
import pytest

from ray_multiprocess_env import GymnasiumVectorEnv
from tests.envs import BigActionEnv, FlakyEnv
from tests.helpers import assert_killed, worker_pids
from tests.interrupts import Gate

LANE_TRANSPORTS = ["auto", "tcp"]


def _readable(envs, worker: int, within: float = 60.0) -> bool:
    """Whether worker `worker`'s answer is waiting in its pipe (or socket) within `within` s."""
    transport = envs._engine._pool.workers[worker].transport  # (private)
    return bool(select.select([transport.fileno()], [], [], within)[0])


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_worker_that_answered_and_then_died_leaves_the_step_its_results(transport, tmp_path):
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=60)
    with contextlib.closing(envs):
        envs.reset()
        pid = worker_pids(envs)[0]
        gate = Gate(str(tmp_path))
        envs.set_attr("gate", [None, None, str(gate), str(gate)])
        envs.step_async(np.ones(4, dtype=np.int64))
        gate.wait_entered()  # worker 1 is inside its step
        assert _readable(envs, 0)  # worker 0 answered
        os.kill(pid, signal.SIGKILL)
        assert_killed(envs.remote_envs[0])
        gate.open()
        obs = envs.step_wait()[0]  # (its pipe ends after the answer: that answer counts)
        assert obs[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("transport", LANE_TRANSPORTS)
def test_a_verb_that_reads_the_pipes_while_a_step_is_pending_leaves_it_its_replies(
    transport, tmp_path
):
    envs = GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2, transport=transport, timeout=60)
    with contextlib.closing(envs):
        envs.reset()
        gate = Gate(str(tmp_path))
        envs.set_attr("gate", [None, None, str(gate), str(gate)])
        envs.step_async(np.ones(4, dtype=np.int64))
        gate.wait_entered()
        assert _readable(envs, 0)  # worker 0's answer waits in its pipe
        gate.open()
        pids = worker_pids(envs)  # reads both pipes: the answers behind it too
        assert len(pids) == 2
        obs = envs.step_wait()[0]
        assert obs[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0]
        envs.set_attr("gate", [None] * 4)
        assert envs.step(np.ones(4, dtype=np.int64))[0][:, 0].tolist() == [2.0] * 4


def test_a_tcp_doorbell_the_socket_takes_only_part_of_is_written_in_full():
    envs = GymnasiumVectorEnv([BigActionEnv] * 4, envs_per_worker=2, transport="tcp", timeout=60)
    with contextlib.closing(envs):
        envs.reset()
        transports = [worker.transport for worker in envs._engine._pool.workers]  # (private)
        for transport in transports:  # (a copy of the descriptor: the same socket)
            with socket.socket(fileno=os.dup(transport.write_fileno())) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        actions = np.random.default_rng(0).uniform(-1, 1, (4, 1 << 19)).astype(np.float32)
        envs.step_async(actions)
        assert any(transport.wants_write for transport in transports)  # (only part written)
        obs = envs.step_wait()[0]
        assert obs[:, 0].tolist() == (actions[:, 0] + actions[:, -1]).tolist()
