"""Host runner for ONNX programs: ONNX Runtime's CPU execution provider, one `InferenceSession` per
method (created once, then called by name), driven exactly as an app drives it
(ProgramDir.call_train_method does the state I/O).

Session settings (the same an app should use; see docs/onnx.md for the measurements behind them):
- `session.disable_prepacking = 1`: by default the CPU provider repacks every constant right-hand
  MatMul operand (the `dy @ W` matmuls of the backward, the LM head) into its own heap buffers at
  session creation: an anonymous copy of the frozen weights. Without prepacking the weights stay in
  the memory-mapped external-data file (clean file-backed pages, not counted by the phones' metrics).
- Node order = the exported order: `execution_order = PRIORITY_BASED` (the ready node that comes
  first in the file runs first) and no graph optimization (`ORT_DISABLE_ALL`). The exported order
  is the step's memory plan; ORT's default order and any rewrite scatter it. Measured on
  Qwen2.5-0.5B fp32, seq 256: default order + all optimizations 1354 MB peak, default order with
  `GatherSliceToSplitFusion` off 1062 MB, priority order with optimizations 924 MB, priority order
  without them 180 MB (of which 101 MB is the session itself), at the same step time. Optimizers that
  would be harmful even in order (kept in DISABLED_OPTIMIZERS, should the level be raised):
  `ConstantFolding` (stores every dequantized weight and LM-head slice as a new float32 tensor),
  `CommonSubexpressionElimination` (merges MeSP's recompute in backward with the forward, keeping
  the forward's activations), `GatherSliceToSplitFusion` (one Split materializes all LM-head slices).
- Memory arena (`arena=`): "off" (default): no arena, no memory patterns, plain malloc/free per
  tensor, so the peak is the step's live tensors and nothing is kept between steps. Qwen2.5-0.5B fp32
  seq 256: peak 180 MB (session 102 MB + step) vs 248 MB with "shared" (one BFC arena registered
  once per process and used by every session via `session.use_env_allocators`, memory patterns on;
  it keeps its 248 MB between steps) and 250 MB with "session" (ORT's default: an arena per session,
  so per LCSB phase method).
- Threads: `intra_op_num_threads` (0 = ORT's default, one per physical core), one inter-op thread,
  sequential execution, no spin-waiting (a phone's cores are shared with the UI).
"""

from __future__ import annotations

import torch

from toolchain.errors import BadInput
from toolchain.runtime.program_dir import ProgramDir

__all__ = ["OnnxRunner", "run_onnx_step", "session_options", "DISABLED_OPTIMIZERS"]

DISABLED_OPTIMIZERS = ["ConstantFolding", "CommonSubexpressionElimination", "GatherSliceToSplitFusion"]


ARENAS = ("off", "shared", "session")
_shared_arena_registered = False


def _register_shared_arena() -> None:
    """Register the process-wide CPU arena once (registering a second one aborts ORT's process)."""
    global _shared_arena_registered
    import onnxruntime as ort

    if not _shared_arena_registered:
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 1}))  # kSameAsRequested
        _shared_arena_registered = True


def session_options(threads: int | None = None, *, arena: str = "off"):
    """The `onnxruntime.SessionOptions` every method's session is created with (module docstring)."""
    import onnxruntime as ort

    if arena not in ARENAS:
        raise BadInput(f"unknown ONNX Runtime arena mode {arena!r}; choose from {', '.join(ARENAS)}")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # The exported node order is the step's memory plan (forward, then per layer: recompute, backward,
    # update). PRIORITY_BASED runs the ready node that comes first in the file; ORT's default order (a
    # DFS from the outputs) and any graph rewrite (fused nodes get new, last indices, so the nodes
    # that are ready early, e.g. the LM head's weight slices, run first) both scatter it.
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.enable_cpu_mem_arena = arena != "off"
    so.enable_mem_pattern = arena != "off"
    so.log_severity_level = 3  # errors only
    so.add_session_config_entry("session.disable_prepacking", "1")
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if arena == "shared":
        _register_shared_arena()
        so.add_session_config_entry("session.use_env_allocators", "1")
    return so


class OnnxRunner:
    """Every ONNX method of a program directory, one session each, created once."""

    backend = "onnx"

    def __init__(self, pdir: ProgramDir, *, threads: int | None = None, arena: str = "off") -> None:
        import onnxruntime as ort

        entry = next((p for p in pdir.manifest["programs"] if p["target"] == "onnx"), None)
        if entry is None:
            raise BadInput(f"{pdir.path} has no onnx program; export it with --target onnx")
        files = entry.get("methods") or {}
        missing = [m for m in pdir.train_methods() if m not in files]
        if missing:
            raise BadInput(f"{pdir.path}: the onnx program lacks method(s) {', '.join(missing)} listed in the "
                           f"manifest; re-export the program")
        so = session_options(threads, arena=arena)
        self.sessions, self.input_names = {}, {}
        for name in pdir.train_methods():
            sess = ort.InferenceSession(str(pdir.path / files[name]), so, providers=["CPUExecutionProvider"],
                                        disabled_optimizers=DISABLED_OPTIMIZERS)
            _check_io(pdir, name, sess, entry.get("output_suffix", ""))
            self.sessions[name] = sess
            self.input_names[name] = [i.name for i in sess.get_inputs()]

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Outputs in the manifest's order (loss, then the updated state entries)."""
        feeds = {n: t.detach().contiguous().numpy() for n, t in zip(self.input_names[method], inputs)}
        return [torch.from_numpy(v) for v in self.sessions[method].run(None, feeds)]


def _check_io(pdir: ProgramDir, method: str, sess, suffix: str) -> None:
    """The session's inputs/outputs are the manifest's, in order (outputs: `loss`, then entry + suffix)."""
    spec = pdir.method(method)
    want_in = [io["name"] for io in spec["inputs"]]
    want_out = [spec["outputs"][0]["name"]] + [io["name"] + suffix for io in spec["outputs"][1:]]
    got_in, got_out = [i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()]
    if got_in != want_in or got_out != want_out:
        raise BadInput(f"{pdir.path}: the onnx graph of {method} does not have the manifest's inputs/outputs; "
                       f"re-export the program")


def run_onnx_step(program_dir, threads: int | None = None, arena: str = "off"):
    """For `toolchain bench memory --modes onnx`: a callable(input_ids, labels) -> loss that runs one
    training step of the exported program (its first train method, manifest default lr), the state held
    as an app holds it."""
    from pathlib import Path

    pdir = ProgramDir(Path(program_dir))
    runner = OnnxRunner(pdir, threads=threads, arena=arena)
    method = pdir.train_methods()[0]
    lr = pdir.manifest["optimizer"].get("default_lr", 1e-4)
    state = pdir.state_init()

    def step(input_ids: torch.Tensor, labels: torch.Tensor) -> float:
        return pdir.call_train_method(runner.execute, method, input_ids, labels, lr, state)

    step.program = pdir
    step.runner = runner
    return step
