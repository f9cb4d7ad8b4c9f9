"""Host runtime for ONNX programs: ONNX Runtime's CPU execution provider, one
`InferenceSession` per method (created once, then called by name), behind the `execute(method, inputs)`
that runtime/loop.py's `LayerLoop` drives, exactly as an app drives it.

Inputs are fed without copying: each tensor's `.numpy()` (a view; tensors are made contiguous
first, which the loop's already are) goes to `InferenceSession.run`, whose CPU provider wraps a
contiguous numpy array of the graph's dtype in place. The frozen weights are views of the
memory-mapped weights.safetensors and stay clean file-backed pages (measured: a Qwen2.5-0.5B
block's 56.9 MiB of fp32 weights fed to block_forward / block_backward raise the peak RssAnon by
10 / 25 MiB, activations only; see docs/onnx.md). Outputs are ORT-allocated arrays wrapped by
`torch.from_numpy` (no copy).

Session settings (the same an app should use; docs/onnx.md has the measurements behind them):
- Node order = the exported order: `execution_order = PRIORITY_BASED` (the ready node that comes
  first in the file runs first) and no graph optimization (`ORT_DISABLE_ALL`). The exported order is
  the method's memory plan; ORT's default order (a DFS from the outputs) and any rewrite (fused
  nodes get new, last indices) scatter it. Measured in v2 (the whole step in one graph, Qwen2.5-0.5B
  fp32, seq 256): default order + all optimizations 1354 MB peak, priority order without
  optimizations 180 MB. Optimizers that would be harmful even in order (DISABLED_OPTIMIZERS, should
  the level be raised): `ConstantFolding` (would store a dequantized/sliced constant as a new float32
  tensor; with weights as inputs there is little left for it to fold), `CommonSubexpressionElimination`
  (merges MeSP's deliberate recomputes), `GatherSliceToSplitFusion` (one Split materializes every
  slice at once).
- `session.disable_prepacking = 1`: prepacking copies *constant* right-hand MatMul operands into the
  provider's own heap at session creation. No weight is a constant (they are graph inputs), so it does
  not apply to weights; it is set so that no constant of a graph is ever duplicated.
- Memory arena (`arena=`): "off" (default): no arena, no memory patterns, plain malloc/free per
  tensor, so the peak is the method's live tensors and nothing is kept between calls. "shared": one
  BFC arena registered once per process and used by every session (`session.use_env_allocators`,
  memory patterns on; it keeps its high-water mark between calls). "session": ORT's default, an
  arena per session, i.e. per method. (v2 0.5B fp32 numbers: 180 / 248 / 250 MB peak.)
- Threads: `intra_op_num_threads` (0 = ORT's default, one per physical core), one inter-op thread,
  sequential execution, no spin-waiting (a phone's cores are shared with the UI).
"""

from __future__ import annotations

import torch

from toolchain.errors import BadInput
from toolchain.program.directory import ProgramDir

__all__ = ["OnnxRuntime", "session_options", "DISABLED_OPTIMIZERS", "ARENAS"]

DISABLED_OPTIMIZERS = ["ConstantFolding", "CommonSubexpressionElimination", "GatherSliceToSplitFusion"]
ARENAS = ("off", "shared", "session")
_ORT_TYPES = {"float32": "tensor(float)", "int64": "tensor(int64)", "int8": "tensor(int8)", "uint8": "tensor(uint8)"}
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


class OnnxRuntime:
    """Every ONNX method of a program directory, one session each, created once."""

    backend = "onnx"

    def __init__(self, pdir: ProgramDir, *, threads: int | None = None, arena: str = "off",
                 methods: list[str] | None = None) -> None:
        """methods: the methods to create sessions for (None: every method of the manifest)."""
        import onnxruntime as ort

        if "onnx" not in pdir.targets:
            raise BadInput(f"{pdir.path} has no onnx program; export it with --target onnx")
        files = pdir.program("onnx").methods or {}
        names = list(pdir.methods) if methods is None else list(methods)
        missing = [m for m in names if m not in files]
        if missing:
            raise BadInput(f"{pdir.path}: the onnx program lacks method(s) {', '.join(missing)} listed in the "
                           f"manifest; re-export the program")
        so = session_options(threads, arena=arena)
        self.sessions, self.input_names = {}, {}
        for name in names:
            method = pdir.methods[name]
            sess = ort.InferenceSession(str(pdir.path / files[name]), so, providers=["CPUExecutionProvider"],
                                        disabled_optimizers=DISABLED_OPTIMIZERS)
            _check_io(pdir, method, sess)
            self.sessions[name] = sess
            self.input_names[name] = [io.name for io in method.inputs]

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Outputs in the method's manifest order. Inputs are not copied (contiguous CPU tensors)."""
        names = self.input_names[method]
        if len(inputs) != len(names):
            raise BadInput(f"{method} takes {len(names)} inputs, got {len(inputs)}")
        feeds = {n: t.detach().contiguous().numpy() for n, t in zip(names, inputs)}
        return [torch.from_numpy(v) for v in self.sessions[method].run(None, feeds)]


def _check_io(pdir: ProgramDir, method, sess) -> None:
    """The session's inputs/outputs are the manifest's method IoSpecs: names in order, dtypes, shapes."""
    def sig(ios):
        return [(io.name, _ORT_TYPES[io.dtype], list(io.shape)) for io in ios]

    def got(args):
        return [(a.name, a.type, list(a.shape)) for a in args]

    if got(sess.get_inputs()) != sig(method.inputs) or got(sess.get_outputs()) != sig(method.outputs):
        raise BadInput(f"{pdir.path}: the onnx graph of {method.name} does not have the manifest's inputs/outputs; "
                       f"re-export the program")

