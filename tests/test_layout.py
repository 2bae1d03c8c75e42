"""The layers the folders show: the worker side and the engine import nothing above them."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import pytest

import ray_multiprocess_env
from ray_multiprocess_env import make_vector_env

_PACKAGE = Path(ray_multiprocess_env.__file__).parent

#: What each layer may import of the package (besides itself): the shared leaf modules.
_LEAVES = {"batch", "compat", "errors", "options"}
_ALLOWED = {
    "_worker": {"_worker", "_protocol", *_LEAVES},
    "_protocol": {"_protocol", *_LEAVES},
    "_engine": {"_engine", "_protocol", "_worker", "placement", "runtime", *_LEAVES},
}


def _imports(path: Path) -> set[str]:
    """The first name under `ray_multiprocess_env` of every import in the module at `path`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ray_multiprocess_env" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", sorted(_ALLOWED))
def test_a_layer_imports_nothing_above_it(layer):
    """`_worker/` and `_protocol/` import nothing of the driver side, `_engine/` no face."""
    modules = sorted((_PACKAGE / layer).rglob("*.py"))
    assert modules, layer
    above = {
        f"{path.relative_to(_PACKAGE)}: {name}"
        for path in modules
        for name in _imports(path) - _ALLOWED[layer]
    }
    assert not above, sorted(above)


def test_a_worker_process_imports_only_the_worker_side():
    """A worker imports `_worker/`, `_protocol/` and the leaves: no face, no engine (start-up)."""

    def cartpole_listing_the_package_modules():  # (local: pickled by value, imports no test)
        import sys

        import gymnasium as gym

        env = gym.make("CartPole-v1")
        package = [m for m in sys.modules if m.startswith("ray_multiprocess_env")]
        env.unwrapped.modules = sorted(package)
        return env

    with contextlib.closing(
        make_vector_env(cartpole_listing_the_package_modules, 1, num_workers=1)
    ) as envs:
        (modules,) = envs.get_attr("modules")
    layers = {name.split(".")[1] for name in modules if "." in name}
    assert "_worker" in layers, modules
    assert layers <= _ALLOWED["_worker"] | {"env_factories"}, sorted(layers)


def test_every_public_name_is_found_where_the_package_says():
    """The lazy top level (`_HOMES`) lists exactly `__all__`, and each name is in its module."""
    assert set(ray_multiprocess_env._HOMES) == set(ray_multiprocess_env.__all__)
    for name in ray_multiprocess_env.__all__:
        assert getattr(ray_multiprocess_env, name) is not None, name
