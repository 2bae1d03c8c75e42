"""Where the driver's CPU time of a first-ready round trip goes, stage by stage.

Run by hand from the repository root (`benchmarks.against_probe` runs it too):

    python -m benchmarks.driver_stages [--env HalfCheetah-v5] [--k 8]

It steps 2 workers x `k` envs with ``recv(k)`` + ``send``, as `benchmarks.against_probe` does,
and times the library's own functions on the way with the thread's CPU clock: each stage is
wrapped for the run (a wrapper costs about 2 µs here, counted in its stage). The stages nest:
an indented stage is part of the one above it. The probe's driver does its whole round trip in
the time of about one of these stages; see docs/performance.md.
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

from benchmarks import loops
from ray_multiprocess_env import make_vector_env
from ray_multiprocess_env._engine import (
    call_state,
    first_ready,
    interrupts,
    lanes,
    store,
)
from ray_multiprocess_env._engine.transports import channel
from ray_multiprocess_env.faces import gymnasium as face

#: (owner, attribute, stage): the stages, in the order of a round trip, indented as they nest.
STAGES = [
    (face.GymnasiumVectorEnv, "recv", "`recv`: all of it"),
    (type(interrupts.DEFERRED), "poll", "  waiting: `poll` (and the wake-up)"),
    (channel.ChannelTransport, "read_lane", "  reading the reply"),
    (first_ready, "_env_ids", "  the answers' envs"),
    (call_state.CallState, "take", "  the call state: out of flight"),
    (lanes.Lanes, "batch", "  the batch: the answers' infos and rows"),
    (store.BatchStore, "rows_of", "    the rows: copies of obs, rewards, flags, info columns"),
    (face.GymnasiumVectorEnv, "_received", "  the face's results"),
    (face.GymnasiumVectorEnv, "send", "`send`: all of it (the face's checks included)"),
    (first_ready.FirstReadyVerbs, "send", "  the engine's `send`"),
    (channel.ChannelTransport, "ring", "    actions in, doorbell written"),
    (call_state.CallState, "put_in_flight", "    the call state: in flight"),
]


@contextmanager
def _timed(spent: collections.Counter[str]) -> Iterator[None]:
    """Every stage of `STAGES` wrapped to add its CPU time to `spent` (undone after)."""
    saved = []
    for owner, name, label in STAGES:
        original = getattr(owner, name)
        saved.append((owner, name, original))

        def wrapper(*args: Any, _f: Any = original, _label: str = label, **kwargs: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_label] += time.thread_time_ns() - start

        setattr(owner, name, functools.wraps(original)(wrapper))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def measure(env_id: str, k: int, calls: int = 4000) -> dict[str, float]:
    """µs of the driver's CPU per round trip: ``total`` and each stage's."""
    envs = make_vector_env(env_id, 2 * k, num_workers=2)
    envs.async_reset(seed=0)
    one = loops.recv_send(envs, k)

    spent: collections.Counter[str] = collections.Counter()
    with _timed(spent):
        for t in range(200):
            one(t)
        spent.clear()
        start = time.thread_time_ns()
        for t in range(calls):
            one(t)
        total = time.thread_time_ns() - start
    envs.recv()
    envs.close()
    out = {"total": total / calls / 1000}
    out.update({label: spent[label] / calls / 1000 for _, _, label in STAGES})
    return out


def table(stages: dict[str, float]) -> list[str]:
    """The stages as a Markdown table (µs per round trip)."""
    lines = [
        "| stage of one `recv` + `send` (driver, main thread) | µs of CPU |",
        "|---|---:|",
        f"| the round trip, stages timed | {stages['total']:.0f} |",
    ]
    for _, _, label in STAGES:
        depth = (len(label) - len(label.lstrip())) // 2
        lines.append(f"| {'&nbsp;&nbsp;' * 2 * depth}{label.strip()} | {stages[label]:.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    print("\n".join(table(measure(args.env, args.k))))
    ray.shutdown()


if __name__ == "__main__":
    main()
