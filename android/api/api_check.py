"""Check the Android side against the recorded ExecuTorch API listing (android/api/executorch-android.json, made by
generate_listing.sh from ExecuTorch's own sources). Run by android/test.sh; standard library only.

    python3 api_check.py stubs LISTING STUBS_DUMP.json     # the host stubs declare exactly the listing's API
    python3 api_check.py calls LISTING CLASS_DIR_OR_JAR...  # every ExecuTorch member the compiled glue calls is listed

`stubs`: STUBS_DUMP.json is ApiDump.kt's description of the compiled android/host-stubs/executorch; every class
must have the listing's language (a Kotlin class where ExecuTorch ships Kotlin: property versus function syntax
depends on it), kind, supertypes, Kotlin declarations and JVM members, no more and no fewer.
`calls`: `javap -c -p` of the app's classes; each reference into org/pytorch/executorch (invoke*, get/putfield,
get/putstatic, new) must name a class of the listing and a member of it or of its listed supertypes (members
inherited from java.* supertypes, e.g. Throwable.getMessage, are looked up with javap). Prints one line per
problem and `api: N problems`; exits 1 on any.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = "org/pytorch/executorch/"

# javap -c: "invokevirtual #12  // Method org/pytorch/executorch/Tensor.getRawDataBuffer:()Ljava/nio/Buffer;"
REF = re.compile(r"//\s*(Method|InterfaceMethod|Field|class)\s+(\"?[\w/$<>]+\"?)(?:\.(\"?[\w$<>]+\"?):(\S+))?")
INSTR = re.compile(r"^\s*\d+:\s*(\w+)")


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def classes_of(listing: dict) -> dict:
    return listing["classes"] if "classes" in listing else listing


def compare_stubs(listing: dict, stubs: dict) -> list[str]:
    """Differences between the listing's classes and the stubs' (both ApiDump.kt descriptions)."""
    want, have = classes_of(listing), classes_of(stubs)
    problems = []
    for name in sorted(set(want) | set(have)):
        if name not in have:
            problems.append(f"stubs: no class {name} (the listing has it)")
            continue
        if name not in want:
            problems.append(f"stubs: class {name} is not in the listing")
            continue
        w, h = want[name], have[name]
        for key in ("language", "kind", "supertypes"):
            if w[key] != h[key]:
                problems.append(f"stubs: {name}: {key} is {h[key]!r}, the listing says {w[key]!r}")
        for key, what in (("declarations", "declaration"), ("jvm", "JVM member")):
            for d in sorted(set(h[key]) - set(w[key])):
                problems.append(f"stubs: {name}: {what} `{d}` is not in the listing")
            for d in sorted(set(w[key]) - set(h[key])):
                problems.append(f"stubs: {name}: lacks the listing's {what} `{d}`")
    return problems


def references(javap_text: str) -> list[tuple[str, str, str | None, str | None]]:
    """(instruction, class, member, descriptor) of every constant-pool reference into the ExecuTorch package that
    an instruction of `javap -c` output uses; member and descriptor are None for a class reference (new, checkcast)."""
    out = []
    for line in javap_text.splitlines():
        m = INSTR.match(line)
        r = REF.search(line)
        if not m or not r:
            continue
        kind, cls, member, desc = r.groups()
        cls = cls.strip('"')
        if not cls.startswith(PACKAGE):
            continue
        if kind == "class":
            out.append((m.group(1), cls, None, None))
        else:
            out.append((m.group(1), cls, member.strip('"'), desc))
    return out


def _listed(entry: dict, instr: str, member: str, desc: str) -> bool:
    """Whether the listing's JVM members of a class have what the instruction refers to (a static one for the
    static instructions; a field write only to a non-final field)."""
    static = instr in ("invokestatic", "getstatic", "putstatic")
    if instr in ("getfield", "putfield", "getstatic", "putstatic"):
        pat = re.compile(r"^(protected )?" + ("static " if static else "") + r"(final )?field " + re.escape(member) + ":" + re.escape(desc) + "$")
        hits = [j for j in entry["jvm"] if pat.match(j)]
        return any(not (instr.startswith("put") and " final field " in f" {j}") for j in hits)
    sig = ("static " if static else "") + member + desc
    return any(j.removeprefix("protected ") == sig for j in entry["jvm"])


def jdk_members(cls: str, cache: dict) -> tuple[set[str], list[str]]:
    """The public and protected members of a JDK class as name+descriptor (fields as name:descriptor), and its
    superclass and interfaces, from `javap -protected -s`."""
    if cls not in cache:
        text = subprocess.run(["javap", "-protected", "-s", cls.replace("/", ".")], capture_output=True, text=True).stdout
        sigs, supers, name = set(), [], None
        for line in text.splitlines():
            line = line.strip()
            head = re.match(r".*\b(?:class|interface) [\w.$]+(?: extends ([\w.$, ]+?))?(?: implements ([\w.$, ]+))? \{$", line)
            if head:
                supers = [x.strip().replace(".", "/") for g in head.groups() if g for x in g.split(",")]
            elif line.startswith("descriptor:") and name:
                sigs.add(name + line.split(":", 1)[1].strip())
                name = None
            elif line.endswith(";") and "(" in line:
                name = line.split("(")[0].split()[-1]
                if "." in name:
                    name = "<init>"
            elif line.endswith(";"):
                name = line.rstrip(";").split()[-1] + ":"
        cache[cls] = (sigs, supers)
    return cache[cls]


def _inherited(classes: dict, supers: list[str], instr: str, member: str, desc: str, jdk, cache: dict) -> bool:
    todo, seen = [s.replace(".", "/") for s in supers], set()
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        e = classes.get(s)
        if e is not None:
            if _listed(e, instr, member, desc):
                return True
            todo += [x.replace(".", "/") for x in e["supertypes"]]
        elif s.startswith(("java/", "javax/")):
            sigs, more = jdk(s, cache)
            if member + desc in sigs or f"{member}:{desc}" in sigs:
                return True
            todo += more
    return False


def check_calls(listing: dict, refs: list[tuple[str, str, str | None, str | None]], jdk=jdk_members) -> list[str]:
    """Problems with the references: a class or member the listing lacks."""
    classes = {k.replace(".", "/"): v for k, v in classes_of(listing).items()}
    problems, cache = [], {}
    for instr, cls, member, desc in refs:
        name = cls.replace("$", "/")          # nested: ApiDump names them Outer.Inner, the bytecode Outer$Inner
        where = cls.replace("/", ".")
        if name.endswith("/Companion") and name.removesuffix("/Companion") in classes:
            # a call on the Companion instance (Kotlin calls companion members so): listed as Companion.member
            outer = classes[name.removesuffix("/Companion")]
            sig = ("static " if instr == "invokestatic" else "") + f"Companion.{member}{desc}"
            if member is not None and sig not in {j.removeprefix("protected ") for j in outer["jvm"]}:
                problems.append(f"calls: {instr} {where}.{member}{desc} is not in the listing")
            continue
        e = classes.get(name)
        # what ApiDump leaves out of supertypes: an enum class extends java.lang.Enum (ordinal(), name(), ...)
        supers = e["supertypes"] + (["java.lang.Enum"] if e and e.get("kind") == "enum class" else []) + ["java.lang.Object"] if e else []
        if e is None:
            problems.append(f"calls: class {where} is not in the listing")
        elif member is not None and not _listed(e, instr, member, desc) \
                and not _inherited(classes, supers, instr, member, desc, jdk, cache):
            problems.append(f"calls: {instr} {where}.{member}{desc} is not in the listing")
    return problems


def javap_classes(paths: list[str]) -> str:
    files = []
    for p in paths:
        p = Path(p)
        files += sorted(str(f) for f in p.rglob("*.class")) if p.is_dir() else [str(p)]
    if not files:
        raise SystemExit(f"Error: no class files under {' '.join(paths)}")
    out = subprocess.run(["javap", "-c", "-p", *files], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"Error: javap failed: {out.stderr.strip()[:500]}")
    return out.stdout


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("stubs", "calls"):
        print("Error: usage: api_check.py stubs LISTING STUBS_DUMP.json | calls LISTING CLASSES...", file=sys.stderr)
        return 2
    listing = load(argv[1])
    if argv[0] == "stubs":
        problems = compare_stubs(listing, load(argv[2]))
        what = f"{len(classes_of(listing))} classes"
    else:
        refs = references(javap_classes(argv[2:]))
        problems = check_calls(listing, refs)
        what = f"{len(refs)} references into {PACKAGE[:-1].replace('/', '.')}"
    for p in problems:
        print(p)
    print(f"api {argv[0]}: {len(problems)} problems ({what}; listing {listing.get('source', {}).get('commit', '?')[:10]})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
