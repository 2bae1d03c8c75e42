"""Real SIGINTs at random moments into every verb of every face, then a check of the next call.

Run by hand from the repository root (its table goes in docs/benchmarks.md):

    python -m benchmarks.interrupt_soak --signals 2000

For each face another process sends SIGINT to this one at random moments (0 to 3 ms apart)
while the main thread runs that face's verbs in a loop (steps, resets, first-ready
``send``/``recv``, Tianshou's asynchronous ``step``). After each ``KeyboardInterrupt`` the
signals stop and the next calls must work: a wedge is any error from them (a "pending call"
that nobody started, a call in flight that no verb can see). First-ready faces also check that
every env sent comes back exactly once ("lost" counts the envs that never came back, or came
twice). `tests/test_interrupt_soak.py` runs a short soak in the ``long`` marker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FACES", "soak"]

FACES = ("gymnasium-step", "gymnasium-recv", "pfrl-step", "sb3-step", "tianshou-async")
_ONES = np.ones(4, dtype=np.int64)


_SENDER = """
import os, random, signal, sys, time
import numpy as np
pid, path, seed, most = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
flags = np.memmap(path, dtype=np.int64, mode="r+", shape=(5,))  # armed, stop, sent, asked, seen
rng = random.Random(seed)
while not flags[1]:
    wake = time.monotonic() + rng.uniform(0, most)
    while True:  # (in slices of 0.2 ms: a `settle` waits for the next)
        asked = flags[3]  # (read before `armed`: see `_Sender.settle`)
        if time.monotonic() >= wake:
            break
        flags[4] = asked
        time.sleep(min(0.0002, most))
    if flags[0]:
        os.kill(pid, signal.SIGINT)
        flags[2] += 1
    flags[4] = asked
