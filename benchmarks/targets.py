"""The throughput targets of the issues, checked against rows measured in one run."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

LIMIT = "machine limit: raw loops at once"  # one per core, each in its own process
SYNC, ASYNC = "gymnasium SyncVectorEnv", "gymnasium AsyncVectorEnv"
BEST_GYMNASIUM = "the best gymnasium vector env"  # whichever of the two was faster


@dataclass
class Row:
    env: str
    implementation: str
    num_envs: int
    steps_per_second: float


def rate(rows: Sequence[Row], env: str, implementation: str, n: int | None = None) -> float | None:
    """The measured env steps/s of `implementation` on `env` (with `n` envs, if given)."""
    if implementation == BEST_GYMNASIUM:
        rates = [rate(rows, env, kind, n) for kind in (SYNC, ASYNC)]
        return max((r for r in rates if r is not None), default=None)
    for row in rows:
        if (row.env, row.implementation) == (env, implementation) and n in (None, row.num_envs):
            return row.steps_per_second
    return None


Check = tuple[str, float, tuple[str, str, int | None], tuple[str, str, int | None]]


def synthetic_checks(w: int) -> list[Check]:
    """Issue #14's targets (2 cores, or many cores), and the older ones of #3 and #9."""

    def ours(env: str, k: int) -> tuple[str, str, int]:
        return env, f"ours, {w} workers x {k}", w * k

    def limit(env: str) -> tuple[str, str, None]:
        return env, LIMIT, None

    def peer(env: str, kind: str, k: int) -> tuple[str, str, int]:
        return env, kind, w * k

    if (os.cpu_count() or 1) > 2:
        return [
            (
                "CartPole, W x 256 >= 0.75 of the limit",
                0.75,
                ours("CartPole", 256),
                limit("CartPole"),
            ),
            ("frames, W x 16 >= 0.6 of the limit", 0.6, ours("frames", 16), limit("frames")),
            ("1 ms env, W x 4 >= 0.9 of the limit", 0.9, ours("1 ms env", 4), limit("1 ms env")),
        ]
    return [
        (
            "frames, W x 16 >= 1.5x AsyncVectorEnv",
            1.5,
            ours("frames", 16),
            peer("frames", ASYNC, 16),
        ),
        ("frames, W x 16 >= 0.8 of the limit", 0.8, ours("frames", 16), limit("frames")),
        (
            "CartPole, W x 64 >= 1.3x SyncVectorEnv",
            1.3,
            ours("CartPole", 64),
            peer("CartPole", SYNC, 64),
        ),
        ("CartPole, W x 512 >= 0.8 of the limit", 0.8, ours("CartPole", 512), limit("CartPole")),
        ("1 ms env, W x 8 >= 0.9 of the limit", 0.9, ours("1 ms env", 8), limit("1 ms env")),
        (
            "CartPole, W x 64 >= 5x AsyncVectorEnv (#3)",
            5.0,
            ours("CartPole", 64),
            peer("CartPole", ASYNC, 64),
        ),
        (
            "CartPole, W x 512 >= 1.0x SyncVectorEnv (#9)",
            1.0,
            ours("CartPole", 512),
            peer("CartPole", SYNC, 512),
        ),
        (
            "1 ms env, W x 8 >= 0.95x the same with Ray calls only (#9)",
            0.95,
            ours("1 ms env", 8),
            ("1 ms env", f"ours with Ray calls only, {w} workers x 8", w * 8),
        ),
        (
            "frames, W x 16 with copy=False: of the limit (no target)",
            0.0,
            ("frames", f"ours with copy=False, {w} workers x 16", w * 16),
            limit("frames"),
        ),
        (
            "CartPole, W x 64: against Ray calls only (no target)",
            0.0,
            ours("CartPole", 64),
            ("CartPole", f"ours with Ray calls only, {w} workers x 64", w * 64),
        ),
    ]


def real_checks(w: int) -> list[Check]:
    """Issue #22's targets on the envs people train on (2 cores; many cores: measured)."""
    many = (os.cpu_count() or 1) > 2
    k = 8

    def ours(env: str, face: str = "ours") -> tuple[str, str, int]:
        return env, f"{face}, {w} workers x {k}", w * k

    def goal(value: float) -> float:
        return 0.0 if many else value

    return [
        (
            "HalfCheetah, W x 8 >= 0.75 of the limit",
            goal(0.75),
            ours("HalfCheetah"),
            ("HalfCheetah", LIMIT, None),
        ),
        (
            "HalfCheetah, W x 8 >= 1.5x SyncVectorEnv",
            goal(1.5),
            ours("HalfCheetah"),
            ("HalfCheetah", SYNC, w * k),
        ),
        ("Pong, W x 8 >= 0.9 of the limit", goal(0.9), ours("Pong"), ("Pong", LIMIT, None)),
        (
            "Pong, W x 8 >= 1.3x the best gymnasium vector env",
            goal(1.3),
            ours("Pong"),
            ("Pong", BEST_GYMNASIUM, w * k),
        ),
        (
            "HalfCheetah, pfrl face W x 8 >= 3x pfrl MultiprocessVectorEnv",
            goal(3.0),
            ours("HalfCheetah", "ours, pfrl face"),
            ("HalfCheetah", "pfrl MultiprocessVectorEnv", w * k),
        ),
        (
            "HalfCheetah, W x 8 against envpool (no target)",
            0.0,
            ours("HalfCheetah"),
            ("HalfCheetah", "envpool (C++)", w * k),
        ),
        (
            "Pong, W x 8 against envpool (no target)",
            0.0,
            ours("Pong"),
            ("Pong", "envpool (C++)", w * k),
        ),
        *first_ready_checks(w),
    ]


