"""The README's Python snippets run as written, and both READMEs show the same code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ray_multiprocess_env import GymnasiumVectorEnv, RayVectorEnv

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks(name: str, language: str) -> list[str]:
    text = (ROOT / name).read_text(encoding="utf-8")
    return [code for lang, code in _BLOCK.findall(text) if lang == language]


def _without_comments(code: str) -> str:
    return "\n".join(line.split("#", 1)[0].rstrip() for line in code.splitlines())


def _excerpts() -> list[tuple[str, str]]:
    """The blocks that quote a file: their first line is ``# examples/<file>``."""
    out = []
    for code in _blocks("README.md", "python"):
        first, _, rest = code.partition("\n")
        if first.startswith("# examples/"):
            out.append((first[2:].strip(), rest))
    return out


def test_python_snippets_run_each_on_its_own():
    """Every Python block of README.md that is not an excerpt runs alone, in a fresh namespace.

    A reader pastes one block at a time: each brings its own imports, and closes what it opens.
    """
    pytest.importorskip("pfrl")
    quoted = {code for _, code in _excerpts()}
    ran = 0
    for code in _blocks("README.md", "python"):
        if code.partition("\n")[2] in quoted:
            continue
        namespace: dict[str, object] = {"__name__": "readme"}
        exec(compile(code, "README.md", "exec"), namespace)
        left_open = [
            name
            for name, value in namespace.items()
            if isinstance(value, (RayVectorEnv, GymnasiumVectorEnv)) and not value._engine.closed
        ]
        assert not left_open, f"a README block leaves {left_open} open:\n{code}"
        ran += 1
    assert ran >= 8


@pytest.mark.parametrize("language", ["python", "bash"])
def test_japanese_readme_shows_the_same_code(language):
    """README.ja.md has the same code blocks as README.md (comments may be translated)."""
    english = [_without_comments(c) for c in _blocks("README.md", language)]
    japanese = [_without_comments(c) for c in _blocks("README.ja.md", language)]
    assert japanese == english


def test_excerpts_match_the_examples():
    """Each excerpt block is, paragraph by paragraph, a verbatim part of the file it names."""
    excerpts = _excerpts()
    assert {name for name, _ in excerpts} == {
        "examples/pfrl_ppo_cartpole.py",
        "examples/sb3_ppo_cartpole.py",
        "examples/rllib_ppo_cartpole.py",
        "examples/torchrl_ppo_cartpole.py",
        "examples/tianshou_dqn_cartpole.py",
    }
    for name, code in excerpts:
        source = [line.strip() for line in (ROOT / name).read_text().splitlines()]
        text = "\n".join(source)
        for paragraph in re.split(r"\n\s*\n", code.strip()):
            lines = "\n".join(line.strip() for line in paragraph.splitlines())
            assert lines in text, f"{name}: not found:\n{paragraph}"
