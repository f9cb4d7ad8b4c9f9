"""The app's flat float32 state as the manifest lays it out: one `StateEntry` per tensor (LoRA A/B per layer and
target, then the optimizer's moments in the same order, then the AdamW step counter), and the names they have.

program/spec.py computes the layout of a config (`state_layout`); this module is its description.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["StateEntry", "STATE_ROLE_PREFIX", "STEP_ENTRY", "state_name"]

# Entry name prefix per role: lora_3_q_proj_a, adam_m_3_q_proj_a, adam_v_3_q_proj_a.
STATE_ROLE_PREFIX = {"param": "lora", "exp_avg": "adam_m", "exp_avg_sq": "adam_v"}
STEP_ENTRY = "adam_step"  # the AdamW step counter's entry (the manifest's state.step_entry)


def state_name(role: str, layer: int | str, target: str, which: str) -> str:
    """The entry name of one LoRA tensor (`which` a or b) of `role` at `layer` (an index, or `{layer}`)."""
    return f"{STATE_ROLE_PREFIX[role]}_{layer}_{target}_{which}"


@dataclass(frozen=True)
class StateEntry:
    """One tensor of the flat state vector."""

    name: str            # e.g. lora_3_q_proj_a
    key: str             # PEFT key of the parameter it belongs to (moments too)
    role: Literal["param", "exp_avg", "exp_avg_sq", "step"]
    shape: tuple[int, ...]
    offset: int          # in elements
    layer: int | None = None  # the decoder layer it belongs to (None: the AdamW step counter)
    numel: int = field(init=False)

    def __post_init__(self) -> None:
        n = 1
        for s in self.shape:
            n *= s
        object.__setattr__(self, "numel", n)

    def to_json(self) -> dict:
        return {"name": self.name, "key": self.key, "role": self.role, "shape": list(self.shape), "offset": self.offset,
                **({"layer": self.layer} if self.layer is not None else {})}

    @classmethod
    def from_json(cls, d: dict) -> StateEntry:
        return cls(d["name"], d["key"], d["role"], tuple(d["shape"]), d["offset"], d.get("layer"))
