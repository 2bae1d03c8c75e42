"""Notebooks run in a Jupyter kernel: cells as users write them, and each notebook top to bottom.

The stored files themselves (Japanese twins, outputs of one clean run): `test_notebook_files.py`.
"""

from __future__ import annotations

import concurrent.futures
import copy
import os
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.notebook_cells import ENGLISH, ERRORS, all_text, code_cells, output_kinds


def _execute(
    cells: list[str] | nbformat.NotebookNode, ray_address: str, cwd: Path | None = None
) -> nbformat.NotebookNode:
    if isinstance(cells, list):
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in cells]
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    else:
        notebook = cells
    resources = {"metadata": {"path": str(cwd)}} if cwd else {}
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources=resources)
    client.execute(env={**os.environ, "RAY_ADDRESS": ray_address})  # join the test cluster
    return notebook


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.outputs:
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@pytest.mark.slow
def test_env_and_helper_defined_in_cells_with_module_level_imports(ray_address):
    """An env class and a helper defined in cells, with module-level imports only, run remotely."""
    notebook = _execute(
        [
            """
            import gymnasium as gym
            import numpy as np
            import ray
            from ray_multiprocess_env import RayVectorEnv, make_remote_class
            ray.init()
            """,
            """
            def doubled(values):
                return np.asarray(values, dtype=np.float32) * 2

            class CounterEnv(gym.Env):
                observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,))
                action_space = gym.spaces.Discrete(5)

                def reset(self, *, seed=None, options=None):
                    super().reset(seed=seed)
                    self.total = int(self.np_random.integers(10))
                    return doubled([self.total]), {}

                def step(self, action):
                    self.total += int(action)
                    return doubled([self.total]), 1.0, self.total > 20, False, {}

            class CounterHolder:
                def __init__(self):
                    self.env = CounterEnv()
            """,
            """
            RemoteCounter = make_remote_class(CounterHolder, "env", CounterEnv)
            vec = RayVectorEnv([RemoteCounter.remote() for _ in range(3)])
            vec.seed(7)
            obs, infos = vec.reset()
            local = [CounterEnv() for _ in range(3)]
            expected = [env.reset(seed=7 + i)[0] for i, env in enumerate(local)]
            assert np.array_equal(np.stack(obs), np.stack(expected)), (obs, expected)
            obs, rewards, terminated, truncated, infos = vec.step([1, 2, 3])
            expected = [env.step(a)[0] for env, a in zip(local, [1, 2, 3])]
            assert np.array_equal(np.stack(obs), np.stack(expected))
            print("remote obs", [o.tolist() for o in obs])
            """,
            """
            @ray.remote
            class PlainActor:
                def __init__(self):
                    self.value = np.zeros(1)

                def reset(self):
                    self.value = doubled([1])
                    return self.value

                def step(self, action):
                    self.value = self.value + action
                    return self.value, 0, False, None

            plain = RayVectorEnv([PlainActor.remote() for _ in range(2)])
            print("plain reset", [o.tolist() for o in plain.reset()])
            print("plain step", [o.tolist() for o in plain.step([3, 4])[0]])
            vec.close()
            plain.close()
            """,
        ],
        ray_address,
    )
    assert "remote obs" in _text(notebook.cells[2])
    assert "plain reset [[2.0], [2.0]]" in _text(notebook.cells[3])
    assert "plain step [[5.0], [6.0]]" in _text(notebook.cells[3])


