"""How much of each manual page is measurement (issue 64: a manual and a results log, apart).

The docs pages say what a thing is, how to use it and why it is built so; dated runs live in one
results log, docs/results.md, and a page keeps at most a short "Measured" paragraph that links it.
This script counts, for every docs/*.md but results.md, the lines that are measurement, and with
`--check` fails when a page's share is over 20 % or a table cell is over 300 characters.

The rule (fenced code blocks are read as one unit; a heading inside a fence is not a heading):

1. **Measured sections.** A heading whose text contains the word "measured" or "measurement(s)",
   or starts with "Results" or "Runs" ("## Measured", "### `strata bench edge`: measured",
   "## Runs"), and every line under it up to the next heading of the same or a higher level:
   prose, tables, code and blank lines alike.
2. **Measured paragraphs.** A paragraph or list item whose text starts with "Measured" or
   "**Measured" (the page's pointer to its results entry): its lines.
3. **Bench output.** A fenced code block with a bench's last line in it, a line carrying two or
   more `name=<number>` pairs (`rm spearman=0.988 latency_ratio=3.4`): its lines, fences included.
4. **Dated runs.** A paragraph, list item or table row that names a run: a commit or zoo id in
   backticks (7 to 12 hex digits, at least one of them a decimal digit: `1a2b3c4`,
   `7755f6fb7e39`) or a working session by its ordinal ("the sixth session"): its lines.

A line counts once whichever parts of the rule it falls under. Paragraphs end at a blank line or a
heading; a list item also ends where the next item starts. The share is measurement lines over all
the page's lines (blank lines included).

Table cells: every `|` table row outside a fence, on every page but results.md, is split on its
unescaped pipes, and a cell longer than 300 characters of source (link targets included) is named
(the log may keep long cells: it quotes runs verbatim).

Run: `python scripts/docs_measurement_share.py [--check] [--docs DIR]`.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_LOG = "results.md"
MAX_SHARE = 0.20
MAX_CELL_CHARS = 300

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_MEASURED_HEADING = re.compile(r"\bmeasured\b|\bmeasurements?\b|^(?:results?|runs)\b", re.IGNORECASE)
_MEASURED_START = re.compile(r"^(?:\*\*|_)?measured\b", re.IGNORECASE)
_KEY_NUMBER = re.compile(r"(?:^|\s)[A-Za-z_][\w.]*=[-+]?\d[\d.,]*(?:e[-+]?\d+)?%?(?=\s|$)")
_RUN_ID = re.compile(r"`(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}`")
_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"\d+(?:st|nd|rd|th)"
)
_SESSION = re.compile(rf"\b(?:{_ORDINALS})\s+session\b", re.IGNORECASE)
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class PageShare:
    page: str
    lines: int
    measurement: int

    @property
    def share(self) -> float:
        return self.measurement / self.lines if self.lines else 0.0


@dataclass(frozen=True)
class LongCell:
    page: str
    line: int  # 1-based
    chars: int


@dataclass(frozen=True)
class _Block:
    """A paragraph, list item, table row or fenced code block: lines [start, end) of the page."""

    start: int
    end: int
    fenced: bool


def _heading_text(text: str) -> str:
    return text.replace("`", "").replace("*", "").strip()  # "### `strata bench edge`: measured"


def headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, text) of every heading outside a fence."""
    found: list[tuple[int, int, str]] = []
    in_fence = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := _HEADING.match(line)):
            found.append((i, len(m.group(1)), m.group(2)))
    return found


def _blocks(lines: list[str]) -> list[_Block]:
    """The page cut into the units rules 2 to 4 judge whole; headings and blank lines belong to none."""
    blocks: list[_Block] = []
    start: int | None = None
    i = 0

    def close(end: int) -> None:
        nonlocal start
        if start is not None and end > start:
            blocks.append(_Block(start, end, fenced=False))
        start = None

    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            close(i)
            j = i + 1
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            blocks.append(_Block(i, min(j + 1, len(lines)), fenced=True))
            i = j + 1
            continue
        if not line.strip() or _HEADING.match(line):
            close(i)
        elif line.lstrip().startswith("|"):
            close(i)
            blocks.append(_Block(i, i + 1, fenced=False))  # a table row stands alone
        elif _LIST_ITEM.match(line) or start is None:
            close(i)
            start = i
        i += 1
    close(len(lines))
    return blocks


def measured_sections(lines: list[str]) -> set[int]:
    """Line indices under a heading that names a measurement (rule 1)."""
    marked: set[int] = set()
    heads = headings(lines)
    for n, (i, level, text) in enumerate(heads):
        if not _MEASURED_HEADING.search(_heading_text(text)):
            continue
        end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
        marked.update(range(i, end))
    return marked


def _is_measured_block(lines: list[str], block: _Block) -> bool:
    text = lines[block.start : block.end]
    if block.fenced:
        return any(len(_KEY_NUMBER.findall(line)) >= 2 for line in text)  # rule 3
    first = _LIST_ITEM.sub("", text[0], count=1).strip()
    if _MEASURED_START.match(first):  # rule 2
        return True
    joined = " ".join(text)
    return bool(_RUN_ID.search(joined) or _SESSION.search(joined))  # rule 4


def measurement_lines(text: str) -> set[int]:
    """0-based indices of the lines of `text` that are measurement under the module's rule."""
    lines = text.splitlines()
    marked = measured_sections(lines)
    for block in _blocks(lines):
        if _is_measured_block(lines, block):
            marked.update(range(block.start, block.end))
    return marked


def page_share(path: Path) -> PageShare:
    text = path.read_text(encoding="utf-8")
    return PageShare(path.name, len(text.splitlines()), len(measurement_lines(text)))


def long_cells(text: str, page: str, limit: int = MAX_CELL_CHARS) -> list[LongCell]:
    found: list[LongCell] = []
    in_fence = False
    for i, line in enumerate(text.splitlines()):
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.lstrip().startswith("|"):
            cells = _UNESCAPED_PIPE.split(line.strip().strip("|"))
            found.extend(LongCell(page, i + 1, len(c.strip())) for c in cells if len(c.strip()) > limit)
    return found


def manual_pages(docs: Path) -> list[Path]:
    return sorted(p for p in docs.glob("*.md") if p.name != RESULTS_LOG)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on a page over 20 %% or a cell over 300 chars")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)

    pages = manual_pages(args.docs)
    shares = [page_share(p) for p in pages]
    print(f"{'page':24} {'lines':>6} {'measured':>9} {'share':>6}")
    for s in shares:
        print(f"{s.page:24} {s.lines:6d} {s.measurement:9d} {s.share:6.1%}")
    if not args.check:
        return 0
    failures = [f"{s.page}: {s.share:.1%} of its lines are measurement (most {MAX_SHARE:.0%})"
                for s in shares if s.share > MAX_SHARE]
    for p in pages:
        cells = long_cells(p.read_text(encoding="utf-8"), p.name)
        failures += [f"{c.page}:{c.line}: a table cell of {c.chars} characters (most {MAX_CELL_CHARS})" for c in cells]
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
