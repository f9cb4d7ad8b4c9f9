"""ExecuTorch target: the methods -> one `.pte` (torch.export -> exir edge -> executorch).

No method holds a weight: frozen tensors and the LoRA state are method inputs (the app passes views
of its memory-mapped weights file and of its state array), so the program is small and its export
time does not depend on the layer count. Op choices that matter on this runtime (measured, see
docs/export.md): `aten.linear` is preserved through `to_edge` (its optimized kernel reads the weight
in place; decomposed, it becomes `permute_copy(W)` + mm), and inputs are not memory-planned
(`alloc_graph_input=False`: the app's buffers are used as they are).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from pathlib import Path

import torch

from toolchain.contract import GENERATION_ROLES
from toolchain.export.bodies import example_inputs, method_module
from toolchain.program.artifact import TargetArtifact
from toolchain.program.spec import ProgramSpec, method_specs

__all__ = ["export_executorch", "PTE_NAME", "quiet_logger"]

PTE_NAME = "model.pte"


def exported_methods(spec: ProgramSpec, weights_file: Path | None = None) -> dict:
    """`torch.export` of every method (no gradients: the backward is explicit). The XNNPACK generation variant's
    methods hold their weights: they are read from `weights_file` (the program's, written before)."""
    # defines quantized_decomposed::embedding_4bit (int4 dequantization, `method_module(executorch=True)`)
    import executorch.exir.passes._quant_patterns_and_replacements  # noqa: F401

    from toolchain.export.xnnpack_generation import xnnpack_method_module

    eps = {}
    weights = None
    with torch.no_grad():
        for name, method in method_specs(spec).items():
            if method.variant is not None:
                if weights is None:
                    from toolchain.program.weights_file import map_weights

                    weights = map_weights(weights_file)
                module = xnnpack_method_module(spec, method, weights)
            else:
                module = method_module(spec, name, executorch=True)
            eps[name] = torch.export.export(module, example_inputs(method), strict=False)
            # The tracing inputs are zeros of every input at full size, the frozen weights' included (one layer,
            # or the whole int4 embedding / head): 2.77 GiB over Qwen2.5-7B's 12 methods, which the
            # ExportedProgram would keep (and to_edge / to_backend pass along) until the .pte is written. Nothing
            # after tracing reads them (the setter allows None), so each method's are freed here.
            eps[name].example_inputs = None
            del module
    return eps


# XNNPACK takes a matmul only if it multiplies by a frozen weight (a weight input of the method, or a
# chunk dequantized from one), costs at least this many FLOPs, and its weight operand packs into at most
# XNNPACK_MAX_PACKED_BYTES. Every delegate adds lowering time and a per-call packing; the LoRA products and
# attention's per-head [T, T] matmuls (activation x activation) gain little and stay on ExecuTorch's
# kernels whatever T is (at T = 1024 one head's scores cross any fixed FLOP threshold). XNNPACK packs
# runtime weights per call into one shared workspace (anonymous memory) the size of the largest packed
# operand: a whole-vocabulary LM head ([V, d] fp32, 545 MB at 0.5B) must never be packed.
# Measured on the Qwen2.5-0.5B int4 methods: see docs/export.md.
# The generation methods are not delegated at all: at one token no matmul reaches the threshold, and the
# stock block_prefill (C = 32 rows) delegated its dequantized-chunk matmuls with a 17.6 MB arena at
# Qwen2.5-0.5B, which the host bindings' one shared arena then charged to training too (the fused methods
# are the fast path; the stock ones only have to run).
XNNPACK_MIN_FLOPS = 16e6
XNNPACK_MAX_PACKED_BYTES = 16 << 20

# Besides the weight matmuls, XNNPACK takes these single ops when their output has at least
# XNNPACK_MIN_ELEMENTS elements: ExecuTorch's portable kernels for them are scalar loops (std::exp per
# element, an index computation per element of a permute), XNNPACK's are vectorized. Measured on the
# Qwen2.5-0.5B int4 step (ETDump, scripts/profile_step.py, docs/benchmarks.md, CHANGELOG.md 2026-12-02): attention's
# softmax over [T, T] scores, SwiGLU's sigmoid, the transposes ExecuTorch materializes (`permute_copy`:
# heads <-> rows, the MLP chunks' dg^T, du^T). Every delegate costs ~1.7 KB resident from the method's
# load on (XNNPACK's runtime and operator objects; CHANGELOG.md 2026-12-03), so `exp` (the online
# softmax's over [T, V_chunk] logits: 148 head chunks, ~0.19 s of a 12.4 s step) is left to ExecuTorch:
# the least time per delegate of the four. Op names are the edge dialect's targets
# (`exir_ops.edge.aten.<name>`); `xnnpack_partitioner` also knows `exp.default`.
XNNPACK_ELEMENTWISE_OPS = ("_softmax.default", "sigmoid.default", "permute_copy.default")
XNNPACK_MIN_ELEMENTS = 1 << 14


def _matmul_flops(node) -> float:
    """FLOPs of a linear / mm / bmm node from its argument shapes (0 for anything else)."""
    name = str(node.target)
    if node.op != "call_function" or not any(k in name for k in ("linear", "mm")):
        return 0.0
    try:
        a, b = (arg.meta["val"].shape for arg in node.args[:2])
    except (AttributeError, KeyError, ValueError):
        return 0.0
    if "linear" in name:                       # x [..., K] @ W [N, K]^T
        m = 1
        for d in a[:-1]:
            m *= d
        return 2.0 * m * a[-1] * b[0]
    if "bmm" in name:                          # [B, M, K] @ [B, K, N]
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    if "mm" in name:                           # [M, K] @ [K, N]
        return 2.0 * a[0] * a[1] * b[1]
    return 0.0


def weight_derived(graph, weight_inputs: set[str], user_inputs: set[str]) -> set:
    """Nodes computed from frozen weights (and constants) alone: the weight placeholders and every node
    whose inputs are all weight-derived or constant, at least one weight-derived (views and dequantization
    chunks of a weight; `- 8` and `// 16` lift their scalars to constant placeholders; a node without
    inputs, such as the `arange` row indices of `embedding_4bit`, is a constant)."""
    derived, const = set(), set()
    for n in graph.nodes:
        if n.op == "placeholder":
            if n.name in weight_inputs:
                derived.add(n)
            elif n.name not in user_inputs:
                const.add(n)
        elif n.op == "get_attr":
            const.add(n)
        elif n.op == "call_function" and not n.all_input_nodes:
            const.add(n)
        elif n.op == "call_function":
            ins = n.all_input_nodes
            if all(a in const for a in ins):
                const.add(n)
            elif all(a in derived or a in const for a in ins):
                derived.add(n)
    return derived


def _weight_operand(node, derived: set):
    """The frozen-weight operand of a matmul node (None if it has none): linear's W, or either side of mm."""
    name = str(node.target)
    if "bmm" in name or not ("linear" in name or "mm" in name):
        return None
    args = node.args[1:2] if "linear" in name else node.args[:2]
    for a in args:
        if a in derived:
            return a
    return None


def _packed_bytes(arg) -> int:
    try:
        return int(arg.meta["val"].numel()) * 4
    except (AttributeError, KeyError):
        return 0


def _elements(node) -> int:
    try:
        return int(node.meta["val"].numel())
    except (AttributeError, KeyError):
        return 0


def _target_name(node) -> str:
    """`exir_ops.edge.aten.exp.default` -> "exp.default" ("" for anything but an ATen op call)."""
    if node.op != "call_function":
        return ""
    target = node.target
    op = target._op if type(target).__name__ == "EdgeOpOverload" else target   # else an ATen OpOverload
    return str(op).removeprefix("aten.")


def xnnpack_partitioner(weight_inputs: set[str], min_flops: float | None = None,
                        max_packed_bytes: int = XNNPACK_MAX_PACKED_BYTES, elementwise_ops: tuple[str, ...] | None = None,
                        min_elements: int | None = None):
    """XNNPACK for the large weight matmuls (see XNNPACK_MIN_FLOPS) and the large elementwise ops of
    XNNPACK_ELEMENTWISE_OPS, one op per delegate, weights taken as runtime tensors
    (`force_non_static_weights_for_f32_linear`: they are method inputs or in-graph dequantized chunks).
    XNNPACK then packs each weight per call into one workspace shared by all delegates instead of packing
    constants into its heap at load. Larger partitions fail on training graphs ("Invalid partition, found
    dependency cycles").

    Args:
        weight_inputs: names of the method's placeholders that are frozen weights (bind "weight").
        min_flops: None: XNNPACK_MIN_FLOPS (read at call time).
        elementwise_ops, min_elements: None: XNNPACK_ELEMENTWISE_OPS, XNNPACK_MIN_ELEMENTS (read at call
            time); () delegates the weight matmuls only.
    """
    from executorch.backends.xnnpack.partition.config.gemm_configs import LinearConfig, MMConfig
    from executorch.backends.xnnpack.partition.config.generic_node_configs import (ExpConfig, PermuteConfig,
                                                                                   SigmoidConfig, SoftmaxConfig)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    ops = XNNPACK_ELEMENTWISE_OPS if elementwise_ops is None else elementwise_ops
    configs = {"_softmax.default": SoftmaxConfig, "sigmoid.default": SigmoidConfig,
               "permute_copy.default": PermuteConfig, "exp.default": ExpConfig}
    unknown = set(ops) - set(configs)
    if unknown:
        raise ValueError(f"no XNNPACK config for {', '.join(sorted(unknown))} here; known: {', '.join(configs)}")

    class LargeOpPartitioner(XnnpackPartitioner):
        def generate_partitions(self, ep):
            derived = weight_derived(ep.graph, weight_inputs, set(ep.graph_signature.user_inputs))
            least = XNNPACK_MIN_FLOPS if min_flops is None else min_flops
            fewest = XNNPACK_MIN_ELEMENTS if min_elements is None else min_elements

            def wanted(p) -> bool:
                mats = [n for n in p.nodes if _matmul_flops(n) > 0]
                if not mats:
                    calls = [n for n in p.nodes if n.op == "call_function"]
                    return (len(calls) == 1 and _target_name(calls[0]) in ops
                            and _elements(calls[0]) >= fewest)
                if len(mats) != 1:
                    return False
                w = _weight_operand(mats[0], derived)
                return (w is not None and _matmul_flops(mats[0]) >= least
                        and _packed_bytes(w) <= max_packed_bytes)

            return [p for p in super().generate_partitions(ep) if wanted(p)]

    return LargeOpPartitioner(configs=[LinearConfig, MMConfig] + [configs[o] for o in ops], per_op_mode=True,
                              force_non_static_weights_for_f32_linear=True)


def _weight_placeholders(ep, method) -> set[str]:
    """Placeholder names of a method's frozen-weight inputs (user inputs are in the MethodSpec's order)."""
    names = list(ep.graph_signature.user_inputs)
    if len(names) != len(method.inputs):
        raise AssertionError(f"{method.name}: {len(names)} graph inputs for {len(method.inputs)} declared")
    return {n for n, io in zip(names, method.inputs) if io.bind == "weight"}


@contextlib.contextmanager
def quiet_logger(logger_name: str):
    """Silence one library logger (XNNPACK's partitioner warns that to_edge + to_backend is deprecated in
    favour of to_edge_transform_and_lower, which we cannot use: see export_executorch)."""
    log = logging.getLogger(logger_name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# The signature `_no_relegalizing_single_op_partitions` wraps (executorch 1.5.1, exir/lowered_backend_module.py).
REPLACED_PARAMETERS = (("gm", inspect.Parameter.empty), ("node_list", inspect.Parameter.empty),
                       ("tag", inspect.Parameter.empty), ("skip_legalize_graph", False))


def check_replaced_signature(fn) -> None:
    """Raise RuntimeError unless `fn` takes (gm, node_list, tag, skip_legalize_graph=False), as the patch expects."""
    got = tuple((p.name, p.default) for p in inspect.signature(fn).parameters.values())
    if got != REPLACED_PARAMETERS:
        want = ", ".join(n if d is inspect.Parameter.empty else f"{n}={d}" for n, d in REPLACED_PARAMETERS)
        raise RuntimeError(f"executorch's {fn.__module__}.{fn.__qualname__}{inspect.signature(fn)} is not the "
                           f"({want}) that toolchain/export/executorch.py's lowering patch replaces: update "
                           f"_no_relegalizing_single_op_partitions for this ExecuTorch version")


@contextlib.contextmanager
def _no_relegalizing_single_op_partitions():
    """ExecuTorch re-sorts ("legalizes") the whole graph after fusing each partition into a delegate
    (exir/lowered_backend_module.py: create_submodule_from_nodes), which copies every node and regenerates
    the graph's Python code: O(nodes) per delegate, so a method's lowering costs O(nodes x delegates)
    (a 3B block_backward: ~400 delegates in a graph of thousands of nodes). A one-op partition fused in
    place leaves the graph topologically ordered (the call takes the op's position; its inputs are
    before it, its users after), so the pass is skipped for those; `keep_original_order` re-sorts and
    lints each lowered graph once afterwards. Multi-node partitions still get ExecuTorch's pass.

    Raises:
        RuntimeError: this ExecuTorch's create_submodule_from_nodes is not the function the patch replaces
            (`check_replaced_signature`): an upgrade must update the patch, not silently slow export.
    """
    from executorch.exir.backend import backend_api

    original = backend_api.create_submodule_from_nodes
    check_replaced_signature(original)

    def create(gm, node_list, tag, skip_legalize_graph: bool = False):
        return original(gm, node_list, tag, skip_legalize_graph=skip_legalize_graph or len(node_list) == 1)

    backend_api.create_submodule_from_nodes = create
    try:
        yield
    finally:
        backend_api.create_submodule_from_nodes = original


def _node_order(graph) -> dict[str, int]:
    return {n.name: i for i, n in enumerate(graph.nodes)}


def keep_original_order(gm, order: dict[str, int]) -> None:
    """Re-sort a lowered graph so that it runs in the order the step was written (the memory plan).

    Delegation re-sorts the graph topologically, which can run every ready node early: all LM-head
    chunks' logits, say, would be computed before the first is consumed, and memory planning then keeps
    them all live (measured on a 0.5B-width program: head_loss arena 9 -> 314 MB). Here every node keeps
    its position in the edge (pre-lowering) graph; a node lowering created (a delegate call, its
    getitems) runs just before its first user, so its output lives no longer than in the
    original graph. List scheduling: among the nodes whose inputs are ready, the smallest position runs
    next.
    """
    import heapq

    graph = gm.graph
    nodes = list(graph.nodes)
    pos: dict = {}

    def position(n) -> float:
        if n not in pos:
            if n.name in order:
                pos[n] = float(order[n.name])
            else:
                users = [position(u) for u in n.users]
                pos[n] = (min(users) - 0.5) if users else float(len(order))
        return pos[n]

    fixed = [n for n in nodes if n.op in ("placeholder", "get_attr")]
    movable = [n for n in nodes if n.op not in ("placeholder", "get_attr", "output")]
    movable_set = set(movable)
    waiting = {n: sum(1 for a in n.all_input_nodes if a in movable_set) for n in movable}
    ready = [(position(n), i, n) for i, n in enumerate(movable) if waiting[n] == 0]
    heapq.heapify(ready)
    index = {n: i for i, n in enumerate(movable)}
    scheduled = []
    while ready:
        _, _, n = heapq.heappop(ready)
        scheduled.append(n)
        for u in n.users:
            if u in waiting:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (position(u), index[u], u))
    assert len(scheduled) == len(movable), "graph has a cycle"
    prev = fixed[-1] if fixed else None
    for n in scheduled:
        if prev is None:
            nodes[0].prepend(n)
        else:
            prev.append(n)
        prev = n
    graph.lint()
    gm.recompile()


def export_executorch(spec: ProgramSpec, out_dir: Path, *, on_stage=None, xnnpack: bool = True) -> TargetArtifact:
    """Export every method into `out_dir/model.pte` (the caller handles atomicity of the directory).

    Args:
        xnnpack: delegate the matmuls to XNNPACK (see `xnnpack_partitioner`); else ExecuTorch's
            optimized kernels (single-threaded Eigen gemm).
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    from toolchain.contract import WEIGHTS_NAME

    note = on_stage or (lambda _s: None)
    note("torch.export")
    eps = exported_methods(spec, Path(out_dir) / WEIGHTS_NAME)
    note("to_edge")
    edge = to_edge(eps, compile_config=EdgeCompileConfig(_check_ir_validity=False,
                                                         preserve_ops=[torch.ops.aten.linear.default]))
    methods = method_specs(spec)
    training = [name for name in eps if methods[name].role not in GENERATION_ROLES]
    variant = [name for name in eps if methods[name].variant is not None]
    if variant:
        # the XNNPACK generation variant: each method delegated as a whole (its int8 x int4 linears, and what
        # else XNNPACK takes); the partitioner's defaults, as export_llama's
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        note("XNNPACK generation")
        with quiet_logger("executorch.backends.xnnpack.partition.xnnpack_partitioner"):
            edge = edge.to_backend({name: XnnpackPartitioner() for name in variant})
    if xnnpack:
        # to_edge, then to_backend (not to_edge_transform_and_lower): the edge graph's node order is the one
        # to restore after lowering (the torch.export graph's names do not survive decomposition: restoring
        # from them left a 0.5B-width block_backward arena at 76 MB instead of 20 MB).
        note("XNNPACK")
        order = {name: _node_order(edge.exported_program(name).graph) for name in eps}
        with quiet_logger("executorch.backends.xnnpack.partition.xnnpack_partitioner"), \
                _no_relegalizing_single_op_partitions():
            edge = edge.to_backend({name: xnnpack_partitioner(_weight_placeholders(edge.exported_program(name),
                                                                                   methods[name]))
                                    for name in training})
        for name in training:
            keep_original_order(edge.exported_program(name).graph_module, order[name])
    note("to_executorch")
    et = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False)))
    note("write .pte")
    (Path(out_dir) / PTE_NAME).write_bytes(et.buffer)
    planned = {}
    for plan in et.executorch_program.execution_plan:
        # non_const_buffer_sizes[0] is reserved; [1] is the arena (activations and outputs).
        planned[plan.name] = int(sum(list(plan.non_const_buffer_sizes)[1:]))
    return TargetArtifact("executorch", PTE_NAME, planned_arena_bytes=planned, delegate="xnnpack" if xnnpack else None)
