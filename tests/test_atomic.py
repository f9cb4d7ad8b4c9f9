"""Atomic outputs: nothing half-written on failure, the old output kept until the new one is
complete, and temporaries in flight deletable by a stopping process (`discard_pending`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from toolchain import atomic
from toolchain.atomic import atomic_dir, atomic_write_bytes, check_output_dir, check_output_file, discard_pending
from toolchain.errors import OutputExists, OutputNotWritable


def test_a_failed_block_leaves_the_old_directory_and_no_temporary(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(out, replace=True) as tmp:
        (tmp / "a").write_text("new")
        raise RuntimeError("boom")
    assert (out / "a").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not atomic._PENDING


def test_a_finished_block_replaces_the_old_directory(tmp_path):
    out = tmp_path / "out"
    for text in ("old", "new"):
        with atomic_dir(out, replace=True) as tmp:
            (tmp / "a").write_text(text)
    assert (out / "a").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not atomic._PENDING


def test_a_non_empty_directory_is_not_replaced_without_permission(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("x")
    ran = []
    with pytest.raises(OutputExists, match="not empty.*--force"), atomic_dir(out) as tmp:
        ran.append(tmp)
    assert not ran and (out / "mine.txt").read_text() == "x" and os.listdir(tmp_path) == ["out"]
    with pytest.raises(OutputExists, match="not empty"):
        check_output_dir(out)
    check_output_dir(out, force=True)             # --force: this command may replace it ...
    with atomic_dir(out, replace=True) as tmp:    # ... and says so to the writer
        (tmp / "new").write_text("y")
    assert os.listdir(out) == ["new"]
    with pytest.raises(OutputExists):             # checking with force left no permission behind
        with atomic_dir(out):
            pass


def test_an_empty_directory_is_replaced_and_a_file_never(tmp_path):
    (tmp_path / "empty").mkdir()
    with atomic_dir(tmp_path / "empty") as tmp:
        (tmp / "a").write_text("a")
    assert os.listdir(tmp_path / "empty") == ["a"]
    (tmp_path / "f").write_text("mine")
    for force in (False, True):
        with pytest.raises(OutputExists, match="not a directory"):
            check_output_dir(tmp_path / "f", force=force)
    with pytest.raises(OutputExists):
        with atomic_dir(tmp_path / "f", replace=True):
            pass
    assert (tmp_path / "f").read_text() == "mine"


def test_output_checks_find_unwritable_and_full_locations(tmp_path, monkeypatch):
    import errno

    with pytest.raises(OutputNotWritable, match="is a file"):
        (tmp_path / "f").write_text("x")
        check_output_dir(tmp_path / "f" / "sub" / "out")
    with pytest.raises(OutputNotWritable, match="needs about"):
        check_output_dir(tmp_path / "out", expected_bytes=1 << 62)

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    with pytest.raises(OutputNotWritable, match="Read-only file system"):
        check_output_file(tmp_path / "x.json")
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_discard_pending_deletes_what_is_in_flight(tmp_path):
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "out") as tmp:
        (tmp / "half").write_text("x")
        assert tmp in atomic._PENDING
        discard_pending()
        assert not tmp.exists() and not atomic._PENDING
        raise KeyboardInterrupt                    # what a stopping process does instead of finishing
    assert list(tmp_path.iterdir()) == []


def test_files_are_replaced_whole(tmp_path):
    path = tmp_path / "f.bin"
    atomic_write_bytes(path, b"one")
    atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert not atomic._PENDING


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
@pytest.mark.parametrize("kind", ["dir", "file"])
def test_sigterm_as_the_temporary_is_created_still_deletes_it(tmp_path, kind):
    """A SIGTERM that arrives just after the temporary is created, before it is registered, is delivered once
    it is registered: the stopping process deletes it (seen under load: an export stopped right after its
    temporary directory appeared left it behind)."""
    script = textwrap.dedent(f"""
        import os, signal, sys, tempfile
        from pathlib import Path
        from toolchain import atomic
        from toolchain.atomic import atomic_dir, atomic_write_bytes, discard_pending

        def stop(signum, frame):
            discard_pending()
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        for name in ("mkdtemp", "mkstemp"):
            real = getattr(tempfile, name)

            def created_then_signal(*a, _real=real, **k):
                made = _real(*a, **k)
                os.kill(os.getpid(), signal.SIGTERM)   # the stop lands before the caller's next line
                return made

            setattr(atomic.tempfile, name, created_then_signal)
        out = Path({str(tmp_path / "out")!r})
        if {kind!r} == "dir":
            with atomic_dir(out) as tmp:
                (tmp / "a").write_text("x")
        else:
            atomic_write_bytes(out, b"x")
        sys.exit(3)                                    # not reached
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_sigterm_during_the_rename_waits_for_it(tmp_path):
    """A SIGTERM that arrives while the output is being swapped in is delivered after the swap:
    the process stops with the new output complete, the old one gone, no temporaries."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from toolchain import atomic
        from toolchain.atomic import atomic_dir, discard_pending

        def stop(signum, frame):
            discard_pending()
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        out = Path({str(tmp_path / "out")!r})
        with atomic_dir(out) as tmp:
            (tmp / "a").write_text("old")
        real_replace = os.replace

        def replace_then_signal(src, dst):
            real_replace(src, dst)
            os.kill(os.getpid(), signal.SIGTERM)   # arrives in the middle of the swap

        atomic.os.replace = replace_then_signal
        with atomic_dir(out, replace=True) as tmp:
            (tmp / "a").write_text("new")
        sys.exit(3)                                # not reached: the pending SIGTERM stops the process
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert (tmp_path / "out" / "a").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert os.listdir(tmp_path / "out") == ["a"]
