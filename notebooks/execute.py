"""Re-execute notebooks in place in a real Jupyter kernel and store their outputs.

The notebooks are committed with the outputs of a real run, so that GitHub shows what each cell
prints and plots. After changing a notebook, run it again (one at a time, a few minutes in all)::

    python notebooks/execute.py                                            # every notebook here
    python notebooks/execute.py notebooks/03_extending_RayVectorEnv.ipynb  # only these

Each notebook runs top to bottom in a fresh ``python3`` kernel with its own directory as the
working directory, and without ``RAY_ADDRESS``, so its ``ray.init()`` starts a local Ray: the run
a reader gets. A notebook is written back only if every cell ran and no output names a path of
this machine (a warning that quotes a file, say); otherwise it is left as it was and the script
exits with status 1. Cell timings are not stored, so a re-run changes only what the cells print
and plot, and ``metadata.execute_py.code_sha256`` records which code the outputs came from
(``tests/test_notebook_files.py`` fails when the code has changed since).

Two things are tidied, so that the stored outputs are those a reader would see:

- A tqdm bar in Jupyter is a widget whose plain-text fallback, all that GitHub shows, is the bar
  as first drawn (0%); it is replaced with the finished bar, read from the widget state that
  nbclient stores.
- Old ``gym`` prints a notice on import, and stable-baselines3 imports it when it is installed.
  A development install has it (pfrl needs it), the ``notebooks`` extra does not; the notice's
  lines are dropped from stderr, in the kernel's and the Ray workers' (``(EnvWorker pid=...)``).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

__all__ = ["code_sha256", "execute", "main"]

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 600  # per cell; 04_training's PPO run, the longest, takes under a minute on 2 cores
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: What no stored output may hold: errors, and Ray's crash dumps and error log lines,
ERRORS = re.compile(
    r"Traceback \(most recent call last\)|SIGTERM|\bERROR\b|^\[[^\]]* E \d+ \d+\]", re.MULTILINE
)
#: nor what belongs to the machine that ran it: logs forwarded from Ray workers (with pids), paths.
MACHINE = re.compile(r"pid=\d+|site-packages|/home/|/Users/|/root/|/tmp/")
_RAY_WORKER_PREFIX = re.compile(r"^(\x1b\[\d+m)?\([^)]*pid=\d+[^)]*\)(\x1b\[0m)? ")


def code_sha256(notebook: nbformat.NotebookNode) -> str:
    """A hash of the notebook's code cells, to tell whether its stored outputs are current."""
    sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def execute(path: Path) -> nbformat.NotebookNode:
    """Run the notebook at `path` in a fresh kernel and return it with its outputs.

    Raises:
        CellExecutionError: A cell raised.
        ValueError: An output holds an error, a Ray error line, a worker pid or a path of this
            machine (`ERRORS`, `MACHINE`).
    """
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},  # the kernel's working directory
        record_timing=False,
    )
    client.execute(env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    widgets = notebook.metadata.get("widgets", {}).get(_WIDGET_STATE, {}).get("state", {})
    notice = _gym_notice()
    machine_paths = {str(HERE.parent), str(path.parent), sys.prefix, str(Path.home())} - {"/"}
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        cell.outputs = [_tidy(output, widgets, notice) for output in cell.outputs]
        cell.outputs = [output for output in cell.outputs if output.get("text", True)]  # not empty
        for output in cell.outputs:
            text = output.get("text", "") + "".join(
                str(value) for kind, value in output.get("data", {}).items() if "text/" in kind
            )
            found = ERRORS.search(text) or MACHINE.search(text)
            noise = found.group(0) if found else next((p for p in machine_paths if p in text), "")
            if noise:
                raise ValueError(
                    f"{path.name}: cell {index} prints {noise!r}, an error or something of this "
                    "machine; change the cell so that its output is clean and the same everywhere."
                )
    notebook.metadata["execute_py"] = {"code_sha256": code_sha256(notebook)}
    return notebook


def _tidy(
    output: nbformat.NotebookNode, widgets: dict[str, Any], notice: set[str]
) -> nbformat.NotebookNode:
    """`output` as a reader would see it: a finished progress bar, no gym notice (see above)."""
    view = output.get("data", {}).get(_WIDGET_VIEW)
    bar = _finished_bar(view["model_id"], widgets) if view else None
    if bar is not None:
        output.data["text/plain"] = bar
    if output.get("name") == "stderr":
        lines = output.text.splitlines(keepends=True)
        output.text = "".join(
            line for line in lines if _RAY_WORKER_PREFIX.sub("", line).rstrip("\n") not in notice
        )
    return output


def _finished_bar(model_id: str, widgets: dict[str, Any]) -> str | None:
    """The text of the tqdm bar shown by widget `model_id` as it ended; None for other widgets."""
    box = widgets.get(model_id, {})
    if box.get("model_name") != "HBoxModel":
        return None
    parts = [widgets.get(c.removeprefix("IPY_MODEL_"), {}) for c in box["state"]["children"]]
    if [p.get("model_name") for p in parts] != ["HTMLModel", "FloatProgressModel", "HTMLModel"]:
        return None
    left, progress, right = (p["state"] for p in parts)
    filled = round(10 * progress["value"] / progress["max"]) if progress["max"] else 10
    text = f"{left['value']}|{'█' * filled:<10}|{right['value']}"
    return html.unescape(text).replace("\u2007", " ")  # tqdm pads with figure spaces for HTML


def _gym_notice() -> set[str]:
    """The lines of the notice the installed old ``gym`` prints on import; empty without it."""
    try:
        from gym_notices.notices import notices  # gym's own source of the notice

        return {line for line in notices.get(version("gym"), "").splitlines() if line}
    except (ImportError, PackageNotFoundError):
        return set()


def main(argv: list[str] | None = None) -> int:
    """Execute the notebooks named in `argv` (default: all in this folder) and save them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: all here)")
    paths = parser.parse_args(argv).paths or sorted(HERE.glob("*.ipynb"))
    failed = 0
    for path in paths:
        print(f"{path.name} ...", end=" ", flush=True)
        try:
            notebook = execute(path.resolve())
        except (CellExecutionError, ValueError) as err:
            print(f"failed, left as it was:\n{err}", file=sys.stderr)
            failed += 1
            continue
        nbformat.write(notebook, path)
        print("saved")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
