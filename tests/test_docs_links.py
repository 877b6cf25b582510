"""The README and docs/ as a test: every relative link resolves to a file in the repository,
every #anchor to a heading of its page (GitHub's slugs), every docs page is linked from the
README, and the README fits on a screen or three (at most 300 lines). Pure text: milliseconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300  # issue 30: "a README that fits on a screen or three"

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target "title") and ![alt](target); the target has no spaces
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    names: set[str] = set()
    repeats: dict[str, int] = {}
    for _, line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = repeats.get(base, 0)
            repeats[base] = count + 1
            names.add(f"{base}-{count}" if count else base)
    return names


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link and link definition outside code."""
    found = []
    for number, line in prose_lines(page.read_text()):
        line = CODE_SPAN.sub("", line)
        definition = REFERENCE_DEF.match(line)
        targets = LINK.findall(line) + ([definition.group(1)] if definition else [])
        found += [(number, target) for target in targets if not EXTERNAL.match(target)]
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, target in links(page):
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            problems.append(f"{where}: no heading with that anchor in {dest.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_fits_on_three_screens_and_links_every_docs_page() -> None:
    readme = ROOT / "README.md"
    lines = len(readme.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
    linked = {(ROOT / t.partition("#")[0]).resolve() for _, t in links(readme) if t[0] != "#"}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_checker_sees_a_broken_link_a_wrong_anchor_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Set-up: `make setup` and GPUs\n## Set-up: `make setup` and GPUs\n"
        "[ok](#set-up-make-setup-and-gpus) [ok](#set-up-make-setup-and-gpus-1) [web](https://x.y)\n"
        "[gone](missing.md) [bad](page.md#nowhere) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
    )
    problems = [p.split(": ", 1)[1] for p in broken_links(page, root=tmp_path)]
    assert problems == [
        "missing.md: no such file",
        "page.md#nowhere: no heading with that anchor in page.md",
    ]
