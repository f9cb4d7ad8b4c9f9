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
    """GitHub's heading ids (lower case, punctuation but '-' and '_' dropped, spaces to '-') and the explicit
    `<a id="..."></a>` anchors outside code blocks."""
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code:
            out.update(re.findall(r'<a id="([\w\-]+)"></a>', line))
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


def test_glossary_table_equals_json() -> None:
    """docs/architecture.md's glossary table and docs/glossary.json name the same targets, so the later renames
    have one source to follow."""
    import json

    glossary = json.loads((ROOT / "docs" / "glossary.json").read_text(encoding="utf-8"))
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Glossary"):]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] not in ("concept", "---"):
            rows[cells[0]] = cells[1:4]
    assert set(rows) == set(glossary)
    for concept, entry in glossary.items():
        for cell, lang in zip(rows[concept], ("python", "kotlin", "swift")):
            name = entry[lang]
            assert (name is None and "none" in cell) or (name is not None and cell.startswith(f"`{name}`")), \
                (concept, lang, cell)


def test_glossary_kotlin_names_are_the_codes() -> None:
    """Every Kotlin name of the glossary (the target and its related names) is a type the Android code declares:
    the Kotlin renames are done, and a later rename that forgets the glossary fails here."""
    import json

    glossary = json.loads((ROOT / "docs" / "glossary.json").read_text(encoding="utf-8"))
    source = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "android").rglob("*.kt"))
                       if "host-stubs" not in p.parts)
    declared = set(re.findall(r"^(?:[a-z]+ )*(?:class|interface|object) (\w+)", source, re.MULTILINE))
    names = [n for entry in glossary.values() for n in [entry["kotlin"], *entry.get("related", {}).get("kotlin", [])] if n]
    assert names and [n for n in names if n not in declared] == []
