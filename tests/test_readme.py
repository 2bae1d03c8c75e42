"""The README's Python snippets run as written, and both READMEs show the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks(name: str, language: str) -> list[str]:
    text = (ROOT / name).read_text(encoding="utf-8")
    return [code for lang, code in _BLOCK.findall(text) if lang == language]


def _without_comments(code: str) -> str:
    return "\n".join(line.split("#", 1)[0].rstrip() for line in code.splitlines())


def test_python_snippets_run():
    """Every Python block of README.md runs, in order, in one namespace."""
    pytest.importorskip("pfrl")
    namespace: dict[str, object] = {"__name__": "readme"}
    for code in _blocks("README.md", "python"):
        exec(compile(code, "README.md", "exec"), namespace)
    vec = namespace["vec"]
    assert vec.num_envs == 4
    namespace["env"].close()
    vec.close()


@pytest.mark.parametrize("language", ["python", "bash"])
def test_japanese_readme_shows_the_same_code(language):
    """README.ja.md has the same code blocks as README.md (comments may be translated)."""
    english = [_without_comments(c) for c in _blocks("README.md", language)]
    japanese = [_without_comments(c) for c in _blocks("README.ja.md", language)]
    assert japanese == english
