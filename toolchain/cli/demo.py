"""`toolchain demo`: the quick-start job (toolchain/demo.py): export the bundled pretrained `demo` model,
show its held-out loss and a greedy generation, personalize it on the bundled user text, and show the
loss curve, the held-out loss and the generation after, all on the ExecuTorch runtime."""

from __future__ import annotations

from pathlib import Path

import click

from toolchain.cli.options import lcsb_k_option, threads_option, verbose_requested
from toolchain.validate import STEPS, FiniteFloat


@click.command()
@click.option("--steps", type=STEPS, default=400, show_default=True, help="Personalization steps (one row each).")
@click.option("--lr", type=FiniteFloat(min=0, min_open=True), default=3e-3, show_default=True,
              help="AdamW learning rate.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=80, show_default=True,
              help="Length of the greedy generation before and after.")
@click.option("--eval-every", type=click.IntRange(min=0), default=50, show_default=True,
              help="Held-out loss of the live adapter every N steps (0: only before and after).")
@lcsb_k_option("every layer; the layers cycle")
@threads_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("out/demo"),
              show_default=True, help="Where the exported program goes (re-used if already exported; an older "
                                      "export is replaced; any other non-empty directory is refused unless --force).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out that is not an export.")
def demo(*, steps: int, lr: float, max_new_tokens: int, eval_every: int, lcsb_k: int | None, threads: int | None,
         out: Path, force: bool) -> None:
    """Personalize the bundled pretrained model on the bundled user text, on the ExecuTorch runtime:
    held-out loss and a greedy generation before and after, and the loss curve."""
    import time

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from toolchain.atomic import check_output_dir, check_output_file
    from toolchain.contract import MANIFEST_NAME
    from toolchain.demo import DemoConfig, current_program, export_demo, run_demo, sparkline

    cfg = DemoConfig(steps=steps, lr=lr, max_new_tokens=max_new_tokens, eval_every=eval_every, lcsb_k=lcsb_k,
                     threads=threads)
    console = Console(stderr=True)
    t_start = time.perf_counter()
    for suffix in ("telemetry.jsonl", "rows.jsonl", "held-out.jsonl"):  # written beside --out
        check_output_file(out.parent / f"{out.name}.{suffix}", option="demo file")
    exported = False
    if not current_program(out, cfg):
        # our own older export (a manifest.json) is replaced; anything else needs --force
        replace = force or (out / MANIFEST_NAME).is_file()
        check_output_dir(out, force=replace)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      transient=True) as progress:
            task = progress.add_task("export", total=None)
            export_demo(cfg, out, on_stage=lambda s: progress.update(task, description=f"export demo: {s}"),
                        replace=replace)
        exported = True
    t_export = time.perf_counter() - t_start

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("load", total=steps)
        result = run_demo(cfg, out, verbose=verbose_requested(),
                          on_phase=lambda s: progress.update(task, description=s),
                          on_step=lambda step, loss: progress.update(
                              task, completed=step, description=f"personalize: step {step}/{steps} loss {loss:.3f}"))

    prompt = cfg.prompt.replace("\n", " ")
    click.echo(f"model: the bundled `demo` preset (toolchain/assets/demo_model, pretrained on public-domain books), "
               f"program {out} ({result.backend}, {'exported' if exported else 're-used'} in {t_export:.0f} s)")
    click.echo(f"user text: {result.rows} rows of {cfg.seq_len} byte tokens; held out: {result.held_out_rows} rows")
    click.echo("")
    click.echo(f"BEFORE  held-out loss {result.before_loss:.4f}")
    click.echo(f"BEFORE  {prompt!r} ->")
    click.echo(_indent(cfg.prompt + result.before_text))
    click.echo("")
    finite = [x for x in result.losses if x == x]
    head, tail = finite[:10], finite[-10:]   # the curve's ends: means of the first and last 10 steps
    click.echo(f"personalize: {steps} steps, lr {lr:g}, LoRA r={cfg.rank} on every projection"
               + (f", LCSB k={lcsb_k}" if lcsb_k else ", every layer") + f" ({result.seconds['train']:.0f} s)")
    click.echo(f"  training loss  {sum(head) / len(head):.3f} {sparkline(result.losses)} {sum(tail) / len(tail):.3f}"
               f"  (means of the first and last {len(tail)} steps)")
    click.echo("  held-out loss  " + "  ".join(f"step {s}: {v:.3f}" for s, v in result.eval_curve))
    click.echo("")
    click.echo(f"AFTER   held-out loss {result.after_loss:.4f}  ({result.after_loss - result.before_loss:+.4f})")
    click.echo(f"AFTER   {prompt!r} ->")
    click.echo(_indent(cfg.prompt + result.after_text))
    click.echo("")
    if result.peak_anon_mib is not None:
        click.echo(f"peak anonymous memory during training: {result.peak_anon_mib:.1f} MiB above the loaded runtime")
    click.echo(f"total {time.perf_counter() - t_start:.0f} s.  program: {out}   telemetry: "
               f"{out.parent / (out.name + '.telemetry.jsonl')}  (toolchain telemetry import/report)")


def _indent(text: str) -> str:
    return "\n".join("    | " + line for line in text.split("\n"))

