"""The status record: a step's doorbell and a worker's answer as 16 fixed bytes, no pickle.

A step of every env of a worker whose actions are in its rows (shared memory, or raw bytes after
the message over a TCP stream) needs no arguments, and a worker whose envs all answered well,
with their rows written and every info in its column, has nothing to say but which columns it
wrote and whether an env spoke old gym's API. Both then travel as one `RECORD` in place of a
pickle: the driver rings with `DOORBELL` (the worker reads it with `operation`), the worker
answers with `answer` (the driver reads it with `code_of`; `reply_of_code` is the reply it
stands for). A worker that keeps one info dict per env (SB3's and Tianshou's layout) answers
with `answer_infos`: the record says so and how long the pickle of those dicts after it is,
the only pickle such an answer has (`_protocol.pipes.infos_answer` reads it back). Everything
else (an env error, infos off the columns, any other operation) is a pickled message as
before. The two never mix up: a pickle (protocol 2 and later) starts with
byte 0x80, a record with byte 0. Over a TCP stream the rows follow a record as they follow a
pickle.

Both ends import this module; it imports nothing of the driver side.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

__all__ = [
    "ANSWERS",
    "DOORBELL",
    "FRAMED_RECORD",
    "RECORD",
    "Reply",
    "answer",
    "answer_infos",
    "code_of",
    "in_place",
    "infos_in_place",
    "infos_length",
    "is_record",
    "operation",
    "reply_of_code",
    "reply_of_infos",
]


class Reply(NamedTuple):
    """A worker's reply to a ``reset`` or ``step`` of its envs: the record is its short form.

    The rows of the envs it ran (None where they are in place already: in shared memory, or
    after the message over a TCP stream), their infos (gymnasium's layout: ``(pieces not in
    columns or None, the columns written)``; SB3's and Tianshou's: an info dict by position),
    and whether an env spoke old gym's API.
    """

    observations: Any
    rewards: Any
    terminations: Any
    truncations: Any
    infos: Any
    old_api: bool


#: tag (0), kind, padding, the info columns written (a bit each)
RECORD = struct.Struct("<BB6xQ")
_TAG = 0
_STEP = 1  # the driver's doorbell: step every env of the worker
_OK = 2  # the worker's answer: every env answered well, rows and infos in place
_OK_OLD_API = 3  # the same, and an env spoke old gym's API
_OK_INFOS = 4  # every env answered well, rows in place, the info dicts per env after it
_OK_INFOS_OLD_API = 5  # the same, and an env spoke old gym's API

#: The doorbell of a step of every env whose actions are in the rows.
DOORBELL = RECORD.pack(_TAG, _STEP, 0)
#: A record after the pipes' message header (sequence number, payload length): one read,
#: its tag and kind as one number (a key of `ANSWERS`).
FRAMED_RECORD = struct.Struct("<qqH6xQ")
#: A worker's answers as `FRAMED_RECORD` reads their tag and kind: whether old gym's API.
ANSWERS = {_TAG | _OK << 8: 0, _TAG | _OK_OLD_API << 8: 1}
#: The kinds of `answer_infos`, and whether old gym's API.
_INFO_KINDS = {_OK_INFOS: False, _OK_INFOS_OLD_API: True}


def is_record(payload: Any) -> bool:
    """Whether the message `payload` (bytes, maybe rows after it) starts with a record."""
    return len(payload) >= RECORD.size and payload[0] == _TAG


def answer(columns: int, old_api: bool) -> bytes:
    """The worker's answer to a step or reset that went well in place (`in_place`)."""
    return RECORD.pack(_TAG, _OK_OLD_API if old_api else _OK, columns)


def answer_infos(pickled: bytes, old_api: bool) -> bytes:
    """The answer to a step or reset that went well with its rows in place (`infos_in_place`).

    `pickled`: its info dicts by position, pickled; they follow the record, whose last field
    is their length (over a TCP stream the rows come after them).
    """
    kind = _OK_INFOS_OLD_API if old_api else _OK_INFOS
    return RECORD.pack(_TAG, kind, len(pickled)) + pickled


def infos_length(payload: Any) -> tuple[int, bool] | None:
    """The length of the pickle after an `answer_infos` record, and whether old gym's API.

    None if `payload` does not start with such a record (or is cut short of its pickle).
    """
    if len(payload) < RECORD.size or payload[0] != _TAG:
        return None
    _, kind, length = RECORD.unpack_from(payload)
    old_api = _INFO_KINDS.get(kind)
    if old_api is None or len(payload) < RECORD.size + length:
        return None
    return length, old_api


def operation(payload: Any) -> tuple[str, tuple[Any, ...]]:
    """The operation a record from the driver stands for (the worker's side of `DOORBELL`).

    Raises:
        ValueError: If `payload` is not a doorbell.
    """
    _, kind, _ = RECORD.unpack_from(payload)
    if kind != _STEP:
        raise ValueError(f"not a doorbell: a status record of kind {kind}")
    return "step", (None, None)


def code_of(tag: int, kind: int, columns: int) -> int:
    """A worker's answer (a record's fields) as one int: ``columns << 1 | old_api``; -1 if not one.

    The driver's hot path keeps this in place of a reply (`reply_of_code` makes the reply).
    """
    old_api = ANSWERS.get(tag | kind << 8)
    return -1 if old_api is None else columns << 1 | old_api


def reply_of_code(code: int) -> Reply:
    """The reply an answer of this `code_of` stands for: nothing but the columns written."""
    return Reply(None, None, None, None, (None, code >> 1), bool(code & 1))


def reply_of_infos(infos: dict[int, Any], old_api: bool) -> Reply:
    """The reply an `answer_infos` stands for: its rows in place, these info dicts by position."""
    return Reply(None, None, None, None, infos, old_api)


def _rows_in_place(value: Any) -> bool:
    """Whether `value` is a `Reply` whose rows are all in place (none travel in it)."""
    return (
        type(value) is Reply
        and value.observations is None
        and value.rewards is None
        and value.terminations is None
        and value.truncations is None
        and type(value.old_api) is bool
    )


def infos_in_place(value: Any) -> bool:
    """Whether a step's or reset's `value` has its rows in place and an info dict per env."""
    return _rows_in_place(value) and type(value.infos) is dict


def in_place(value: Any) -> bool:
    """Whether a step's or reset's `value` has everything in place (`answer` says it all)."""
    if not _rows_in_place(value):
        return False
    infos = value.infos
    return (
        type(infos) is tuple
        and len(infos) == 2
        and infos[0] is None
        and type(infos[1]) is int
        and 0 <= infos[1] < 1 << 64
    )
