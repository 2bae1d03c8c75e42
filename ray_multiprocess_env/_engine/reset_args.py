"""A reset's arguments, as each env and each worker takes them, and the positions they reset.

A face gives a reset one seed per env (`SeedBook.for_reset`), options (one dict for every env,
or one per env) and maybe a mask. Envs with no batch layout are reset one by one with their
keyword arguments (`env_kwargs`); a worker of a batch layout takes its part of each in one
message (`worker_args`), and resets the positions its mask marks (`reset_positions`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray_multiprocess_env._engine.pool import Worker
from ray_multiprocess_env._engine.transports.base import Ticket

__all__ = ["env_kwargs", "reset_positions", "ticket_positions", "worker_args"]


def env_kwargs(seeds: Sequence[int | None], options: Any) -> list[dict[str, Any]]:
    """The keyword arguments of each env's ``reset``: its seed and options (None left out)."""
    out = []
    for env, seed in enumerate(seeds):
        kwargs: dict[str, Any] = {} if seed is None else {"seed": seed}
        env_options = options if options is None or isinstance(options, Mapping) else options[env]
        if env_options is not None:
            kwargs["options"] = env_options
        out.append(kwargs)
    return out


def worker_args(
    workers: Sequence[Worker], seeds: Sequence[int | None], options: Any, mask: Any = None
) -> list[tuple[Any, ...]]:
    """Each worker's ``(seeds, options, mask)``: its part of each (its mask a list, or None).

    `options`: one dict for every env, or one per env; `mask`: an array, one flag per env.
    """
    out = []
    for worker in workers:
        span = slice(worker.envs.start, worker.envs.stop)
        part = options if options is None or isinstance(options, Mapping) else list(options[span])
        out.append((seeds[span], part, None if mask is None else mask[span].tolist()))
    return out


def reset_positions(args: tuple[Any, ...] | None) -> list[int] | None:
    """The positions a ``reset`` with these arguments resets (None: all of the worker's)."""
    mask = None if args is None else args[2]
    return None if mask is None else [k for k, m in enumerate(mask) if m]


def ticket_positions(ticket: Ticket) -> list[int] | None:
    """The positions a ``step`` or ``reset`` ticket ran in its worker (None: all)."""
    return ticket.args[1] if ticket.op == "step" else reset_positions(ticket.args)
