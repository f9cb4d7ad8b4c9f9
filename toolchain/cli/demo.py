"""`toolchain demo`: the quick-start job on the embedded tiny preset (random weights, no downloads):
export the training program (contract v3), train it on the real ExecuTorch runtime with LCSB chosen
at run time, print the loss curve and the peak memory."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.validate import STEPS, FiniteFloat


@click.command()
@click.option("--steps", type=STEPS, default=40, show_default=True, help="Training steps.")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=3e-3, show_default=True,
              help="AdamW learning rate.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("out/demo-tiny"),
              show_default=True, help="Where the exported program goes (re-used if already exported; an older "
                                      "export is replaced; any other non-empty directory is refused unless --force).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out that is not an export.")
def demo(steps: int, lr: float, out: Path, force: bool) -> None:
    """Export the tiny preset (LCSB k=4, AdamW, int4 weights), train it on the ExecuTorch runtime
    with the bundled corpus, and print the loss curve and peak memory."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from toolchain.dataset import bundled_examples
    from toolchain.tokenizer import ByteTokenizer
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.export.program import OptimizerSpec, QuantSpec
    from toolchain.lcsb.plan import make_plan
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.memory.measure import MIB, measure_peak
    from toolchain.models import get_preset, random_weights
    from toolchain.runtime import ProgramDir
    from toolchain.runtime.runners import open_runner
    from toolchain.training import TrainRun, run_program

    from toolchain.atomic import check_output_dir, check_output_file

    seq_len = 64
    console = Console(stderr=True)
    check_output_file(out.parent / f"{out.name}.telemetry.jsonl", option="telemetry file")
    if not _current_program(out):
        # our own older export (a manifest.json of another version) is replaced; anything else needs --force
        check_output_dir(out, force=force or (out / "manifest.json").is_file())
        arch = get_preset("tiny")
        cfg = LoraConfig(rank=8, alpha=16)
        spec = ExportSpec(source="tiny", init="random", seed=0, seq_len=seq_len, quant=QuantSpec("int4", 64),
                          optimizer=OptimizerSpec("adamw", weight_decay=0.01), plan=make_plan(arch.layers, 4, "cyclic"),
                          default_lr=lr, tokenizer_kind="byte", pad_token_id=ByteTokenizer.PAD)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      transient=True) as progress:
            task = progress.add_task("export", total=None)
            export_program(arch, random_weights(arch, seed=0), cfg, init_lora(arch, cfg, seed=0), spec, out,
                           on_stage=lambda s: progress.update(task, description=f"export tiny: {s}"))
    pdir = ProgramDir(out)
    examples = bundled_examples(ByteTokenizer(), seq_len=seq_len)
    runner = open_runner(pdir)
    telemetry = out.parent / f"{out.name}.telemetry.jsonl"
    plan = pdir.default_plan()
    with Progress(console=console, transient=True) as progress, measure_peak() as peak:
        task = progress.add_task("train (executorch, LCSB)", total=steps)
        result = run_program(pdir, runner, examples, TrainRun(steps=steps, lr=lr, telemetry=telemetry, plan=plan),
                             on_step=lambda entry: progress.update(task, completed=entry.step))
    for i, loss in enumerate(result.losses):
        bar = "#" * max(1, int(loss * 8))
        layers = ",".join(map(str, plan.layers_at(i)))
        click.echo(f"step {i:3d}  layers {layers:10s} loss {loss:.4f}  {bar}")
    mp = pdir.manifest["memory_plan"]
    arenas = mp["planned_arena_bytes"].get("executorch", {})
    click.echo(f"peak anonymous memory during training: {(peak.peak_anon_bytes - peak.anon_before_bytes) / MIB:.1f} MiB above "
               f"the loaded runtime (planned arenas {sum(arenas.values()) / MIB:.2f} MiB over {len(arenas)} methods, "
               f"LoRA+AdamW state {mp['lora_state_bytes'] / MIB:.2f} MiB, checkpoints {mp['checkpoint_bytes'] / MIB:.2f} MiB)")
    click.echo(f"program: {out}   telemetry: {telemetry}  (toolchain telemetry import/report)")


def _current_program(out: Path) -> bool:
    """An export from an earlier run, in this toolchain's manifest format (else export again)."""
    import json

    from toolchain.export.manifest import MANIFEST_NAME, MANIFEST_SCHEMA_VERSION

    try:
        return json.loads((out / MANIFEST_NAME).read_text()).get("schema_version") == MANIFEST_SCHEMA_VERSION
    except (OSError, ValueError, AttributeError):
        return False
