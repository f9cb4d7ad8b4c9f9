"""The generation methods converted to Core ML: package I/O as the manifest says, MIL ops within the
expected set, and their MIL graphs evaluated op by op equal to the eager methods (test_coreml.py's
checker; the Core ML runtime itself needs macOS)."""

from __future__ import annotations

import pytest

pytest.importorskip("coremltools")

from test_coreml import ARCH, CFG, OPTIONS, T, _check_method, _load  # noqa: E402

from toolchain.contract import GENERATION_ROLES  # noqa: E402
from toolchain.export.coreml import EXPECTED_OPS, _convert, mil_op_histogram  # noqa: E402
from toolchain.program.spec import ProgramSpec, QuantSpec, method_specs  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["none", "int4"])
def test_generation_methods_convert_and_match(tmp_path, quant, monkeypatch):
    import test_coreml

    # head_logits takes the head's chunks only (no whole `head` to slice them from): independent random chunks
    monkeypatch.setattr(test_coreml, "_head_chunks_consistent", lambda method, inputs: None)
    spec = ProgramSpec(ARCH, CFG, T, quant=QuantSpec(quant, 16), options=OPTIONS, generation=True)
    for k, name in enumerate(GENERATION_ROLES):
        model = _convert(spec, method_specs(spec)[name])
        assert set(mil_op_histogram(model._mil_program)) <= EXPECTED_OPS, name
        model.save(str(tmp_path / f"{name}.mlpackage"))
        mspec, prog = _load(tmp_path / f"{name}.mlpackage")
        assert [f.name for f in mspec.description.input] == [io.name for io in method_specs(spec)[name].inputs]
        _check_method(spec, name, prog.functions["main"], seed=60 + k)
