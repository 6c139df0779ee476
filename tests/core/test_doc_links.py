"""Every relative link in README.md and docs/*.md resolves: the file exists inside the repository and, when the link
names an anchor, the target file has a heading with that GitHub anchor. External links are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def broken(md: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for line in prose_lines(md):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part).resolve() if file_part else md
            if root not in dest.parents and dest != root:
                problems.append(f"{md.relative_to(root)}: {target}: outside the repository")
            elif not dest.exists():
                problems.append(f"{md.relative_to(root)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{md.relative_to(root)}: {target}: no such heading")
    return problems


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("md", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(md: Path) -> None:
    assert broken(md) == []


def test_a_missing_file_an_unknown_heading_and_an_outside_path_are_reported(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "architecture.md").write_text("# Architecture\n")
    md = root / "docs" / "probe.md"
    md.write_text("[a](nowhere.md) [b](architecture.md#no-such-heading) [c](../../outside.md) [d](architecture.md#architecture)\n")
    problems = broken(md, root)
    assert [p.split(": ")[-1] for p in problems] == ["no such file", "no such heading", "outside the repository"]
