"""ExecuTorch target: `StepProgram` -> `.pte` (torch.export -> exir edge -> [XNNPACK] -> executorch).

Every method is exported from a thin wrapper around the same `StepProgram`, so the frozen weights
have the same names in every method and are serialized once in the constant segment (memory-mapped
by `Module`'s MMAP load mode on phones). The LoRA/optimizer state is not in the program: it comes in
as inputs and the changed entries go out as outputs (see program.py for why).
"""

from __future__ import annotations

from pathlib import Path

import torch

from toolchain.export.artifact import TargetArtifact
from toolchain.export.program import StepProgram, TrainMethod, example_inputs, method_name

__all__ = ["export_executorch", "PTE_NAME"]

PTE_NAME = "model.pte"


def _exported_programs(program: StepProgram, phases: list[tuple[int, ...]] | None, seq_len: int):
    args = example_inputs(program, seq_len)
    eps = {}
    with torch.no_grad():
        for k, layers in enumerate(phases or [None]):
            name = method_name(None if phases is None else k)
            eps[name] = torch.export.export(TrainMethod(program, layers), args, strict=False)
    return eps


def export_executorch(program: StepProgram, phases: list[tuple[int, ...]] | None, seq_len: int, out_dir: Path, *,
                      xnnpack: bool = False, on_stage=None) -> TargetArtifact:
    """Export all methods into one `out_dir/model.pte` (the caller handles atomicity of the directory).

    Args:
        phases: LCSB phases (layers backpropagated by each phase method); None: one full-backprop method.
        xnnpack: delegate attention's activation matmuls to XNNPACK (see below why not more).
        on_stage: optional callback(stage_name) for progress reporting.
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    note = on_stage or (lambda _s: None)
    note("torch.export")
    eps = _exported_programs(program, phases, seq_len)
    partitioner = None
    if xnnpack:
        # Only activation x activation matmuls (attention's bmm), one op per partition. Matmuls with a
        # frozen weight stay on the portable kernels: XNNPACK would pack (copy) constant weights into
        # its own heap buffers, defeating the memory-mapped weights phones rely on; and grouping the
        # whole training graph into large partitions takes the partitioner many minutes.
        from executorch.backends.xnnpack.partition.config.generic_node_configs import BMMConfig
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = {name: [XnnpackPartitioner(configs=[BMMConfig], per_op_mode=True)] for name in eps}
    note("to_edge" + (" + XNNPACK" if xnnpack else ""))
    edge = to_edge_transform_and_lower(eps, partitioner=partitioner,
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    note("to_executorch")
    # Inputs (the app's state slices, ids, labels) are not planned: the app's memory is used as is.
    et = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False)))
    note("write .pte")
    (Path(out_dir) / PTE_NAME).write_bytes(et.buffer)
    methods = {}
    for plan in et.executorch_program.execution_plan:
        # non_const_buffer_sizes[0] is reserved; [1] is the arena (activations and outputs).
        sizes = list(plan.non_const_buffer_sizes)
        methods[plan.name] = int(sum(sizes[1:]))
    return TargetArtifact("executorch", PTE_NAME, planned_arena_bytes=methods, delegate="xnnpack" if xnnpack else None)
