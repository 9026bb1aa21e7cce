"""scripts/docs_measurement_share.py: the rule on small pages, and the real docs under it (issue 64)."""

from __future__ import annotations

import re
from pathlib import Path

import scriptutil

share = scriptutil.load_script("docs_measurement_share")
DOCS = scriptutil.ROOT / "docs"


def _marked(text: str) -> list[str]:
    lines = text.splitlines()
    return [lines[i] for i in sorted(share.measurement_lines(text))]


def test_a_measured_section_counts_to_the_next_heading_of_its_level() -> None:
    text = "\n".join([
        "# Page",
        "How to use it.",
        "## Measured",
        "One run: 12.3 ms.",
        "### A table",
        "| a | b |",
        "## Settings",
        "`k`: neighbours searched.",
    ])
    assert _marked(text) == ["## Measured", "One run: 12.3 ms.", "### A table", "| a | b |"]


def test_headings_that_name_a_measurement() -> None:
    for heading in ("## Measured: head against likelihood", "### `strata bench edge`: measured",
                    "## `strata bench chaos`, measured", "## Runs", "## Results"):
        assert _marked(f"{heading}\nA figure.\n") == [heading, "A figure."], heading
    assert _marked("## How to measure\nRun the bench.\n") == []


def test_the_manual_prose_is_not_counted() -> None:
    text = "\n".join([
        "## The scheduler's decision",
        "",
        "The encoder is most of a decision; a FAISS search takes ~2 ms p99, and the limit is measured in",
        "the same run. `--latency-sizes` (default `10000,100000,1000000`) sets the sizes.",
        "",
        "```",
        "STRATA_ZOO_PRESET=default strata bench scheduler --latency-only",
        "```",
    ])
    assert _marked(text) == []


def test_measured_paragraphs_bench_output_and_dated_runs_count() -> None:
    text = "\n".join([
        "Prose.",
        "",
        "**Measured.** p99 13.8 ms,",
        "[results.md](results.md#x).",
        "",
        "```",
        "rm spearman=0.988 latency_ratio=3.4",
        "```",
        "",
        "- a design note (`ba15453`) that",
        "  names its commit.",
        "- a plain note.",
        "",
        "In the seventh session the RM grew.",
        "| zoo `7755f6fb7e39` | 0.5 |",
        "| zoo | 0.5 |",
    ])
    assert _marked(text) == [
        "**Measured.** p99 13.8 ms,", "[results.md](results.md#x).",
        "```", "rm spearman=0.988 latency_ratio=3.4", "```",
        "- a design note (`ba15453`) that", "  names its commit.",
        "In the seventh session the RM grew.", "| zoo `7755f6fb7e39` | 0.5 |",
    ]


def test_a_heading_inside_a_fence_is_not_a_heading() -> None:
    text = "## Measured\n```\n# prompts.jsonl\n```\nstill measured\n## Next\nprose\n"
    assert _marked(text) == ["## Measured", "```", "# prompts.jsonl", "```", "still measured"]


def test_long_table_cells_are_named() -> None:
    row = "| short | " + "x" * 301 + " | `a \\| b` |"
    text = f"| a | b | c |\n|---|---|---|\n{row}\n```\n| {'y' * 400} |\n```\n"
    cells = share.long_cells(text, "page.md")
    assert [(c.line, c.chars) for c in cells] == [(3, 301)]  # the fenced row is code, not a table


def test_the_page_share() -> None:
    page = share.PageShare("p.md", lines=10, measurement=2)
    assert page.share == 0.2


def test_the_docs_pass_the_check() -> None:
    assert share.main(["--check"]) == 0
    for path in share.manual_pages(DOCS):
        assert share.page_share(path).share <= share.MAX_SHARE, path.name
        assert share.long_cells(path.read_text(encoding="utf-8"), path.name) == [], path.name


# --- links into and out of the results log resolve (the moves rely on its anchors) ---

_LINK = re.compile(r"\]\(([\w./-]*\.md)?#([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, _, text in share.headings(lines):
        slug = _slug(text)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_links_into_and_out_of_the_results_log_resolve() -> None:
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for m in _LINK.finditer(page.read_text(encoding="utf-8")):
            target = DOCS / m.group(1) if m.group(1) else page
            if share.RESULTS_LOG not in (page.name, target.name) or not target.is_file():
                continue
            if m.group(2) not in _anchors(target):
                broken.append(f"{page.name} -> {target.name}#{m.group(2)}")
    assert broken == []
