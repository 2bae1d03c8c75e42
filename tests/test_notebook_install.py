"""Each notebook's first cell installs the package in a kernel that lacks it, as a reader's would.

The cell is run in a fresh venv without the package, with ``get_ipython`` standing in for the
kernel's ``%pip``: pip is really run (``--dry-run --no-deps``, so nothing is downloaded past the
package itself), and its report says what it would install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from tests.helpers import without_comments

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

#: The kernel's ``%pip`` (IPython runs ``python -m pip`` with the line), with pip's report kept.
KERNEL = textwrap.dedent(
    """
    import shlex, subprocess, sys

    class _Kernel:
        def run_line_magic(self, name, line):
            assert name == "pip", name
            command = [sys.executable, "-m", "pip", *shlex.split(line)]
            command += ["--dry-run", "--no-deps", "--report", sys.argv[1]]
            subprocess.run(command, check=True)

    def get_ipython():
        return _Kernel()
    """
)


#: This environment's variables (pip's index and proxies), less what would lead to this checkout.
_OUTSIDE = {
    k: v
    for k, v in os.environ.items()
    if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS", "RAY_MULTIPROCESS_ENV_SOURCE")
}
_OUTSIDE["PATH"] = "/usr/bin:/bin"  # (not this venv's bin)


def _install_cell(path: Path) -> str:
    notebook = nbformat.read(path, as_version=4)
    return next(cell.source for cell in notebook.cells if cell.cell_type == "code")


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory):
    """The python of a new venv (a current pip only): the package cannot be imported there.

    (Python 3.11's own pip refuses a ``git+file:///`` URL in a requirement: Colab's and a new
    Jupyter's pip are current.)
    """
    venv = tmp_path_factory.mktemp("kernel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--upgrade-deps", str(venv)], check=True)
    return str(venv / "bin" / "python")


def _run_cell(python, cwd, tmp_path, env=None):
    """Run the install cell in `python` from `cwd`: pip's report of what it installs, or None."""
    script = tmp_path / "cell.py"
    script.write_text(KERNEL + "\n" + _install_cell(NOTEBOOKS[0]))
    report = tmp_path / "report.json"
    result = subprocess.run(
        [python, str(script), str(report)],
        cwd=cwd,
        env={**_OUTSIDE, "HOME": str(tmp_path), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result, (json.loads(report.read_text())["install"] if report.exists() else None)


def test_every_notebook_has_the_same_install_cell_first():
    """The first code cell of every notebook (Japanese twins too) is the one install cell."""
    cells = {without_comments(_install_cell(path)) for path in NOTEBOOKS}
    assert len(cells) == 1, cells


def test_in_a_checkout_it_installs_the_checkout_with_the_notebooks_extra(fresh_python, tmp_path):
    """Run from notebooks/ (a clone's notebook in a new kernel): this checkout, `[notebooks]`."""
    result, install = _run_cell(fresh_python, ROOT / "notebooks", tmp_path)
    assert result.returncode == 0, result.stderr
    (item,) = install
    assert item["metadata"]["name"] == "ray-multiprocess-env"
    assert item["requested_extras"] == ["notebooks"]
    assert item["download_info"]["url"] == ROOT.as_uri()


def test_with_only_the_repositorys_url_it_installs_from_the_url(fresh_python, tmp_path):
    """Run where no checkout is (Colab), given the repository's git URL: installed from it."""
    url = f"git+{ROOT.as_uri()}"
    result, install = _run_cell(
        fresh_python, tmp_path, tmp_path, {"RAY_MULTIPROCESS_ENV_SOURCE": url}
    )
    assert result.returncode == 0, result.stderr
    (item,) = install
    assert item["metadata"]["name"] == "ray-multiprocess-env"
    assert item["requested_extras"] == ["notebooks"]
    assert item["download_info"]["url"] == ROOT.as_uri()
    assert item["download_info"]["vcs_info"]["vcs"] == "git"


def test_with_neither_it_says_what_to_set(fresh_python, tmp_path):
    """No checkout and no URL: the cell raises, saying to set `REPOSITORY`; pip never runs."""
    result, install = _run_cell(fresh_python, tmp_path, tmp_path)
    assert result.returncode != 0
    assert "Set REPOSITORY in this cell to the repository's URL or path." in result.stderr
    assert install is None
