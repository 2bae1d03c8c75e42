"""Run the peers' own test suites with our classes in place of theirs.

stable-baselines3's VecEnv tests run with ``SubprocVecEnv`` replaced by `SB3VecEnv`, from the
source distribution of the installed SB3 version (it ships ``tests/``; nothing of it is kept in
this repository)::

    python scripts/peers/run.py sb3

gymnasium's vector tests run with ``AsyncVectorEnv`` replaced by `GymnasiumVectorEnv`, from a
checkout of https://github.com/Farama-Foundation/Gymnasium at the installed version's tag (its
source distribution has no tests)::

    git clone --branch v1.2.2 https://github.com/Farama-Foundation/Gymnasium /tmp/Gymnasium
    python scripts/peers/run.py gymnasium --source /tmp/Gymnasium

Tianshou's vector-env and collector tests run with ``SubprocVectorEnv``, ``ShmemVectorEnv`` and
``RayVectorEnv`` replaced by `TianshouVectorEnv`, from a checkout at the installed version's tag
(its source distribution has no tests either; its tests need ``networkx``)::

    git clone --branch v2.0.1 https://github.com/thu-ml/tianshou /tmp/tianshou
    python scripts/peers/run.py tianshou --source /tmp/tianshou

Arguments after ``--`` go to pytest. The tests listed in `NOT_APPLICABLE` are deselected, with
the reason printed; everything else must pass. Rendering runs headless (pygame's dummy video
driver, MuJoCo on EGL) unless the environment says otherwise.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

SUITES = {
    "sb3": [
        "tests/test_vec_envs.py",
        "tests/test_vec_monitor.py",
        "tests/test_vec_normalize.py",
        "tests/test_vec_stacked_obs.py",
        "tests/test_vec_extract_dict_obs.py",
        "tests/test_vec_check_nan.py",
    ],
    "tianshou": ["test/base/test_env.py", "test/base/test_collector.py"],
    "gymnasium": [
        "tests/vector/test_autoreset_mode.py",
        "tests/vector/test_vector_env.py",
        "tests/vector/test_vector_env_info.py",
        "tests/vector/test_vector_wrapper.py",
        "tests/vector/test_observation_mode.py",
        "tests/wrappers/vector",
    ],
}

_MODES = "tests/vector/test_observation_mode.py::TestVectorEnvObservationModes"

#: Test ids that check the replaced class's own machinery, and why they do not apply.
NOT_APPLICABLE = {
    "sb3": {
        "tests/test_vec_envs.py::test_subproc_start_method": (
            "checks multiprocessing start methods; Ray starts the workers"
        ),
    },
    "tianshou": {},
    "gymnasium": {
        **{
            f"tests/vector/test_vector_env.py::test_partial_reset_failure[Async({mode})]": (
                "expects AsyncVectorEnv's AssertionError text for a bad `reset_mask`; we raise "
                "a ValueError naming the argument, its shape and the shape needed"
            )
            for mode in ("shared_memory=True", "shared_memory=False")
        },
        **{
            f"{_MODES}::{test}[AsyncVectorEnv(shared_memory={shared})]": (
                f"expects gymnasium's own wording of {what}; ours names {names} in its own "
                "words (the same error types)"
            )
            for shared in ("True", "False")
            for test, what, names in (
                ("test_invalid_observation_mode", "a bad mode", "the value and the accepted forms"),
                ("test_obs_mode_same_different_spaces", "differing spaces", "the env and the fix"),
            )
        },
    },
}

#: Tests that do not apply when a worker holds more than one env, and why.
ONE_ENV_PER_WORKER = {
    "test/base/test_env.py::test_async_check_id": (
        "times each env's answer as if each env had its own process; the envs of one worker "
        "answer together (it passes with --envs-per-worker 1)"
    ),
}

#: The folder of each suite's tests, where our conftest.py goes.
TEST_DIRS = {"sb3": "tests", "gymnasium": "tests", "tianshou": "test"}

HEADLESS = {"SDL_VIDEODRIVER": "dummy", "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}


def sb3_source(workdir: Path) -> Path:
    """Download and unpack the source distribution of the installed stable-baselines3."""
    version = importlib.metadata.version("stable-baselines3")
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
            *("--no-binary", "stable-baselines3", f"stable-baselines3=={version}"),
            *("--dest", str(workdir)),
        ],
        check=True,
    )
    (archive,) = workdir.glob("stable_baselines3-*.tar.gz")
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(workdir, filter="data")
        else:
            tar.extractall(workdir)  # the package index's sdist of SB3
    return workdir / archive.name.removesuffix(".tar.gz")


def check_source(suite: str, source: Path) -> None:
    """Refuse a checkout of gymnasium or Tianshou whose version is not the installed one's."""
    version = importlib.metadata.version(suite)
    if suite == "gymnasium":
        text = (source / "gymnasium" / "__init__.py").read_text(encoding="utf-8")
        found = f'__version__ = "{version}"' in text
    else:  # Tianshou's version is in its pyproject.toml
        text = (source / "pyproject.toml").read_text(encoding="utf-8")
        found = f'\nversion = "{version}"' in text
    if not found:
        raise SystemExit(
            f"{source} is not a checkout of {suite} {version}, the installed version; "
            f"check out its tag: git -C {source} checkout v{version}"
        )


def run(suite: str, source: Path, envs_per_worker: int, pytest_args: list[str]) -> int:
    """Put our conftest.py into `source`'s tests and run the suite's files there."""
    conftest = source / TEST_DIRS[suite] / "conftest.py"
    if conftest.exists() and "ray_multiprocess_env" not in conftest.read_text(encoding="utf-8"):
        raise SystemExit(f"{conftest} is the project's own; refusing to replace it")
    shutil.copyfile(HERE / f"{suite}_conftest.py", conftest)
    not_applicable = dict(NOT_APPLICABLE[suite])
    if suite == "tianshou" and envs_per_worker > 1:
        not_applicable |= ONE_ENV_PER_WORKER
    for test_id, reason in not_applicable.items():
        print(f"not applicable: {test_id}: {reason}", flush=True)
    env = {**HEADLESS, **os.environ, "PEER_ENVS_PER_WORKER": str(envs_per_worker)}
    env.pop("RAY_ADDRESS", None)  # the suite starts its own Ray, with its modules importable
    deselect = [f"--deselect={test_id}" for test_id in not_applicable]
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tb=native"]
    command += deselect + SUITES[suite] + pytest_args
    print("running:", " ".join(command), f"(in {source})", flush=True)
    return subprocess.run(command, cwd=source, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument(
        "--source", type=Path, help="gymnasium, tianshou: a checkout at the installed tag"
    )
    parser.add_argument("--workdir", type=Path, help="sb3: where to unpack (default: a temp dir)")
    parser.add_argument("--envs-per-worker", type=int, default=2)
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.pytest_args = argv[split + 1 :]
    if args.suite in ("gymnasium", "tianshou"):
        if args.source is None:
            parser.error(f"{args.suite} needs --source, a checkout of its repository")
        check_source(args.suite, args.source)
        return run(args.suite, args.source, args.envs_per_worker, args.pytest_args)
    with tempfile.TemporaryDirectory() as temp:
        workdir = args.workdir or Path(temp)
        workdir.mkdir(parents=True, exist_ok=True)
        return run("sb3", sb3_source(workdir), args.envs_per_worker, args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
