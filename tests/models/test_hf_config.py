"""config.json against what the step computes (toolchain/models/hf_config.py).

1. Every parameter of each family's installed transformers config class is in the family's allow-list, with the
   class's own default: a field a new transformers adds cannot slip through unclassified.
2. A checkpoint config with any one field set to a value other than the one of the base config (every parameter
   of the HF class, plus fields HF reads from elsewhere and hostile types) either gives Hugging Face's loss on
   the same weights (float64) or is refused with a BadInput naming the field.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from helpers import float64_faithful_hf, hf_loss, randomize_hf_params

from toolchain.errors import BadInput, ShapeMismatch
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import model_loss
from toolchain.models import ModelArch
from toolchain.models.family import get_family
from toolchain.models.hf_config import _MISSING, FIELDS
from toolchain.models.load import arch_from_hf_config, weights_from_state_dict

FAMILIES = ("qwen2", "qwen3", "llama")
_NOT_FIELDS = {"self", "kwargs"}


def _hf_class(family: str):
    import transformers

    return getattr(transformers, get_family(family).hf_config_class)


def _signature(family: str) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(_hf_class(family).__init__).parameters.items() if n not in _NOT_FIELDS}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_field_of_the_hf_config_class_is_classified(family):
    params = _signature(family)
    missing = sorted(set(params) - set(FIELDS[family]))
    assert not missing, f"{family}: transformers' {_hf_class(family).__name__} reads {missing}, which " \
                        f"toolchain/models/hf_config.py does not classify (implement or refuse them)"
    for name, p in params.items():
        spec = FIELDS[family][name]
        if spec.default is not _MISSING and spec.kind != "inert":
            assert spec.default == p.default, f"{family}.{name}: our default {spec.default!r}, HF's {p.default!r}"
    # the keys the class's __post_init__ takes besides its parameters (older files' rope fields)
    assert {"rope_theta", "rope_scaling", "torch_dtype"} <= set(FIELDS[family])
    assert _hf_class(family)().rope_parameters["rope_theta"] == FIELDS[family]["rope_theta"].default


def _base_arch(family: str) -> ModelArch:
    extra = {"qwen2": {}, "qwen3": {"head_dim": 6}, "llama": {"head_dim": 4}}[family]
    return ModelArch(family=family, hidden=16, layers=2, heads=4, kv_heads=2, intermediate=24, vocab=40,
                     max_positions=64, rope_theta=10_000.0, tie_embeddings=False, **extra)


def _alternatives(family: str, name: str, default, base: dict) -> list:
    """Values other than the base config's for one field: what a careless or hostile config.json would hold."""
    special = {
        "vocab_size": [43, "40", 40.0, 0], "hidden_size": [20, "16", 16.5, -16], "intermediate_size": [31, 0],
        "num_hidden_layers": [1, 3, True], "num_attention_heads": [2, 8, 3], "num_key_value_heads": [4, 1, None, 3],
        "head_dim": [8, 2, None, 5, "8"], "max_position_embeddings": [32, 0],
        "rms_norm_eps": [1e-3, -1, 0, "1e-6"], "rope_theta": [500.0, 0, -10_000.0, "1e4"],
        "tie_word_embeddings": [True, "false", 0],
        "rope_parameters": [{"rope_type": "default", "rope_theta": 123.0}, "default",
                            {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
                            {"rope_type": "default", "rope_theta": 1e4, "attention_factor": 2.0},
                            {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                            {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                            {"rope_type": "llama3", "rope_theta": 1e4, "factor": 0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                            {"rope_type": "llama3", "rope_theta": 1e4, "factor": "x", "low_freq_factor": 0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                            {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 4.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}],
        "rope_scaling": [{"type": "dynamic", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0}, "linear"],
        "hidden_act": ["gelu", "relu", "swish"], "attention_dropout": [0.1, 0],
        "use_sliding_window": [True], "sliding_window": [4, None], "max_window_layers": [0, 1],
        "layer_types": [["sliding_attention", "full_attention"], ["full_attention", "full_attention"], "full"],
        "attention_bias": [True], "mlp_bias": [True], "pretraining_tp": [2, 1],
        "is_encoder_decoder": [True], "initializer_range": [0.5], "use_cache": [False],
        "pad_token_id": [3], "bos_token_id": [4], "eos_token_id": [5, [5, 6]],
    }
    if name in special:
        values = special[name]
    elif isinstance(default, bool):
        values = [not default]
    elif isinstance(default, int):
        values = [default + 1]
    elif isinstance(default, float):
        values = [default * 2 + 0.5]
    elif isinstance(default, str):
        values = [default + "x"]
    else:
        values = [1, "x"]
    return [v for v in values if base.get(name, default) != v or type(base.get(name, default)) is not type(v)]


def _cases():
    for family in FAMILIES:
        base = _base_arch(family).to_hf_config().to_dict()
        names = dict.fromkeys([*_signature(family), "rope_scaling", "rope_theta", "head_dim", "quantization_config",
                               "auto_map", "num_experts", "attn_logit_softcapping", "query_pre_attn_scalar",
                               "partial_rotary_factor"])
        for name in names:
            default = _signature(family)[name].default if name in _signature(family) else None
            extra = {"quantization_config": [{"quant_method": "bitsandbytes", "load_in_4bit": True}],
                     "auto_map": [{"AutoModelForCausalLM": "modeling_x.X"}], "num_experts": [8],
                     "attn_logit_softcapping": [50.0], "query_pre_attn_scalar": [8],
                     "partial_rotary_factor": [0.5]}.get(name)
            for value in extra or _alternatives(family, name, default, base):
                yield pytest.param(family, name, value, id=f"{family}-{name}={value!r}"[:80])


def _hf_model(family: str, cfg: dict):
    config = _hf_class(family).from_dict(copy.deepcopy(cfg))
    config._attn_implementation = "eager"
    config.return_dict = True          # inert for the function; the oracle reads `.logits`
    model = get_family(family).causal_lm()(config).to(torch.float64).eval()
    randomize_hf_params(model, torch.Generator().manual_seed(0))
    return model


@pytest.mark.parametrize(("family", "name", "value"), list(_cases()))
def test_a_field_set_gives_the_hf_loss_or_is_refused(family, name, value):
    cfg = _base_arch(family).to_hf_config().to_dict()
    if name == "rope_theta":        # the older files' spelling: no rope_parameters beside it
        cfg.pop("rope_parameters")
    if name == "rope_scaling":
        cfg["rope_parameters"] = None
    cfg[name] = value
    try:
        arch = arch_from_hf_config(cfg)
    except BadInput as e:
        assert name in str(e) or (name == "rope_scaling" and "rope" in str(e)), str(e)
        return
    try:
        model = _hf_model(family, cfg)
    except Exception as e:     # noqa: BLE001 - a config HF itself cannot build must have been refused
        pytest.fail(f"accepted {name} = {value!r}, which Hugging Face cannot build ({type(e).__name__}: {e})")
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    try:
        weights = weights_from_state_dict(arch, sd, dtype=torch.float64)
    except ShapeMismatch as e:
        pytest.fail(f"accepted {name} = {value!r}, but our architecture is not Hugging Face's: {e}")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, arch.vocab, (12,), generator=gen)
    with float64_faithful_hf(), torch.no_grad():
        expected = hf_loss(model, ids, ids)
    lora_cfg = LoraConfig(rank=2, alpha=4, targets=("q_proj",))
    lora = init_lora(arch, lora_cfg, seed=0, dtype=torch.float64)
    got = model_loss(arch, weights, lora_cfg, lora, ids, ids)
    torch.testing.assert_close(got, expected, msg=lambda m: f"{family} {name} = {value!r}: {m}")


def test_the_cases_try_every_classified_field():
    tried = {(f, n) for f, n, _ in (p.values for p in _cases())}
    for family in FAMILIES:
        assert {(family, n) for n in _signature(family)} <= tried
