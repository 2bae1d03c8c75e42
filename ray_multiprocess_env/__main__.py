"""Command line: ``python -m ray_multiprocess_env demo [options]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ray_multiprocess_env",
        description="Ray vector envs for reinforcement learning.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="step gymnasium envs with a random policy on local Ray and report throughput",
        description=(
            "Run NUM_ENVS gymnasium envs as Ray actors in one RayVectorEnv, step them with a "
            "random policy for STEPS vector steps, and print env steps/s, episodes finished and "
            "their mean return. Starts a local Ray runtime (dashboard off) unless Ray is already "
            "running or RAY_ADDRESS names a cluster."
        ),
    )
    demo.add_argument("--env-id", default="CartPole-v1", help="gymnasium env id (CartPole-v1)")
    demo.add_argument("--num-envs", type=int, default=8, help="number of envs/actors (8)")
    demo.add_argument("--steps", type=int, default=500, help="vector steps to run (500)")
    demo.add_argument("--seed", type=int, default=0, help="env i gets seed SEED+i (0)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from ray_multiprocess_env.demo import run_demo

    try:
        result = run_demo(
            env_id=args.env_id,
            num_envs=args.num_envs,
            steps=args.steps,
            seed=args.seed,
            progress=not args.no_progress,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"env: {args.env_id} x {args.num_envs} Ray actors, {args.steps} vector steps")
    print(f"env steps/s: {result.steps_per_second:.0f}")
    print(f"episodes finished: {result.episodes}")
    print(f"mean return: {result.mean_return:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
