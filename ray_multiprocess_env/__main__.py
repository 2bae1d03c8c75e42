"""Command line: ``python -m ray_multiprocess_env demo [options]``."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Sequence

from ray_multiprocess_env.bench_policies import POLICIES

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ray_multiprocess_env",
        description="Ray vector envs for reinforcement learning.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="step gymnasium envs with a random policy on local Ray and report throughput",
        description=(
            "Run NUM_ENVS gymnasium envs (64 per CPU) in Ray workers through make_vector_env, "
            "step them with a random policy for STEPS vector steps, and print env steps/s beside "
            "gymnasium's SyncVectorEnv (the same envs) and AsyncVectorEnv (16 envs per "
            "worker of ours, a process each), then episodes "
            "finished and their mean return. Starts a local Ray runtime (dashboard off) unless "
            "Ray is already running or RAY_ADDRESS names a cluster."
        ),
    )
    demo.add_argument("--env-id", default="CartPole-v1", help="gymnasium env id (CartPole-v1)")
    demo.add_argument(
        "--num-envs", type=int, default=None, help="number of envs (64 per CPU Ray offers)"
    )
    demo.add_argument("--steps", type=int, default=3000, help="vector steps to run (3000)")
    demo.add_argument(
        "--peer-seconds",
        type=float,
        default=2.0,
        help="seconds to measure gymnasium's SyncVectorEnv and AsyncVectorEnv each (2; 0: skip)",
    )
    demo.add_argument("--seed", type=int, default=0, help="env i gets seed SEED+i (0)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    bench = commands.add_parser(
        "bench",
        help="measure env steps/s of a few worker settings for one env and recommend one",
        description=(
            "Measure GymnasiumVectorEnv throughput for ENV, for each setting of workers x envs "
            "per worker, print a table and the recommended setting. ENV is a gymnasium id "
            "(CartPole-v1) or 'package.module:factory' naming a function that returns an env "
            "(taking no argument, or the env index). The actions are random, or with --policy "
            "those of a small torch policy acting on every step, as in training."
        ),
    )
    bench.add_argument("env", metavar="ENV", help="gymnasium id or package.module:factory")
    bench.add_argument(
        "--workers", type=_int_list, default=None, help="worker counts, e.g. 1,2 (1 and #CPUs)"
    )
    bench.add_argument(
        "--envs-per-worker", type=_int_list, default=None, help="e.g. 1,64 (1,16,64,256)"
    )
    bench.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help="act with a torch policy: mlp (256 x 256) or conv (frames); needs torch",
    )
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.add_argument("--seconds", type=float, default=2.0, help="time per setting (2.0)")
    bench.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _version() -> str:
    from ray_multiprocess_env import __version__

    return __version__


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive ints, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "bench":
        return _bench(args)
    return _demo(args)


def _bench(args: argparse.Namespace) -> int:
    import ray

    from ray_multiprocess_env.bench import (
        DEFAULT_ENVS_PER_WORKER,
        as_json,
        default_settings,
        env_factory,
        format_table,
        recommended_code,
        sweep,
    )
    from ray_multiprocess_env.runtime import ensure_runtime, shutdown_runtime

    try:
        env_fn = env_factory(args.env)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.policy is not None and importlib.util.find_spec("torch") is None:
        print(f"error: --policy {args.policy} needs torch: pip install torch", file=sys.stderr)
        return 2
    ensure_runtime()
    try:
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        cpus = int(resources.get("CPU", 1))
        workers = args.workers or sorted({1, cpus})
        per_worker = args.envs_per_worker or DEFAULT_ENVS_PER_WORKER
        settings = [(w, k) for w in workers for k in per_worker]
        if args.workers is None and args.envs_per_worker is None:
            settings = default_settings(cpus)
        results = sweep(
            env_fn,
            settings,
            seconds=args.seconds,
            progress=not args.no_progress,
            policy=args.policy,
        )
    finally:
        shutdown_runtime()
    if args.json:
        print(as_json(args.env, cpus, args.seconds, results, policy=args.policy))
        return 0
    acting = "random actions" if args.policy is None else f"a torch {args.policy} policy acting"
    print(
        f"env: {args.env}, {cpus} CPUs in the Ray cluster, {args.seconds} s per setting, {acting}"
    )
    print(format_table(results))
    best = max(results, key=lambda r: r.steps_per_second)
    print("recommended (paste it):")
    print(recommended_code(args.env, env_fn, best))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ray_multiprocess_env.demo import run_demo

    try:
        result = run_demo(
            env_id=args.env_id,
            num_envs=args.num_envs,
            steps=args.steps,
            seed=args.seed,
            progress=not args.no_progress,
            peer_seconds=args.peer_seconds,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    per_worker = -(-result.num_envs // result.num_workers)
    print(
        f"env: {args.env_id} x {result.num_envs} in {result.num_workers} Ray workers "
        f"(make_vector_env, up to {per_worker} envs each), {args.steps} vector steps"
    )
    print(f"env steps/s: {result.steps_per_second:.0f}")
    for name, rate in result.peers.items():
        envs = result.peer_envs[name]
        setup = (
            f"the same {envs} envs in this process"
            if name == "SyncVectorEnv"
            else f"{envs} envs, a process each"
        )
        if rate is None:
            print(f"gymnasium {name}, {setup}: not measured (too many processes)")
        else:
            ratio = result.steps_per_second / rate
            print(f"gymnasium {name}, {setup}: {rate:.0f} env steps/s (ours: {ratio:.2f}x)")
    print(f"episodes finished: {result.episodes}")
    print(f"mean return: {result.mean_return:.1f}")
    print(
        f"next: `python -m ray_multiprocess_env bench {args.env_id}` finds the fastest setting "
        "for your env; RayVectorEnv is the pfrl-style API (docs/usage.md)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
