"""The ExecuTorch Swift API as Swift code sees it, from ExecuTorch's sources (extension/apple/ExecuTorch/Exported: the
Objective-C headers as Swift imports them, and the Swift overlay files), recorded as ios/typecheck/executorch-swift.json;
and the check that the stand-ins in ios/typecheck/ExecuTorch.swift declare only what that listing has (ios/test.sh).

    python3 swift_api.py record GIT_DIR COMMIT [OUT]       # write the listing (git show of the sources; nothing else kept)
    python3 swift_api.py check LISTING STANDIN.swift        # every type, member and conformance of the stand-in is listed

A member is keyed by what a call site depends on: kind (func / init / var / case), static or not, its Swift name with
argument labels (`load(_:)`, `init(bytesNoCopy:shape:strides:dimensionOrder:shapeDynamism:)`) and `throws`; members
of the Swift overlay also by their parameter and result types (as written, whitespace removed), so a stand-in that
changes a type (`[T]` for `inout [T]`) fails. Objective-C members are imported by the rules the headers use:
NS_SWIFT_NAME, NS_REFINED_FOR_SWIFT (hidden as `__name`, left out), NS_SWIFT_UNAVAILABLE / NS_UNAVAILABLE (left out),
a trailing `error:` (NSError **) parameter -> `throws`, `initWith...:` -> `init(...:)`, NS_ENUM case prefixes, and the
one name pruning the headers rely on (a class property named after its own type: `sharedLog` of Log -> `shared`).
Their types are not compared. Standard library only; prints one line per problem; exits 1 on any.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

EXPORTED = "extension/apple/ExecuTorch/Exported"


# ---------------------------------------------------------------------------------------------- Swift sources

def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def _logical_lines(text: str) -> list[str]:
    """Physical lines joined while parentheses or brackets are open (multi-line parameter lists)."""
    out, cur, depth = [], "", 0
    for line in text.splitlines():
        cur = f"{cur} {line.strip()}" if cur else line.strip()
        depth += line.count("(") + line.count("[") - line.count(")") - line.count("]")
        if depth <= 0:
            out.append(cur)
            cur, depth = "", 0
    if cur:
        out.append(cur)
    return out


def _split_top(s: str, sep: str = ",") -> list[str]:
    parts, cur, depth = [], "", 0
    for ch in s:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def _balanced(s: str, start: int) -> int:
    """Index just past the parenthesis group opening at s[start] == '('."""
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "(":
            depth += 1
        elif s[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(s)


def _norm(t: str) -> str:
    return re.sub(r"\s+", "", t)


def _params(inner: str, labelled_by_default: bool) -> tuple[str, list[str]]:
    labels, types = [], []
    for p in _split_top(inner):
        if not p:
            continue
        head, _, rest = p.partition(":")
        names = head.split()
        label = names[0] if len(names) >= 2 or labelled_by_default else "_"
        labels.append(label)
        default = "=" if re.search(r"=", rest) and not rest.strip().startswith("(") else ""
        typ = rest.split("=")[0] if default else rest
        types.append(_norm(typ) + default)
    return "".join(f"{x}:" for x in labels), types


MEMBER = re.compile(r"^((?:@\w+(?:\([^)]*\))?\s+)*)((?:(?:public|open|internal|private|fileprivate|static|class|final|convenience|"
                    r"override|mutating|nonisolated|required)\s+)*)(func|init[?!]?|var|let|case|subscript)\b(.*)$")
TYPE = re.compile(r"^((?:@\w+(?:\([^)]*\))?\s+)*)((?:(?:public|open|internal|private|fileprivate|final)\s+)*)"
                  r"(class|enum|struct|protocol|extension|actor)\s+([\w.]+)\s*(<[^>{]*>)?\s*(?::\s*([^{]*?))?\s*(where [^{]*)?\{")


def swift_declarations(text: str, public_only: bool = True) -> dict:
    """{types: {Name: kind}, members: {Name: [signature...]}, conformances: [\"Name: Protocol\"...]} of the
    public declarations of a Swift file (one level of nesting: members directly inside a type or an extension)."""
    types, members, conformances = {}, {}, []
    stack: list[tuple[str, int, bool, str]] = []   # (name, body depth, members public by default, kind)
    depth = 0
    for line in _logical_lines(_strip(text)):
        before = depth
        depth += line.count("{") - line.count("}")
        while stack and before < stack[-1][1]:
            stack.pop()
        t = TYPE.match(line)
        if t and (not stack or before == stack[-1][1]):
            mods, kind, name, supers = t.group(2).split(), t.group(3), t.group(4), t.group(6)
            public = "public" in mods or "open" in mods
            if kind == "extension":
                for s in _split_top(supers or ""):
                    if s:
                        conformances.append(f"{name}: {_norm(s)}")
                default_public = public or not public_only
            else:
                if public or not public_only:
                    types[name] = "class" if kind == "actor" else kind
                    for s in _split_top(supers or ""):
                        if s:
                            conformances.append(f"{name}: {_norm(s)}")
                default_public = kind in ("protocol", "enum") and (public or not public_only)
            if depth > before:
                stack.append((name, before + 1, default_public, kind))
            continue
        if not stack or before != stack[-1][1]:
            continue
        m = MEMBER.match(line)
        if not m:
            continue
        owner, _, default_public, owner_kind = stack[-1]
        mods, kind, rest = m.group(2).split(), m.group(3), m.group(4)
        if "private" in mods or "fileprivate" in mods or "internal" in mods:
            continue
        if public_only and not ("public" in mods or "open" in mods or default_public):
            continue
        static = "static " if ("static" in mods or "class" in mods) else ""
        sigs = []
        if kind == "case":
            for c in _split_top(rest):
                sigs.append("case " + re.split(r"[\s(=]", c.strip(), maxsplit=1)[0].strip("`"))
        elif kind in ("var", "let"):
            v = re.match(r"\s*(\w+)\s*(?::\s*([^={]+))?", rest)
            if v:
                sigs.append(f"{static}var {v.group(1)}: {_norm(v.group(2) or '?')}")
        elif kind == "subscript":
            continue
        else:
            if kind.startswith("init"):
                name, tail = "init", rest
            else:
                f = re.match(r"\s*([^\s(<]+)\s*", rest)
                name, tail = f.group(1), rest[f.end():]
            generics = ""
            if tail.lstrip().startswith("<"):
                g = re.match(r"\s*(<[^(]*>)\s*", tail)
                generics, tail = g.group(1), tail[g.end():]
            open_at = tail.find("(")
            close = _balanced(tail, open_at)
            labels, types_ = _params(tail[open_at + 1:close - 1], not kind.startswith("init") or True)
            after = tail[close:]
            throws = " throws" if re.match(r"\s*(throws|rethrows)\b", after) else ""
            ret = re.search(r"->\s*([^{]+)", after)
            sigs.append(f"{static}{'init' if name == 'init' else 'func'} {name}({labels}){throws}"
                        f" [{_norm(generics)}({', '.join(types_)}){' -> ' + _norm(ret.group(1)) if ret else ''}]")
        members.setdefault(owner, []).extend(sigs)
    return {"types": types, "members": members, "conformances": conformances}


# ---------------------------------------------------------------------------------------------- Objective-C headers

def _lower_first_word(s: str) -> str:
    m = re.match(r"([A-Z]+)(?=[A-Z][a-z]|[0-9_]|$)|([A-Z])", s)
    if not m:
        return s
    run = m.group(0)
    return run.lower() + s[len(run):]


def objc_declarations(text: str) -> dict:
    """Types, members and conformances of a header as Swift imports them (rules in the module docstring)."""
    text = _strip(text)
    types, members, conformances, names = {}, {}, [], {}
    raw_types = {"NSInteger": "Int", "NSUInteger": "UInt", "int8_t": "Int8", "uint8_t": "UInt8", "int16_t": "Int16",
                 "uint16_t": "UInt16", "int32_t": "Int32", "uint32_t": "UInt32", "int64_t": "Int64", "uint64_t": "UInt64"}
    for m in re.finditer(r"typedef\s+NS_ENUM\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*\{(.*?)\}\s*NS_SWIFT_NAME\((\w+)\)", text, re.S):
        raw, objc, body, swift = m.groups()
        names[objc] = swift
        types[swift] = "enum"
        if raw in raw_types:          # an NS_ENUM is a RawRepresentable Swift enum of its C type
            conformances.append(f"{swift}: {raw_types[raw]}")
        for c in _split_top(body):
            c = c.split("=")[0].strip()
            if c.startswith(objc):
                members.setdefault(swift, []).append("case " + _lower_first_word(c[len(objc):]))
    for m in re.finditer(r"NS_SWIFT_NAME\((\w+)\)\s*(?:__attribute__\(\([^)]*\)\)\s*)?@(interface|protocol)\s+(\w+)", text):
        swift, kind, objc = m.groups()
        names[objc] = swift
        types[swift] = "class" if kind == "interface" else "protocol"
        if kind == "protocol":        # an Objective-C protocol is class-bound in Swift
            conformances.append(f"{swift}: AnyObject")
    for m in re.finditer(r"@(interface|protocol)\s+(\w+)\s*(\([^)]*\))?\s*(?::\s*(\w+))?\s*(<[^>]*>)?(.*?)@end", text, re.S):
        kind, objc, category, _, protos, body = m.groups()
        swift = names.get(objc)
        if swift is None:
            continue
        for p in re.findall(r"\w+", protos or ""):
            conformances.append(f"{swift}: {names.get(p, p)}")
        for decl in re.split(r";", body):
            d = " ".join(decl.split())
            if not d or "NS_UNAVAILABLE" in d or "NS_SWIFT_UNAVAILABLE" in d or "NS_REFINED_FOR_SWIFT" in d:
                continue
            explicit = re.search(r"NS_SWIFT_NAME\((\w+(?:\([^)]*\))?)\)", d)
            if d.startswith("@property"):
                attrs = re.match(r"@property\s*(\(([^)]*)\))?", d)
                static = "static " if attrs.group(2) and re.search(r"\bclass\b", attrs.group(2)) else ""
                decl_part = re.sub(r"\bNS_\w+(\([^)]*\))?", "", d[attrs.end():]).strip()
                pm = re.search(r"(\w+)\s*$", decl_part)
                name = explicit.group(1) if explicit else pm.group(1)
                typ = decl_part[:pm.start()].strip()
                own = swift
                tm = re.search(r"(\w+)\s*\*?$", typ)
                if static and tm and tm.group(1) == objc and name.lower().endswith(swift.lower()) and name.lower() != swift.lower():
                    name = name[: len(name) - len(swift)]
                members.setdefault(own, []).append(f"{static}var {name}")
                continue
            mm = re.match(r"([-+])\s*\(([^)]*(?:\([^)]*\))?[^)]*)\)\s*(.*)$", d)
            if not mm:
                continue
            static = "static " if mm.group(1) == "+" else ""
            sel = re.sub(r"\bNS_\w+(\([^)]*(?:\([^)]*\))?\))?", "", mm.group(3)).strip()
            pieces = re.findall(r"(\w+)\s*:\s*\(([^)]*(?:\([^)]*\))?[^)]*)\)\s*\w+", sel)
            throws = bool(pieces) and "NSError" in pieces[-1][1] and "**" in pieces[-1][1]
            params = pieces[:-1] if throws else pieces
            if explicit:
                sig_name = explicit.group(1)
                if sig_name.startswith("init("):
                    static = ""
            else:
                base = pieces[0][0] if pieces else re.match(r"\w+", sel).group(0)
                first = "_"
                w = re.match(r"^(\w+?)With([A-Z]\w*)$", base)
                if base.startswith("initWith"):
                    base, first = "init", _lower_first_word(base[len("initWith"):])
                elif w:
                    base, first = w.group(1), _lower_first_word(w.group(2))
                labels = ([first] + [p[0] for p in params[1:]]) if params else []
                if base == "init":
                    static = ""
                sig_name = f"{base}(" + "".join(f"{x}:" for x in labels) + ")"
            kind = "init" if sig_name.startswith("init(") else "func"
            members.setdefault(swift, []).append(f"{static}{kind} {sig_name}{' throws' if throws else ''}")
    return {"types": types, "members": members, "conformances": conformances}


# ---------------------------------------------------------------------------------------------- listing and check

def merge(parts: list[dict]) -> dict:
    out = {"types": {}, "members": {}, "conformances": set()}
    for p in parts:
        out["types"].update(p["types"])
        for k, v in p["members"].items():
            out["members"].setdefault(k, set()).update(v)
        out["conformances"].update(p["conformances"])
    return {"types": dict(sorted(out["types"].items())),
            "members": {k: sorted(v) for k, v in sorted(out["members"].items())},
            "conformances": sorted(out["conformances"])}


def _key(sig: str) -> tuple[str, str | None]:
    """(name part, types part or None) of a member signature."""
    m = re.match(r"^(.*?)(?: \[(.*)\])?$", sig)
    return m.group(1), m.group(2)


def check(listing: dict, standin: dict) -> list[str]:
    problems = []
    api = listing["api"] if "api" in listing else listing
    for name, kind in sorted(standin["types"].items()):
        want = api["types"].get(name)
        if want is None:
            problems.append(f"type {name} is not in the listing")
        elif want != kind:
            problems.append(f"type {name} is a {kind} in the stand-in, a {want} in the listing")
    for owner, sigs in sorted(standin["members"].items()):
        listed = api["members"].get(owner, [])
        by_name: dict[str, list[str | None]] = {}
        for s in listed:
            n, t = _key(s)
            by_name.setdefault(n, []).append(t)
        for s in sigs:
            n, t = _key(s)
            if n.startswith(("var ", "static var ")):
                n_plain = n.split(":")[0]
                cands = [x for x in listed if _key(x)[0].split(":")[0] == n_plain]
                if not cands:
                    problems.append(f"{owner}: `{s}` is not in the listing")
                elif not any(":" not in _key(x)[0] or _key(x)[0].endswith(": ?") or _key(x)[0] == n or n.endswith(": ?")
                             for x in cands):
                    problems.append(f"{owner}: `{s}` has another type in the listing: {', '.join(cands)}")
                continue
            if n not in by_name:
                problems.append(f"{owner}: `{n}` is not in the listing")
            elif t is not None and None not in by_name[n] and t not in by_name[n]:
                problems.append(f"{owner}: `{n}` takes [{t}] in the stand-in, the listing has "
                                + " or ".join(f"[{x}]" for x in by_name[n]))
    for c in standin["conformances"]:
        if c not in api["conformances"]:
            problems.append(f"conformance {c} is not in the listing")
    return problems


def record(git_dir: str, commit: str) -> dict:
    def git(*a: str) -> str:
        return subprocess.run(["git", "--git-dir", git_dir, *a], check=True, capture_output=True, text=True).stdout
    sha = git("rev-parse", f"{commit}^{{commit}}").strip()
    files = sorted(f for f in git("ls-tree", "--name-only", sha, f"{EXPORTED}/").split()
                   if f.endswith((".h", ".swift")))
    parts = []
    for f in files:
        text = git("show", f"{sha}:{f}")
        parts.append(objc_declarations(text) if f.endswith(".h") else swift_declarations(text))
    return {"source": {"repository": "https://github.com/pytorch/executorch", "ref": commit, "commit": sha,
                       "version_txt": git("show", f"{sha}:version.txt").strip(), "files": files},
            "how": "ios/typecheck/swift_api.py record", "api": merge(parts)}


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "record":
        out = Path(argv[3]) if len(argv) > 3 else Path(__file__).with_name("executorch-swift.json")
        doc = record(argv[1], argv[2])
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{out}: {len(doc['api']['types'])} types from {doc['source']['commit'][:10]}")
        return 0
    if len(argv) == 3 and argv[0] == "check":
        listing = json.loads(Path(argv[1]).read_text())
        standin = swift_declarations(Path(argv[2]).read_text(), public_only=True)
        problems = check(listing, standin)
        for p in problems:
            print(p)
        n = sum(len(v) for v in standin["members"].values())
        print(f"swift api: {len(problems)} problems ({len(standin['types'])} types, {n} members, "
              f"{len(standin['conformances'])} conformances of {argv[2]}; listing {listing['source']['commit'][:10]})")
        return 1 if problems else 0
    print("Error: usage: swift_api.py record GIT_DIR COMMIT [OUT] | check LISTING STANDIN.swift", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
