"""Every relative link and ``#anchor`` in README.md, ARCHITECTURE.md and benches/ leads somewhere.

The README links its results table into benches/RESULTS.md and each moved narrative back to its
section; a renamed heading or a moved file breaks such links silently, so they are checked:
the target file exists (relative to the linking document) and, for a Markdown target, the
anchor is one of its headings' anchors as GitHub makes them (lower case, punctuation dropped,
spaces to hyphens, ``-1``, ``-2`` ... for repeats). Links inside code are not links.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "README.md",
    REPO / "ARCHITECTURE.md",
    REPO / "benches" / "RESULTS.md",
    REPO / "benches" / "README.md",
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose(text: str, code_spans: bool = False) -> list[str]:
    """The lines outside fenced blocks; inline code spans dropped unless ``code_spans``."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line if code_spans else re.sub(r"`[^`]*`", "", line))
    return out


def anchors(doc: Path) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    for line in _prose(doc.read_text(encoding="utf-8"), code_spans=True):
        heading = HEADING.match(line)
        if not heading:
            continue
        title = re.sub(r"<[^>]+>", "", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def links(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    return [m.group(1) for line in _prose(text) for m in LINK.finditer(line)]


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    found = links(doc)
    assert found, f"{doc.name}: no links found (is the pattern right?)"
    broken = []
    for target in found:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.name}")
    assert not broken, f"{doc.name}: " + "; ".join(broken)


def test_the_anchor_rule_matches_githubs(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# A, b: `c_d`!\n## Results at a glance\n## Results at a glance\n")
    doc.write_text(doc.read_text() + "```\n# not a heading\n```\n")
    assert anchors(doc) == {"a-b-c_d", "results-at-a-glance", "results-at-a-glance-1"}
    doc.write_text("[x](other.md#there) `[y](not-a-link)`\n```\n[z](in-code)\n```\n")
    assert links(doc) == ["other.md#there"]
