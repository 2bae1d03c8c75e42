"""The driver's CPU per lockstep step: the library against a bare loop over the same workers.

Run by hand from the repository root, on a machine with nothing else running:

    python -m benchmarks.driver_floor [--env CartPole-v1] [--k 8] [--rounds 200] [--functions 0]
    python -m benchmarks.driver_floor --first-ready [--env ...] [--k 8] [--functions 0]
    python -m benchmarks.driver_floor --verbs [--env ...] [--k 8]

One `make_vector_env` of 2 workers x `k` envs on shared memory is stepped three ways, taking
turns every 20 steps (so the machine's drift falls on all alike):

- ``face``: the gymnasium face's ``step`` (what a user calls; observations copied out);
- ``engine``: the engine's ``step``, as the face calls it, without the face's checks and copies;
- ``bare``: what the same workers need and nothing else: the actions written into their rows,
  one doorbell message per worker on its pipe, ``poll`` on the answers, each answer's header and
  status record read, then the rows and the info columns copied out (as the face does). No
  tickets, no checks, no recovery: a yardstick of the library's own protocol, the floor of what
  its bookkeeping could cost, beside the bare-Python probe's own design (`against_probe`).

The bare loop keeps the transports' sequence numbers in step, so the library's calls go on
working between turns. `bare_first_ready` is its first-ready twin, envpool's loop over the same
workers (each worker that answered has its rows copied out and is rung again at once), which
`benchmarks.against_probe` runs beside ours and the probe's.

The table splits off the part of each way's CPU spent in the kernel
(``getrusage`` of the thread: its system calls, and being put to sleep and woken in ``poll``),
which Python code cannot shorten, and gives the workers' CPU per env step under each way
(psutil: the workers run the same code whichever way steps them, so what it differs by is what
the driver's way costs them, a poll that lasts while the driver works among it: set
``RAY_MULTIPROCESS_ENV_WORKER_SPIN_US=0`` to leave polling out). It also counts the Python
bytecodes the face and the engine
run per step (a tracer on a separate run of steps: counting slows them down, so it is not
timed); with ``--functions N`` it lists the N functions that run the most of the face's.

``--first-ready`` counts instead the bytecodes of the face's first-ready round trip: a
``recv(batch_size=k)`` and the ``send`` of new actions to the envs it handed back, as an
envpool-style loop runs them (a worker's envs come back together, so a `recv` may hand back
more than one worker's). The count includes the loop's own (about 50 bytecodes). How many
workers a `recv` hands back depends on timing, so the count does too; ``--first-ready
--fixed`` counts three loops where it does not: one worker of `k` envs (``recv(batch_size=k)``
always hands back that worker), 2 workers of `k` with ``recv()`` waiting for both, and 2
workers of `k` with ``recv(batch_size=k)`` while the second is inside a step of a few seconds
(each `recv` polls both pipes and hands back the first worker's envs: envpool's usual case).

``--verbs`` counts the engine's other steps and resets instead: `step_envs` (Tianshou's
synchronous ``step(action, id)``) of one worker's envs and of every env, and `reset` of every
env, each a call that waits for every worker it called; and the face's `async_reset` with the
`recv` of every env after it.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import select
import sys
import time
from typing import Any

import numpy as np
import ray

from benchmarks.report import cpu_of, workers_of
from ray_multiprocess_env import GymnasiumVectorEnv, make_vector_env
from ray_multiprocess_env._protocol.pipes import HEADER
from ray_multiprocess_env._protocol.status import DOORBELL, RECORD

_TURN = 20  # steps per turn
_STUCK_S = 5.0  # seconds of the stuck worker's step (`_one_of_two`): past the loops counted


def measure(env_id: str, k: int, rounds: int) -> dict[str, Any]:
    """µs of driver CPU per step, of the workers' per env step, env steps/s of each way; bytecodes.

    (The workers run the same code whichever way steps them: what their CPU per env step
    differs by is what the driver's way costs them.)
    """
    env = make_vector_env(env_id, 2 * k, num_workers=2, seed=0)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        actions = [env.action_space.sample() for _ in range(64)]
        engine = env._engine  # (private: what the face calls)
        loops = {"face": _loop(env.step, actions), "engine": _loop(engine.step, actions)}
        loops["bare"] = _bare(engine, actions)
        for loop in loops.values():
            loop(100, 0)  # (warm)
        workers = workers_of(env)
        cpu = dict.fromkeys(loops, 0.0)
        workers_cpu = dict.fromkeys(loops, 0.0)
        kernel = dict.fromkeys(loops, 0.0)
        wall = dict.fromkeys(loops, 0.0)
        for turn in range(rounds):
            names = list(loops) if turn % 2 else list(loops)[::-1]
            for name in names:
                start_cpu, start_kernel = time.thread_time(), _kernel_time()
                start, start_workers = time.perf_counter(), cpu_of(workers)
                loops[name](_TURN, turn * _TURN)
                workers_cpu[name] += cpu_of(workers) - start_workers
                cpu[name] += time.thread_time() - start_cpu
                kernel[name] += _kernel_time() - start_kernel
                wall[name] += time.perf_counter() - start
        steps = rounds * _TURN
        out: dict[str, Any] = {
            name: {
                "cpu_us": cpu[name] / steps * 1e6,
                "kernel_us": kernel[name] / steps * 1e6,
                "workers_us": workers_cpu[name] / (2 * k * steps) * 1e6,
                "rate": 2 * k * steps / wall[name],
            }
            for name in loops
        }
        counted = {name: _bytecodes(loop) for name, loop in loops.items()}
        out["bytecodes"] = {name: sum(by.values()) for name, by in counted.items()}
        out["functions"] = counted["face"]
        return out
    finally:
        env.close()


def _kernel_time() -> float:
    """Seconds this thread has spent in the kernel (its system calls, and the wake-ups)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_stime


def _loop(step: Any, actions: list[Any]) -> Any:
    def loop(count: int, at: int) -> None:
        for i in range(count):
            step(actions[(at + i) % 64])

    return loop


def _bare_workers(engine: Any) -> tuple[Any, ...]:
    """What a bare loop needs of the engine's own workers (module docstring).

    Each worker's transport, action rows and first and last env; the store; each answer
    pipe's transport and a poller of them all; a buffer to read answers into.
    """
    workers = engine._pool.workers  # (private: the workers the engine steps)
    transports = [w.transport for w in workers]
    if any(t.kind != "shared_memory" for t in transports):
        raise SystemExit("the workers are not on shared memory: nothing to compare")
    leaves = [t._leaf for t in transports]
    bounds = [(w.envs.start, w.envs.stop) for w in workers]
    by_fd = {t.fileno(): t for t in transports}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return transports, leaves, bounds, engine._store, by_fd, poller, bytearray(1 << 16)


def _bare(engine: Any, actions: list[Any]) -> Any:
    """The bare loop over the engine's own workers (module docstring)."""
    transports, leaves, bounds, store, by_fd, poller, scratch = _bare_workers(engine)
    answer_size = HEADER.size + RECORD.size

    def loop(count: int, at: int) -> None:
        for i in range(count):
            batch = actions[(at + i) % 64]
            for transport, leaf, (start, stop) in zip(transports, leaves, bounds, strict=True):
                leaf[...] = batch[start:stop]
                transport._seq += 1
                os.write(transport._go, HEADER.pack(transport._seq, RECORD.size) + DOORBELL)
            waiting, written = len(transports), 0
            while waiting:
                for fd, _ in poller.poll():
                    size = os.readv(fd, [scratch])
                    seq, _ = HEADER.unpack_from(scratch)
                    _, kind, columns = RECORD.unpack_from(scratch, HEADER.size)
                    if size != answer_size or kind != 2:
                        raise SystemExit("an answer other than a status record: not comparable")
                    by_fd[fd]._answered = seq
                    written |= columns
                    waiting -= 1
            np.array(store.observations), np.array(store.rewards)
            np.array(store.terminations), np.array(store.truncations)
            infos = {}
            for j, column in enumerate(store.columns):
                if written >> j & 1:
                    name = column.path[-1]
                    infos[name], infos[f"_{name}"] = column.values.copy(), column.mask.copy()

    return loop


def bare_first_ready(engine: Any, actions: list[Any]) -> tuple[Any, Any, Any]:
    """A bare first-ready loop over the engine's own workers, envpool's way (as the probe's).

    Returns ``(start, one, drain)``: ``start(t)`` rings every worker; ``one(t)`` waits for
    answers, and each worker that answered has its rows copied out and the next actions
    rung at once (its env steps are returned); ``drain()`` reads the last answers. Nothing of
    the library's may be in flight from ``start`` to ``drain``; the library's calls go on
    working after it (the transports' sequence numbers kept in step).
    """
    transports, leaves, bounds, store, by_fd, poller, scratch = _bare_workers(engine)
    answer_size = HEADER.size + RECORD.size
    worker_of = {fd: transports.index(transport) for fd, transport in by_fd.items()}

    def ring(worker: int, t: int) -> None:
        transport, (first, stop) = transports[worker], bounds[worker]
        leaves[worker][...] = actions[t % len(actions)][first:stop]
        transport._seq += 1
        os.write(transport._go, HEADER.pack(transport._seq, RECORD.size) + DOORBELL)

    def start(t: int) -> None:
        for worker in range(len(transports)):
            ring(worker, t)

    def one(t: int) -> int:
        steps = 0
        for fd, _ in poller.poll():
            size = os.readv(fd, [scratch])
            seq, _ = HEADER.unpack_from(scratch)
            _, kind, written = RECORD.unpack_from(scratch, HEADER.size)
            if size != answer_size or kind != 2:
                raise SystemExit("an answer other than a status record: not comparable")
            worker = worker_of[fd]
            transports[worker]._answered = seq
            first, stop = bounds[worker]
            rows = slice(first, stop)
            store.observations[rows].copy(), store.rewards[rows].copy()
            store.terminations[rows].copy(), store.truncations[rows].copy()
            infos = {}
            for j, column in enumerate(store.columns):
                if written >> j & 1:
                    name = column.path[-1]
                    infos[name], infos[f"_{name}"] = (
                        column.values[rows].copy(),
                        column.mask[rows].copy(),
                    )
            ring(worker, t)
            steps += stop - first
        return steps

    def drain() -> None:
        waiting = len(transports)
        while waiting:
            for fd, _ in poller.poll():
                os.readv(fd, [scratch])
                by_fd[fd]._answered = HEADER.unpack_from(scratch)[0]
                waiting -= 1

    return start, one, drain


def _bytecodes(loop: Any, steps: int = 100) -> dict[str, float]:
    """Python bytecodes run per step by `loop`, by function (a tracer counts them)."""
    count = collections.Counter[str]()

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            code = frame.f_code
            count[f"{code.co_qualname} ({os.path.basename(code.co_filename)})"] += 1
        return trace

    sys.settrace(trace)
    try:
        loop(steps, 0)
    finally:
        sys.settrace(None)
    return {name: ops / steps for name, ops in count.items()}


def first_ready_bytecodes(env_id: str, k: int, rounds: int) -> dict[str, Any]:
    """Bytecodes per first-ready round trip of the face, by function; envs per `recv`."""
    env = make_vector_env(env_id, 2 * k, num_workers=2, seed=0)
    try:
        env.reset(seed=0)
        space = env.single_action_space
        sizes: list[int] = []

        def actions(count: int) -> np.ndarray:
            return np.zeros((count, *space.shape), dtype=space.dtype)

        def loop(count: int, at: int) -> None:
            for _ in range(count):
                ids = env.recv(batch_size=k)[-1]["env_id"]
                sizes.append(len(ids))
                env.send(actions(len(ids)), ids)

        env.send(actions(2 * k), np.arange(2 * k))
        loop(100, 0)  # (warm)
        sizes.clear()
        functions = _bytecodes(loop, max(rounds, 1))
        return {"functions": functions, "envs_per_recv": sum(sizes) / len(sizes)}
    finally:
        env.close()


def fixed_first_ready_bytecodes(env_id: str, k: int, rounds: int) -> dict[str, float]:
    """Bytecodes per first-ready round trip, where what each `recv` hands back is fixed.

    By loop (1 worker of `k` envs, 2 workers, 1 of 2 workers): the count does not depend on
    timing.
    """
    out = {}
    for workers, label in ((1, "1 worker"), (2, "2 workers")):
        env = make_vector_env(env_id, workers * k, num_workers=workers, seed=0)
        try:
            env.reset(seed=0)
            space = env.single_action_space
            actions = np.zeros((workers * k, *space.shape), dtype=space.dtype)

            def loop(count: int, at: int, env: Any = env, actions: Any = actions) -> None:
                for _ in range(count):
                    ids = env.recv()[-1]["env_id"]  # (all in flight: every worker's)
                    env.send(actions[: len(ids)], ids)

            env.send(actions, np.arange(workers * k))
            loop(100, 0)  # (warm)
            key = f"{label} x {k}, `recv()` + `send`"
            out[key] = sum(_bytecodes(loop, max(rounds, 1)).values())
            env.recv()
        finally:
            env.close()
    out[f"1 of 2 workers x {k}, `recv(batch_size={k})` + `send`"] = _one_of_two(env_id, k, rounds)
    return out


def _one_of_two(env_id: str, k: int, rounds: int) -> float:
    """Bytecodes per `recv(batch_size=k)` + `send` that wait for one of two workers.

    The other worker is inside a step of a few seconds all along, so each `recv` polls both
    pipes and hands back the first worker's envs (envpool's loop, its usual case).
    """
    import gymnasium as gym

    class Stuck(gym.Wrapper):  # type: ignore[type-arg]  # (in a function: pickled by value)
        def step(self, action: Any) -> Any:
            time.sleep(_STUCK_S / k)  # (its k envs in turn: `_STUCK_S` in all)
            return self.env.step(action)

    def stuck() -> Any:
        return Stuck(gym.make(env_id))

    env = GymnasiumVectorEnv([lambda: gym.make(env_id)] * k + [stuck] * k, envs_per_worker=k)
    try:
        env.reset(seed=0)
        space = env.single_action_space
        actions = np.zeros((2 * k, *space.shape), dtype=space.dtype)

        def loop(count: int, at: int) -> None:
            for _ in range(count):
                ids = env.recv(batch_size=k)[-1]["env_id"]
                if len(ids) != k or ids[0] != 0:  # (the stuck worker answered: too soon)
                    raise RuntimeError(f"`recv` handed back envs {ids}; raise _STUCK_S")
                env.send(actions[:k], ids)

        env.send(actions, np.arange(2 * k))
        loop(50, 0)  # (warm)
        ops = sum(_bytecodes(loop, max(rounds, 1)).values())
        env.recv(timeout=_STUCK_S * 2)
        return ops
    finally:
        env.close()


def verb_bytecodes(env_id: str, k: int, rounds: int) -> dict[str, float]:
    """Bytecodes per call of `step_envs`, `reset` and `async_reset`, 2 workers of `k` envs.

    `step_envs` (Tianshou's synchronous ``step(action, id)``) of one worker's envs and of every
    env, and `reset` of every env: synchronous calls that wait for every worker they call. And
    the face's first-ready `async_reset` and the `recv` of every env after it.
    """
    env = make_vector_env(env_id, 2 * k, num_workers=2, seed=0)
    try:
        env.reset(seed=0)
        engine = env._engine  # (private: what the faces call)
        space = env.single_action_space
        out = {}
        for label, ids in (("one worker's envs", np.arange(k)), ("every env", np.arange(2 * k))):
            actions = np.zeros((len(ids), *space.shape), dtype=space.dtype)

            def steps(count: int, at: int, ids: Any = ids, actions: Any = actions) -> None:
                for _ in range(count):
                    engine.step_envs(actions, ids)

            steps(50, 0)  # (warm)
            key = f"2 workers x {k}, `step_envs` of {label}, per call"
            out[key] = sum(_bytecodes(steps, max(rounds, 1)).values())

        def resets(count: int, at: int) -> None:
            for _ in range(count):
                engine.reset()

        resets(10, 0)  # (warm)
        key = f"2 workers x {k}, `reset` of every env, per call"
        out[key] = sum(_bytecodes(resets, max(rounds // 10, 1)).values())

        def async_resets(count: int, at: int) -> None:
            for _ in range(count):
                env.async_reset()
                env.recv()  # (every env: all that is in flight)

        async_resets(10, 0)  # (warm)
        key = f"2 workers x {k}, the face's `async_reset` + `recv()` of every env, per call"
        out[key] = sum(_bytecodes(async_resets, max(rounds // 10, 1)).values())
        return out
    finally:
        env.close()


def table(env_id: str, k: int, result: dict[str, Any]) -> list[str]:
    """The result as markdown rows."""
    bare = result["bare"]
    lines = [
        f"| {env_id}, 2 workers x {k}, lockstep | driver CPU per step (µs) | of it in the kernel "
        "| workers' CPU per env step (µs) | env steps/s | bytecodes per step |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("face", "engine", "bare"):
        row = result[name]
        ops = result["bytecodes"].get(name)
        lines.append(
            f"| {name} | {row['cpu_us']:.0f} ({row['cpu_us'] / bare['cpu_us']:.2f}x bare) "
            f"| {row['kernel_us']:.0f} | {row['workers_us']:.1f} | {row['rate']:,.0f} "
            f"| {'' if ops is None else f'{ops:,.0f}'} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--functions", type=int, default=0, help="list the face's top N")
    parser.add_argument("--first-ready", action="store_true", help="count recv + send instead")
    parser.add_argument("--fixed", action="store_true", help="with --first-ready: see above")
    parser.add_argument("--verbs", action="store_true", help="count step_envs and resets instead")
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    counter = verb_bytecodes if args.verbs else None
    if args.first_ready and args.fixed:
        counter = fixed_first_ready_bytecodes
    if counter is not None:  # (counts only)
        try:
            counts = counter(args.env, args.k, args.rounds)
        finally:
            ray.shutdown()
        for label, ops in counts.items():
            print(f"{args.env}, {label}: {ops:,.0f} bytecodes")
        return
    try:
        if args.first_ready:
            result = first_ready_bytecodes(args.env, args.k, args.rounds)
        else:
            result = measure(args.env, args.k, args.rounds)
    finally:
        ray.shutdown()
    unit = "round trip" if args.first_ready else "step"
    if args.first_ready:
        print(
            f"{args.env}, 2 workers x {args.k}, `recv(batch_size={args.k})` + `send`: "
            f"{sum(result['functions'].values()):,.0f} bytecodes per round trip, "
            f"{result['envs_per_recv']:.2f} envs per `recv`"
        )
    else:
        print("\n".join(table(args.env, args.k, result)))
    if args.functions:
        print(f"\n| the face's {unit}, by function | bytecodes per {unit} |\n|---|---:|")
        top = sorted(result["functions"].items(), key=lambda item: -item[1])[: args.functions]
        for name, ops in top:
            print(f"| `{name}` | {ops:,.0f} |")


if __name__ == "__main__":
    main()
