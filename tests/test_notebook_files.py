"""The notebooks as stored: a Japanese twin for each, and the outputs of one clean run."""

from __future__ import annotations

import nbformat
import pytest

from tests.notebook_cells import (
    API_NAME,
    ENGLISH,
    ERRORS,
    JAPANESE,
    MACHINE,
    NOTEBOOKS,
    SCRIPT,
    WIDGET,
    all_text,
    calls,
    code_cells,
    expects_output,
    output_kinds,
    shape,
    twin,
)


def test_every_english_notebook_has_a_japanese_twin_and_back():
    """Each notebook in notebooks/ has a `.ja.ipynb` twin, and each twin an English notebook."""
    assert len(ENGLISH) >= 5
    assert sorted(twin(p) for p in ENGLISH) == JAPANESE


@pytest.mark.parametrize("path", ENGLISH, ids=[p.name for p in ENGLISH])
def test_japanese_twin_has_the_english_code_and_translated_text(path):
    """A twin's cells match the English ones: the same code, comments and text aside.

    Code cells have the same syntax tree once comments, string literals and the text of
    f-strings are left out; a string literal may differ only by being translated (it then holds
    Japanese; a translated key or id would fail when `notebooks/execute.py` runs the twin, and
    the stored-outputs test requires that run). Markdown cells are translated and name the same
    APIs in backticks.
    """
    english = nbformat.read(path, as_version=4)
    japanese = nbformat.read(twin(path), as_version=4)
    assert [c.cell_type for c in japanese.cells] == [c.cell_type for c in english.cells]
    for index, (en, ja) in enumerate(zip(english.cells, japanese.cells, strict=True)):
        where = f"{twin(path).name} cell {index}"
        if en.cell_type == "markdown":
            assert not ja.source.isascii(), f"{where} is not translated"
            assert set(API_NAME.findall(ja.source)) == set(API_NAME.findall(en.source)), where
            continue
        en_code, en_strings = shape(en.source)
        ja_code, ja_strings = shape(ja.source)
        assert ja_code == en_code, f"{where}: code differs from English beyond comments and text"
        for en_string, ja_string in zip(en_strings, ja_strings, strict=True):
            assert ja_string == en_string or not ja_string.isascii(), (
                f"{where}: {ja_string!r} is neither the English {en_string!r} nor a translation"
            )
        same = output_kinds(ja) == output_kinds(en)
        assert same, f"{where}: outputs differ in kind from the English"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_with_the_outputs_of_one_top_to_bottom_run(path):
    """Outputs come from one clean run of the current code and carry no errors or machine noise.

    Cells were executed once each, in order (execution counts 1, 2, ...), by
    `notebooks/execute.py` on the code as it is now; every cell that prints, plots or ends in an
    expression has outputs, every plot is a PNG and every progress bar shows its end; the last
    cell shuts Ray down (else a kernel that started a local Ray prints stack dumps when it exits).
    """
    notebook = nbformat.read(path, as_version=4)
    cells = code_cells(notebook)
    rerun = f"run `python notebooks/execute.py notebooks/{path.name}`"
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), rerun
    stored_for = notebook.metadata.get("execute_py", {}).get("code_sha256")
    assert stored_for == SCRIPT.code_sha256(notebook), f"code changed: {rerun}"
    for index, cell in enumerate(cells):
        where = f"{path.name} code cell {index}"
        if expects_output(cell.source):
            assert cell.outputs, f"{where} prints or shows something but has no stored output"
        if "show" in calls(cell.source):
            assert "image/png" in output_kinds(cell), f"{where} has no PNG"
        for output in cell.outputs:
            assert output.output_type != "error", where
            if WIDGET in output.get("data", {}) and "tqdm" in calls(cell.source):
                assert "100%|" in output.data["text/plain"], f"{where}: bar not finished"
        noise = ERRORS.search(all_text(cell)) or MACHINE.search(all_text(cell))
        assert noise is None, f"{where} stores {noise.group()!r}"
    assert "ray.shutdown()" in cells[-1].source, f"{path.name} leaves Ray running at the end"
