"""The XNNPACK lowering patch of export/executorch.py (`_no_relegalizing_single_op_partitions`): it refuses an
ExecuTorch whose create_submodule_from_nodes changed, and it really skips the whole-graph re-sort for one-op
partitions (so an upgrade that breaks it fails here instead of silently slowing export)."""

from __future__ import annotations

import pytest

pytest.importorskip("executorch")

from executorch.exir import lowered_backend_module  # noqa: E402
from executorch.exir.backend import backend_api  # noqa: E402

from toolchain.export.executorch import (_no_relegalizing_single_op_partitions, check_replaced_signature,  # noqa: E402
                                         export_executorch)
from toolchain.lora import LoraConfig  # noqa: E402
from toolchain.models import ModelArch  # noqa: E402
from toolchain.program.spec import ProgramSpec  # noqa: E402

ARCH = ModelArch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)


def test_the_installed_executorch_has_the_replaced_signature():
    check_replaced_signature(backend_api.create_submodule_from_nodes)


def test_another_signature_is_a_clear_error(monkeypatch):
    def changed(gm, node_list, tag, *, skip_legalize_graph=False, keep_meta=True):
        raise AssertionError("never called")

    monkeypatch.setattr(backend_api, "create_submodule_from_nodes", changed)
    with pytest.raises(RuntimeError, match="is not the .*skip_legalize_graph=False.* update "
                                           "_no_relegalizing_single_op_partitions"):
        with _no_relegalizing_single_op_partitions():
            pass
    assert backend_api.create_submodule_from_nodes is changed     # nothing left patched


def test_one_op_partitions_skip_the_whole_graph_resort(monkeypatch, tmp_path):
    """Count the partitions by size and the legalize_graph calls during a real lowering: one call per
    multi-node partition, none for the one-op ones (and there are one-op ones)."""
    sizes, resorts = [], []
    real_create, real_legalize = backend_api.create_submodule_from_nodes, lowered_backend_module.legalize_graph

    def create(gm, node_list, tag, skip_legalize_graph: bool = False):
        sizes.append(len(node_list))
        return real_create(gm, node_list, tag, skip_legalize_graph=skip_legalize_graph)

    def legalize(gm):
        resorts.append(gm)
        return real_legalize(gm)

    monkeypatch.setattr(backend_api, "create_submodule_from_nodes", create)
    monkeypatch.setattr(lowered_backend_module, "legalize_graph", legalize)
    monkeypatch.setattr("toolchain.export.executorch.XNNPACK_MIN_FLOPS", 0.0)   # delegate every weight matmul
    spec = ProgramSpec(ARCH, LoraConfig(rank=2, alpha=4, targets=("q_proj", "down_proj")), 16)
    export_executorch(spec, tmp_path, xnnpack=True)
    assert sizes.count(1) > 0, sizes
    assert len(resorts) == sum(1 for n in sizes if n > 1), (len(resorts), sizes)
    assert backend_api.create_submodule_from_nodes is create      # the patch restored what it found
