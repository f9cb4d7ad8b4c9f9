"""ExecuTorch target: the v3 methods -> one `.pte` (torch.export -> exir edge -> executorch).

No method holds a weight: frozen tensors and the LoRA state are method inputs (the app passes views
of its memory-mapped weights file and of its state array), so the program is small and its export
time does not depend on the layer count. Op choices that matter on this runtime (measured, see
docs/export.md): `aten.linear` is preserved through `to_edge` (its optimized kernel reads the weight
in place; decomposed, it becomes `permute_copy(W)` + mm), and inputs are not memory-planned
(`alloc_graph_input=False`: the app's buffers are used as they are).
"""

from __future__ import annotations

from pathlib import Path

import torch

from toolchain.export.artifact import TargetArtifact
from toolchain.export.program import ProgramSpec, example_inputs, method_module, method_specs

__all__ = ["export_executorch", "PTE_NAME"]

PTE_NAME = "model.pte"


def exported_methods(spec: ProgramSpec) -> dict:
    """`torch.export` of every method (no gradients: the backward is explicit)."""
    eps = {}
    with torch.no_grad():
        for name, method in method_specs(spec).items():
            eps[name] = torch.export.export(method_module(spec, name), example_inputs(method), strict=False)
    return eps


def xnnpack_partitioner():
    """XNNPACK for the matmuls only (linear, mm, bmm), one op per delegate, weights taken as runtime
    tensors (`force_non_static_weights_for_f32_linear`: they are method inputs or in-graph dequantized
    chunks). XNNPACK then packs each weight per call into one workspace shared by all delegates (about the
    largest weight's size, anonymous memory) instead of packing constants into its heap at load. Larger
    partitions fail on training graphs ("Invalid partition, found dependency cycles")."""
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig, MMConfig
    from executorch.backends.xnnpack.partition.config.generic_node_configs import BMMConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner(configs=[LinearConfig, MMConfig, BMMConfig], per_op_mode=True,
                              force_non_static_weights_for_f32_linear=True)


def export_executorch(spec: ProgramSpec, out_dir: Path, *, on_stage=None, xnnpack: bool = True) -> TargetArtifact:
    """Export every method into `out_dir/model.pte` (the caller handles atomicity of the directory).

    Args:
        xnnpack: delegate the matmuls to XNNPACK (see `xnnpack_partitioner`); else ExecuTorch's
            optimized kernels (single-threaded Eigen gemm).
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    note = on_stage or (lambda _s: None)
    note("torch.export")
    eps = exported_methods(spec)
    note("to_edge" + (" + XNNPACK" if xnnpack else ""))
    partitioner = {name: [xnnpack_partitioner()] for name in eps} if xnnpack else None
    edge = to_edge_transform_and_lower(
        eps, partitioner=partitioner,
        compile_config=EdgeCompileConfig(_check_ir_validity=False, preserve_ops=[torch.ops.aten.linear.default]))
    note("to_executorch")
    et = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False)))
    note("write .pte")
    (Path(out_dir) / PTE_NAME).write_bytes(et.buffer)
    planned = {}
    for plan in et.executorch_program.execution_plan:
        # non_const_buffer_sizes[0] is reserved; [1] is the arena (activations and outputs).
        planned[plan.name] = int(sum(list(plan.non_const_buffer_sizes)[1:]))
    return TargetArtifact("executorch", PTE_NAME, planned_arena_bytes=planned, delegate="xnnpack" if xnnpack else None)
