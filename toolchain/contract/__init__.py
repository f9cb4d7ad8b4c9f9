"""The program directory contract between the toolchain and the apps: file names, method and state specs, the
typed manifest (parsed and validated once, here), the chat template. The bottom layer every reader shares:
`export/` writes it; `runtime/`, `memory/`, `tokenizer.py`, `text_data.py`, the demo and the CLI read it."""

from toolchain.contract.chat import ASSISTANT_HEADER, CHAT_ROLES, ENDOFTEXT, IM_END, IM_START, QWEN_ENDOFTEXT_ID
from toolchain.contract.files import (ADAPTER_INIT_DIR, INT4_PACKING, LAYER, MANIFEST_NAME, MANIFEST_SCHEMA_VERSION,
                                      STATE_INIT_NAME, TOKENIZER_NAME, WEIGHTS_NAME, PROBE_NAME, sha256_file)
from toolchain.contract.manifest import (AdapterSection, DefaultsSection, FusedSection, XnnpackSection, GenerateSection, LcsbSection, LoopSection,
                                         LoraSection, Manifest, MemoryPlan, ModelSection, OptimizerSection,
                                         OptionsSection, ProgramEntry, QuantSection, StateSection, TokenizerSection,
                                         WeightsSection)
from toolchain.contract.methods import (ALL_ROLES, GENERATION_ROLES, HELD_OUT_EVAL_ROWS, PREFERENCE_ROLES,
                                        TRAINING_ROLES, IoSpec, MethodSpec, fused_name)
from toolchain.contract.read import (ManifestVersionError, ProgramTextFields, check_paths, inside, manifest_path,
                                     read_manifest, read_program_manifest, read_text_fields, write_manifest)
from toolchain.contract.state import STATE_ROLE_PREFIX, STEP_ENTRY, StateEntry, state_name

__all__ = ["ASSISTANT_HEADER", "CHAT_ROLES", "ENDOFTEXT", "IM_END", "IM_START", "QWEN_ENDOFTEXT_ID",
           "ADAPTER_INIT_DIR", "INT4_PACKING", "LAYER", "MANIFEST_NAME", "MANIFEST_SCHEMA_VERSION", "STATE_INIT_NAME",
           "TOKENIZER_NAME", "WEIGHTS_NAME", "PROBE_NAME", "sha256_file",
           "AdapterSection", "DefaultsSection", "FusedSection", "XnnpackSection", "GenerateSection", "LcsbSection", "LoopSection", "LoraSection",
           "Manifest", "MemoryPlan", "ModelSection", "OptimizerSection", "OptionsSection", "ProgramEntry",
           "QuantSection", "StateSection", "TokenizerSection", "WeightsSection",
           "ALL_ROLES", "GENERATION_ROLES", "HELD_OUT_EVAL_ROWS", "PREFERENCE_ROLES", "TRAINING_ROLES", "IoSpec", "MethodSpec", "fused_name",
           "ManifestVersionError", "ProgramTextFields", "check_paths", "inside", "manifest_path", "read_manifest",
           "read_program_manifest", "read_text_fields", "write_manifest",
           "STATE_ROLE_PREFIX", "STEP_ENTRY", "StateEntry", "state_name"]
