"""The README's and docs' Python snippets run as written; the Japanese pages show the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import ray

from ray_multiprocess_env import GymnasiumVectorEnv, RayVectorEnv
from tests.helpers import without_comments

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)

#: The pages whose Python blocks run: the README and the docs pages that hold its moved snippets.
RUNNABLE_PAGES = ["README.md", "docs/usage.md", "docs/trainers.md", "docs/cluster.md"]
#: The runnable blocks over all of `RUNNABLE_PAGES` (the README's 8, usage.md's 7, 1, 1).
RUNNABLE_BLOCKS = 17

#: Where a page of its own (cluster.md, benchmarks.md) goes on with sections moved from the
#: README: only what follows it runs, and only that is translated in docs/ja/.
MOVED = "<!-- moved from the README -->"

#: Each English page with a Japanese twin: README.ja.md, and docs/ja/X.md for docs/X.md.
TWINS = [("README.md", "README.ja.md")] + [
    (f"docs/{path.name}", f"docs/ja/{path.name}")
    for path in sorted((ROOT / "docs" / "ja").glob("*.md"))
]


def _blocks(name: str, language: str) -> list[str]:
    text = (ROOT / name).read_text(encoding="utf-8")
    if MOVED in text:
        text = text.split(MOVED, 1)[1]
    return [code for lang, code in _BLOCK.findall(text) if lang == language]


def test_python_snippets_run_each_on_its_own(monkeypatch):
    """Every Python block of `RUNNABLE_PAGES` runs alone.

    Each runs in a fresh namespace: a reader pastes one block at a time, so each brings its own
    imports, and closes what it opens.
    The README's notebook block ends with `ray.shutdown()`, as a notebook's last cell should;
    here Ray is the test session's, which later tests use, so that call does nothing.
    """
    for trainer in ("pfrl", "stable_baselines3", "tianshou", "torchrl", "ray.rllib"):
        pytest.importorskip(trainer)  # (the trainers' blocks: the test extra has them all)
    monkeypatch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
    ran = 0
    for page in RUNNABLE_PAGES:
        for code in _blocks(page, "python"):
            namespace: dict[str, object] = {"__name__": "readme"}
            exec(compile(code, page, "exec"), namespace)
            left_open = [
                name
                for name, value in namespace.items()
                if isinstance(value, (RayVectorEnv, GymnasiumVectorEnv))
                and not value._engine.closed
            ]
            assert not left_open, f"a block of {page} leaves {left_open} open:\n{code}"
            ran += 1
    assert ran >= RUNNABLE_BLOCKS


@pytest.mark.parametrize("language", ["python", "bash"])
@pytest.mark.parametrize(("english", "japanese"), TWINS, ids=[ja for _, ja in TWINS])
def test_japanese_readme_shows_the_same_code(english, japanese, language):
    """README.ja.md and each docs/ja/ page show the code of their English page.

    The same code blocks, in the same order; comments may be translated.
    """
    english_blocks = [without_comments(c) for c in _blocks(english, language)]
    japanese_blocks = [without_comments(c) for c in _blocks(japanese, language)]
    assert japanese_blocks == english_blocks


def test_every_japanese_page_has_an_english_one():
    """Each docs/ja/ page translates a docs/ page of the same name."""
    assert len(TWINS) >= 8
    for english, japanese in TWINS:
        assert (ROOT / english).exists(), f"{japanese} has no {english}"


def test_every_trainer_block_runs_as_pasted_and_links_its_example():
    """The README's trainer sections each have a block (which runs) and link their script.

    `test_python_snippets_run_each_on_its_own` runs them; each trainer's section links the
    script of `examples/` that trains it to a threshold, and that script exists.
    """
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## With your trainer", 1)[1].split("\n## ", 1)[0]
    trainers = re.split(r"\n(?=### )", section)[1:]
    assert [part.partition("\n")[0] for part in trainers][:5] == [
        "### stable-baselines3",
        "### pfrl",
        "### Tianshou",
        "### TorchRL",
        "### RLlib",
    ]
    for part in trainers[:5]:
        blocks = [code for lang, code in _BLOCK.findall(part) if lang == "python"]
        assert blocks, part
        linked = re.findall(r"\]\((examples/\w+\.py)\)", part)
        assert linked, part
        assert all((ROOT / name).exists() for name in linked), part


@pytest.mark.parametrize("page", ["README.md", "README.ja.md"])
def test_training_figures_are_rows_of_the_benchmarks_table(page):
    """The README's training rows are, verbatim, rows `benchmarks.training` wrote in the docs."""
    docs = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    written = docs.split("<!-- BEGIN training -->", 1)[1].split("<!-- END training -->", 1)[0]
    text = (ROOT / page).read_text(encoding="utf-8")
    section = text.split("<!-- training rows -->", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    quoted = rows[1:]  # (the header row is the page's own)
    assert len(quoted) >= 3, section
    for row in quoted:
        assert row in written.splitlines(), f"{page}: {row} is not in docs/benchmarks.md"
