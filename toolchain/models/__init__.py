"""Qwen2.5 architectures, Hugging Face key maps and weight loading."""

from toolchain.models.load import load_model, random_weights, state_dict_from_weights, weights_from_state_dict
from toolchain.models.presets import PRESETS, Qwen25Arch, get_preset
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["PRESETS", "Qwen25Arch", "get_preset", "LayerWeights", "ModelWeights", "load_model",
           "random_weights", "state_dict_from_weights", "weights_from_state_dict"]