def first_ready_checks(w: int) -> list[Check]:
    """Issue #29's first-ready targets, HalfCheetah, W x 8 (its policy one: `policy_checks`)."""
    many = (os.cpu_count() or 1) > 2
    n, half = w * 8, w * 4
    cheetah = "HalfCheetah"

    def first(workers: int, per_worker: int, tail: str = "") -> tuple[str, str, int]:
        name = f"ours first-ready, {workers} workers x {per_worker}, recv({half}){tail}"
        return cheetah, name, n

    envpool_first = f"envpool (C++) first-ready, batch_size={half}"
    limit = (cheetah, LIMIT, None)
    return [
        (
            "HalfCheetah, W x 8 >= 0.6 of the limit (#29)",
            0.6,
            (cheetah, f"ours, {w} workers x 8", n),
            limit,
        ),
        (
            "HalfCheetah first-ready W x 8 >= 0.68 of the limit",
            0.0 if many else 0.68,
            first(w, 8),
            limit,
        ),
        (
            f"HalfCheetah first-ready {2 * w} workers x 4 >= 0.65 of the limit",
            0.0 if many else 0.65,
            first(2 * w, 4),
            limit,
        ),
        (
            "HalfCheetah first-ready W x 8 >= 0.8x envpool's",
            0.8,
            first(w, 8),
            (cheetah, envpool_first, n),
        ),
    ]


def policy_checks(w: int) -> list[Check]:
    """Issues #31's and #29's targets with a torch policy in the loop, W x 8 envs."""
    from benchmarks.loops import DEFAULTS, KEPT, ONE_THREAD, RENICED, first_ready_name

    n, half, cheetah, pong = w * 8, w * 4, "HalfCheetah", "Pong"

    def row(env: str, name: str) -> tuple[str, str, int]:
        return env, name, n

    ours, first = f"ours, {w} workers x 8", first_ready_name(w, 8, half)
    envpool_first = f"envpool (C++) first-ready, batch_size={half}"
    checks: list[Check] = []
    for env in (cheetah, pong):
        sync = row(env, SYNC + DEFAULTS)
        ours_checks: list[Check] = [
            (f"{env}, torch defaults: our lockstep >= 1.0x SyncVectorEnv", 1.0,
             row(env, ours + DEFAULTS), sync),
            (f"{env}, torch defaults kept (no fit): our lockstep against SyncVectorEnv",
             0.0, row(env, ours + KEPT), sync),
            (f"{env}, one torch thread: our lockstep >= 1.3x SyncVectorEnv (torch defaults)",
             1.3, row(env, ours + ONE_THREAD), sync),
            (f"{env}, one torch thread: our first-ready >= 1.5x SyncVectorEnv (torch defaults)",
             1.5, row(env, first + ONE_THREAD), sync),
            (f"{env}, one torch thread: our first-ready >= 0.8x envpool's first-ready", 0.8,
             row(env, first + ONE_THREAD), row(env, envpool_first + ONE_THREAD)),
            (f"{env}, one torch thread: our first-ready >= 1.3x our lockstep (#29)", 1.3,
             row(env, first + ONE_THREAD), row(env, ours + ONE_THREAD)),
            (f"{env}: our lockstep >= 0.97x the same with workers reniced", 0.97,
             row(env, ours + DEFAULTS), row(env, ours + DEFAULTS + RENICED)),
            (f"{env}: our first-ready >= 0.97x the same with workers reniced", 0.97,
             row(env, first + DEFAULTS), row(env, first + DEFAULTS + RENICED)),
        ]  # fmt: skip
        if env != cheetah:  # (#31's targets are HalfCheetah's; Pong's ratios are measured)
            ours_checks = [(_untargeted(text), 0.0, a, b) for text, _, a, b in ours_checks]
        checks += ours_checks
    return checks


def _untargeted(text: str) -> str:
    """A check's text with its target (">= 1.3x") turned into "against", marked no target."""
    return re.sub(r">= [0-9.]+x", "against", text) + " (no target)"


def report(rows: Sequence[Row], checks: Sequence[Check], w: int) -> list[str]:
    """One line per check: met or not (or measured), the ratio and both rates."""
    lines = []
    for text, target, mine, peer in checks:
        a, b = rate(rows, *mine), rate(rows, *peer)
        text = text.replace("W x", f"{w} workers x")
        if a is None or b is None:
            lines.append(f"- {text}: not measured in this run")
            continue
        ratio = a / b
        verdict = "measured" if target == 0 else "**met**" if ratio >= target else "**not met**"
        lines.append(f"- {text}: {verdict}, {ratio:.3f}x ({a:,.0f} vs {b:,.0f} env steps/s)")
    return lines


def tianshou_checks(w: int) -> list[Check]:
    """Issue #24's comparison: our Tianshou face against Tianshou's own vector envs (no target)."""
    sizes = {"CartPole": 16, "HalfCheetah": 8}
    return [
        (
            f"{env}, Tianshou face W x {k} against Tianshou {kind} (no target)",
            0.0,
            (env, f"ours, Tianshou face, {w} workers x {k}", w * k),
            (env, f"Tianshou {kind}", w * k),
        )
        for env, k in sizes.items()
        for kind in ("SubprocVectorEnv", "ShmemVectorEnv", "RayVectorEnv")
    ]
