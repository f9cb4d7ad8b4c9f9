"""The hostile-input table: one row per bad input or fault, as a demanding new user would try them.

Every row must end the same way (tests/hostile/test_hostile_inputs.py): exit code 2, exactly one
`Error: ...` line on stderr (containing `expect`), no traceback, no output left behind in the working
directory and no pre-existing file changed. docs/reliability.md lists the rows with their results.

A row's `setup(w)` builds its inputs in the work directory `w` (the command runs with `w` as its current
directory) and returns the command line; `patch(monkeypatch)` injects a fault (a read-only or full file
system); `subprocess=True` runs the command in a child process (cases that could abort or block one),
`preexec` sets that child up (an rlimit, stdout closed). `may_leave` names what a refusal must leave
behind (the checkpoint of a run stopped by a fault), `check(w)` asserts more afterwards.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import threading
import time
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
    may_leave: tuple[str, ...] = field(default=())    # new paths the refusal must leave (a checkpoint to resume)
    preexec: Callable[[], None] | None = None         # run in the child before the command (subprocess only)
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


def foreign_sqlite(w: Work, name: str = "other.db") -> str:
    """Another application's SQLite file (one table of its own)."""
    import sqlite3

    con = sqlite3.connect(w.path / name)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    return name


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


# ------------------------------------------------------------------ issue 27: faults phones and fleets produce

class _Held:
    """A file descriptor held (with its flock) until the case ends."""

    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


def adapter_lock_held(w: Work) -> list[str]:
    """Another run's lock on --adapter-out ad (held by this process until the case ends)."""
    import fcntl

    fd = os.open(w.path / "ad.train-checkpoint.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    w.keep = _Held(fd)
    return [*TRAIN, "--data", w.data(), "--adapter-out", "ad"]


def forge_weights(*, truncate_to: int | None = None, header: Callable[[dict], None] | None = None):
    """Rewrite weights.safetensors (its header edited by `header`, then cut to `truncate_to` bytes) and forge
    its checksum and weights.bytes in the manifest, so only the file's own check can catch it."""
    def edit(m: dict, d: Path) -> None:
        f = d / "weights.safetensors"
        raw = f.read_bytes()
        if header is not None:
            n = int.from_bytes(raw[:8], "little")
            h = json.loads(raw[8:8 + n])
            header(h)
            new = json.dumps(h, separators=(",", ":")).encode()
            raw = raw[:8] + new + b" " * (n - len(new)) + raw[8 + n:]
        if truncate_to is not None:
            raw = raw[:truncate_to]
        f.write_bytes(raw)
        m["files"]["weights.safetensors"] = hashlib.sha256(raw).hexdigest()
        m["weights"]["bytes"] = len(raw)
    return edit


def _grow_first_tensor(h: dict) -> None:
    key = next(k for k in h if not k.startswith("__"))
    h[key]["shape"][0] *= 1000


def shrink_weights_during_train(w: Work) -> list[str]:
    """`train --program` while another process truncates the (memory-mapped) weights file mid-run."""
    prog, data = w.program(), w.data()
    checkpoint, weights = w.path / "ad.train-checkpoint.safetensors", w.path / prog / "weights.safetensors"

    def truncate() -> None:
        deadline = time.monotonic() + 240
        while not checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.truncate(weights, 4096)
    threading.Thread(target=truncate, daemon=True).start()
    return ["train", "--program", prog, "--data", data, "--steps", "100000", "--checkpoint-every", "1",
            "--adapter-out", "ad"]


def _checkpoint_kept(w: Work) -> None:
    from toolchain.training.checkpoint import load_checkpoint

    assert load_checkpoint(w.path / "ad.train-checkpoint.safetensors").step >= 1


def adapter(w: Work, name: str = "ad", *, config: str | None = None, nan: bool = False) -> str:
    """A copy of the program's initial adapter, its config replaced by `config`, its tensors NaN with `nan`."""
    d = w.path / name
    shutil.copytree(w._program / "adapter_init", d)
    if config is not None:
        (d / "adapter_config.json").write_text(config)
    if nan:
        from safetensors.torch import load_file, save_file

        sd = load_file(str(d / "adapter_model.safetensors"))
        save_file({k: v.clone().fill_(float("nan")) for k, v in sd.items()}, str(d / "adapter_model.safetensors"))
    return name


def nan_state_checkpoint(w: Work, name: str, *, meta: bool) -> str:
    """A checkpoint whose flat state is all NaN (`meta`: with a run record, as `train --resume` reads)."""
    import torch
    from safetensors.torch import save_file

    from toolchain.training.checkpoint import save_checkpoint

    numel = (w._program / "state_init.bin").stat().st_size // 4
    state = {"state": torch.full((numel,), float("nan"))}
    if meta:
        save_checkpoint(w.path / name, state, step=1, run_id="r1", seq=0, losses=[1.0], settings={})
    else:
        save_file(state, str(w.path / name))
    return name


def rlimit(which: str, value: int) -> Callable[[], None]:
    """A child-process limit (`resource.RLIMIT_FSIZE`, `RLIMIT_AS`), for `preexec`."""
    def limit() -> None:
        import resource

        resource.setrlimit(getattr(resource, which), (value, value))
    return limit


def close_stdout() -> None:
    os.close(1)


def fifo(w: Work, name: str = "events.fifo") -> str:
    os.mkfifo(w.path / name)
    return name


def outside_tokenizer(m: dict, d: Path) -> None:
    (d.parent / "outside.json").write_text("{}")
    m["tokenizer"]["file"] = "../outside.json"


def drop_pad_id(m: dict, _d: Path) -> None:
    del m["tokenizer"]["pad_token_id"]



# ------------------------------------------------------------------ issue 45: checkpoints, special paths, races

def _checkpoint_arch(family: str):
    from toolchain.models import ModelArch, get_preset
    from toolchain.models.arch import RopeScaling

    if family == "qwen2":
        return get_preset("tiny")
    if family == "qwen3":
        return ModelArch(family="qwen3", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=96,
                         vocab=264, max_positions=512)
    return ModelArch(family="llama", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=264,
                     max_positions=512, rope_theta=500_000.0,
                     rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_positions=64))