"""


class _Sender:
    """Another process that sends SIGINT to this one at random moments while armed.

    A thread of this process would need the GIL to send, so its signals would land only
    where the main thread had released it (in a wait); another process sends at any moment.
    """

    def __init__(self, seed: int, most_ms: float) -> None:
        self._folder = tempfile.TemporaryDirectory(
            dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        path = os.path.join(self._folder.name, "flags")
        self._flags = np.memmap(path, dtype=np.int64, mode="w+", shape=(5,))
        args = [str(os.getpid()), path, str(seed), str(most_ms / 1000)]
        self._process = subprocess.Popen([sys.executable, "-c", _SENDER, *args])

    @property
    def sent(self) -> int:
        return int(self._flags[2])

    def arm(self) -> None:
        self._flags[0] = 1

    def disarm(self) -> None:
        """Stop sending (one may still be on its way: `settle` waits for it)."""
        self._flags[0] = 0

    def settle(self) -> None:
        """Stop sending; returns once the sender has seen it (no signal is on its way).

        The sender reads the count of these before it looks at `armed`: once it echoes the
        count written after `armed` went to 0, that look saw 0, and every signal it sent
        before has landed here (a kill from another process is delivered at once).
        """
        flags = self._flags
        flags[0] = 0
        flags[3] += 1
        ends = time.monotonic() + 10.0  # (a sender gone: nothing more is on its way)
        while flags[4] != flags[3] and time.monotonic() < ends:  # (no `Popen.poll` here: a
            time.sleep(0)  # SIGINT inside it can leave its lock held, and `stop` waits on it)

    def stop(self) -> None:
        self._flags[0], self._flags[1] = 0, 1
        self._process.wait(timeout=30)
        self._folder.cleanup()


def _make(face: str) -> Any:
    from tests.envs import FlakyEnv

    if face.startswith("gymnasium"):
        from ray_multiprocess_env import GymnasiumVectorEnv

        return GymnasiumVectorEnv([FlakyEnv] * 4, envs_per_worker=2)
    if face == "pfrl-step":
        from ray_multiprocess_env import RayVectorEnv

        return RayVectorEnv.from_env_fns([FlakyEnv] * 4, envs_per_worker=2)
    if face == "sb3-step":
        from ray_multiprocess_env import SB3VecEnv

        return SB3VecEnv([FlakyEnv] * 4, envs_per_worker=2)
    from ray_multiprocess_env import TianshouVectorEnv

    return TianshouVectorEnv([FlakyEnv] * 4, envs_per_worker=2, wait_num=2)


def _verbs(face: str, envs: Any, rng: random.Random) -> tuple[Callable[[], Any], Callable[[], int]]:
    """One random verb of `face`, and the recovery after an interrupt (the envs lost)."""
    if face == "gymnasium-recv":

        def verb() -> Any:
            if not envs._engine.busy_envs():  # (private: which envs are out)
                if rng.random() < 0.1:
                    return envs.async_reset()
                return envs.send(_ONES, [0, 1, 2, 3])
            return envs.recv(batch_size=2)

        return verb, lambda: _collect(envs)
    if face == "tianshou-async":

        def tianshou_verb() -> Any:
            ready = envs.ready_id
            if ready and rng.random() < 0.9:
                return envs.step(np.ones(len(ready), dtype=np.int64), ready)
            if envs.waiting_id:
                return envs.step(None, id=envs.waiting_id)
            return envs.reset()

        def tianshou_recover() -> int:
            while envs.waiting_id:  # as Tianshou's AsyncCollector.reset_env does
                envs.step(None, id=envs.waiting_id)
            envs.reset()
            return 0

        return tianshou_verb, tianshou_recover

    def step_verb() -> Any:
        return envs.reset() if rng.random() < 0.05 else envs.step(_ONES)

    def step_recover() -> int:
        envs.step(_ONES)
        return 0

    return step_verb, step_recover


def _collect(envs: Any) -> int:
    """Receive everything in flight; how many envs came back other than exactly once."""
    sent = set(envs._engine.busy_envs())
    seen: list[int] = []
    while envs._engine.busy_envs():
        seen += [int(env) for env in envs.recv()[-1]["env_id"]]
    return len(sent ^ set(seen)) + (len(seen) - len(set(seen)))


def soak(face: str, signals: int, seed: int = 0, most_ms: float = 3.0) -> dict[str, Any]:
    """Interrupt `signals` calls of `face`'s verbs; the counts of wedges and losses.

    A signal that arrives once the call is over (the sender raced the disarm) is held back
    while the next calls are checked and counted as ``late``, not as an interrupt.
    """
    rng = random.Random(seed)
    envs = _make(face)
    verb, recover = _verbs(face, envs, rng)
    counts = {"face": face, "interrupts": 0, "late": 0, "wedges": 0, "lost": 0, "calls": 0}
    envs.reset()
    sender = _Sender(seed, most_ms)
    held: list[int] = []
    started = time.monotonic()
    try:
        while counts["interrupts"] < signals:
            interrupted, failed = False, None
            try:
                sender.arm()
                verb()
                counts["calls"] += 1
                sender.disarm()
            except KeyboardInterrupt:
                interrupted = True
            except Exception as err:  # (a wedge left by an earlier interrupt)
                failed = err
            while True:  # (a signal that lands before the handler below is one more try's)
                try:
                    signal.signal(signal.SIGINT, lambda *_: held.append(1))  # (late ones: held)
                    break
                except KeyboardInterrupt:
                    interrupted = True
            try:
                sender.settle()
                if failed is not None:
                    raise failed
                if interrupted:
                    counts["interrupts"] += 1
                    counts["lost"] += recover()
            except Exception as err:  # a wedge: the next call did not work
                counts["wedges"] += 1
                print(f"{face}: wedged: {type(err).__name__}: {err}", flush=True)
                with contextlib.suppress(Exception):
                    envs.close()
                envs = _make(face)
                verb, recover = _verbs(face, envs, rng)
                envs.reset()
            finally:
                try:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                except KeyboardInterrupt:  # (one that came just then: late too)
                    held.append(1)
                counts["late"] += len(held)
                held.clear()
    finally:
        sender.stop()
        counts["signals"] = sender.sent
        counts["seconds"] = round(time.monotonic() - started, 1)
        envs.close()
    return counts


def main() -> None:
    """Run the soak over every face and print a Markdown table."""
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--signals", type=int, default=2000, help="SIGINTs per face")
    parser.add_argument("--faces", nargs="*", default=list(FACES), choices=FACES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False)
    rows = [soak(face, args.signals, args.seed) for face in args.faces]
    print(
        "| face | SIGINTs sent | calls interrupted | late (after the call) | calls done "
        "| wedges | envs lost | seconds |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['face']} | {r['signals']} | {r['interrupts']} | {r['late']} | {r['calls']} "
            f"| {r['wedges']} | {r['lost']} | {r['seconds']} |"
        )
    total = sum(r["interrupts"] for r in rows)
    print(f"\n{total} calls interrupted, {sum(r['wedges'] for r in rows)} wedges")


if __name__ == "__main__":
    main()
