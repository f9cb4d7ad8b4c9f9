"""Adapters in PEFT's on-disk format: `adapter_config.json` + `adapter_model.safetensors`.

Key names are PEFT's with the adapter name stripped (as `get_peft_model_state_dict` writes them),
so an adapter saved here loads with `PeftModel.from_pretrained` and vice versa.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from toolchain.atomic import atomic_dir
from toolchain.errors import BadInput, MissingWeights, ShapeMismatch
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.models.presets import ModelArch
from toolchain.validate import read_json

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "peft_key", "lora_state_dict", "lora_from_state_dict",
           "save_adapter", "load_adapter", "peft_config_dict"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

MAX_RANK = 65536           # far above any projection's width; the tensors' shapes must then match it exactly
MAX_ALPHA = 1e6

_MODULE_PATH = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def peft_key(layer: int, target: str, which: str) -> str:
    """PEFT's saved key, e.g. `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    return f"base_model.model.model.layers.{layer}.{_MODULE_PATH[target]}.{target}.lora_{which}.weight"


def lora_state_dict(lora: LoraWeights) -> dict[str, torch.Tensor]:
    """Flatten adapter tensors (or gradients with the same structure) to PEFT key names."""
    out = {}
    for i, layer in enumerate(lora):
        for t, pair in layer.items():
            out[peft_key(i, t, "A")] = pair.a
            out[peft_key(i, t, "B")] = pair.b
    return out


def lora_from_state_dict(arch: ModelArch, cfg: LoraConfig, sd: dict[str, torch.Tensor], *,
                         dtype: torch.dtype = torch.float32) -> LoraWeights:
    """Inverse of `lora_state_dict`, checking that every key is present and every shape fits `arch`."""
    expected = set()
    layers = []
    for i in range(arch.layers):
        layer = {}
        for t in cfg.targets:
            d_out, d_in = arch.linear_shape(t)
            pair = []
            for which, shape in (("A", (cfg.rank, d_in)), ("B", (d_out, cfg.rank))):
                key = peft_key(i, t, which)
                expected.add(key)
                if key not in sd:
                    raise MissingWeights(f"adapter lacks {key!r} (targets {','.join(cfg.targets)}, {arch.layers} layers)")
                if tuple(sd[key].shape) != shape:
                    raise ShapeMismatch(f"adapter tensor {key!r} has shape {list(sd[key].shape)}, "
                                        f"the model and rank imply {list(shape)}")
                pair.append(sd[key].to(dtype))
            layer[t] = LoraPair(*pair)
        layers.append(layer)
    extra = sorted(set(sd) - expected)
    if extra:
        raise ShapeMismatch(f"adapter has {len(extra)} tensor(s) the model has no place for, e.g. {extra[0]!r}")
    return tuple(layers)


def peft_config_dict(cfg: LoraConfig, *, base_model: str | None = None) -> dict:
    """The `adapter_config.json` contents, built by PEFT itself so every field PEFT expects is there."""
    import peft

    pc = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.targets), lora_dropout=0.0,
                         bias="none", task_type="CAUSAL_LM", use_rslora=cfg.use_rslora,
                         base_model_name_or_path=base_model)
    d = pc.to_dict()
    d["target_modules"] = sorted(d["target_modules"])  # a set in PEFT: make the file deterministic
    d["peft_version"] = peft.__version__
    return json.loads(json.dumps(d, default=list))


def save_adapter(path: Path, cfg: LoraConfig, lora: LoraWeights, *, base_model: str | None = None,
                 replace: bool = False) -> Path:
    """Write a PEFT adapter directory atomically. Tensors are saved contiguous, as they are (dtype kept).
    An existing non-empty `path` is refused unless `replace` (the command's --force)."""
    from safetensors.torch import save_file

    with atomic_dir(Path(path), replace=replace) as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(peft_config_dict(cfg, base_model=base_model), indent=2, sort_keys=True))
        save_file({k: v.detach().contiguous() for k, v in lora_state_dict(lora).items()}, str(tmp / WEIGHTS_NAME),
                  metadata={"format": "pt"})
    return Path(path)


def _config_from_peft(d: dict, where: Path) -> LoraConfig:
    if d.get("peft_type", "LORA") != "LORA":
        raise BadInput(f"{where} is a {d.get('peft_type')} adapter; only LoRA adapters are supported")
    unsupported = [k for k in ("use_dora", "rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save")
                   if d.get(k)]
    if unsupported:
        raise BadInput(f"{where} uses PEFT option(s) {', '.join(unsupported)}, which this toolchain does not support")
    if d.get("bias", "none") != "none":
        raise BadInput(f"{where} trains biases (bias={d['bias']!r}); only bias='none' is supported")
    targets = d.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not targets or not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise BadInput(f"{where} has no target_modules (a list of projection names)")
    rank, alpha = d.get("r"), d.get("lora_alpha", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
        raise BadInput(f"{where}: `r` must be an integer in 1..{MAX_RANK}, got {str(rank)[:40]}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= MAX_ALPHA:
        raise BadInput(f"{where}: `lora_alpha` must be a number in (0, {MAX_ALPHA:g}], got {str(alpha)[:40]}")
    if not isinstance(d.get("use_rslora", False), bool):
        raise BadInput(f"{where}: `use_rslora` must be true or false")
    return LoraConfig(rank=rank, alpha=float(alpha), targets=tuple(targets), use_rslora=d.get("use_rslora", False))


def load_adapter(path: Path, arch: ModelArch, *, dtype: torch.dtype = torch.float32) -> tuple[LoraConfig, LoraWeights]:
    """Read a PEFT LoRA adapter directory and check it against `arch`.

    Raises:
        MissingWeights: a file or key is missing.
        BadInput: unreadable or unsupported adapter config.
        ShapeMismatch: tensor shapes that do not fit the model.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    cfg_path, w_path = path / CONFIG_NAME, path / WEIGHTS_NAME
    if not os.path.lexists(cfg_path):         # a FIFO or a link loop is there: refused when read (toolchain.inputs)
        raise MissingWeights(f"adapter directory {str(path)!r} has no {CONFIG_NAME}")
    if not os.path.lexists(w_path):
        raise MissingWeights(f"adapter directory {str(path)!r} has no {WEIGHTS_NAME}")
    doc = read_json(cfg_path)       # strict: UTF-8, no NaN / 1e400 / 30-digit integers, bounded nesting
    if not isinstance(doc, dict):
        raise BadInput(f"{cfg_path} is not a JSON object")
    cfg = _config_from_peft(doc, cfg_path)
    from toolchain.inputs import check_input

    check_input(w_path, dir_ok=False)
    try:
        sd = load_file(str(w_path))
    except (SafetensorError, OSError) as e:
        raise BadInput(f"{w_path} is not a readable safetensors file ({e})") from None
    sd = {k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v for k, v in sd.items()}
    lora = lora_from_state_dict(arch, cfg, sd, dtype=dtype)
    for key, t in sd.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise BadInput(f"{w_path}: tensor {key!r} holds NaN or infinite values (a diverged training run, or a "
                           f"damaged file); use another adapter")
    return cfg, lora