def checkpoint(w: Work, name: str = "ck", *, family: str = "qwen2", config: Callable[[dict], object] | None = None,
               raw_config: bytes | None = None, tensors: Callable[[dict], None] | None = None) -> str:
    """A small Hugging Face checkpoint directory of `family` (random weights, float32, one shard), its config
    edited by `config(cfg)` (or replaced by `raw_config`), its tensors by `tensors(state_dict)`."""
    from safetensors.torch import save_file

    from toolchain.models import random_weights
    from toolchain.models.load import state_dict_from_weights

    arch = _checkpoint_arch(family)
    d = w.path / name
    d.mkdir()
    sd = {k: v.contiguous() for k, v in state_dict_from_weights(random_weights(arch, seed=0)).items()}
    if tensors is not None:
        tensors(sd)
    save_file(sd, str(d / "model.safetensors"))
    cfg = arch.to_hf_config().to_dict()
    if config is not None:
        cfg = config(cfg) or cfg
    (d / "config.json").write_bytes(raw_config if raw_config is not None else json.dumps(cfg).encode())
    return name


def setting(**fields) -> Callable[[dict], None]:
    return lambda cfg: cfg.update(fields)


def rope(**params) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        cfg["rope_parameters"] = {**cfg["rope_parameters"], **params}
    return edit


def poison(key: str, value: float) -> Callable[[dict], None]:
    def edit(sd: dict) -> None:
        sd[key] = sd[key].clone()
        sd[key].view(-1)[7] = value
    return edit


def ck_grads(w: Work, **kw) -> list[str]:
    return ["grads", "--model", checkpoint(w, **kw), "--data", w.data(), "--out", "g.safetensors"]


def ck_export(w: Work, **kw) -> list[str]:
    return ["export", "--model", checkpoint(w, **kw), "--seq-len", "8", "--out", "out"]


def special_in_checkpoint(what: str, kind: str) -> Callable[[Work], list[str]]:
    """A checkpoint whose config.json or model.safetensors (`what`) is a FIFO, a socket or a symlink loop."""
    def setup(w: Work) -> list[str]:
        name = checkpoint(w)
        p = w.path / name / what
        p.unlink()
        make_special(w, p, kind)
        return ["grads", "--model", name, "--data", w.data(), "--out", "g.safetensors"]
    return setup


