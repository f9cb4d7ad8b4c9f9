"""The run defaults `toolchain export` records in the manifest (`defaults`: lr, steps) for the apps and
`toolchain train --program` when the user chooses nothing: one source, chosen by measurement.

Measured with scripts/bench_app_defaults.sh on the bundled demo model (4 layers, byte tokenizer, seq 128, fp32; the
bundled user text, 59 training rows, 8 held out; docs/android.md "Defaults" has the table, the generated text and the
commit): SGD's held-out loss moves with lr; at 1e-4 (the old default, the MeSP paper's benchmark lr) 100 steps change
nothing visible. The optimizer default stays SGD (`toolchain export --optimizer`): it keeps no moments, the memory
headline (AdamW adds 2 x 17.6 MB of state at Qwen2.5-0.5B r8 x 7); its lr default is the largest measured that
trains stably, and AdamW's the demo's.
"""

from __future__ import annotations

__all__ = ["DEFAULT_LR", "DEFAULT_STEPS", "default_lr"]

# optimizer kind -> the lr recorded when --lr is not given
DEFAULT_LR = {"sgd": 1e-1, "adamw": 3e-3}
# the steps of a run when the user chooses none (the apps' step field, `toolchain train --program --steps`)
DEFAULT_STEPS = 200


def default_lr(optimizer: str) -> float:
    """The recorded lr of an `optimizer` ("sgd" or "adamw") program when --lr is not given."""
    return DEFAULT_LR[optimizer]
