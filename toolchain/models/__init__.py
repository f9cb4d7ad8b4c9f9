"""Model families (toolchain/models/<family>/: qwen2, qwen3, llama), their architectures (`ModelArch`),
Hugging Face key maps and weight loading."""

from toolchain.models.arch import FAMILY_NAMES, ModelArch, RopeScaling
from toolchain.models.load import load_model, random_weights, state_dict_from_weights, weights_from_state_dict
from toolchain.models.presets import PRESETS, get_preset
from toolchain.models.weights import LayerWeights, ModelWeights

__all__ = ["FAMILY_NAMES", "PRESETS", "ModelArch", "RopeScaling", "get_preset", "LayerWeights", "ModelWeights",
           "load_model", "random_weights", "state_dict_from_weights", "weights_from_state_dict"]
