"""The documentation says what the code does: docs/ARCHITECTURE.md lists the schema, kinds and causes the code
declares, every relative link resolves, and every reference from the code names a section that exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from ppscope.analysis.result import CAUSES
from ppscope.trace.model import COUNTER_COLUMNS, REQUEST_COLUMNS, SPAN_COLUMNS, Metric, RunMeta, SpanKind

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "docs" / "ARCHITECTURE.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SECTION_REF = re.compile(r'docs/ARCHITECTURE\.md,\s+"([^"]+)"')


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _headings(path: Path) -> list[str]:
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            lines.append(line.lstrip("#").strip())
    return lines


def _table(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header starts with `| first_header |`, cells stripped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _dtype_name(t: object) -> str:
    return "str" if t is str else np.dtype(t).name  # type: ignore[call-overload]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    for target in _LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.is_relative_to(ROOT), f"{doc.name}: {target} points outside the repository"
        assert dest.exists(), f"{doc.name}: {target} does not exist"
        if anchor:
            assert anchor in {_anchor(h) for h in _headings(dest)}, f"{doc.name}: no heading for #{anchor}"


def test_readme_links_the_architecture() -> None:
    assert "](docs/ARCHITECTURE.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("header", "columns"),
    [("column", SPAN_COLUMNS), ("column", COUNTER_COLUMNS), ("column", REQUEST_COLUMNS)],
    ids=["spans", "counters", "requests"],
)
def test_schema_tables_match_the_code(header: str, columns: dict[str, object]) -> None:
    text = ARCH.read_text(encoding="utf-8")
    first_row = text.index(f"| `{next(iter(columns))}` |")
    rows = _table(text[text.rindex(f"| {header} |", 0, first_row) :], header)  # the table that row opens
    documented = {r[0].strip("`"): r[1] for r in rows}
    assert list(documented) == list(columns)
    assert documented == {c: _dtype_name(t) for c, t in columns.items()}


def test_kinds_causes_metrics_and_metadata_are_documented() -> None:
    text = ARCH.read_text(encoding="utf-8")
    kinds = {c.strip().strip("`") for row in _table(text, "kind") for c in row[0].split(",")}
    assert kinds == {str(k) for k in SpanKind}
    causes = [r[0].strip("`") for r in _table(text, "cause")]
    assert causes == list(CAUSES)
    fields = [r[0].strip("`") for r in _table(text, "field")]
    assert fields == [f.name for f in dataclasses.fields(RunMeta)]
    for metric in Metric:
        assert f"`{metric}`" in text


def test_references_from_the_code_name_real_sections() -> None:
    sections = set(_headings(ARCH))
    found = 0
    for path in sorted((ROOT / "ppscope").rglob("*.py")):
        text = re.sub(r"\s*\n\s*", " ", path.read_text(encoding="utf-8"))  # a reference may wrap
        for name in _SECTION_REF.findall(text):
            found += 1
            assert name in sections, f"{path.relative_to(ROOT)} cites {name!r}, not a section of docs/ARCHITECTURE.md"
    assert found


def test_nothing_cites_a_document_outside_the_repository() -> None:
    outside = "DESIGN" + ".md"
    for path in [*DOCS, *sorted((ROOT / "ppscope").rglob("*.py"))]:
        assert outside not in path.read_text(encoding="utf-8"), path
