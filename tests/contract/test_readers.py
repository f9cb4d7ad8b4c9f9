"""Only toolchain/contract reads or writes manifest JSON: every other module goes through its typed
`Manifest` (import-linter cannot see what a module does with a file, so this test reads the source)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "toolchain"
CONTRACT = PACKAGE / "contract"

# What reading or writing manifest JSON looks like in our code.
RAW_READS = {
    "the manifest schema used directly": re.compile(r"""(validate|read_json|write_json|load_schema|validation_errors)"""
                                                    r"""\(\s*(\S+,\s*)?["']manifest["']"""),
    "the manifest file opened": re.compile(r"""(MANIFEST_NAME|["']manifest\.json["'])\s*\)?\s*\.(read_text|read_bytes|open)\("""),
    "a manifest as a dict": re.compile(r"""\bmanifest\s*\[\s*["']|\.manifest\.get\(|\bm\[["'](model|lora|generate|tokenizer)["']\]"""),
    "the manifest's JSON searched": re.compile(r"""json\.dumps\([^)]*manifest"""),
}


def _modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if CONTRACT not in p.parents]


def test_only_the_contract_reads_manifest_json():
    found = [f"{p.relative_to(PACKAGE.parent)}:{n}: {what}: {line.strip()}"
             for p in _modules() for n, line in enumerate(p.read_text().splitlines(), 1)
             for what, pattern in RAW_READS.items() if pattern.search(line)]
    assert not found, "\n".join(found)


def test_the_patterns_catch_what_they_are_for():
    lines = ['validate("manifest", doc)', 'read_json(path, "manifest")', '(out / MANIFEST_NAME).read_text()',
             'json.loads((folder / "manifest.json").read_text())', 'pdir.manifest["generate"]', 'm["model"]["arch"]',
             'manifest["seq_len"]', '"block_decode" in json.dumps(manifest)']
    assert all(any(p.search(line) for p in RAW_READS.values()) for line in lines)
    assert not any(p.search("pdir.manifest.generate.cache_bytes") for p in RAW_READS.values())
