"""The fenced code blocks of the README and the documentation pages, and what each claims to be.

A block is one of (docs/development.md, "The documentation"): a ``python`` block, run; a block after
``<!-- excerpt: PATH -->``, a contiguous run of PATH's lines; a block after ``<!-- output of: examples/NAME -->``,
lines that example prints; a block after ``<!-- recorded output: COMMAND -->``, a figure from a recorded run of a
script in the repository; an ``sh`` block, whose commands are checked against the command line, the Makefile and
the tree. Anything else is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(\s*)```([\w-]*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*(excerpt|output of|recorded output):\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str
    """The block's content, dedented by the fence's indentation."""
    mark: str | None = None
    """``excerpt``, ``output of``, ``recorded output`` or None."""
    target: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and not (lines[j].strip() == "```" and lines[j].startswith(indent)):
            j += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = _MARK.match(lines[k]) if k >= 0 else None
        out.append(
            Block(
                page=page,
                line=i + 1,
                lang=lang,
                text="\n".join(body),
                mark=mark.group(1) if mark else None,
                target=mark.group(2) if mark else None,
            )
        )
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]
