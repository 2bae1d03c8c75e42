"""A worker's CPU per env step against a raw loop over the same envs, in one process.

Run by hand from the repository root (`benchmarks.against_probe` runs it too):

    python -m benchmarks.worker_step [--env HalfCheetah-v5] [--k 8] [--idle-us 300] [--in-ray]

The worker is set up as the shared-memory transport sets it up (its rows in shared memory, the
numeric infos in their columns) and answers the step's doorbell as its pipe loop does: the
actions written into its rows, the message run, the status record made. The raw loop steps
as many envs of the same id with the same actions (``env.step`` and a reset when an episode
ends, nothing else). The two take turns every 10 calls, so the machine's drift falls on both
alike; the CPU time is the thread's own.

With ``--idle-us``, both loops sleep that long after each call, as a worker in lockstep waits
while the driver hands the results out and sends the next actions. The sleep is not counted
(the CPU time is the thread's), but on the machine measured here (docs/performance.md) the
env steps after it cost a third to a half more CPU, in the raw loop as in ours: a core that
went idle wakes slower (cold caches, maybe a lower clock). That, not the worker's code, is most
of what a worker spends beyond its env steps in `benchmarks.profile_step`.

With ``--in-ray`` both loops run, taking turns three times, in this process and in a Ray actor's
process, where a worker steps its envs (Ray's threads and memory beside them): the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import gymnasium as gym
import ray
from gymnasium.vector import AutoresetMode

from benchmarks.report import start_ray_settled
from ray_multiprocess_env._protocol import pipes
from ray_multiprocess_env._protocol.infos import learnable
from ray_multiprocess_env._protocol.shared_layout import ColumnBlock, SharedBatch
from ray_multiprocess_env._protocol.status import DOORBELL
from ray_multiprocess_env._worker.env_worker import EnvWorker, _plain_handle


def measure(env_id: str, k: int, rounds: int = 300, idle: float = 0.0) -> dict[str, float]:
    """µs of CPU per env step: ``raw_us``, ``ours_us``, and ``overhead`` (ours / raw - 1).

    `idle`: the seconds both loops sleep after each call (see the module docstring).
    """
    worker = EnvWorker(
        [lambda: gym.make(env_id)] * k, list(range(k)), AutoresetMode.NEXT_STEP.value
    )
    if worker.start_error is not None:  # (an env that cannot be made)
        raise worker.start_error
    first = worker.envs[0]
    batch = SharedBatch.create(first.observation_space, first.action_space, k)
    worker.handle("share", (batch.spec, 0, k))
    worker.handle("reset", ([None] * k, None, None))
    batched = gym.vector.utils.batch_space(first.action_space, k)
    batched.seed(0)
    actions = [batched.sample() for _ in range(64)]
    leaf = batch.views(0, k).action_leaves[0]
    handle = _plain_handle(worker)
    envs = [gym.make(env_id) for _ in range(k)]  # (the raw loop's own: the worker's autoreset
    for seed, env in enumerate(envs):  # flags stay its own)
        env.reset(seed=seed)
    leaf[...] = actions[0]
    reply = pipes.run(handle, DOORBELL)[2]  # (its infos show which keys get a column)
    specs = [s for s in (learnable(p) for p in (reply.infos[0] or [])) if s is not None]
    block = ColumnBlock.create(specs, k) if specs else None
    if block is not None:
        worker.handle("share_infos", ([block.spec],))

    def ours(count: int, t: int) -> None:
        for i in range(count):
            leaf[...] = actions[(t + i) % 64]
            _, ok, value = pipes.run(handle, DOORBELL)
            pipes.encode_result(ok, value, worker.env_indices, "step")
            if idle:
                time.sleep(idle)

    def raw(count: int, t: int) -> None:
        for i in range(count):
            action = actions[(t + i) % 64]
            for j, env in enumerate(envs):
                _, _, terminated, truncated, _ = env.step(action[j])
                if terminated or truncated:
                    env.reset()
            if idle:
                time.sleep(idle)

    spent = {"raw": 0.0, "ours": 0.0}
    for run in range(rounds):
        order: list[tuple[str, Any]] = [("raw", raw), ("ours", ours)]
        for name, loop in order if run % 2 else order[::-1]:
            start = time.thread_time()
            loop(10, run * 10)
            spent[name] += time.thread_time() - start
    worker.handle("close", ())
    for env in envs:
        env.close()
    for memory in (batch, block):
        if memory is not None:
            memory.close()
    steps = rounds * 10 * k
    raw_us, ours_us = spent["raw"] / steps * 1e6, spent["ours"] / steps * 1e6
    return {"raw_us": raw_us, "ours_us": ours_us, "overhead": ours_us / raw_us - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--idle-us", type=float, default=0.0, help="sleep after each call")
    parser.add_argument("--in-ray", action="store_true", help="in a Ray actor's process")
    args = parser.parse_args()
    if args.idle_us < 0:
        parser.error(f"--idle-us must be 0 or more, got {args.idle_us}")
    given = (args.env, args.k, args.rounds, args.idle_us / 1e6)
    idle = f", {args.idle_us:g} µs idle after each call" if args.idle_us else ""
    if not args.in_ray:
        _report(f"{args.env}, {args.k} envs{idle}", [measure(*given)])
        return
    start_ray_settled()
    try:
        actor = ray.remote(num_cpus=0)(_InActor).remote()
        here: list[dict[str, float]] = []
        there: list[dict[str, float]] = []
        for _ in range(3):  # (taking turns: the machine's drift falls on both alike)
            here.append(measure(*given))
            there.append(ray.get(actor.measure.remote(*given)))
    finally:
        ray.shutdown()
    _report(f"{args.env}, {args.k} envs{idle}, in this process", here)
    _report(f"{args.env}, {args.k} envs{idle}, in a Ray actor's process", there)


def _report(what: str, results: list[dict[str, float]]) -> None:
    """One line: the medians of `results` (`measure`'s)."""
    raw = statistics.median(r["raw_us"] for r in results)
    ours = statistics.median(r["ours_us"] for r in results)
    extra = (ours / raw - 1) * 100
    print(f"{what}: raw loop {raw:.1f} µs, the worker {ours:.1f} µs per env step (+{extra:.1f}%)")


class _InActor:
    """`measure` in a Ray actor's process (``--in-ray``), where a worker steps its envs."""

    def measure(self, *given: Any) -> dict[str, float]:
        return measure(*given)


if __name__ == "__main__":
    main()
