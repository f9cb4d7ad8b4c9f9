"""The hostile-input table: one row per bad input or fault, as a demanding new user would try them.

Every row must end the same way (tests/hostile/test_hostile_inputs.py): exit code 2, exactly one
`Error: ...` line on stderr (containing `expect`), no traceback, no output left behind in the working
directory and no pre-existing file changed. docs/reliability.md lists the rows with their results.

A row's `setup(w)` builds its inputs in the work directory `w` (the command runs with `w` as its current
directory) and returns the command line; `patch(monkeypatch)` injects a fault (a read-only or full file
system); `subprocess=True` runs the command in a child process (cases that could abort or block one).
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TINY = ["--model", "tiny", "--init", "random"]
ROWS = [{"input_ids": [256, *b"hello hostile world"]}, {"input_ids": [256, *b"another row of bytes"]}]


@dataclass(frozen=True)
class Case:
    id: str
    what: str                                   # the hostile input, in words (docs/reliability.md)
    setup: Callable[[Work], list[str]]
    expect: str                                 # a substring of the Error line
    patch: Callable | None = None
    subprocess: bool = False
    may_change: tuple[str, ...] = field(default=())   # paths (relative to w) a refusal may rewrite in place
    check: Callable[[Work], None] | None = None       # more to assert afterwards


class Work:
    """The work directory of one case, and the session's tiny program."""

    def __init__(self, path: Path, program: Path):
        self.path, self._program = path, program

    def write(self, name: str, content: str | bytes) -> str:
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return name

    def data(self, name: str = "data.jsonl", rows=ROWS) -> str:
        return self.write(name, "".join(json.dumps(r) + "\n" for r in rows))

    def mine(self, name: str) -> str:
        """A user's non-empty directory (holding mine.txt)."""
        self.write(f"{name}/mine.txt", "the user's file\n")
        return name

    def program(self, name: str = "prog", edit: Callable[[dict, Path], None] | None = None, *,
                manifest: bytes | None = None) -> str:
        """A copy of the session's exported tiny program, its manifest edited by `edit(manifest, dir)` or
        replaced by the bytes `manifest`."""
        d = self.path / name
        shutil.copytree(self._program, d)
        if manifest is not None:
            (d / "manifest.json").write_bytes(manifest)
        if edit is not None:
            m = json.loads((d / "manifest.json").read_text())
            edit(m, d)
            (d / "manifest.json").write_text(json.dumps(m, indent=2))
        return name


# ------------------------------------------------------------------------------------------ builders

