"""The status record: what a hot step's doorbell and a worker's answer carry without a pickle.

A record and a pickle must never be taken for each other, a step that went well in place must
travel as a record (and mean exactly the reply it stands for), and anything else as a pickle.
"""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from ray_multiprocess_env._engine.transports.base import decode_reply
from ray_multiprocess_env._protocol import status
from ray_multiprocess_env._protocol.infos import Piece
from ray_multiprocess_env._protocol.pipes import dumps, encode_result, infos_answer, run
from ray_multiprocess_env._protocol.status import Reply
from ray_multiprocess_env._protocol.stream import split_tail, trailer


@pytest.mark.parametrize("columns", [0, 1, 0b1011, (1 << 64) - 1])
@pytest.mark.parametrize("old_api", [False, True])
def test_a_step_in_place_travels_as_a_record_and_reads_back_the_same(columns, old_api):
    reply = Reply(None, None, None, None, (None, columns), old_api)
    data = encode_result(True, reply, [0, 1], "step")
    assert len(data) == status.RECORD.size
    assert status.is_record(data)
    outcome = decode_reply(data)
    assert outcome.ok
    assert outcome.value == reply
    assert type(outcome.value.old_api) is bool


@pytest.mark.parametrize(
    "value",
    [
        # rows that travel (no shared memory), infos off the columns, another operation's value
        Reply(
            np.zeros((2, 3)), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), (None, 0), False
        ),
        Reply(
            None, None, None, None, ([Piece(("k",), "typed", np.arange(2), np.ones(2))], 1), False
        ),
        (None, None, None, None, (None, 0), False),  # (a plain tuple: not a worker's reply)
        [1, 2],
        None,
    ],
)
def test_anything_else_is_a_pickle_that_is_never_taken_for_a_record(value):
    data = encode_result(True, value, [0, 1], "step")
    assert not status.is_record(data)
    assert pickle.loads(data)[0] is True


@pytest.mark.parametrize("old_api", [False, True])
def test_info_dicts_per_env_follow_a_record_and_read_back_the_same_values_and_types(old_api):
    """SB3's and Tianshou's layout: the record says how long the pickle of the dicts is."""
    infos = {0: {"x": np.float64(1.5), "r": np.float32(-0.25)}, 2: {"k": 1, "tuple": (1, "a")}}
    reply = Reply(None, None, None, None, infos, old_api)
    data = encode_result(True, reply, [4, 5, 6], "step")
    assert status.is_record(data)
    assert status.infos_length(data) == (len(data) - status.RECORD.size, old_api)
    assert status.code_of(*status.RECORD.unpack_from(data)) == -1  # (never a column answer)
    for payload in (data, data + b"\1" * 24 + trailer(24)):  # (over the stream, rows after it)
        assert infos_answer(payload) == (infos, old_api)
        assert decode_reply(payload).value == reply
    read = infos_answer(data)[0]
    assert [type(v) for v in read[0].values()] == [np.float64, np.float32]
    assert infos_answer(dumps((True, reply))) is None  # (a pickle is not one)
    assert infos_answer(data[:-1]) is None  # (cut short of its pickle)


def test_info_dicts_per_env_that_cannot_be_pickled_are_an_error_naming_the_env():
    """An info the driver could never read is reported as the env's failure, not sent."""
    reply = Reply(None, None, None, None, {1: {"lock": threading.Lock()}}, False)
    data = encode_result(True, reply, [4, 5], "step")
    assert not status.is_record(data)
    outcome = decode_reply(data)
    assert not outcome.ok
    assert outcome.error.cause.env_indices == [5]
    assert "cannot pickle '_thread.lock'" in str(outcome.error)


def test_a_failed_step_is_never_a_record():
    data = encode_result(False, (ValueError("boom"), "traceback"), [0], "step")
    assert not status.is_record(data)
    assert not decode_reply(data).ok


def test_pickles_of_any_protocol_from_2_start_with_a_byte_a_record_never_has():
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        assert not status.is_record(pickle.dumps(("step", (None, None)), protocol=protocol))
    assert not status.is_record(dumps(("reset", ([None], None, None))))


def test_the_worker_reads_the_doorbell_as_a_step_of_every_env_in_the_rows():
    seen = []
    op, ok, value = run(lambda op, args: seen.append((op, args)) or "stepped", status.DOORBELL)
    assert (op, ok, value) == ("step", True, "stepped")
    assert seen == [("step", (None, None))]
    # over a TCP stream the actions follow the doorbell as raw rows: still the doorbell
    assert run(lambda op, args: (op, args), status.DOORBELL + b"\1" * 24 + trailer(24))[2] == (
        "step",
        (None, None),
    )
    assert len(split_tail(status.DOORBELL + b"\1" * 24 + trailer(24))) == 24


def test_a_record_of_the_wrong_side_is_refused_not_misread():
    answer = status.answer(3, False)
    assert not run(lambda op, args: None, answer)[1]  # a worker given an answer: an error
    assert not decode_reply(status.DOORBELL).ok  # a driver given a doorbell: a failure
