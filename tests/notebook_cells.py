"""The notebooks in notebooks/ as stored: their paths, and what their cells and outputs hold.

Shared by the tests of the stored files (`test_notebook_files.py`) and of their runs in a
Jupyter kernel (`test_notebook.py`).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
ENGLISH = [p for p in NOTEBOOKS if not p.name.endswith(".ja.ipynb")]
JAPANESE = [p for p in NOTEBOOKS if p.name.endswith(".ja.ipynb")]

WIDGET = "application/vnd.jupyter.widget-view+json"


def _load_execute_script():
    spec = importlib.util.spec_from_file_location("execute", NOTEBOOK_DIR / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What no stored output may hold: the same patterns execute.py refuses to save.
SCRIPT = _load_execute_script()
ERRORS, MACHINE = SCRIPT.ERRORS, SCRIPT.MACHINE


def twin(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".ipynb") + ".ja.ipynb")


def code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def all_text(cell: nbformat.NotebookNode) -> str:
    """Everything a cell's outputs say in text (streams, tracebacks, text/* data; no images)."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.extend(output.get("traceback", []))
        data = output.get("data", {})
        parts.extend(str(v) for k, v in data.items() if k.startswith("text/"))
    return "\n".join(parts)


def output_kinds(cell: nbformat.NotebookNode) -> set[str]:
    """What a cell's outputs are, stderr aside (Ray logs differently when it joins a cluster)."""
    kinds = set()
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            kinds.add(output.name)
        else:
            kinds.add(output.output_type)
            kinds.update(k for k in output.get("data", {}) if k in ("image/png", WIDGET))
    return kinds - {"stderr"}


def parse(source: str) -> ast.Module:
    return ast.parse(TransformerManager().transform_cell(source))  # IPython magics to Python


def calls(source: str) -> set[str]:
    """The names of the functions a cell calls when it runs (not those only called in defs)."""
    names = set()
    pending: list[ast.AST] = list(parse(source).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
        pending.extend(ast.iter_child_nodes(node))
    return names


def expects_output(source: str) -> bool:
    """Whether a cell prints, plots (`show`), shows a progress bar or ends in a plain expression."""
    if calls(source) & {"print", "show", "tqdm"}:
        return True
    body = parse(source).body
    return (
        bool(body)
        and isinstance(body[-1], ast.Expr)
        and not isinstance(body[-1].value, ast.Call)
        and not source.rstrip().endswith(";")
    )


def shape(source: str) -> tuple[str, list[str]]:
    """The code of a cell without its text: comments, string literals and f-strings' text.

    Returns the dump of the syntax tree with every string literal blanked and f-strings cut to
    their replacement fields (their format specs kept), and the blanked literals in order.
    """
    strings: list[str] = []

    class Blank(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            if isinstance(node.value, str):
                strings.append(node.value)
                return ast.Constant(value="")
            return node

        def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
            fields = [v for v in node.values if isinstance(v, ast.FormattedValue)]
            node.values = [self.visit(v) for v in fields]
            return node

        def visit_FormattedValue(self, node: ast.FormattedValue) -> ast.AST:
            node.value = self.visit(node.value)
            return node  # the format spec (say `+.2f`) is code: kept as it is

    tree = Blank().visit(parse(source))
    return ast.dump(tree), strings


API_NAME = re.compile(r"`([A-Za-z_][\w.]*(?:\([^`]*\))?)`")
