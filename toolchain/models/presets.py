"""Every family's presets in one table (`PRESETS`: the names `--model` takes), and where their pretrained
weights live on the Hub. The architectures themselves are defined in toolchain/models/<family>/."""

from __future__ import annotations

from toolchain.errors import BadInput
from toolchain.models import llama, qwen2, qwen3
from toolchain.models.arch import ModelArch

__all__ = ["PRESETS", "HF_REPO_IDS", "get_preset"]

PRESETS: dict[str, ModelArch] = {**qwen2.PRESETS, **qwen3.PRESETS, **llama.PRESETS}

# Where real weights of each preset live on the Hugging Face Hub (resolved from the local cache only).
HF_REPO_IDS: dict[str, str] = {**qwen2.HF_REPO_IDS, **qwen3.HF_REPO_IDS, **llama.HF_REPO_IDS}


def get_preset(name: str) -> ModelArch:
    """Look up a preset by name.

    Raises:
        BadInput: the name is not a preset.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise BadInput(f"unknown preset {name!r}; choose {', '.join(PRESETS)} or pass a checkpoint directory") from None
