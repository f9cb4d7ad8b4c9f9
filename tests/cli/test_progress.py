"""The progress bar of `data --text` / `tokenize`: shown only on a terminal and for large files."""

from __future__ import annotations

import io

from toolchain.cli import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_off_a_terminal_or_for_a_small_file(tmp_path, monkeypatch):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 100)
    monkeypatch.setattr(progress, "SHOW_FROM_BYTES", 50)
    with progress.file_progress(big, "tokenizing") as on_bytes:        # pytest's stderr is not a terminal
        assert on_bytes is None
    monkeypatch.setattr("sys.stderr", _Tty())
    monkeypatch.setattr(progress, "SHOW_FROM_BYTES", 1000)
    with progress.file_progress(big, "tokenizing") as on_bytes:
        assert on_bytes is None


def test_bar_advances_by_the_bytes_read(tmp_path, monkeypatch):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 100)
    monkeypatch.setattr(progress, "SHOW_FROM_BYTES", 50)
    err = _Tty()
    monkeypatch.setattr("sys.stderr", err)
    with progress.file_progress(big, "tokenizing") as on_bytes:
        assert on_bytes is not None
        on_bytes(60)
        on_bytes(40)
    shown = err.getvalue()
    assert "tokenizing" in shown and "100/100 bytes" in shown
    assert shown.endswith("\x1b[2K")             # transient: the bar is erased at the end
