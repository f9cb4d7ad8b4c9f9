"""A stand-in for `adb` and the phone, for the scripts in scripts/android/ (tests only).

The device filesystem is a directory ($FAKE_ADB_ROOT); every call is logged as a JSON list of its
arguments to $FAKE_ADB_LOG. `am start-foreground-service` / `am start` play the app: they write the
run's telemetry log (schema-valid events) and adapter under files/runs/RUN_ID/, as the real app does.
`dumpsys meminfo` prints $FAKE_ADB_MEMINFO. $FAKE_ADB_OFFLINE=1 plays "no device".
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(os.environ["FAKE_ADB_ROOT"])


def dev(path: str) -> Path:
    return ROOT / path.lstrip("/")


def play_app(extras: dict[str, str]) -> None:
    pkg_files = next(p for p in ROOT.glob("sdcard/Android/data/*/files") if p.is_dir())
    latest = pkg_files / "runs" / "latest"
    run_id = extras.get("run_id") or (latest.read_text().strip() if latest.is_file() else None)
    if run_id is None:  # resume with no run on the phone: the app shows "no run to start"
        return
    run = pkg_files / "runs" / run_id
    (run / "adapter").mkdir(parents=True, exist_ok=True)
    latest.write_text(run_id + "\n")
    steps = int(extras.get("steps", "3"))
    t0 = time.time()
    common = {"schema_version": 1, "run_id": run_id}
    events = [{"type": "run_start", "model": "tiny", "method": "mesp", "backend": "executorch", "seq_len": 64, "rank": 8,
               "platform": "android", "device_model": "Fake Pixel", "os": "Android 14 (API 34)",
               "total_ram_bytes": 8 << 30, "budget_bytes": int(extras.get("budget_mb", "2048")) << 20, "steps_planned": steps}]
    for s in range(steps):
        events.append({"type": "step", "step": s, "loss": 5.0 - 0.1 * s, "step_time_s": 0.5, "tokens_per_s": 100.0, "lcsb_phase": s % 2})
        events.append({"type": "memory", "probe": "android_proc_status", "step": s, "anon_bytes": (100 + s) << 20,
                       "rss_bytes": 300 << 20, "peak_bytes": 320 << 20})
    events.append({"type": "run_end", "status": "completed", "steps_completed": steps, "final_loss": 5.0 - 0.1 * (steps - 1)})
    with open(run / "telemetry.jsonl", "w") as f:
        for seq, e in enumerate(events):
            f.write(json.dumps({**common, "seq": seq, "timestamp": round(t0 + 0.5 * seq, 3), **e}, separators=(",", ":")) + "\n")
    (run / "adapter" / "adapter_model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (run / "adapter" / "adapter_config.json").write_text('{"peft_type": "LORA"}\n')


def shell(argv: list[str]) -> int:
    cmd = shlex.split(" ".join(argv))  # the device shell re-splits what adb joined
    if cmd[:2] == ["mkdir", "-p"]:
        for p in cmd[2:]:
            dev(p).mkdir(parents=True, exist_ok=True)
    elif cmd[0] == "am" and cmd[1] in ("start-foreground-service", "start"):
        extras = {cmd[i + 1]: cmd[i + 2] for i in range(len(cmd)) if cmd[i] == "--es"}
        print(f"Starting service: Intent {{ act={cmd[cmd.index('-a') + 1]} cmp={cmd[cmd.index('-n') + 1]} }}")
        play_app(extras)
    elif cmd[:2] == ["am", "broadcast"]:
        print("Broadcasting: Intent { act=%s }\nBroadcast completed: result=0" % cmd[cmd.index("-a") + 1])
    elif cmd[:2] == ["dumpsys", "meminfo"]:
        print(Path(os.environ["FAKE_ADB_MEMINFO"]).read_text(), end="")
    elif cmd[0] in ("tail", "cat", "ls"):
        path = dev(cmd[-1])
        if not path.exists():
            print(f"{cmd[0]}: {cmd[-1]}: No such file or directory", file=sys.stderr)
            return 1
        if cmd[0] == "tail":
            print(path.read_text().splitlines()[-1])
        elif cmd[0] == "cat":
            print(path.read_text(), end="")
        else:
            print(cmd[-1])
    else:
        print(f"/system/bin/sh: {cmd[0]}: inaccessible or not found", file=sys.stderr)
        return 127
    return 0


def main(argv: list[str]) -> int:
    with open(os.environ["FAKE_ADB_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\n")
    if os.environ.get("FAKE_ADB_OFFLINE") == "1":
        print("error: no devices/emulators found", file=sys.stderr)
        return 1
    cmd = argv[0]
    if cmd == "get-state":
        print("device")
    elif cmd == "install":
        print("Success")
    elif cmd == "reverse":
        return 0
    elif cmd == "push":
        *srcs, dst = argv[1:]
        target = dev(dst)
        for s in map(Path, srcs):
            into = target / s.name if dst.endswith("/") or target.is_dir() else target
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(s, into, dirs_exist_ok=True) if s.is_dir() else shutil.copy(s, into)
            print(f"{s}: 1 file pushed")
    elif cmd == "pull":
        src, dst = dev(argv[1]), Path(argv[2])
        if not src.exists():
            print(f"adb: error: failed to stat remote object '{argv[1]}': No such file or directory", file=sys.stderr)
            return 1
        into = dst / src.name if dst.is_dir() else dst
        shutil.copytree(src, into, dirs_exist_ok=True) if src.is_dir() else shutil.copy(src, into)
    elif cmd == "shell":
        return shell(argv[1:])
    else:
        print(f"fake adb: unsupported command {argv}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
