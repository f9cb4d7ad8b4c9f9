"""scripts/android/: the `dumpsys meminfo` parser on real device output, and every script run against
a fake `adb` on PATH (tests/scripts/fake_adb.py plays the phone and the app)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from toolchain.telemetry import meminfo
from toolchain.telemetry.events import check_events

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "android"
SAMPLES = (REPO / ".." / "shared" / "android-samples").resolve()
PKG = "org.onphonellm.trainer"
FILES = f"sdcard/Android/data/{PKG}/files"

needs_samples = pytest.mark.skipif(not SAMPLES.is_dir(), reason=f"{SAMPLES} is absent: the real dumpsys outputs live "
                                   "outside the repository (../shared/android-samples)")

# (file, pid, process or None, TOTAL PSS, Private Dirty or None, TOTAL RSS, TOTAL SWAP) in kB, from the
# key values in ../shared/android-samples/README.md (None: the README states no value for it).
CASES = [
    ("dumpsys-meminfo-android4.3-droidmonitor-sample43.txt", 29607, "com.sample.package", 28929, 25960, None, None),
    ("dumpsys-meminfo-android4.4-droidmonitor-sample44.txt", 30125, None, 44563, 36396, None, 0),
    ("dumpsys-meminfo-d-android5-aosp-docs-maps-nexus5.txt", 18227, None, 216524, 208232, None, 0),
    ("dumpsys-meminfo-android6-droidmonitor-sample60.txt", 22861, None, 145991, 101701, None, 22236),
    ("dumpsys-meminfo-androidUnknown-flutter-gallery.txt", 16141, "io.flutter.demo.gallery", 95085, None, None, 62),
    ("dumpsys-meminfo-androidUnknown-gracker-oppo-launcher.txt", 10396, "com.oppo.launcher", 148046, None, None, 0),
    ("dumpsys-meminfo-androidUnknown-yvr-yframework.txt", 4821, None, 253123, None, None, 0),
    ("dumpsys-meminfo-android11-unity-pixel2.txt", 14978, "com.DefaultCompany.MemoryTests", 688561, None, 746132, 15),
    ("dumpsys-meminfo-a-d-android11-gracker-launcher3.txt", 21936, None, 105529, None, 187052, 0),
    ("dumpsys-meminfo-android12-gracker-systemui-pixel3.txt", 2084, "com.android.systemui", 96932, None, 182691, 0),
    ("dumpsys-meminfo-android12or13-rk3588-yolodemo.txt", 1941, "com.rockchip.gpadc.yolodemo", 572115, None, 655516, 0),
    ("dumpsys-meminfo-android12or13-miui-systemui.txt", 4485, None, 257285, None, 385320, 34832),
    ("dumpsys-meminfo-android14plus-pixel7a-footos.txt", 27172, "app.footos", 431653, None, 585360, 132),
    ("dumpsys-meminfo-android14plus-ming-test-native.txt", 19540, "org.ming.test_native", 59376, None, 163640, 286),
    ("dumpsys-meminfo-android14plus-mixelmeza-emulator.txt", 3794, "com.example.app_movil", 353574, None, 508256, 0),
    ("dumpsys-meminfo-d-android14plus-gracker-memorylab.txt", 20602, "com.androidperformance.memorylab", 337790, None, 421296, 162),
    ("dumpsys-meminfo-android16-pixel10pro-douyin.txt", 24989, "com.ss.android.ugc.aweme", 1144795, None, 1363052, 0),
    ("dumpsys-meminfo-checkin-v3-adt-profilerapp.txt", 2820, None, 11850, 6308, None, None),
    ("dumpsys-meminfo-checkin-v4-adt-profilerapp.txt", 2737, "com.android.profilerapp", 13568, 7640, None, 0),
    ("dumpsys-meminfo-checkin-v4-systemui-unknownrepo.txt", 2110, None, 63828, 42916, None, 0),
    ("dumpsys-meminfo-checkin-v4-aosp-tradefed-system_server-EDITED.txt", 938, "system_server", 218228, None, None, 0),
]


@needs_samples
@pytest.mark.parametrize("case", CASES, ids=[c[0][16:60] for c in CASES])
def test_meminfo_totals_of_real_samples(case):
    name, pid, process, pss, dirty, rss, swap = case
    [t] = meminfo.parse_meminfo((SAMPLES / name).read_text(errors="replace"))
    assert t.pid == pid and t.pss_kb == pss and t.rss_kb == rss and t.swap_kb == swap
    assert process is None or t.process == process
    if dirty is not None:
        assert t.private_dirty_kb == dirty
    assert 0 < t.private_dirty_kb <= t.pss_kb + (t.swap_kb or 0)


@needs_samples
def test_meminfo_multiprocess_and_non_app_outputs():
    blocks = meminfo.parse_meminfo((SAMPLES / "dumpsys-meminfo-package-android14plus-crossbench-chrome-multiprocess-EDITED.txt").read_text())
    assert [(b.pid, b.pss_kb, b.rss_kb, b.swap_kb) for b in blocks] == [
        (14449, 29036, 207800, 0), (14438, 27937, 180556, 0), (14487, 44527, 205104, 0), (14356, 168450, 413536, 500)]
    assert meminfo.parse_meminfo((SAMPLES / "dumpsys-meminfo-c-systemwide-fragment-aosp-loganalysis.txt").read_text()) == []
    assert meminfo.parse_meminfo("No process found for: org.onphonellm.trainer\n") == []
    # the CLI reports the package's main process (no ':suffix'), as a schema-valid event in bytes
    out = subprocess.run([sys.executable, str(SCRIPTS / "meminfo_to_telemetry.py"), "--run-id", "r1", "--seq", "7", "--step", "3",
                          str(SAMPLES / "dumpsys-meminfo-package-android14plus-crossbench-chrome-multiprocess-EDITED.txt")],
                         capture_output=True, text=True, check=True)
    event = json.loads(out.stdout)
    check_events([event])
    assert (event["pss_bytes"], event["rss_bytes"], event["swap_bytes"], event["step"]) == (168450 * 1024, 413536 * 1024, 500 * 1024, 3)
    assert event["anon_bytes"] == blocks[3].private_dirty_kb * 1024


# --- the scripts, against the fake adb --------------------------------------------------------------

@pytest.fixture
def phone(tmp_path, monkeypatch):
    """PATH with a fake `adb`; returns a helper to run scripts and read what adb was asked."""
    bin_dir, root = tmp_path / "bin", tmp_path / "device"
    bin_dir.mkdir()
    (root / FILES).mkdir(parents=True)
    adb = bin_dir / "adb"
    adb.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{Path(__file__).with_name('fake_adb.py')}' \"$@\"\n")
    adb.chmod(adb.stat().st_mode | stat.S_IEXEC)
    meminfo_file = tmp_path / "meminfo.txt"
    sample = SAMPLES / "dumpsys-meminfo-android14plus-pixel7a-footos.txt"
    meminfo_file.write_text(sample.read_text() if sample.is_file() else (
        f"** MEMINFO in pid 4242 [{PKG}] **\n                   Pss  Private  Private\n"
        "                 Total    Dirty    Clean\n                ------   ------   ------\n"
        "        TOTAL   200000   150000     1000\n"))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_ADB_ROOT": str(root),
           "FAKE_ADB_LOG": str(tmp_path / "adb.log"), "FAKE_ADB_MEMINFO": str(meminfo_file),
           "TOOLCHAIN": str(Path(sys.executable).with_name("toolchain")), "PYTHON": sys.executable}
    env.pop("ADB", None)

    class Phone:
        files = root / FILES

        def run(self, script: str, *args: str, ok: bool = True, **extra_env: str) -> subprocess.CompletedProcess:
            r = subprocess.run(["bash", str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True,
                               env={**env, **extra_env}, cwd=tmp_path, timeout=120)
            assert (r.returncode == 0) == ok, f"{script} exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
            return r

        def calls(self) -> list[list[str]]:
            log = tmp_path / "adb.log"
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return Phone()


@pytest.fixture
def program(tmp_path):
    """A program directory shaped like `toolchain export` writes it: the tiny trace's manifest
    (schema_version 3) and every file it lists, state_init.bin holding state.numel float32 values, and a
    plain-text file for the app to make rows from."""
    d = tmp_path / "tiny-prog"
    d.mkdir()
    manifest = json.loads((REPO / "shared_schemas" / "traces" / "tiny" / "program" / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(manifest))
    for rel in list(manifest["files"]) + [manifest["weights"]["file"]]:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(b"PTE" * 100 if rel == "model.pte" else b"{}")
    numel = manifest["state"]["numel"]
    (d / manifest["state"]["init_file"]).write_bytes((bytes(range(256)) * (numel // 64 + 1))[:4 * numel])
    data = tmp_path / "notes.txt"
    data.write_text("The lighthouse keeper wrote every evening.\n")
    return d, data


def test_deploy_pushes_program_data_and_apk(phone, program, tmp_path):
    prog, data = program
    apk = tmp_path / "app.apk"
    apk.write_bytes(b"APK")
    r = phone.run("deploy.sh", prog, data, "--apk", apk)
    assert r.stdout.strip() == "tiny-prog"
    assert (phone.files / "programs/tiny-prog/model.pte").read_bytes() == b"PTE" * 100
    assert (phone.files / "programs/tiny-prog/state_init.bin").read_bytes() == (prog / "state_init.bin").read_bytes()
    assert (phone.files / "programs/tiny-prog/adapter_init/adapter_config.json").is_file()
    assert (phone.files / "programs/tiny-prog/weights.safetensors").is_file()
    assert (phone.files / "data/notes.txt").read_text() == data.read_text()
    assert ["install", "-r", str(apk)] in phone.calls()


def test_deploy_refuses_bad_input_before_touching_the_phone(phone, program, tmp_path):
    prog, data = program
    r = phone.run("deploy.sh", tmp_path, data, ok=False)
    assert "no manifest.json" in r.stderr and phone.calls() == []
    r = phone.run("deploy.sh", prog, data, ok=False, FAKE_ADB_OFFLINE="1")
    assert "no device attached" in r.stderr
    assert not (phone.files / "programs").exists()
    # the initial state missing: refused before the push (the app could not start from it)
    n = len(phone.calls())
    (prog / "state_init.bin").rename(prog / "kept.bin")
    r = phone.run("deploy.sh", prog, data, ok=False)
    assert "lacks state_init.bin" in r.stderr and r.returncode == 2
    (prog / "kept.bin").rename(prog / "state_init.bin")
    # the memory-mapped weights missing: refused too
    (prog / "weights.safetensors").rename(prog / "kept.bin")
    r = phone.run("deploy.sh", prog, data, ok=False)
    assert "lacks weights.safetensors" in r.stderr
    (prog / "kept.bin").rename(prog / "weights.safetensors")
    # a program of a retired contract (version 2: whole-model train_step methods) must be re-exported
    manifest = json.loads((prog / "manifest.json").read_text())
    (prog / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 2}))
    r = phone.run("deploy.sh", prog, data, ok=False)
    assert "schema_version 2" in r.stderr and "re-export" in r.stderr
    assert len(phone.calls()) == n  # adb was not called
    assert not (phone.files / "programs").exists()


def test_start_stop_and_reverse_send_the_right_commands(phone):
    r = phone.run("start.sh", "--program", "tiny-prog", "--data", "notes.txt", "--steps", "5", "--lr", "1e-4",
                  "--budget-mb", "1500", "--run-id", "run-1", "--telemetry-url", "http://127.0.0.1:8765/v1/events", "--token", "T0k",
                  "--held-out", "0.2", "--lcsb", "cyclic", "--k", "1")
    assert r.stdout.strip() == "run-1"
    am = next(c for c in phone.calls() if c[:2] == ["shell", "am"])
    assert am[2:7] == ["start-foreground-service", "-n", f"{PKG}/org.onphonellm.trainer.app.TrainingService", "-a",
                       "org.onphonellm.trainer.action.START"]
    extras = {am[i + 1]: am[i + 2] for i in range(len(am)) if am[i] == "--es"}
    assert extras == {"program": "tiny-prog", "text": "notes.txt", "steps": "5", "lr": "1e-4", "budget_mb": "1500",
                      "telemetry_url": "http://127.0.0.1:8765/v1/events", "telemetry_token": "T0k", "run_id": "run-1",
                      "held_out": "0.2", "lcsb": "cyclic", "k": "1"}
    # resume the latest run: no program, no data, no run id
    n = len(phone.calls())
    assert phone.run("start.sh", "--resume").stdout.strip() == "latest"
    am = phone.calls()[n:][-1]
    assert am[2:7] == ["start-foreground-service", "-n", f"{PKG}/org.onphonellm.trainer.app.TrainingService", "-a",
                       "org.onphonellm.trainer.action.START"] and "--es" not in am
    phone.run("start.sh", "--program", "p", "--data", "d.jsonl", "--run-id", "run-2", "--via", "activity")
    assert phone.calls()[-1][2:5] == ["start", "-n", f"{PKG}/org.onphonellm.trainer.app.MainActivity"]
    # values that the device shell would interpret are refused
    r = phone.run("start.sh", "--program", "p;rm -rf /", "--data", "d", ok=False)
    assert "characters the device shell would interpret" in r.stderr
    r = phone.run("start.sh", "--program", "p", "--data", "d", "--run-id", "../x", ok=False)
    assert "--run-id" in r.stderr
    phone.run("stop.sh")
    assert phone.calls()[-1] == ["shell", "am", "broadcast", "-a", "org.onphonellm.trainer.action.STOP", "-p", PKG]
    assert phone.run("reverse.sh", "9000").stdout.strip() == "http://127.0.0.1:9000/v1/events"
    assert phone.calls()[-1] == ["reverse", "tcp:9000", "tcp:9000"]
    phone.run("reverse.sh", "--remove", "9000")
    assert phone.calls()[-1] == ["reverse", "--remove", "tcp:9000"]


def test_sample_meminfo_appends_numbered_valid_events(phone, tmp_path):
    out = tmp_path / "dumpsys.jsonl"
    phone.run("sample_meminfo.sh", "--run-id", "run-1", "--out", out, "--count", "2", "--interval", "0")
    phone.run("sample_meminfo.sh", "--run-id", "run-1", "--out", out, "--count", "1", "--interval", "0")
    events = [json.loads(line) for line in out.read_text().splitlines()]
    check_events(events)
    base = meminfo.HOST_SEQ_BASE
    assert [e["seq"] for e in events] == [base, base + 1, base + 2]  # continues after the file's last seq
    assert {e["probe"] for e in events} == {"android_dumpsys"} and all(e["run_id"] == "run-1" for e in events)
    assert all(e["anon_bytes"] > 0 and e["pss_bytes"] >= e["anon_bytes"] // 2 for e in events)
    # the app not running: bounded tries, no event, no error
    gone = tmp_path / "gone.txt"
    gone.write_text(f"No process found for: {PKG}\n")
    r = phone.run("sample_meminfo.sh", "--run-id", "run-1", "--out", tmp_path / "none.jsonl", "--count", "1", "--tries", "2",
                  "--interval", "0", FAKE_ADB_MEMINFO=str(gone))
    assert "0 dumpsys samples" in r.stderr and not (tmp_path / "none.jsonl").exists()


def test_pull_fetches_telemetry_and_adapter(phone, tmp_path):
    phone.run("start.sh", "--program", "p", "--data", "d.jsonl", "--run-id", "run-9", "--steps", "2")
    out = tmp_path / "pulled"
    phone.run("pull.sh", "--run-id", "run-9", "--out", out)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    events = [json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines()]
    assert events[-1]["type"] == "run_end"
    r = phone.run("pull.sh", "--run-id", "missing", "--out", out, ok=False)
    assert "no telemetry for run missing" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("server", [False, True], ids=["offline", "with-server"])
def test_profile_runs_deploy_to_report(phone, program, tmp_path, server):
    prog, data = program
    out = tmp_path / "profile"
    port = _free_port()
    args = [prog, data, "--steps", "3", "--run-id", "prof-1", "--out", out, "--interval", "0", "--timeout", "60"]
    r = phone.run("profile.sh", *args, *(["--port", str(port)] if server else ["--no-server"]))
    assert r.stdout.strip() == str(out)
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert (summary["run_id"], summary["status"], summary["steps"]) == ("prof-1", "completed", 3)
    assert (out / "report" / "index.html").is_file() and (out / "adapter" / "adapter_model.safetensors").is_file()
    dumpsys = [json.loads(line) for line in (out / "dumpsys.jsonl").read_text().splitlines()]
    assert dumpsys and all(e["run_id"] == "prof-1" for e in dumpsys)
    calls = phone.calls()
    start = next(c for c in calls if c[:3] == ["shell", "am", "start-foreground-service"])
    if server:
        assert ["reverse", f"tcp:{port}", f"tcp:{port}"] in calls
        assert "telemetry_token" in start
        assert "telemetry server on http://127.0.0.1" in (out / "server.log").read_text()
        with socket.socket() as s:  # the server was stopped: nothing listens on its port (TIME_WAIT allowed)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    else:
        assert not any(c[0] == "reverse" for c in calls) and "telemetry_token" not in start


@pytest.mark.parametrize("revision, refused", [("27.2.12479018", True), ("28.2.13676358", False), ("29.0.1", False)])
def test_custom_aar_script_requires_ndk_r28(tmp_path, revision, refused):
    """android/native/build_executorch_aar.sh refuses an NDK older than r28 (16 KB-aligned libraries, which Android 15+
    phones with 16 KB pages need) before building anything; r28 and later pass that gate (the fake NDK then stops at
    the next one, the missing ANDROID_SDK)."""
    ndk = tmp_path / f"ndk-{revision}"
    (ndk / "build" / "cmake").mkdir(parents=True)
    (ndk / "build" / "cmake" / "android.toolchain.cmake").write_text("")
    (ndk / "source.properties").write_text(f"Pkg.Desc = Android NDK\nPkg.Revision = {revision}\n")
    et = tmp_path / "executorch"
    et.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ANDROID_SDK", "ANDROID_HOME")}
    env["ANDROID_NDK"] = str(ndk)
    r = subprocess.run(["bash", str(REPO / "android" / "native" / "build_executorch_aar.sh"), str(et), str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0
    major = revision.split(".")[0]
    assert (f"NDK r{major}: use NDK r28 or later" in r.stderr) == refused, r.stderr
    if not refused:
        assert "set ANDROID_SDK" in r.stderr, r.stderr
