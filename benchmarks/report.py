"""Write one benchmark's section of docs/benchmarks.md, with the machine's facts and a plot."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil
import ray

TITLE = "# Benchmarks\n"


def start_ray_settled() -> None:
    """Start a local Ray on every core, then wait for its start-up to settle.

    Ray's idle worker processes go on importing for seconds after ``ray.init``; figures taken
    meanwhile would share the cores with them.
    """
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    time.sleep(10)


def workers_of(envs: Any) -> list[psutil.Process]:
    """The worker processes of a vector env of ours (none for gymnasium's own)."""
    engine = getattr(envs, "_engine", None)
    return [] if engine is None else [psutil.Process(pid) for pid in engine.run_on_workers("pid")]


def cpu_of(processes: list[psutil.Process]) -> float:
    """Seconds of CPU (user and kernel) these processes have used."""
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def write_section(path: Path, name: str, markdown: str) -> None:
    """Replace (or add) the section `name` of `path`, delimited by HTML comment markers."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else TITLE
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat: user ... steal), or [] off Linux."""
    try:
        return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return []


def idle_and_stolen(before: list[int], after: list[int]) -> tuple[float, float] | None:
    """The shares (%) of CPU time idle (iowait too) and stolen between two `cpu_times` readings.

    Stolen: what the hypervisor of a virtual machine gave to others. None off Linux.

    Example:
        >>> idle_and_stolen([0, 0, 0, 0, 0, 0, 0, 0], [50, 0, 0, 40, 0, 0, 0, 10])
        (40.0, 10.0)
    """
    if len(before) < 8 or len(after) < 8:
        return None
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = max(1, sum(delta))
    return 100 * (delta[3] + delta[4]) / total, 100 * delta[7] / total


def stolen(before: list[int], after: list[int]) -> str:
    """The share of CPU time the hypervisor gave to others (steal) between two readings."""
    shares = idle_and_stolen(before, after)
    return "unknown" if shares is None else f"{shares[1]:.1f}%"


@contextlib.contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """Environment variable `name` set to `value` inside (a vector env made there reads it).

    Example:
        >>> with environment_variable("RAY_MULTIPROCESS_ENV_WORKER_SPIN_US", "0"):
        ...     os.environ["RAY_MULTIPROCESS_ENV_WORKER_SPIN_US"]
        '0'
    """
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def child_result(command: list[str], what: str) -> Any:
    """Run `command` (one run of a benchmark, in a process of its own); its ``RESULT`` JSON."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def package_version(package: str) -> str:
    """`package`'s installed version, or "not installed"."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def plot_rates(rows: list[Any], path: Path, limit: str) -> None:
    """Env steps/s against the number of envs, a panel per env, saved to `path` (a PNG).

    `rows` have ``env``, ``implementation``, ``num_envs`` and ``steps_per_second``; the rows of
    the raw single-env loop and of `limit` (the machine's limit) are drawn as lines across.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r.env for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4.5), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        env_rows = [r for r in rows if r.env == env]
        kinds = {r.implementation.split(", ")[0] for r in env_rows}
        for kind in sorted(kinds):
            pts = sorted(
                (r.num_envs, r.steps_per_second)
                for r in env_rows
                if r.implementation.split(", ")[0] == kind
            )
            if kind in ("raw single-env loop", limit):
                style = "--" if kind == limit else ":"
                ax.axhline(pts[0][1], color="grey", linestyle=style, label=kind)
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
        ax.set(xscale="log", yscale="log", xlabel="envs", ylabel="env steps/s", title=env)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
