"""The quick-start demo: personalization a person can see, on the ExecuTorch runtime.

1. Export the `demo` preset (toolchain/assets/demo_model/: a 3 M-parameter Qwen2 decoder with the byte
   tokenizer, pretrained on public-domain books by scripts/pretrain_demo_model.py) as a training program
   with the generation methods.
2. BEFORE: the held-out loss of the bundled user text's held-out part (`evaluate_program`) and a greedy
   generation for a fixed prompt (`generate`), with the program's initial adapter (LoRA B = 0: the
   pretrained model itself).
3. Personalize: the user text (toolchain/assets/user_text.txt, a keeper's log of an invented
   lighthouse) as rows through `toolchain.text.text_data` (what `toolchain data` writes), trained on the
   program's methods by the program trainer (`ProgramTrainer`, what `toolchain train --program` runs);
   every `eval_every` steps the held-out loss of the live state, the array the trainer is updating.
   Each held-out loss is an `eval` telemetry event; the telemetry also holds the loaded-runtime baseline
   (a `memory` event with `baseline: true`, taken before the program is loaded) and the planner's estimate
   of the program's memory above it (run_start `planner_estimate_bytes`), which the report compares.
4. AFTER: the held-out loss and the same greedy generation with the trained state.

Everything runs in one `TrainingSession` (training/session.py): one runtime (ExecuTorch unless `target` says
otherwise), one layer loop, one state; nothing is re-exported and no adapter file is written between training,
eval and generation.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolchain.contract import MANIFEST_NAME, Manifest
from toolchain.errors import BadInput, ToolchainError

__all__ = ["DemoConfig", "DemoResult", "ASSETS", "USER_TEXT", "USER_HELD_OUT", "export_demo", "run_demo",
           "sparkline", "current_program"]

ASSETS = Path(__file__).resolve().parent / "assets"
USER_TEXT = ASSETS / "user_text.txt"
USER_HELD_OUT = ASSETS / "user_text_held_out.txt"
PROMPT = "Thursday. Wind from the"


@dataclass(frozen=True)
class DemoConfig:
    """Args:
        model: what to export (`demo`: the bundled pretrained model; a checkpoint directory works too).
        steps: training steps (one row of `seq_len` tokens each).
        lr: AdamW learning rate.
        rank / alpha: LoRA (all seven projections of every layer).
        seq_len: the program's T (rows and generation: prompt + new tokens <= T).
        lcsb_k: backprop through k layers per step (cycling); None: every layer.
        prompt / max_new_tokens: the fixed greedy generation before and after.
        eval_every: held-out loss of the live state every this many steps (0: only before and after).
        target / threads: runtime (default: the program's first host-runnable target, ExecuTorch) and its threads.
        user_text / held_out: the text to personalize on and its held-out part.
    """

    model: str = "demo"
    steps: int = 400
    lr: float = 3e-3
    rank: int = 8
    alpha: int = 16
    seq_len: int = 128
    lcsb_k: int | None = None
    prompt: str = PROMPT
    max_new_tokens: int = 80
    eval_every: int = 50
    target: str | None = None
    threads: int | None = None
    user_text: Path = USER_TEXT
    held_out: Path = USER_HELD_OUT
    seed: int = 0


@dataclass
class DemoResult:
    program: Path
    backend: str
    rows: int
    held_out_rows: int
    before_loss: float
    after_loss: float
    before_text: str
    after_text: str
    losses: list[float]
    eval_curve: list[tuple[int, float]] = field(default_factory=list)   # (step, held-out loss of the live state)
    seconds: dict[str, float] = field(default_factory=dict)
    peak_anon_mib: float | None = None


def current_program(out: Path, cfg: DemoConfig) -> bool:
    """An export from an earlier demo run of this model, seq_len and LCSB k, in this toolchain's manifest
    format (anything else is exported again)."""
    from toolchain.contract import read_manifest

    try:
        m = read_manifest(out / MANIFEST_NAME)
    except (ToolchainError, OSError):
        return False
    return (m.model.source == cfg.model and m.seq_len == cfg.seq_len
            and m.generate is not None and m.generate.prefill_chunk is not None
            and (None if m.lcsb is None else m.lcsb.k) == cfg.lcsb_k)


def export_demo(cfg: DemoConfig, out: Path, *, on_stage: Callable[[str], None] | None = None,
                replace: bool = False) -> Manifest:
    """Export `cfg.model` with the byte tokenizer, fp32 weights, AdamW and the generation methods (`replace`: a
    non-empty `out` is replaced)."""
    from toolchain.export.build import ExportSpec, export_program
    from toolchain.lcsb.plan import make_plan
    from toolchain.lora import LoraConfig, init_lora
    from toolchain.models import load_model
    from toolchain.optim import OptimizerConfig
    from toolchain.program.spec import QuantSpec
    from toolchain.text.tokenizer import ByteTokenizer

    arch, weights = load_model(cfg.model)
    tok = ByteTokenizer()
    if arch.vocab != tok.vocab:
        raise BadInput(f"the demo runs byte-tokenizer models (vocab {tok.vocab}); {cfg.model} has vocab {arch.vocab}")
    lora_cfg = LoraConfig(rank=cfg.rank, alpha=cfg.alpha)
    plan = None if cfg.lcsb_k is None else make_plan(arch.layers, cfg.lcsb_k, "cyclic")
    spec = ExportSpec(source=cfg.model, init="pretrained", seed=cfg.seed, seq_len=cfg.seq_len, quant=QuantSpec("none"),
                      optimizer=OptimizerConfig("adamw", weight_decay=0.0), plan=plan, default_lr=cfg.lr,
                      tokenizer_kind="byte", pad_token_id=tok.PAD, eos_token_id=tok.EOS, tokenizer_json=tok.to_json(),
                      generation=True)
    return export_program(arch, weights, lora_cfg, init_lora(arch, lora_cfg, seed=cfg.seed), spec, out,
                          on_stage=on_stage, replace=replace)


def _examples(rows: list[dict], arch, path: Path):
    """Rows written as JSONL (what `toolchain data` writes) and read back through the data file checks."""
    from toolchain.text.dataset import load_examples
    from toolchain.text.text_data import write_rows

    write_rows(path, rows)
    return load_examples(path, arch)


def run_demo(cfg: DemoConfig, out: Path, *, on_step: Callable[[int, float], None] | None = None,
             on_phase: Callable[[str], None] | None = None, verbose: bool = False) -> DemoResult:
    """Run the demo on the program in `out` (export it first with `export_demo`). Writes the rows, the held-out
    rows and the telemetry beside it (`{out}.rows.jsonl`, `{out}.held-out.jsonl`, `{out}.telemetry.jsonl`).
    `verbose`: the runtime's native log lines are shown."""
    import torch

    from toolchain.memory.measure import MIB, measure_peak
    from toolchain.text.text_data import make_rows, program_text
    from toolchain.training import TrainRun
    from toolchain.training.session import TrainingSession

    phase = on_phase or (lambda _s: None)
    seconds: dict[str, float] = {}
    session = TrainingSession(out, target=cfg.target, threads=cfg.threads, use="all", verbose=verbose)
    pdir = session.pdir
    ptext = program_text(out)                 # the program's own tokenizer (tokenizer.json), T, vocabulary
    tok = ptext.tokenizer
    side = lambda suffix: out.parent / f"{out.name}.{suffix}"  # noqa: E731
    train = _examples(make_rows(ptext, text=cfg.user_text), pdir.arch, side("rows.jsonl"))
    held = _examples(make_rows(ptext, text=cfg.held_out), pdir.arch, side("held-out.jsonl"))
    prompt_ids = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(cfg.prompt, allow_special=False)
    if len(prompt_ids) + cfg.max_new_tokens > pdir.seq_len:
        raise BadInput(f"the prompt ({len(prompt_ids)} tokens) + {cfg.max_new_tokens} new tokens do not fit in "
                       f"seq_len {pdir.seq_len}")

    baseline = session.measure_baseline()
    t0 = time.perf_counter()
    session.open_runtime()
    seconds["load"] = time.perf_counter() - t0

    plan = None if cfg.lcsb_k is None else pdir.default_plan()
    run = TrainRun(steps=cfg.steps, lr=cfg.lr, shuffle_seed=cfg.seed, telemetry=side("telemetry.jsonl"), plan=plan)

    def text_of(state) -> str:
        res = session.generate(prompt_ids, cfg.max_new_tokens, state=state, stop_ids=[tok.eos_id])
        return tok.decode(res.output_ids)

    phase("before: eval + generate")
    t0 = time.perf_counter()   # the session's state before the first step: the program's initial adapter
    # run_start (+ the baseline) before the first eval event; VmHWM is reset when training starts (measure_peak)
    session.start_training(train, run, held=held, eval_every=cfg.eval_every, memory_peak=True)
    before_loss, before_text = float(session.evals[0]["loss"]), text_of(session.state)
    seconds["before"] = time.perf_counter() - t0

    phase("personalize")
    gc.collect()                  # the garbage of eval and generation is not the training's memory
    t0 = time.perf_counter()
    with measure_peak() as peak:
        result = session.train(on_step=None if on_step is None else lambda entry: on_step(entry.step, entry.loss))
    seconds["train"] = time.perf_counter() - t0
    state = result.state
    assert isinstance(state, torch.Tensor)
    curve = [(e["step"], float(e["loss"])) for e in session.evals]
    after_loss = curve[-1][1]
    if result.gate is not None and result.gate.decision != "kept":   # the gate kept an earlier adapter
        after_loss = result.gate.best_loss if result.gate.decision == "kept_best" else result.gate.start_loss
    phase("after: generate")
    t0 = time.perf_counter()
    after_text = text_of(state)
    seconds["after"] = time.perf_counter() - t0
    base = baseline["anon_bytes"] if baseline else peak.anon_before_bytes
    return DemoResult(program=out, backend=session.backend, rows=len(train), held_out_rows=len(held),
                      before_loss=before_loss, after_loss=after_loss, before_text=before_text, after_text=after_text,
                      losses=[float("nan") if x is None else float(x) for x in result.losses], eval_curve=curve,
                      seconds=seconds, peak_anon_mib=(peak.peak_anon_bytes - base) / MIB)


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """`values` averaged into at most `width` buckets, one block character each (low to high)."""
    vals = [v for v in values if v == v]
    if not vals:
        return ""
    n = len(values)
    buckets = []
    for i in range(min(width, n)):
        chunk = [v for v in values[i * n // min(width, n):(i + 1) * n // min(width, n)] if v == v]
        if chunk:
            buckets.append(sum(chunk) / len(chunk))
    lo, hi = min(buckets), max(buckets)
    span = (hi - lo) or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int((b - lo) / span * len(_BARS)))] for b in buckets)
