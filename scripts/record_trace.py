"""Record a replay trace of a tiny exported program on the real ExecuTorch runtime
(format: shared_schemas/traces/README.md).

    .venv/bin/python scripts/record_trace.py [OUT_DIR]                # default shared_schemas/traces/tiny
    .venv/bin/python scripts/record_trace.py --groups [OUT]            # default shared_schemas/traces/tiny_groups
    .venv/bin/python scripts/record_trace.py --family qwen3 [OUT_DIR]  # default shared_schemas/traces/tiny_qwen3

Exports a 3-layer Qwen2.5-shaped program (int4 group 16, AdamW with weight decay, LoRA on a subset of
targets, the generation methods), or with `--family qwen3` a Qwen3-shaped one (per-head q/k RMSNorm, an
explicit head_dim of 16 != hidden / heads = 8, no q/k/v biases, GQA; otherwise the same), then runs the host's own drivers on it: the program trainer
(`toolchain/training/program.py`, i.e. `runtime/loop.py` LayerLoop) for a full-backprop step and LCSB
steps whose layers are chosen at run time, an eval pass (`runtime/evaluate.py`) and a greedy generation
(`runtime/generate.py`). A wrapper around the runtime's `execute` records every call: method, layer,
each input's dtype/shape/sha256, each output's bytes (into outputs.bin). Deterministic: the same script
gives the same trace.json and outputs.bin.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolchain.text.dataset import DataRow  # noqa: E402
from toolchain.export.build import ExportSpec, export_program  # noqa: E402
from toolchain.lcsb.plan import StepPlan  # noqa: E402
from toolchain.lora import LoraConfig, init_lora  # noqa: E402
from toolchain.models import ModelArch, random_weights  # noqa: E402
from toolchain.optim import OptimizerConfig  # noqa: E402
from toolchain.program import ProgramDir  # noqa: E402
from toolchain.program.spec import QuantSpec  # noqa: E402
from toolchain.runtime import LayerLoop  # noqa: E402
from toolchain.runtime.evaluate import evaluate_program  # noqa: E402
from toolchain.runtime.generate import generate  # noqa: E402
from toolchain.runtime.program_runtime import open_runtime  # noqa: E402
from toolchain.training import ProgramTrainer, TrainRun  # noqa: E402

ARCH = ModelArch(hidden=32, layers=3, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
T = 16
CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))
# The Qwen3-shaped program: q/k norms, head_dim 16 (q_dim 64 != hidden 32), no q/k/v biases, 4 heads over 2 kv
# heads; LoRA on k_proj too (its gradient goes back through the k norm) and on an MLP input projection.
ARCH_QWEN3 = ModelArch(family="qwen3", hidden=32, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=64,
                       vocab=96, max_positions=64)
CFG_QWEN3 = LoraConfig(rank=4, alpha=8, targets=("q_proj", "k_proj", "o_proj", "up_proj"))
# --family NAME -> (arch, LoRA config, default output directory under shared_schemas/traces/)
FAMILY_RECORDINGS = {"qwen2": (ARCH, CFG, "tiny"), "qwen3": (ARCH_QWEN3, CFG_QWEN3, "tiny_qwen3")}
LR = 0.05
# Step 0: full backprop; then LCSB (k < L) with the layers chosen at run time: a top layer alone (the
# layers below get block_skip_update), the two outer layers (the middle one skipped), full again.
SELECTIONS = ((0, 1, 2), (2,), (0, 2), (1,), (0, 1, 2))
PROMPT = (5, 17, 42)
NEW_TOKENS = 4
PTE_LIMIT = 2 * 1024 * 1024
DTYPES = {torch.float32: "float32", torch.int64: "int64", torch.uint8: "uint8", torch.int8: "int8",
          torch.int32: "int32"}


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Row-major little-endian bytes of exactly the tensor's elements (a view: only its elements)."""
    a = t.detach().contiguous().cpu().numpy()
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.tobytes(order="C")


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class Recorder:
    """Wraps a runtime: every execute() is recorded; `layer` is set by the loop wrapper before each call."""

    def __init__(self, runtime, methods) -> None:
        self.runtime, self.methods = runtime, methods
        self.backend = getattr(runtime, "backend", "executorch")
        self.calls: list[dict] = []
        self.blob = bytearray()
        self.layer: int | None = None

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        spec = self.methods[method]
        ins = [{"name": io.name, "dtype": DTYPES[t.dtype], "shape": list(t.shape), "sha256": sha(tensor_bytes(t))}
               for io, t in zip(spec.inputs, inputs)]
        outputs = self.runtime.execute(method, inputs)
        outs = []
        for io, t in zip(spec.outputs, outputs):
            b = tensor_bytes(t)
            outs.append({"name": io.name, "dtype": DTYPES[t.dtype], "shape": list(t.shape),
                         "offset": len(self.blob), "nbytes": len(b), "sha256": sha(b)})
            self.blob += b
        self.calls.append({"method": method, "layer": self.layer, "inputs": ins, "outputs": outs})
        return outputs