def make_special(w: Work, p: Path, kind: str) -> str:
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "loop":
        p.symlink_to(p.name)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(p))
        w.keep = sock
    return p.name


def special(w: Work, name: str, kind: str) -> str:
    return make_special(w, w.path / name, kind)


def special_adapter_weights(w: Work) -> list[str]:
    name = adapter(w)
    (w.path / name / "adapter_model.safetensors").unlink()
    make_special(w, w.path / name / "adapter_model.safetensors", "fifo")
    return ["eval", "--program", w.program(), "--data", w.data(), "--adapter", name]


def plan_with(**over) -> Callable[[Work], str]:
    def make(w: Work) -> str:
        doc = {"schema_version": 1, "layers": 8, "policy": "cyclic", "k": 2, "seed": None,
               "phases": [[0, 1], [2, 3], [4, 5], [6, 7]], "schedule": [0, 1, 2, 3], **over}
        return w.write("p.json", json.dumps(doc))
    return make


def change_shard_after_first_read(how: str):
    """A fault: after the first rows are read, the shard is replaced by another file of the same layout
    (`how` = "replace") or rewritten in place with other values ("rewrite")."""
    def patch(monkeypatch) -> None:
        from toolchain.models.shards import CheckpointShards

        original, done = CheckpointShards.read_rows, []

        def read_rows(self, name, start, stop):
            rows = original(self, name, start, stop)
            if not done:
                done.append(name)
                path = self.tensors[name].path
                raw = bytearray(path.read_bytes())
                raw[-64:] = bytes(64)                        # other values, same size and layout
                if how == "replace":
                    tmp = path.with_name("new.tmp")
                    tmp.write_bytes(raw)
                    os.replace(tmp, path)
                else:
                    with open(path, "r+b") as f:
                        f.write(raw)
                    st = os.stat(path)
                    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))   # as a later write would
            return rows
        monkeypatch.setattr(CheckpointShards, "read_rows", read_rows)
    return patch


def immutable_output(w: Work) -> list[str]:
    """`export --force` onto a directory holding an immutable file (chattr +i, as root; a user who cannot set
    the flag gets a read-only subdirectory instead, which is undeletable for them the same way)."""
    import subprocess as sp

    w.mine("out")
    frozen = sp.run(["chattr", "+i", str(w.path / "out" / "mine.txt")], capture_output=True).returncode == 0
    if frozen:
        w.keep = _Unfreeze(w.path / "out" / "mine.txt")
    else:
        w.write("out/sub/kept.txt", "the user's file\n")
        os.chmod(w.path / "out" / "sub", 0o555)
        w.keep = _Unfreeze(w.path / "out" / "sub")
    return ["export", *TINY, "--seq-len", "8", "--out", "out", "--force"]


class _Unfreeze:
    def __init__(self, path: Path):
        self.path = path

    def close(self) -> None:
        import subprocess as sp

        if self.path.is_dir():
            os.chmod(self.path, 0o755)
        else:
            sp.run(["chattr", "-i", str(self.path)], capture_output=True, check=False)


