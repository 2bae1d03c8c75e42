"""The layers the folders show: the worker side and the engine import nothing above them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ray_multiprocess_env

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
