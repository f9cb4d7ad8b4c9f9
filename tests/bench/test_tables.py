"""`bench tables`: cells are cached after each run and reused only with the same settings (resume), the
markdown puts our numbers next to the paper's, the generated section replaces itself, the plot is
a PNG. `run_memory_bench` is replaced by a stub here: the real one is tested in
test_bench_memory_cli.py, and a real grid takes hours."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from toolchain.bench import tables
from toolchain.bench.memory import MemoryBenchConfig
from toolchain.bench.tables import GRID, SECTION_END, SECTION_START, Cell, cell_key, render_markdown, replace_section
from toolchain.cli import cli
from toolchain.schemas import read_json, validation_errors


def _fake_doc(config: MemoryBenchConfig) -> dict:
    # MeBP grows with the logits (seq), MeSP with the rank: distinct numbers per cell.
    mebp = 100.0 + config.seq_len
    mesp = 10.0 + config.rank
    rows = [{"mode": m, "peak_mb": p, "peak_mb_runs": [p], "step_s": s, "step_s_runs": [s], "step_cpu_s": s,
             "grad_max_rel_diff": d, "resident_before_step_mb": 1.0, "baseline_anon_mb": 200.0,
             "mapped_file_mb": 900.0, "file_drift_mb": 0.0, "loss": 12.0, "threads": 1}
            for m, p, s, d in (("mebp", mebp, 2.0, 0.0), ("mesp", mesp, 2.1, 1e-6))]
    return {"schema_version": 1, "config": config.as_json(), "results": rows, "counted": "stub",
            "reference_mode": "mebp", "host": {}}


@pytest.fixture
def stub(monkeypatch):
    calls = []

    def fake(config, on_mode=None):
        calls.append(config)
        return _fake_doc(config)

    monkeypatch.setattr(tables, "run_memory_bench", fake)
    return calls


def test_cells_are_cached_and_reused_only_with_the_same_settings(tmp_path, stub):
    path, base = tmp_path / "cells.json", MemoryBenchConfig(cache_dir=tmp_path)
    few = GRID[:3]
    tables.run_tables(path, base, cells=few)
    assert [(c.model, c.seq_len, c.rank, c.modes) for c in stub] == [(*cell, ("mebp", "mesp")) for cell in few]
    doc = read_json(path, "bench_tables")
    assert sorted(doc["cells"]) == sorted(cell_key(c) for c in few)
    seen = []
    tables.run_tables(path, base, cells=GRID[:4], on_cell=lambda i, cell, cached: seen.append(cached))
    assert seen == [True, True, True, False] and len(stub) == 4      # resumed: only the new cell ran
    tables.run_tables(path, dataclasses.replace(base, mlp_chunk=32), cells=GRID[:1])
    assert len(stub) == 5                                            # other settings: measured again
    assert validation_errors("bench_tables", read_json(path, "bench_tables")) == []


def test_markdown_puts_ours_next_to_the_paper():
    cell = Cell("qwen2.5-0.5b", 256, 8)
    doc = {"schema_version": 1, "cells": {cell_key(cell): _fake_doc(MemoryBenchConfig(model=cell.model, seq_len=256))}}
    text = render_markdown(doc)
    row = next(line for line in text.splitlines() if line.startswith("| qwen2.5-0.5b |"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    assert cols[1:4] == ["356.0", "18.0", f"{18 / 356:.3f}"]                  # ours: MeBP, MeSP, ratio
    assert cols[8:13] == ["360.8", "136.2", f"{136.2 / 360.8:.3f}", "0.68", "0.86"]  # the paper's
    assert "| qwen2.5-3b | - | - |" in text and f"1 of {len(GRID)} cells measured" in text


def test_generated_section_replaces_itself():
    text = replace_section("# Benchmarks\n\nintro\n", "table one\n")
    assert text.count(SECTION_START) == text.count(SECTION_END) == 1 and "table one" in text
    assert text.startswith("# Benchmarks\n\nintro\n")
    again = replace_section(text + "\nafter\n", "table two\n")
    assert "table one" not in again and "table two" in again and again.rstrip().endswith("after")


def test_tables_command_writes_doc_plot_and_cells(tmp_path, stub):
    paths = {k: tmp_path / n for k, n in (("cells", "cells.json"), ("doc", "b.md"), ("plot", "b.png"))}
    args = ["bench", "tables", "--only", "qwen2.5-0.5b/seq128/r8", "--only", "qwen2.5-0.5b/seq256/r4",
            "--cache-dir", str(tmp_path)] + [x for k, p in paths.items() for x in (f"--{k}", str(p))]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert len(stub) == 2 and paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 128 | 228.0 | 18.0 |" in paths["doc"].read_text()
    paths["doc"].write_text("# Mine\n\nkept\n")
    again = CliRunner().invoke(cli, [*args, "--render-only"])
    assert again.exit_code == 0 and len(stub) == 2                  # nothing measured
    text = paths["doc"].read_text()
    assert text.startswith("# Mine\n\nkept\n") and "| 128 | 228.0 | 18.0 |" in text
    bad = CliRunner().invoke(cli, ["bench", "tables", "--only", "qwen2.5-7b/seq256/r8",
                                   "--doc", str(tmp_path / "x.md")])
    assert bad.exit_code == 2 and "unknown cell" in bad.output and not (tmp_path / "x.md").exists()


def test_a_cell_measured_under_memory_pressure_is_not_recorded(tmp_path, monkeypatch):
    """Mapped weight pages that move during the step make the peak unreliable (the 1.5B cell once read
    461.5 MB with a file drift of -152 MB, 109.3 MB on a quiet machine): such a cell is reported, not
    cached, and measured again by the next run."""
    from toolchain.bench.memory import mark_file_drift

    drifts = {"qwen2.5-0.5b": -152.0, "qwen2.5-1.5b": 0.0}

    def fake(config, on_mode=None):
        doc = _fake_doc(config)
        doc["results"][1]["file_drift_mb"] = drifts[config.model]
        for row in doc["results"]:
            mark_file_drift(row)
        return doc

    monkeypatch.setattr(tables, "run_memory_bench", fake)
    cells = (Cell("qwen2.5-0.5b", 256, 8), Cell("qwen2.5-1.5b", 256, 8))
    told = []
    doc = tables.run_tables(tmp_path / "cells.json", MemoryBenchConfig(cache_dir=tmp_path), cells=cells,
                            on_unreliable=lambda cell, reasons: told.append((cell, reasons)))
    assert list(doc["cells"]) == ["qwen2.5-1.5b/seq256/r8"]
    assert list(read_json(tmp_path / "cells.json", "bench_tables")["cells"]) == ["qwen2.5-1.5b/seq256/r8"]
    assert [c for c, _ in told] == [cells[0]] and told[0][1][0].startswith("mesp: file-backed pages changed by -152.0 MB")

    paths = [tmp_path / "b.md", tmp_path / "b.png"]
    result = CliRunner().invoke(cli, ["bench", "tables", "--only", "qwen2.5-0.5b/seq256/r8", "--cells",
                                      str(tmp_path / "cells.json"), "--doc", str(paths[0]), "--plot", str(paths[1]),
                                      "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1 and "not recorded" in result.output and "qwen2.5-0.5b/seq256/r8" in result.output
    assert paths[0].is_file()            # the cells that are recorded are still rendered


@pytest.mark.parametrize("drift, flagged", [(0.0, False), (3.9, False), (-4.1, True), (101.8, True)])
def test_file_drift_beyond_the_limit_marks_a_row(drift, flagged):
    from toolchain.bench.memory import FILE_DRIFT_LIMIT_MB, format_table, mark_file_drift

    assert FILE_DRIFT_LIMIT_MB == 4.0
    doc = _fake_doc(MemoryBenchConfig())
    doc["results"][0]["file_drift_mb"] = drift
    for row in doc["results"]:
        mark_file_drift(row)
    assert ("unreliable" in doc["results"][0]) == flagged and "unreliable" not in doc["results"][1]
    assert ("! mebp: unreliable peak" in format_table(doc)) == flagged
    assert validation_errors("bench_memory", doc) == []