def nested(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def event(seq: int, run_id: str = "r1", **over) -> dict:
    return {"schema_version": 1, "type": "step", "run_id": run_id, "seq": seq, "timestamp": 1767225600.0 + seq,
            "step": seq, "loss": 2.5, "step_time_s": 0.5, "tokens_per_s": 512.0, **over}


def jsonl(events) -> str:
    return "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events)


def forge_pte(content: Callable[[bytes], bytes]) -> Callable[[dict, Path], None]:
    """Replace model.pte by `content(original)` and forge its checksum in the manifest."""
    def edit(m: dict, d: Path) -> None:
        pte = d / "model.pte"
        pte.write_bytes(content(pte.read_bytes()))
        m["files"]["model.pte"] = hashlib.sha256(pte.read_bytes()).hexdigest()
    return edit


def set_field(path: str, value) -> Callable[[dict, Path], None]:
    def edit(m: dict, _d: Path) -> None:
        keys = path.split(".")
        x = m
        for k in keys[:-1]:
            x = x[int(k)] if isinstance(x, list) else x[k]
        x[keys[-1]] = value
    return edit


def store_with_run(w: Work, name: str = "t.sqlite3", *, poisoned: bool = False) -> str:
    from toolchain.telemetry.store import EventStore

    with EventStore(w.path / name) as store:
        store.add([event(0), event(1)])
        if poisoned:     # what an older version stored for "timestamp": 1e400
            body = json.dumps(event(2, timestamp=float("inf")), sort_keys=True, separators=(",", ":"))
            store._db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", ("r1", 2, "step", float("inf"), body, 0.0))
    for suffix in ("-wal", "-shm"):
        (w.path / f"{name}{suffix}").unlink(missing_ok=True)
    return name


def _stored(w: Work, n: int) -> None:
    from toolchain.telemetry.store import EventStore

    with EventStore(w.path / "t.sqlite3") as store:
        assert store.count() == n, f"{store.count()} events stored, expected {n}"
    for suffix in ("-wal", "-shm"):
        (w.path / f"t.sqlite3{suffix}").unlink(missing_ok=True)


def taken_port(w: Work) -> list[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    w.keep = sock                          # held until the case ends
    return ["telemetry", "serve", "--port", str(sock.getsockname()[1]), "--token", "t", "--db", "t.sqlite3"]


def oserror(code: int, where: str):
    """A monkeypatch that makes `where` (module.attr) raise OSError(code)."""
    def patch(monkeypatch) -> None:
        def fail(*_a, **_k):
            raise OSError(code, __import__("os").strerror(code))
        monkeypatch.setattr(where, fail)
    return patch


def no_free_space(monkeypatch) -> None:
    import collections

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr("toolchain.atomic.shutil.disk_usage", lambda _p: usage(1 << 30, 1 << 30, 1024))


BAD_UTF8 = b'{"input_ids": [256, 104], "note": "caf\xe9"}\n{"input_ids": [256, 105]}\n'
GRADS = ["grads", *TINY, "--out", "g.safetensors"]
TRAIN = ["train", *TINY, "--steps", "2"]
FIT = ["plan", "fit", "--model", "tiny", "--device", "android-8gb"]


def _cases() -> list[Case]:
    c = Case
    return [
        # ---- outputs: never lose a user's file, check before any work
        c("export-out-not-empty", "`export --out DIR` where DIR holds the user's files",
          lambda w: ["export", *TINY, "--seq-len", "8", "--out", w.mine("out")], "not empty"),
        c("export-out-is-a-file", "`export --out F` where F is a file",
          lambda w: ["export", *TINY, "--out", w.write("out", "mine")], "is a file"),
        c("export-out-read-only", "`export` to a read-only file system (EROFS)",
          lambda w: ["export", *TINY, "--out", "out"], "Read-only file system",
          patch=oserror(errno.EROFS, "toolchain.atomic.tempfile.mkstemp")),
        c("export-out-full", "`export` to a disk without room for the weights",
          lambda w: ["export", *TINY, "--out", "out"], "free on", patch=no_free_space),
        c("grads-out-disk-full", "`grads` when the disk fills up while writing (ENOSPC)",
          lambda w: [*GRADS[:-1], "g.safetensors", "--data", w.data()], "No space left on device",
          patch=oserror(errno.ENOSPC, "toolchain.atomic.os.replace")),
        c("grads-out-is-a-dir", "`grads --out DIR` (an existing directory)",
          lambda w: [*GRADS[:-1], w.mine("g"), "--data", w.data()], "is a directory"),
        c("plan-lcsb-out-is-a-dir", "`plan lcsb --out DIR`",
          lambda w: ["plan", "lcsb", "--layers", "8", "--k", "2", "--out", w.mine("p")], "is a directory"),
        c("train-adapter-out-not-empty", "`train --adapter-out DIR` where DIR holds the user's files",
          lambda w: [*TRAIN, "--data", w.data(), "--adapter-out", w.mine("ad")], "not empty"),
        c("train-program-adapter-out-not-empty", "`train --program P --adapter-out DIR`, DIR holds the user's files",
          lambda w: ["train", "--program", w.program(), "--data", w.data(), "--steps", "1", "--adapter-out",
                     w.mine("ad")], "not empty"),
        c("report-out-not-empty", "`telemetry report --out DIR` where DIR holds the user's files",
          lambda w: ["telemetry", "report", "r1", "--db", store_with_run(w), "--out", w.mine("rep")], "not empty",
          may_change=("t.sqlite3",)),
        c("bench-json-is-a-dir", "`bench memory --json DIR`",
          lambda w: ["bench", "memory", *TINY, "--json", w.mine("j")], "is a directory"),
        # ---- numbers: finite, bounded by the model or the machine
        c("export-lr-inf", "`export --lr inf` (would write a manifest that is not JSON)",
          lambda w: ["export", *TINY, "--lr", "inf", "--out", "out"], "not a finite number"),
        c("export-lr-nan", "`export --lr nan`", lambda w: ["export", *TINY, "--lr", "nan", "--out", "out"],
          "not a finite number"),
        c("export-weight-decay-nan", "`export --weight-decay nan`",
          lambda w: ["export", *TINY, "--weight-decay", "nan", "--out", "out"], "not a finite number"),
        c("train-lr-nan", "`train --lr nan` (trained NaN adapters, exit 0)",
          lambda w: [*TRAIN, "--data", w.data(), "--lr", "nan"], "not a finite number"),
        c("train-lr-inf", "`train --lr inf`", lambda w: [*TRAIN, "--data", w.data(), "--lr", "inf"],
          "not a finite number"),
        c("train-weight-decay-nan", "`train --weight-decay nan`",
          lambda w: [*TRAIN, "--data", w.data(), "--weight-decay", "nan"], "not a finite number"),
        c("train-momentum-nan", "`train --optimizer sgd --momentum nan`",
          lambda w: [*TRAIN, "--data", w.data(), "--optimizer", "sgd", "--momentum", "nan"], "not a finite number"),
        c("train-steps-1e12", "`train --steps 1000000000000` (allocated GBs before step 0)",
          lambda w: [*TRAIN[:-1], "1000000000000", "--data", w.data()], "1000000"),
        c("grads-alpha-inf", "`grads --alpha inf`", lambda w: [*GRADS, "--data", w.data(), "--alpha", "inf"],
          "not a finite number"),
        c("grads-rank-100000", "`grads --rank 100000` on a 64-wide model",
          lambda w: [*GRADS, "--data", w.data(), "--rank", "100000"], "at most"),
        c("export-rank-100000", "`export --rank 100000`", lambda w: ["export", *TINY, "--rank", "100000", "--out", "out"],
          "at most"),
        c("grads-seed-huge", "`grads --seed 10^30`", lambda w: [*GRADS, "--data", w.data(), "--seed", "1" + "0" * 30],
          "--seed"),
        c("plan-fit-seq-len-100000", "`plan fit --seq-len 100000` (printed 1e18 MB, exit 0)",
          lambda w: [*FIT, "--seq-len", "100000"], "max_position_embeddings"),
        c("plan-fit-rank-100000", "`plan fit --rank 100000`", lambda w: [*FIT, "--seq-len", "32", "--rank", "100000"],
          "at most"),
        c("plan-fit-overhead-nan", "`plan fit --overhead-mb nan`",
          lambda w: [*FIT, "--seq-len", "32", "--overhead-mb", "nan"], "not a finite number"),
        c("export-chunk-10^30", "`export --loss-chunk 10^30` (would write an integer no reader takes)",
          lambda w: ["export", *TINY, "--loss-chunk", "1" + "0" * 30, "--out", "out"], "--loss-chunk"),
        c("export-dequant-chunk-1e300", "`export --dequant-chunk-mb 1e300`",
          lambda w: ["export", *TINY, "--dequant-chunk-mb", "1e300", "--out", "out"], "--dequant-chunk-mb"),
        c("mezo-eps-1e308", "`bench mezo-cosine --eps 1e308` (overflowed inside torch)",
          lambda w: ["bench", "mezo-cosine", *TINY, "--seq-len", "8", "--eps", "1e308", "--no-memory"], "--eps"),
        c("bench-memory-lr-inf", "`bench memory --lr inf`", lambda w: ["bench", "memory", *TINY, "--lr", "inf"],
          "not a finite number"),
        c("bench-memory-seq-len-mismatch", "`bench memory --seq-len` other than the program's",
          lambda w: ["bench", "memory", *TINY, "--program", w.program(), "--modes", "executorch", "--seq-len", "16"],
          "seq_len"),
        # ---- input files: UTF-8, strict JSON, nesting limits
        c("data-not-utf8", "data JSONL with a Latin-1 byte", lambda w: [*GRADS, "--data", w.write("d.jsonl", BAD_UTF8)],
          "not UTF-8"),
        c("data-nested", "data JSONL line nested 100,000 deep",
          lambda w: [*GRADS, "--data", w.write("d.jsonl", nested() + "\n")], "nested too deeply"),
        c("data-1e400", "data row with a number 1e400",
          lambda w: [*GRADS, "--data", w.write("d.jsonl", '{"input_ids": [256, 1e400]}\n')], "out of range"),
        c("data-huge-int", "data row with a 30-digit token id",
          lambda w: [*GRADS, "--data", w.write("d.jsonl", '{"input_ids": [256, ' + "9" * 30 + "]}\n")], "out of range"),
        c("data-nan", "data row with NaN", lambda w: [*GRADS, "--data", w.write("d.jsonl", '{"input_ids": [NaN]}\n')],
          "NaN"),
        c("train-data-not-utf8", "`train` on a non-UTF-8 data file",
          lambda w: [*TRAIN, "--data", w.write("d.jsonl", BAD_UTF8)], "not UTF-8"),
        c("plan-not-utf8", "`train --plan` file with a non-UTF-8 byte",
          lambda w: [*TRAIN, "--data", w.data(), "--plan", w.write("p.json", b'{"policy": "\xff"}')], "not UTF-8"),
        c("plan-nested", "`train --plan` file nested 100,000 deep",
          lambda w: [*TRAIN, "--data", w.data(), "--plan", w.write("p.json", nested())], "nested too deeply"),
        c("export-plan-nan", "`export --plan` file with NaN",
          lambda w: ["export", *TINY, "--out", "out", "--plan", w.write("p.json", '{"k": NaN}')], "NaN"),
        c("device-profile-not-utf8", "`plan fit --device` JSON file with a non-UTF-8 byte",
          lambda w: [*FIT[:-1], w.write("dev.json", b'{"name": "\xfe"}'), "--seq-len", "32"], "not UTF-8"),
        c("device-profile-nested", "`plan fit --device` JSON file nested 100,000 deep",
          lambda w: [*FIT[:-1], w.write("dev.json", nested()), "--seq-len", "32"], "nested too deeply"),
        c("cells-not-utf8", "`bench tables --cells` file with a non-UTF-8 byte",
          lambda w: ["bench", "tables", "--render-only", "--cells", w.write("cells.json", b'{"cells": "\xff"}'),
                     "--doc", "b.md", "--plot", "b.png"], "not UTF-8"),
        c("cells-nested", "`bench tables --cells` file nested 100,000 deep",
          lambda w: ["bench", "tables", "--render-only", "--cells", w.write("cells.json", nested()),
                     "--doc", "b.md", "--plot", "b.png"], "nested too deeply"),
        c("adapter-config-not-utf8", "`grads --adapter DIR` whose adapter_config.json has a non-UTF-8 byte",
          lambda w: [*GRADS, "--data", w.data(), "--adapter", w.write("ad/adapter_config.json", b'{"r": "\xff"}')
                     and w.write("ad/adapter_model.safetensors", b"") and "ad"], "adapter_config.json"),
        c("checkpoint-config-not-utf8", "`grads --model DIR` whose config.json has a non-UTF-8 byte",
          lambda w: ["grads", "--model", w.write("ck/config.json", b'{"x": "\xff"}') and "ck", "--data", w.data(),
                     "--out", "g.safetensors"], "not UTF-8"),
        # ---- exported programs: what the checksums do not cover
        c("manifest-not-utf8", "program manifest.json with a non-UTF-8 byte",
          lambda w: ["train", "--program", w.program(manifest=b'{"schema_version": 3, "x": "\xff"}'), "--data",
                     w.data(), "--steps", "1"], "not UTF-8"),
        c("manifest-nested", "program manifest.json nested 100,000 deep",
          lambda w: ["train", "--program", w.program(manifest=nested().encode()), "--data", w.data(), "--steps", "1"],
          "nested too deeply"),
        c("manifest-pad-out-of-vocab", "manifest tokenizer.pad_token_id outside the vocabulary (crashed the runtime)",
          lambda w: ["train", "--program", w.program(edit=set_field("tokenizer.pad_token_id", 10**6)), "--data",
                     w.data(), "--steps", "1"], "pad_token_id"),
        c("manifest-files-emptied", "manifest `files` emptied (nothing verified)",
          lambda w: ["train", "--program", w.program(edit=set_field("files", {})), "--data", w.data(), "--steps", "1"],
          "no checksum"),
        c("manifest-path-traversal", "manifest weights.file = ../../etc/passwd",
          lambda w: ["train", "--program", w.program(edit=set_field("weights.file", "../../etc/passwd")), "--data",
                     w.data(), "--steps", "1"], "outside the program directory"),
        c("manifest-state-offset", "manifest state entry offset changed (crashed slicing the state)",
          lambda w: ["train", "--program", w.program(edit=set_field("state.entries.0.offset", 10**9)), "--data",
                     w.data(), "--steps", "1"], "state layout"),
        c("pte-garbage-forged-checksum", "model.pte replaced by random bytes, checksum forged (SIGABRT)",
          lambda w: ["train", "--program", w.program(edit=forge_pte(lambda b: bytes(range(256)) * 20)), "--data",
                     w.data(), "--steps", "1"], "not an ExecuTorch program", subprocess=True),
        c("pte-body-garbage-forged-checksum", "model.pte with a valid header and a garbage body, checksum forged",
          lambda w: ["train", "--program", w.program(edit=forge_pte(lambda b: b[:64] + bytes(len(b) - 64))), "--data",
                     w.data(), "--steps", "1"], "ExecuTorch", subprocess=True),
        c("pte-truncated-forged-checksum", "model.pte truncated to 3000 bytes, checksum forged",
          lambda w: ["train", "--program", w.program(edit=forge_pte(lambda b: b[:3000])), "--data", w.data(),
                     "--steps", "1"], "truncated"),
        # ---- telemetry import and report
        c("import-not-utf8", "`telemetry import` of a non-UTF-8 file",
          lambda w: ["telemetry", "import", w.write("e.jsonl", b'{"run_id": "\xff"}\n'), "--db", "t.sqlite3"],
          "not UTF-8"),
        c("import-1e400-timestamp", "`telemetry import` of an event with timestamp 1e400 (must not be stored as Infinity)",
          lambda w: ["telemetry", "import", w.write("e.jsonl", jsonl([json.dumps(event(0)).replace(
              "1767225600.0", "1e400")])), "--db", "t.sqlite3"], "out of range"),
        c("import-lone-surrogate", "`telemetry import` of an event with a lone surrogate",
          lambda w: ["telemetry", "import", w.write("e.jsonl", jsonl([json.dumps(event(0, run_id="r1")).replace(
              '"step",', '"step", "x": "\\ud800",', 1)])), "--db", "t.sqlite3"], "surrogate"),
        c("import-huge-seq", "`telemetry import` of an event with seq 10^23",
          lambda w: ["telemetry", "import", w.write("e.jsonl", jsonl([event(99999999999999999999999)])),
                     "--db", "t.sqlite3"], "out of range"),
        c("import-nested", "`telemetry import` of a line nested 100,000 deep",
          lambda w: ["telemetry", "import", w.write("e.jsonl", nested() + "\n"), "--db", "t.sqlite3"],
          "nested too deeply"),
        c("import-all-or-nothing", "`telemetry import good.jsonl conflicting.jsonl`: nothing of good.jsonl stored",
          lambda w: ["telemetry", "import", w.write("a.jsonl", jsonl([event(5), event(6)])),
                     w.write("b.jsonl", jsonl([event(7), event(0, loss=9.0)])), "--db", store_with_run(w)],
          "reuse a stored", may_change=("t.sqlite3",), check=lambda w: _stored(w, 2)),
        c("report-poisoned-store", "`telemetry report` on a store an older version poisoned with Infinity",
          lambda w: ["telemetry", "report", "r1", "--db", store_with_run(w, poisoned=True), "--out", "rep"],
          "older version", may_change=("t.sqlite3",)),
        c("serve-port-taken", "`telemetry serve` on a port already in use", taken_port, "already in use",
          subprocess=True),
    ]


CASES = _cases()