def stdout_to_file() -> None:
    """The child's stdout redirected to stdout.txt in its working directory (`cmd > stdout.txt`)."""
    fd = os.open("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.close(fd)


def link(w: Work, name: str, target: str) -> str:
    (w.path / name).symlink_to(target)
    return name


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
        c("serve-token-empty", "`telemetry serve --token \"\"` (printed its banner, left the db file behind)",
          lambda w: ["telemetry", "serve", "--port", "0", "--token", "", "--db", "t.sqlite3"], "must not be empty"),
        c("serve-token-blank", "`telemetry serve --token \"   \"` (started a server no client could authenticate to)",
          lambda w: ["telemetry", "serve", "--port", "0", "--token", "   ", "--db", "t.sqlite3"], "must not be empty"),
        c("serve-db-of-another-app", "`telemetry serve --db` on another application's SQLite file (switched to WAL)",
          lambda w: ["telemetry", "serve", "--port", "0", "--token", "t", "--db", foreign_sqlite(w)],
          "left untouched"),
        # ---- issue 27: outputs never overlap inputs (--force included), one run per output
        c("train-adapter-out-is-program", "`train --program P --adapter-out P --force` (replaced the program)",
          lambda w: ["train", "--program", w.program(), "--data", w.data(), "--steps", "1", "--adapter-out", "prog",
                     "--force"], "is the same path as --program"),
        c("train-adapter-out-inside-program", "`train --program P --adapter-out P/adapter_init --force`",
          lambda w: ["train", "--program", w.program(), "--data", w.data(), "--steps", "1", "--adapter-out",
                     "prog/adapter_init", "--force"], "is inside --program"),
        c("data-out-inside-program", "`data --program P --out P/rows.jsonl`",
          lambda w: ["data", "--program", w.program(), "--text", w.write("t.txt", "hello"), "--out", "prog/rows.jsonl"],
          "is inside --program"),
        c("export-out-contains-adapter", "`export --adapter D/ad --out D --force` (the output holds an input)",
          lambda w: ["export", *TINY, "--adapter", w.mine("d/ad"), "--out", "d", "--force"], "contains --adapter"),
        c("export-out-cwd", "`export --out . --force` (ran the whole export, then failed on its own temp dir)",
          lambda w: ["export", *TINY, "--out", ".", "--force"], "current directory"),
        c("train-adapter-out-in-use", "`train --adapter-out D` while another run holds D",
          adapter_lock_held, "in use by another run"),
        # ---- issue 27: output paths that are not regular files
        c("eval-json-dev-null", "`eval --json /dev/null` (as root, replaced the system's /dev/null)",
          lambda w: ["eval", "--program", w.program(), "--data", w.data(), "--json", "/dev/null"],
          "character device"),
        c("tokenize-json-symlink-to-device", "`tokenize --json L`, L a symbolic link to /dev/null",
          lambda w: (w.path / "l.json").symlink_to("/dev/null") or
          ["tokenize", "--tokenizer", "byte", "--json", "l.json", w.write("t.txt", "hi")], "symbolic link"),
        c("tokenize-json-file-too-large", "`tokenize --json` under `ulimit -f 64` (EFBIG traceback; what was left?)",
          lambda w: ["tokenize", "--tokenizer", "byte", "--json", "ids.json", w.write("t.txt", "some words " * 12_000)],
          "File too large", subprocess=True, preexec=rlimit("RLIMIT_FSIZE", 64 * 1024)),
        c("tokenize-stdout-closed", "`tokenize FILE >&-` (exit 0 having written nothing)",
          lambda w: ["tokenize", "--tokenizer", "byte", w.write("t.txt", "hello")], "stdout is closed",
          subprocess=True, preexec=close_stdout),
        c("eval-address-space-limit", "`eval` under `ulimit -v 600000` (SystemError traceback)",
          lambda w: ["eval", "--program", w.program(), "--data", w.data()], "out of memory", subprocess=True,
          preexec=rlimit("RLIMIT_AS", 600_000 * 1024)),
        c("train-telemetry-out-fifo", "`train --telemetry-out FIFO` (blocked forever with no reader)",
          lambda w: [*TRAIN, "--data", w.data(), "--telemetry-out", fifo(w)], "FIFO"),
        # ---- issue 27: the memory-mapped weights file
        c("weights-truncated-forged", "weights.safetensors cut in half, checksum and size forged (ValueError)",
          lambda w: ["train", "--program", w.program(edit=forge_weights(truncate_to=120_000)), "--data", w.data(),
                     "--steps", "1"], "truncated"),
        c("weights-header-forged", "weights header claiming a tensor 1000x its bytes, checksum forged (MemoryError)",
          lambda w: ["eval", "--program", w.program(edit=forge_weights(header=_grow_first_tensor)), "--data",
                     w.data()], "bytes"),
        c("weights-shrink-mid-run", "weights.safetensors truncated by another process while `train --program` runs "
                                    "(SIGBUS); the last checkpoint kept", shrink_weights_during_train,
          "weights.safetensors", subprocess=True, may_change=("prog/weights.safetensors",),
          may_leave=("ad.train-checkpoint.safetensors",), check=_checkpoint_kept),
        # ---- issue 27: non-finite and out-of-range state
        c("adapter-r-1e400", "`eval --adapter D`, adapter_config.json r = 1e400 (OverflowError)",
          lambda w: ["eval", "--program", w.program(), "--data", w.data(), "--adapter",
                     adapter(w, config='{"r": 1e400, "lora_alpha": 8, "target_modules": ["q_proj"]}')],
          "out of range"),
        c("adapter-nan", "`eval --adapter D` with NaN adapter weights (loss nan, exit 0)",
          lambda w: ["eval", "--program", w.program(), "--data", w.data(), "--adapter", adapter(w, nan=True)], "NaN"),
        c("generate-adapter-nan", "`generate --adapter D` with NaN adapter weights (argmax of NaN, exit 0)",
          lambda w: ["generate", "--program", w.program(), "--prompt-ids", "256", "--max-new-tokens", "2",
                     "--adapter", adapter(w, nan=True)], "NaN"),
        c("export-adapter-nan", "`export --adapter D` with NaN adapter weights",
          lambda w: ["export", *TINY, "--rank", "4", "--adapter", adapter(w, nan=True), "--out", "out"], "NaN"),
        c("eval-resume-from-nan", "`eval --resume-from CK`, a checkpoint of NaN state",
          lambda w: ["eval", "--program", w.program(), "--data", w.data(), "--resume-from",
                     nan_state_checkpoint(w, "ck.safetensors", meta=True)], "NaN"),
        c("train-resume-nan", "`train --program P --resume` from a checkpoint of NaN state",
          lambda w: ["train", "--program", w.program(), "--data", w.data(), "--steps", "2", "--adapter-out", "ad",
                     "--resume"] if nan_state_checkpoint(w, "ad.train-checkpoint.safetensors", meta=True) else [],
          "NaN"),
        c("eval-threads-10^9", "`eval --threads 1000000000` (SIGABRT in ExecuTorch's thread pool)",
          lambda w: ["eval", "--program", w.program(), "--data", w.data(), "--threads", "1000000000"], "--threads"),
        c("generate-seed-10^30", "`generate --seed 10^30` (traceback)",
          lambda w: ["generate", "--program", w.program(), "--prompt-ids", "256", "--max-new-tokens", "1",
                     "--temperature", "1", "--seed", "1" + "0" * 30], "--seed"),
        # ---- issue 27: manifest fields, for every command
        c("data-tokenizer-outside", "`data` on a manifest whose tokenizer.file is ../outside.json (followed it)",
          lambda w: ["data", "--program", w.program(edit=outside_tokenizer), "--text", w.write("t.txt", "hi"),
                     "--out", "rows.jsonl"], "outside the program directory"),
        c("data-no-pad-id", "`data` on a manifest without tokenizer.pad_token_id (KeyError)",
          lambda w: ["data", "--program", w.program(edit=drop_pad_id), "--text", w.write("t.txt", "hi"), "--out",
                     "rows.jsonl"], "pad_token_id"),
        c("data-tokenizer-kind-unknown", "`data` on a manifest with tokenizer.kind = klingon (exit 0)",
          lambda w: ["data", "--program", w.program(edit=set_field("tokenizer.kind", "klingon")), "--text",
                     w.write("t.txt", "hi"), "--out", "rows.jsonl"], "klingon"),
        c("data-seq-len-10^12", "`data` on a manifest with seq_len = 10^12 (exit 0)",
          lambda w: ["data", "--program", w.program(edit=set_field("seq_len", 10**12)), "--text",
                     w.write("t.txt", "hi"), "--out", "rows.jsonl"], "seq_len"),
        c("tokenize-program-tokenizer-outside", "`tokenize --tokenizer P`, P's tokenizer.file = ../outside.json",
          lambda w: ["tokenize", "--tokenizer", w.program(edit=outside_tokenizer), w.write("t.txt", "hi")],
          "outside the program directory"),
        # ---- issue 27: large and empty text inputs (streamed; throughput: scripts/bench_encode_stream.py)
        c("data-text-empty", "`data --text` of an empty file (one row of BOS/EOS, exit 0)",
          lambda w: ["data", "--program", w.program(), "--text", w.write("t.txt", b""), "--out", "rows.jsonl"],
          "no token to train on"),
        c("data-text-bom-only", "`data --text` of a file holding only a byte-order mark",
          lambda w: ["data", "--program", w.program(), "--text", w.write("t.txt", b"\xef\xbb\xbf"), "--out",
                     "rows.jsonl"], "no token to train on"),
        c("data-text-over-max", "`data --text` of a file over the size limit (limit lowered to 4 KiB here; "
          "tests/text/test_encode_stream.py tries 256 MiB + 1)",
          lambda w: ["data", "--program", w.program(), "--text", w.write("big.txt", "word " * 820), "--out",
                     "rows.jsonl"], "more than the 4,096 bytes", patch=text_limits),
        c("tokenize-over-max", "`tokenize` of a file over the size limit (lowered to 4 KiB)",
          lambda w: ["tokenize", "--tokenizer", "byte", "--json", "ids.json", w.write("big.txt", "x" * 4097)],
          "more than the 4,096 bytes", patch=text_limits),
        c("data-text-bad-byte-at-3mb", "`data --text`, 3 MB of text without a newline, then a Latin-1 byte",
          lambda w: ["data", "--program", w.program(), "--text", w.write("t.txt", b"word " * 600_000 + b"caf\xe9"),
                     "--out", "rows.jsonl"], "offset 3000003"),
        c("tokenize-run-without-break", "`tokenize --tokenizer qwen2.5`, emoji without a break over the run limit "
          "(one BPE word; limit lowered to 20,000 characters here)",
          lambda w: ["tokenize", "--tokenizer", "qwen2.5", "--json", "ids.json", w.write("t.txt", "\U0001F642" * 90_000)],
          "without a word boundary", patch=run_limit),
        # ---- issue 45: a checkpoint is the model it claims, or it is refused
        c("ckpt-qwen2-sliding-window", "checkpoint config `use_sliding_window: true` (trained 13% off HF's loss, exit 0)",
          lambda w: ck_grads(w, config=setting(use_sliding_window=True, max_window_layers=0)), "use_sliding_window"),
        c("ckpt-llama-gelu", "llama checkpoint config `hidden_act: gelu` (0.9% off HF's loss, exit 0)",
          lambda w: ck_grads(w, family="llama", config=setting(hidden_act="gelu")), "hidden_act"),
        c("ckpt-tie-string", "checkpoint config `tie_word_embeddings: \"false\"` (a string: lm_head dropped)",
          lambda w: ck_grads(w, config=setting(tie_word_embeddings="false")), "tie_word_embeddings"),
        c("ckpt-qwen3-sliding-layer-types", "qwen3 checkpoint config with a sliding_attention layer in layer_types",
          lambda w: ck_grads(w, family="qwen3", config=setting(layer_types=["full_attention", "sliding_attention"])),
          "layer_types"),
        c("ckpt-quantization-config", "checkpoint config with a quantization_config (weights read as floats)",
          lambda w: ck_grads(w, config=setting(quantization_config={"quant_method": "bitsandbytes"})),
          "quantization_config"),
        c("ckpt-unknown-field", "checkpoint config with `attn_logit_softcapping: 50` (not a qwen2 field)",
          lambda w: ck_grads(w, config=setting(attn_logit_softcapping=50.0)), "attn_logit_softcapping"),
        c("ckpt-rope-theta-zero", "checkpoint config `rope_theta` 0 (a NaN model, exit 0)",
          lambda w: ck_grads(w, config=rope(rope_theta=0)), "rope_theta"),
        c("ckpt-rope-theta-negative", "checkpoint config `rope_theta` -10000",
          lambda w: ck_grads(w, config=rope(rope_theta=-10000.0)), "rope_theta"),
        c("ckpt-rms-eps-negative", "checkpoint config `rms_norm_eps: -1` (a NaN model, exit 0)",
          lambda w: ck_grads(w, config=setting(rms_norm_eps=-1)), "rms_norm_eps"),
        c("ckpt-llama3-factor-zero", "llama checkpoint config with llama3 rope `factor: 0` (a NaN model, exit 0)",
          lambda w: ck_grads(w, family="llama", config=rope(factor=0)), "factor"),
        c("ckpt-llama3-low-freq-zero", "llama checkpoint config `low_freq_factor: 0` (ZeroDivisionError)",
          lambda w: ck_grads(w, family="llama", config=rope(low_freq_factor=0)), "low_freq_factor"),
        c("ckpt-llama3-factor-text", "llama checkpoint config `factor: \"big\"` (ValueError)",
          lambda w: ck_grads(w, family="llama", config=rope(factor="big")), "factor"),
        c("ckpt-attention-factor", "llama checkpoint config with an `attention_factor` in its rope (accepted)",
          lambda w: ck_grads(w, family="llama", config=rope(attention_factor=2.0)), "attention_factor"),
        c("ckpt-rope-parameters-string", "checkpoint config `rope_parameters: \"default\"` (AttributeError)",
          lambda w: ck_grads(w, config=setting(rope_parameters="default")), "rope_parameters"),
        c("ckpt-hidden-size-string", "checkpoint config `hidden_size: \"64\"` (TypeError)",
          lambda w: ck_grads(w, config=setting(hidden_size="64")), "hidden_size"),
        c("ckpt-hidden-size-float", "checkpoint config `hidden_size: 64.0`",
          lambda w: ck_grads(w, config=setting(hidden_size=64.0)), "hidden_size"),
        c("ckpt-config-array", "checkpoint config.json that is a JSON array (AttributeError)",
          lambda w: ck_grads(w, raw_config=b"[1, 2]"), "not an object"),
        c("ckpt-config-string", "checkpoint config.json that is a JSON string",
          lambda w: ck_grads(w, raw_config=b'"qwen2"'), "not an object"),
        c("ckpt-config-nested", "checkpoint config.json nested 100,000 deep (RecursionError)",
          lambda w: ck_grads(w, raw_config=nested().encode()), "nested too deeply"),
        c("ckpt-weights-nan", "checkpoint whose q_proj weight holds a NaN (accepted without a word)",
          lambda w: ck_grads(w, tensors=poison("model.layers.1.self_attn.q_proj.weight", float("nan"))),
          "model.layers.1.self_attn.q_proj.weight"),
        c("ckpt-weights-inf-export", "`export` of a checkpoint whose embedding holds +inf",
          lambda w: ck_export(w, tensors=poison("model.embed_tokens.weight", float("inf"))), "NaN or infinity"),
        # ---- issue 45: special files and symbolic links as inputs
        c("ckpt-config-fifo", "checkpoint config.json that is a FIFO (blocked forever)",
          special_in_checkpoint("config.json", "fifo"), "FIFO", subprocess=True),
        c("ckpt-shard-fifo", "checkpoint model.safetensors that is a FIFO (blocked forever)",
          special_in_checkpoint("model.safetensors", "fifo"), "FIFO", subprocess=True),
        c("ckpt-config-loop", "checkpoint config.json that is a symbolic link loop (OSError traceback)",
          special_in_checkpoint("config.json", "loop"), "symbolic link loop"),
        c("ckpt-shard-loop", "checkpoint model.safetensors that is a symbolic link loop",
          special_in_checkpoint("model.safetensors", "loop"), "symbolic link loop"),
        c("ckpt-shard-socket", "checkpoint model.safetensors that is a socket",
          special_in_checkpoint("model.safetensors", "socket"), "socket"),
        c("grads-data-fifo", "`grads --data FIFO`", lambda w: [*GRADS, "--data", special(w, "d.jsonl", "fifo")], "FIFO",
          subprocess=True),
        c("train-plan-fifo", "`train --plan FIFO` (blocked forever)",
          lambda w: [*TRAIN, "--data", w.data(), "--plan", special(w, "p.json", "fifo")], "FIFO", subprocess=True),
        c("eval-adapter-weights-fifo", "`eval --adapter D`, D/adapter_model.safetensors a FIFO", special_adapter_weights,
          "FIFO", subprocess=True),
        c("import-socket", "`telemetry import SOCKET`",
          lambda w: ["telemetry", "import", special(w, "e.sock", "socket"), "--db", "t.sqlite3"], "socket"),
        c("eval-resume-from-fifo", "`eval --resume-from FIFO`",
          lambda w: ["eval", "--program", w.program(), "--data", w.data(), "--resume-from",
                     special(w, "ck.safetensors", "fifo")], "FIFO", subprocess=True),
        c("plan-float-indices", "`train --plan` whose phases hold 0.0 (TypeError)",
          lambda w: [*TRAIN, "--data", w.data(), "--plan", plan_with(phases=[[0.0, 1], [2, 3], [4, 5], [6, 7]])(w)],
          "must be integers"),
        c("plan-float-schedule", "`train --plan` whose schedule holds 1.0",
          lambda w: [*TRAIN, "--data", w.data(), "--plan", plan_with(schedule=[0, 1.0, 2, 3])(w)], "must be integers"),
        # ---- issue 45: outputs through symbolic links (toolchain/outputs.py `output_target`)
        c("tokenize-json-link-loop", "`tokenize --json L`, L a symbolic link loop (the link was replaced by a file)",
          lambda w: ["tokenize", "--tokenizer", "byte", "--json", link(w, "l.json", "l.json"), w.write("t.txt", "hi")],
          "symbolic link loop"),
        c("data-out-link-loop", "`data --out L`, L a symbolic link loop (RuntimeError traceback)",
          lambda w: ["data", "--program", w.program(), "--text", w.write("t.txt", "hi"), "--out",
                     link(w, "rows.jsonl", "rows.jsonl")], "symbolic link loop"),
        c("train-telemetry-out-link-loop", "`train --telemetry-out L`, L a symbolic link loop (OSError traceback)",
          lambda w: [*TRAIN, "--data", w.data(), "--telemetry-out", link(w, "t.jsonl", "t.jsonl")],
          "symbolic link loop"),
        c("export-out-link-loop", "`export --out L`, L a symbolic link loop",
          lambda w: ["export", *TINY, "--seq-len", "8", "--out", link(w, "out", "out")], "symbolic link loop"),
        c("eval-json-link-to-stdout", "`eval --json L > file`, L a symbolic link to /dev/stdout (the link was "
                                      "replaced by a file, nothing reached stdout)",
          lambda w: ["eval", "--program", w.program(), "--data", w.data(), "--json", link(w, "l.json", "/dev/stdout")],
          "open file descriptor", subprocess=True, preexec=stdout_to_file, may_leave=("stdout.txt",)),
        c("grads-out-link-to-fd", "`grads --out L`, L a symbolic link to /proc/self/fd/1",
          lambda w: [*GRADS[:-1], link(w, "g.safetensors", "/proc/self/fd/1"), "--data", w.data()],
          "open file descriptor"),
        # ---- issue 45: a checkpoint that changes while export reads it
        c("export-shard-replaced-mid-run", "`export --model CK` while CK's shard is replaced (same layout) "
                                           "(a weights file of neither checkpoint, exit 0)",
          lambda w: ck_export(w), "changed while it was being read", patch=change_shard_after_first_read("replace"),
          may_change=("ck/model.safetensors",)),
        c("export-shard-rewritten-mid-run", "`export --model CK` while CK's shard is rewritten in place",
          lambda w: ck_export(w), "changed while it was being read", patch=change_shard_after_first_read("rewrite"),
          may_change=("ck/model.safetensors",)),
        # ---- issue 45: leftovers and small wrongs
        c("export-force-immutable", "`export --force` onto a directory holding an immutable file (exit 0, "
                                    "`.out.<pid>.<random>.old` left behind)", immutable_output, "cannot be replaced"),
        c("train-eval-every-without-data", "`train --program --eval-every 2` without --eval-data (accepted silently)",
          lambda w: ["train", "--program", w.program(), "--data", w.data(), "--steps", "1", "--eval-every", "2"],
          "--eval-every needs --eval-data"),
        # ---- issue 43: the evaluation gate and the memory budget
        c("train-no-gate-without-data", "`train --no-gate` without --eval-data (no gate to turn off)",
          lambda w: [*TRAIN, "--data", w.data(), "--no-gate"], "--no-gate needs --eval-data"),
        c("train-memory-budget-zero", "`train --memory-budget 0`",
          lambda w: [*TRAIN, "--data", w.data(), "--memory-budget", "0"], "--memory-budget"),
        c("train-memory-budget-nan", "`train --program --memory-budget nan`",
          lambda w: ["train", "--program", w.program(), "--data", w.data(), "--steps", "1", "--memory-budget", "nan"],
          "--memory-budget"),
    ]


def text_limits(monkeypatch) -> None:
    """The text size limit lowered to 4 KiB, so the cases stay small and fast."""
    monkeypatch.setattr("toolchain.text.encode_stream.MAX_TEXT_BYTES", 4096)


def run_limit(monkeypatch) -> None:
    """The limit on characters without a safe cut lowered to 20,000."""
    monkeypatch.setattr("toolchain.text.encode_stream.MAX_RUN_CHARS", 20_000)


CASES = _cases()
