"""LoRA configuration, adapter tensors, and PEFT-format adapter files."""

from toolchain.lora.config import ALL_TARGETS, LoraConfig, parse_targets
from toolchain.lora.peft_io import load_adapter, lora_from_state_dict, lora_state_dict, peft_key, save_adapter
from toolchain.lora.weights import LoraPair, LoraWeights, init_lora, lora_num_params

__all__ = ["ALL_TARGETS", "LoraConfig", "parse_targets", "LoraPair", "LoraWeights", "init_lora", "lora_num_params",
           "load_adapter", "save_adapter", "lora_state_dict", "lora_from_state_dict", "peft_key"]
