"""LoRA configuration: which projections get adapters, their rank and scale."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolchain.errors import BadInput
from toolchain.models.keys import LINEAR_TARGETS

__all__ = ["LoraConfig", "parse_targets", "ALL_TARGETS"]

ALL_TARGETS = LINEAR_TARGETS


@dataclass(frozen=True)
class LoraConfig:
    """LoRA on a subset of the seven Qwen2 projections: y = W0 x + scale * B (A x).

    Args:
        rank: r, the inner dimension. Default: 8.
        alpha: scale = alpha / rank (PEFT's default), or alpha / sqrt(rank) with `use_rslora`.
            Default: 16.
        targets: projection names, kept in block order. Default: all seven.
        use_rslora: rank-stabilized scale (PEFT `use_rslora`). Default: False.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = field(default=ALL_TARGETS)
    use_rslora: bool = False

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise BadInput(f"`rank` must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise BadInput(f"`alpha` must be > 0, got {self.alpha}")
        unknown = [t for t in self.targets if t not in ALL_TARGETS]
        if unknown:
            raise BadInput(f"unknown LoRA target(s) {', '.join(unknown)}; choose from {','.join(ALL_TARGETS)}")
        if not self.targets:
            raise BadInput("`targets` must name at least one projection")
        # Normalize to block order without duplicates (a frozen dataclass: set via object.__setattr__).
        object.__setattr__(self, "targets", tuple(t for t in ALL_TARGETS if t in self.targets))

    @property
    def scale(self) -> float:
        return self.alpha / (self.rank ** 0.5 if self.use_rslora else self.rank)


def parse_targets(text: str) -> tuple[str, ...]:
    """Parse `--targets q_proj,v_proj` (or `all`)."""
    if text.strip() == "all":
        return ALL_TARGETS
    return tuple(t.strip() for t in text.split(",") if t.strip())
