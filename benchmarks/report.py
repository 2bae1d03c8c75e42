"""Write one benchmark's section of docs/benchmarks.md, leaving the other sections as they are."""

from __future__ import annotations

from pathlib import Path

TITLE = "# Benchmarks\n"


def write_section(path: Path, name: str, markdown: str) -> None:
    """Replace (or add) the section `name` of `path`, delimited by HTML comment markers."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else TITLE
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