def _install_layer_hook(rec: Recorder) -> None:
    """LayerLoop.call_method knows the layer a call is for; the runtime does not: tell the recorder."""
    original = LayerLoop.call_method

    def call_method(self, name, layer, *args, **kw):
        rec.layer = layer
        try:
            return original(self, name, layer, *args, **kw)
        finally:
            rec.layer = None

    LayerLoop.call_method = call_method


def _rows(n: int, seed: int, vocab: int) -> list[DataRow]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = T - (i % 3)  # some rows shorter than T: exercises padding
        ids = torch.randint(0, vocab, (t,), generator=g)
        labels = ids.clone()
        if i % 2 == 1:
            labels[:3] = -100  # a prompt part without loss
        out.append(DataRow(ids, labels))
    return out


def _row_json(ex: DataRow) -> dict:
    return {"input_ids": [int(v) for v in ex.input_ids], "labels": [int(v) for v in ex.labels]}


def export(prog: Path, arch: ModelArch = ARCH, cfg: LoraConfig = CFG) -> None:
    weights = random_weights(arch, seed=3)
    lora = init_lora(arch, cfg, seed=4, zero_b=False)
    spec = ExportSpec(source="trace", init="random", seed=3, seq_len=T, quant=QuantSpec("int4", 16),
                      optimizer=OptimizerConfig("adamw", weight_decay=0.01), plan=None, pad_token_id=0,
                      eos_token_id=95, default_lr=LR, generation=True, prefill_chunk=2)  # the prompt: 2 chunks
    export_program(arch, weights, cfg, lora, spec, prog)