@pytest.mark.slow
def test_seed_notebook_flow_with_gymnasium(ray_address):
    """The flow of the notebook the project is named after works with gymnasium and CartPole-v1.

    Same calls in the same order: an existing env wrapped with `make_remote_class` and
    `TimeLimit`, ten remote envs in a `RayVectorEnv`, reset and a step; then a notebook-defined
    `@ray.remote` class with imports inside its methods (the old workaround, still accepted).
    gymnasium's API differs in two places: ``reset`` also returns infos and ``step`` returns
    ``terminated`` and ``truncated`` instead of ``done``.
    """
    notebook = _execute(
        [
            "import ray\nray.init()",
            "from ray_multiprocess_env import make_remote_class, RayVectorEnv",
            "import gymnasium\nenv = gymnasium.make('CartPole-v1')",
            "type(env)",
            """
            class RemoteCartPole():
                def __init__(self):
                    import gymnasium
                    self.env = gymnasium.make("CartPole-v1")
            """,
            "TimeLimit = gymnasium.wrappers.TimeLimit\n"
            "RemoteCartPole = make_remote_class(RemoteCartPole, 'env', TimeLimit)",
            "n_envs = 10\nremote_envs = [RemoteCartPole.remote() for _ in range(n_envs)]",
            "vector_env = RayVectorEnv(remote_envs)",
            "obs, infos = vector_env.reset()\nobs",
            """
            obs, reward, terminated, truncated, info = vector_env.step([1] * n_envs)
            obs, reward, terminated, truncated, info
            """,
            """
            @ray.remote
            class RemoteCounter():
                def __init__(self):
                    self.number = None

                def reset(self):
                    import numpy as np
                    self.number = np.random.randint(0, 100, size=(1,))
                    return self.number

                def step(self, action):
                    self.number += action
                    return self.number, 0, False, None
            """,
            """
            counters = RayVectorEnv([RemoteCounter.remote() for _ in range(n_envs)])
            start = counters.reset()
            start
            """,
            """
            obs, reward, done, info = counters.step([10] * n_envs)
            assert [int(o[0]) for o in obs] == [int(s[0]) + 10 for s in start]
            obs, reward, done, info
            """,
        ],
        ray_address,
    )
    assert "gymnasium.wrappers.common.TimeLimit" in _text(notebook.cells[3])
    assert _text(notebook.cells[9]).count("1.0") >= 10
    assert "(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)" in _text(notebook.cells[12])
    assert "(False, False, False, False, False, False, False, False, False, False)" in _text(
        notebook.cells[12]
    )


def _run_cleared(path: Path, ray_address: str) -> nbformat.NotebookNode:
    """Run a copy of the notebook at `path` with its outputs cleared, in its directory."""
    notebook = nbformat.read(path, as_version=4)
    for cell in code_cells(notebook):
        cell.outputs = []
        cell.execution_count = None
    return _execute(notebook, ray_address, cwd=path.parent)


#: A line of Ray's own node process, not of the notebook: forwarded to every driver of the cluster.
_RAYLET_LINE = re.compile(r"^(\x1b\[\d+m)?\(raylet\)")


def _without_raylet_streams(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`cell` less its outputs that are streams of nothing but raylet lines.

    With kernels side by side on the test cluster, one driver's many worker starts make the
    raylet warn every driver; that is Ray's, like the stderr `output_kinds` leaves out.
    """
    kept = copy.deepcopy(cell)
    kept.outputs = [
        output
        for output in cell.get("outputs", [])
        if output.output_type != "stream"
        or not (lines := [line for line in output.get("text", "").splitlines() if line.strip()])
        or not all(_RAYLET_LINE.match(line) for line in lines)
    ]
    return kept


@pytest.fixture(scope="module")
def notebook_runs(request, ray_address):
    """The run of each English notebook that this session's tests check, two kernels at a time.

    A kernel spends much of its run starting and waiting (Ray workers, imports), so two run
    side by side on 2 cores in about 60% of the time of one after the other; the heaviest
    (numbered last) start first. Each run is the notebook's bytes before the run and the
    executed copy, or the exception the run raised. All runs count against the first test's
    time limit (300 s; about 32 s here).
    """
    wanted = {
        item.callspec.params["path"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_notebook_runs_top_to_bottom"
    }
    paths = sorted(wanted, key=lambda p: p.name, reverse=True)
    before = {path: path.read_bytes() for path in paths}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {path: pool.submit(_run_cleared, path, ray_address) for path in paths}
        concurrent.futures.wait(futures.values())
    return {
        path: (before[path], future.exception() or future.result())
        for path, future in futures.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("path", ENGLISH, ids=[p.name for p in ENGLISH])
def test_notebook_runs_top_to_bottom(path, notebook_runs):
    """Each English notebook runs in a fresh kernel with outputs of the kinds it stores.

    It runs on a copy with its outputs cleared (the file stays as it is), in the notebook's
    directory, joined to the test session's Ray (`notebook_runs`). The Japanese twins run only
    through `notebooks/execute.py`; `test_japanese_twin_has_the_english_code_and_translated_text`
    keeps their code the same.
    """
    stored_bytes, notebook = notebook_runs[path]
    if isinstance(notebook, BaseException):
        raise notebook
    stored = nbformat.reads(stored_bytes.decode("utf-8"), as_version=4)
    pairs = zip(code_cells(stored), code_cells(notebook), strict=True)
    for index, (old, new) in enumerate(pairs):
        where = f"{path.name} code cell {index}"
        kinds = output_kinds(_without_raylet_streams(new))
        assert kinds == output_kinds(old), f"{where}: {kinds} now, {output_kinds(old)} stored"
        noise = ERRORS.search(all_text(new))
        assert noise is None, f"{where} printed {noise.group()!r}"
    assert path.read_bytes() == stored_bytes
