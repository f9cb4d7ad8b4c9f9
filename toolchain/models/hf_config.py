"""A checkpoint's `config.json` checked against what the step computes: an allow-list per family.

Every field a family's `config.json` may hold is in `FIELDS[family]`, with what the step does with it:

  implemented  the step computes what Hugging Face computes for every value the check lets through (sizes, rope,
               eps, tie, head_dim); a value of the wrong type or range is refused (sizes >= 1, theta and eps
               finite and > 0, rope factors > 0, `tie_word_embeddings` a JSON boolean, not the string "false");
  fixed        only the values listed compute what the step computes (`hidden_act: silu`, `use_sliding_window:
               false`, `attention_bias: false`, `attention_dropout: 0`, ...); any other value is refused;
  inert        does not change the function (token ids, initializer_range, use_cache, dtype, architectures, ...).

A field outside the family's list is refused when its value is not null, false or empty, whatever it is: an
unknown field may be read by the Hugging Face model (its config class, or the model code through `getattr`:
Qwen2's attention reads `head_dim` that way) or by its loader (`quantization_config`), so it is refused until
someone implements it. tests/models/test_hf_config.py checks that every parameter of the installed transformers
config classes (`Qwen2Config`, `Qwen3Config`, `LlamaConfig`) is in the list with the class's own default, and that
a checkpoint with any field set to a non-default value either gives the Hugging Face loss or is refused.

A refusal is one `BadInput` naming the field and the value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolchain.errors import BadInput

__all__ = ["Field", "FIELDS", "check_config", "field_value", "rope_settings", "EMPTY"]

_MISSING = object()
EMPTY = (None, False, [], {}, "")      # an unknown field holding one of these enables nothing


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _pos_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 1 else "must be an integer >= 1"


def _opt_pos_int(v: Any) -> str | None:
    return None if v is None else _pos_int(v)


def _pos_float(v: Any) -> str | None:
    return None if _is_number(v) and v > 0 else "must be a finite number > 0"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false (a JSON boolean, not a string)"


def _inert(v: Any) -> str | None:
    return None


def _one_of(*allowed: Any) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = any(v == a and type(v) is type(a) or (_is_number(v) and _is_number(a) and v == a) for a in allowed)
        return None if ok else f"is not supported here (the step computes {' or '.join(map(repr, allowed))} only)"
    return check


def _full_attention_layers(v: Any) -> str | None:
    if v is None or (isinstance(v, list) and all(x == "full_attention" for x in v)):
        return None
    return "is not supported here (the step computes full attention in every layer)"


def _of_type(*types: type, what: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v is None or (isinstance(v, types) and not (isinstance(v, bool) and bool not in types)) \
            else f"must be {what}"
    return check


_DTYPES = ("float32", "float16", "bfloat16", "float64", "auto")


def _dtype(v: Any) -> str | None:
    return None if v is None or v in _DTYPES else f"must be one of {', '.join(_DTYPES)}"


def _token_ids(v: Any) -> str | None:
    ok = v is None or _is_int(v) or (isinstance(v, list) and all(_is_int(x) for x in v))
    return None if ok else "must be a token id, a list of them, or null"


def _rope_dict(v: Any) -> str | None:
    return None if v is None or isinstance(v, dict) else "must be an object or null"


@dataclass(frozen=True)
class Field:
    """One config.json field a family allows: `check(value)` (None: fine, else why not), `default` (the HF config
    class's default, used when the field is absent), `kind` ("implemented", "fixed", "inert")."""

    check: Callable[[Any], str | None]
    default: Any
    kind: str
    nullable: bool = True           # a JSON null means "the default" (else it is checked like any value)


def _impl(check, default=_MISSING, *, nullable: bool = True) -> Field:
    return Field(check, default, "implemented", nullable)


def _fixed(*allowed, default=_MISSING) -> Field:
    return Field(_one_of(*allowed), allowed[0] if default is _MISSING else default, "fixed")


def _inert_field(default=None, check=_inert) -> Field:
    return Field(check, default, "inert")


# What PretrainedConfig itself takes (every family) and what its files carry besides.
_BASE: dict[str, Field] = {
    "model_type": _inert_field(), "transformers_version": _inert_field(None, _of_type(str, what="a string")),
    "architectures": _inert_field(None, _of_type(list, what="a list of class names")),
    "output_hidden_states": _inert_field(False, _of_type(bool, what="true or false")),
    "output_attentions": _inert_field(False, _of_type(bool, what="true or false")),
    "return_dict": _inert_field(True, _of_type(bool, what="true or false")),
    "dtype": _inert_field(None, _dtype), "torch_dtype": _inert_field(None, _dtype),
    "chunk_size_feed_forward": _inert_field(0, _of_type(int, what="an integer")),
    "is_encoder_decoder": _fixed(False),
    "id2label": _inert_field(None, _of_type(dict, what="an object")),
    "label2id": _inert_field(None, _of_type(dict, what="an object")),
    "problem_type": _inert_field(None, _of_type(str, what="a string")),
    "_name_or_path": _inert_field(""), "name_or_path": _inert_field(""), "_commit_hash": _inert_field(),
    "attn_implementation": _inert_field(), "_attn_implementation_autoset": _inert_field(),
    "initializer_range": _inert_field(0.02, _of_type(int, float, what="a number")),
    "use_cache": _inert_field(True, _of_type(bool, what="true or false")),
    "pad_token_id": _inert_field(None, _token_ids), "bos_token_id": _inert_field(None, _token_ids),
    "eos_token_id": _inert_field(None, _token_ids),
}

_COMMON: dict[str, Field] = {
    "vocab_size": _impl(_pos_int), "hidden_size": _impl(_pos_int), "intermediate_size": _impl(_pos_int),
    "num_hidden_layers": _impl(_pos_int), "num_attention_heads": _impl(_pos_int),
    "num_key_value_heads": _impl(_opt_pos_int),
    "max_position_embeddings": _impl(_pos_int, 32768), "rms_norm_eps": _impl(_pos_float, 1e-6),
    "rope_theta": _impl(_pos_float, 10000.0), "rope_parameters": _impl(_rope_dict, None),
    "rope_scaling": _impl(_rope_dict, None), "tie_word_embeddings": _impl(_bool, False),
    "hidden_act": _fixed("silu", "swish"), "attention_dropout": _fixed(0.0),
}

_SLIDING: dict[str, Field] = {
    "use_sliding_window": _fixed(False),
    "sliding_window": _inert_field(4096),       # read only with use_sliding_window (HF sets it to None otherwise)
    "max_window_layers": _inert_field(28),      # likewise: which layers would slide
    "layer_types": _impl(_full_attention_layers, None),
}

FIELDS: dict[str, dict[str, Field]] = {
    # head_dim: not a Qwen2Config parameter, but Qwen2's attention reads it (getattr), null included (a crash)
    "qwen2": {**_BASE, **_COMMON, **_SLIDING, "num_key_value_heads": _impl(_opt_pos_int, 32),
              "head_dim": _impl(_pos_int, None, nullable=False)},
    "qwen3": {**_BASE, **_COMMON, **_SLIDING, "num_key_value_heads": _impl(_opt_pos_int, 32),
              "head_dim": _impl(_pos_int, 128, nullable=False), "attention_bias": _fixed(False)},
    "llama": {**_BASE, **_COMMON, "num_key_value_heads": _impl(_opt_pos_int, None),
              "max_position_embeddings": _impl(_pos_int, 2048), "head_dim": _impl(_opt_pos_int, None),
              "attention_bias": _fixed(False), "mlp_bias": _fixed(False), "pretraining_tp": _fixed(1, None),
              "bos_token_id": _inert_field(1), "eos_token_id": _inert_field(2)},
}

# Keys of a rope dictionary (`rope_parameters` / the older `rope_scaling`) per rope type, and their checks.
_ROPE_KEYS: dict[str, dict[str, Callable[[Any], str | None]]] = {
    "default": {"rope_type": _inert, "type": _inert, "rope_theta": _pos_float},
    "llama3": {"rope_type": _inert, "type": _inert, "rope_theta": _pos_float, "factor": _pos_float,
               "low_freq_factor": _pos_float, "high_freq_factor": _pos_float,
               "original_max_position_embeddings": _pos_int},
}
_ROPE_TYPES = {"qwen2": ("default",), "qwen3": ("default",), "llama": ("default", "llama3")}


def _refuse(name: str, value: Any, reason: str, family: str) -> BadInput:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return BadInput(f"config.json sets {name} = {shown}, which {reason} for {family} models; this toolchain would "
                    f"compute another model than the checkpoint's (remove or fix the field)")


def field_value(cfg: dict, family: str, name: str) -> Any:
    """`cfg[name]`, or the HF config class's default when absent (a JSON null too, where HF takes null as unset)."""
    spec = FIELDS[family][name]
    value = cfg.get(name, _MISSING)
    return spec.default if value is _MISSING or value is None else value


def rope_settings(cfg: dict, family: str) -> dict[str, Any]:
    """The rope dictionary the model uses (`rope_scaling` overlaid by `rope_parameters`, top-level `rope_theta`
    as its theta when it has none), checked: a known rope type of the family, only that type's keys, finite
    positive numbers (llama3: low_freq_factor < high_freq_factor)."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        params.update(cfg.get(key) or {})
    kind = params.get("rope_type", params.get("type", "default"))
    where = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    if kind not in _ROPE_TYPES[family]:
        raise _refuse(f"{where}.rope_type", kind, f"is not supported (only {' and '.join(_ROPE_TYPES[family])})",
                      family)
    allowed = _ROPE_KEYS[kind]
    for key, value in params.items():
        if key not in allowed:
            if value in EMPTY:
                continue
            raise _refuse(f"{where}.{key}", value, f"is not implemented for rope type {kind!r}", family)
        why = allowed[key](value)
        if why is not None:
            raise _refuse(f"{where}.{key}", value, why, family)
    if "rope_theta" not in params:
        theta = cfg.get("rope_theta")
        params["rope_theta"] = FIELDS[family]["rope_theta"].default if theta is None else theta
    if kind == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in params:
                raise BadInput(f"config.json's llama3 rope scaling lacks {key!r}")
        if params["low_freq_factor"] >= params["high_freq_factor"]:
            raise _refuse(f"{where}.low_freq_factor", params["low_freq_factor"],
                          f"must be below high_freq_factor ({params['high_freq_factor']})", family)
    params["rope_type"] = kind
    return params


def check_config(cfg: Any, family: str) -> None:
    """Refuse a config.json whose fields the step does not compute as Hugging Face does (see the module docstring).

    Raises:
        BadInput: one field, named with its value.
    """
    if not isinstance(cfg, dict):
        raise BadInput(f"config.json is a JSON {type(cfg).__name__ if cfg is not None else 'null'}, not an object")
    fields = FIELDS[family]
    for name, value in cfg.items():
        spec = fields.get(name)
        if spec is None:
            if value in EMPTY and not isinstance(value, (int, float)) or value is False or value is None:
                continue
            raise _refuse(name, value, "is not a field this toolchain implements", family)
        if value is None and spec.kind != "fixed" and spec.nullable:
            continue
        why = spec.check(value)
        if why is not None:
            raise _refuse(name, value, why, family)
    layer_types, layers = cfg.get("layer_types"), cfg.get("num_hidden_layers")
    if isinstance(layer_types, list) and len(layer_types) != layers:
        raise _refuse("layer_types", layer_types, f"must name one type per layer (num_hidden_layers = {layers})", family)
    rope_settings(cfg, family)