def record(prog: Path, layers_per_checkpoint: int = 1) -> tuple[dict, bytes]:
    """Run the host drivers on the exported program `prog`; (trace dict without `program`, outputs blob).
    `layers_per_checkpoint` > 1: the train steps use checkpoint groups (`LayerLoop.train_step`), and the
    trace says so (key `layers_per_checkpoint`)."""
    pdir = ProgramDir(prog)
    runtime = open_runtime(pdir, "executorch", threads=1, use="all", fused=False)  # the stock methods: what apps replay
    rec = Recorder(runtime, pdir.methods)
    _install_layer_hook(rec)
    arch = pdir.arch
    rows, eval_rows = _rows(4, seed=11, vocab=arch.vocab), _rows(2, seed=12, vocab=arch.vocab)
    # The LCSB selections as a plan: the program trainer asks it for each step's layers at run time.
    phases = tuple(sorted(set(SELECTIONS)))
    plan = StepPlan(layers=arch.layers, policy="cyclic", k=arch.layers, phases=phases,
                    schedule=tuple(phases.index(s) for s in SELECTIONS))
    steps: list[dict] = []

    class RecordingTrainer(ProgramTrainer):
        def step(self, step, row, layers):
            first = len(rec.calls)
            loss, n = super().step(step, row, layers)
            sel = list(range(arch.layers)) if layers is None else sorted(layers)
            steps.append({"kind": "train", "step": step, "row": row, "selected": sel, "loss": loss,
                          "calls": [first, len(rec.calls)], "state_sha256": sha(tensor_bytes(self.state))})
            return loss, n

    trainer = RecordingTrainer(pdir, rec, rows, TrainRun(steps=len(SELECTIONS), lr=LR, plan=plan,
                                                         layers_per_checkpoint=layers_per_checkpoint))
    initial = sha(tensor_bytes(trainer.state))
    result = trainer.run()
    state = trainer.state
    final = sha(tensor_bytes(state))
    assert [s["selected"] for s in steps] == [list(s) for s in SELECTIONS]

    first = len(rec.calls)
    ev = evaluate_program(pdir, rec, state, eval_rows, loop=trainer.loop)
    steps.append({"kind": "eval", "rows": list(range(len(eval_rows))), "loss": ev["loss"], "tokens": ev["tokens"],
                  "calls": [first, len(rec.calls)]})
    first = len(rec.calls)
    gen = generate(pdir, rec, state, PROMPT, NEW_TOKENS, loop=trainer.loop)
    steps.append({"kind": "generate", "prompt_ids": list(PROMPT), "max_new_tokens": NEW_TOKENS, "greedy": True,
                  "stop_ids": [], "output_ids": gen.output_ids, "calls": [first, len(rec.calls)]})
    assert sha(tensor_bytes(state)) == final, "eval/generate wrote the state"
    trace = {
        "format": "toolchain-trace", "format_version": 1, "program": "program/", "outputs_file": "outputs.bin",
        "runtime": rec.backend, "seq_len": pdir.seq_len, "pad_token_id": pdir.pad_token_id, "lr": LR,
        "rows": [_row_json(e) for e in rows], "eval_rows": [_row_json(e) for e in eval_rows],
        "initial_state_sha256": initial, "steps": steps, "losses": [float(v) for v in result.losses],
        "final_state_sha256": final, "calls": rec.calls,
    }
    if layers_per_checkpoint > 1:
        trace = {**dict(list(trace.items())[:4]), "layers_per_checkpoint": layers_per_checkpoint,
                 **dict(list(trace.items())[4:])}
    return trace, bytes(rec.blob)


def record_groups(out: Path, layers_per_checkpoint: int = 2) -> int:
    """The same runs on the committed tiny program with checkpoint groups: tiny_groups/ holds only
    trace.json and outputs.bin; its program is ../tiny/program/."""
    base = REPO / "shared_schemas" / "traces" / "tiny"
    trace, blob = record(base / "program", layers_per_checkpoint)
    trace["program"] = "../tiny/program/"
    out.mkdir(parents=True, exist_ok=True)
    (out / "outputs.bin").write_bytes(blob)
    (out / "trace.json").write_text(json.dumps(trace, indent=1) + "\n")
    print(f"{out}: {len(trace['calls'])} calls, {len(blob)} output bytes; losses "
          f"{', '.join(f'{v:.4f}' for v in trace['losses'])}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--groups"]:
        return record_groups(Path(argv[1]) if len(argv) > 1 else REPO / "shared_schemas" / "traces" / "tiny_groups")
    family = "qwen2"
    if argv[:1] == ["--family"]:
        if len(argv) < 2 or argv[1] not in FAMILY_RECORDINGS:
            print(f"Error: --family takes one of {', '.join(FAMILY_RECORDINGS)}", file=sys.stderr)
            return 2
        family, argv = argv[1], argv[2:]
    arch, cfg, default_dir = FAMILY_RECORDINGS[family]
    out = Path(argv[0]) if argv else REPO / "shared_schemas" / "traces" / default_dir
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "program"
        export(prog, arch, cfg)
        trace, blob = record(prog)
        assert sha(ProgramDir(prog).state_init_file.read_bytes()) == trace["initial_state_sha256"]
        staged = Path(tmp) / "trace"
        shutil.copytree(prog, staged / "program")
        for pte in (staged / "program").glob("*.pte"):
            if pte.stat().st_size > PTE_LIMIT:
                pte.unlink()
        (staged / "outputs.bin").write_bytes(blob)
        (staged / "trace.json").write_text(json.dumps(trace, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staged, out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {len(trace['calls'])} calls, {len(blob)} output bytes, {size} bytes in all; "
          f"losses {', '.join(f'{v:.4f}' for v in trace['losses'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
