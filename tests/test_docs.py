"""The docs as a manual: every relative link in README.md, CHANGELOG.md and docs/*.md points at a file (and a
heading) that exists, and no page numbers its history by work session."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SESSION = re.compile(r"session [0-9]", re.IGNORECASE)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        out.add(slug)
    return out


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [m.group(1) for m in LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("page", [*PAGES, *sorted((ROOT / "docs").glob("*.json"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_session_numbering(page: Path) -> None:
    hits = [line for line in page.read_text(encoding="utf-8").splitlines() if SESSION.search(line)]
    assert not hits, f"{page.relative_to(ROOT)}: {hits[:3]}"


def test_result_files_named_without_session() -> None:
    named = [p.name for p in (ROOT / "docs").iterdir() if re.search(r"session[-_ ]?[0-9]", p.name, re.IGNORECASE)]
    assert not named, named
