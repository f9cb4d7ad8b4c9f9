"""toolchain: on-phone LoRA fine-tuning of Qwen2.5 with exact, memory-efficient MeSP steps.

Pipeline (one subpackage per stage, imports point down only; see pyproject's import-linter contract):
models -> lora -> mesp | lcsb -> baselines -> memory -> export | telemetry -> runtime -> bench -> cli
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
