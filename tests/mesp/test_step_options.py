"""StepOptions: bad chunk sizes are the user's error (BadInput); `chunk_overrides` maps command-line values."""

from __future__ import annotations

import pytest

from toolchain.errors import BadInput
from toolchain.mesp import StepOptions, chunk_overrides


@pytest.mark.parametrize("kwargs, field", [({"loss_chunk": 0}, "loss_chunk"), ({"vocab_chunk": 0}, "vocab_chunk"),
                                           ({"mlp_chunk": -1}, "mlp_chunk")])
def test_bad_chunk_sizes_are_bad_input(kwargs, field):
    with pytest.raises(BadInput, match=f"`{field}` must be >= 1"):
        StepOptions(**kwargs)


def test_chunk_overrides_leave_unset_fields_out_and_zero_turns_chunking_off():
    assert chunk_overrides() == {}
    assert chunk_overrides(loss_chunk=32, vocab_chunk=0, mlp_chunk=64) == {"loss_chunk": 32, "vocab_chunk": None,
                                                                          "mlp_chunk": 64}
    assert StepOptions(**chunk_overrides(mlp_chunk=0)) == StepOptions(mlp_chunk=None)
