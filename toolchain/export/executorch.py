"""ExecuTorch target: `StepProgram` -> `.pte` (torch.export -> exir edge -> [XNNPACK] -> executorch).

Every method is exported from a thin wrapper around the same `StepProgram`, so buffers have the same
fully-qualified names in every method: `MemoryPlanningPass(share_mutable_buffers=True)` then gives
the LoRA/optimizer state one allocation all methods read and write (checked on the runtime), and
frozen weights are serialized once in the constant segment (memory-mapped by `Module`'s MMAP load
mode on phones). `InitializedMutableBufferPass` serializes the initial adapter (buffer placeholder
names are `b_program_lora_...`, `b_program_adam_...`; the patterns below match them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from toolchain.export.program import StepProgram, method_name

__all__ = ["ExecutorchArtifact", "export_executorch", "STATE_BUFFER_PATTERNS"]

STATE_BUFFER_PATTERNS = ["program_lora_", "program_adam_"]


class _TrainMethod(nn.Module):
    def __init__(self, program: StepProgram, phase_layers: tuple[int, ...] | None) -> None:
        super().__init__()
        self.program, self.phase_layers = program, phase_layers

    def forward(self, input_ids, labels, lr):
        return (self.program.train_step(input_ids, labels, lr, self.phase_layers),)


class _GetState(nn.Module):
    def __init__(self, program: StepProgram) -> None:
        super().__init__()
        self.program = program

    def forward(self):
        return (self.program.get_state(),)


class _SetState(nn.Module):
    def __init__(self, program: StepProgram) -> None:
        super().__init__()
        self.program = program

    def forward(self, state):
        return (self.program.set_state(state),)


@dataclass(frozen=True)
class ExecutorchArtifact:
    path: Path
    methods: dict[str, dict]       # name -> {"planned_arena_bytes": int, "inputs": [...], "outputs": [...]}
    constant_bytes: int
    delegated: bool


def _exported_programs(program: StepProgram, phases: list[tuple[int, ...]] | None, seq_len: int):
    ids = torch.zeros(seq_len, dtype=torch.int64)
    lr = torch.full((1,), 1e-4, dtype=torch.float32)
    state_numel = sum(e.numel for e in program.layout)
    eps = {}
    with torch.no_grad():
        for k, layers in enumerate(phases or [None]):
            name = method_name(None if phases is None else k)
            eps[name] = torch.export.export(_TrainMethod(program, layers), (ids, ids.clone(), lr), strict=False)
        eps["get_state"] = torch.export.export(_GetState(program), (), strict=False)
        eps["set_state"] = torch.export.export(_SetState(program), (torch.zeros(state_numel),), strict=False)
    return eps


def export_executorch(program: StepProgram, phases: list[tuple[int, ...]] | None, seq_len: int, path: Path, *,
                      xnnpack: bool = False, on_stage=None) -> ExecutorchArtifact:
    """Export all methods into one `.pte` at `path` (the caller handles atomicity of the directory).

    Args:
        phases: LCSB phases (layers backpropagated by each phase method); None: one full-backprop method.
        xnnpack: delegate attention's activation matmuls to XNNPACK (see below why not more).
        on_stage: optional callback(stage_name) for progress reporting.
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

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

        partitioner = {name: ([XnnpackPartitioner(configs=[BMMConfig], per_op_mode=True)]
                              if name.startswith("train_step") else []) for name in eps}
    note("to_edge" + (" + XNNPACK" if xnnpack else ""))
    edge = to_edge_transform_and_lower(eps, partitioner=partitioner,
                                       compile_config=EdgeCompileConfig(_check_ir_validity=False))
    note("to_executorch")
    et = edge.to_executorch(ExecutorchBackendConfig(
        passes=[InitializedMutableBufferPass(STATE_BUFFER_PATTERNS)],
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, share_mutable_buffers=True),
        emit_mutable_buffer_names=True,
    ))
    note("write .pte")
    path.write_bytes(et.buffer)
    methods = {}
    for plan in et.executorch_program.execution_plan:
        # non_const_buffer_sizes[0] is reserved; [1] is the activation arena, [2] the shared state.
        sizes = list(plan.non_const_buffer_sizes)
        methods[plan.name] = {"planned_arena_bytes": int(sizes[1]) if len(sizes) > 1 else 0,
                              "state_arena_bytes": int(sizes[2]) if len(sizes) > 2 else 0}
    constant_bytes = sum(len(seg.data) if hasattr(seg, "data") else 0 for seg in getattr(et.executorch_program, "constant_buffer", []))
    return ExecutorchArtifact(path, methods, constant_bytes, xnnpack)
