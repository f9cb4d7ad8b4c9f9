"""PEFT-format adapters: ours load in PEFT with identical outputs, PEFT's load here identically, and
mismatches are reported with the right error class."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import CASE_SEEDS, float64_faithful_hf, peft_config, random_case, random_hf_model

from toolchain.errors import BadInput, MissingWeights, ShapeMismatch
from toolchain.lora import LoraConfig, init_lora, load_adapter, lora_state_dict, save_adapter
from toolchain.lora.peft_io import CONFIG_NAME, WEIGHTS_NAME
from toolchain.mesp import block_forward, block_params
from toolchain.mesp.ops import rmsnorm_forward, rope_tables
from toolchain.models import ModelArch

CASES = [pytest.param(seed, id=str(random_case(seed))) for seed in CASE_SEEDS[:4]]


def _our_logits(d) -> torch.Tensor:
    a = d.case.arch
    rope = rope_tables(torch.arange(d.case.seq_len), a.head_dim, a.rope_theta, torch.float64)
    x = d.weights.embed[d.input_ids]
    for i in range(a.layers):
        x = block_forward(x, block_params(a, d.weights, d.case.lora, d.lora, i), rope)
    return rmsnorm_forward(x, d.weights.final_norm, a.rms_eps)[0] @ d.weights.lm_head.T


def _peft_scales(model) -> set[float]:
    return {m.scaling["default"] for m in model.modules() if isinstance(getattr(m, "scaling", None), dict)}


@pytest.mark.parametrize("seed", CASES)
def test_saved_adapter_loads_in_peft_with_the_same_outputs(case_data, seed, tmp_path):
    import peft

    d = case_data(seed)
    save_adapter(tmp_path / "adapter", d.case.lora, d.lora)
    fresh = random_hf_model(d.case.arch, torch.Generator().manual_seed(seed))  # same weights as the case's
    model = peft.PeftModel.from_pretrained(fresh, str(tmp_path / "adapter")).eval()
    loaded = {n.replace(".default.", "."): p for n, p in model.named_parameters() if "lora_" in n}
    ours = lora_state_dict(d.lora)
    assert sorted(loaded) == sorted(ours)
    for k, v in ours.items():
        assert torch.equal(loaded[k], v), k
    assert _peft_scales(model) == {d.case.lora.scale}
    with torch.no_grad(), float64_faithful_hf():
        logits = model(input_ids=d.input_ids[None]).logits[0]
    torch.testing.assert_close(_our_logits(d), logits)


@pytest.mark.parametrize("seed", CASES)
def test_peft_saved_adapter_loads_identically(case_data, seed, tmp_path):
    d = case_data(seed)
    d.peft_model.save_pretrained(str(tmp_path / "peft"))
    cfg, lora = load_adapter(tmp_path / "peft", d.case.arch, dtype=torch.float64)
    assert cfg == d.case.lora
    assert _peft_scales(d.peft_model) == {cfg.scale}
    ours, theirs = lora_state_dict(lora), lora_state_dict(d.lora)
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        assert torch.equal(ours[k], theirs[k]), k


def test_adapter_round_trip_and_deterministic_files(tmp_path):
    arch = ModelArch(hidden=12, layers=2, heads=3, kv_heads=1, intermediate=7, vocab=19)
    cfg = LoraConfig(rank=3, alpha=4.5, targets=("v_proj", "q_proj", "down_proj"))
    lora = init_lora(arch, cfg, seed=5, zero_b=False)
    save_adapter(tmp_path / "a", cfg, lora)
    save_adapter(tmp_path / "b", cfg, lora)
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    doc = json.loads((tmp_path / "a" / CONFIG_NAME).read_text())
    assert (doc["peft_type"], doc["r"], doc["lora_alpha"], doc["target_modules"]) == (
        "LORA", 3, 4.5, ["down_proj", "q_proj", "v_proj"])
    cfg2, lora2 = load_adapter(tmp_path / "a", arch)
    assert cfg2 == cfg
    assert all(torch.equal(lora_state_dict(lora2)[k], v) for k, v in lora_state_dict(lora).items())
    # An existing adapter directory is refused (the user's files are never replaced silently); allowed
    # (the CLI's --force), it is replaced whole.
    from toolchain.errors import OutputExists

    other = LoraConfig(rank=1, alpha=1.0, targets=("k_proj",))
    with pytest.raises(OutputExists):
        save_adapter(tmp_path / "a", other, init_lora(arch, other))
    save_adapter(tmp_path / "a", other, init_lora(arch, other), replace=True)
    assert load_adapter(tmp_path / "a", arch)[0].targets == ("k_proj",)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temporary leftovers


def _adapter(tmp_path, arch, cfg, name="adapter"):
    return save_adapter(tmp_path / name, cfg, init_lora(arch, cfg, seed=0))


ARCH = ModelArch(hidden=12, layers=2, heads=3, kv_heads=1, intermediate=7, vocab=19)
CFG = LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "up_proj"))


@pytest.mark.parametrize("other", [
    ModelArch(hidden=16, layers=2, heads=4, kv_heads=1, intermediate=7, vocab=19),
    ModelArch(hidden=12, layers=2, heads=3, kv_heads=1, intermediate=9, vocab=19),
], ids=["hidden", "intermediate"])
def test_shape_mismatch(tmp_path, other):
    path = _adapter(tmp_path, other, CFG)
    with pytest.raises(ShapeMismatch, match="has shape"):
        load_adapter(path, ARCH)


def test_adapter_for_more_layers(tmp_path):
    path = _adapter(tmp_path, ModelArch(hidden=12, layers=3, heads=3, kv_heads=1, intermediate=7, vocab=19), CFG)
    with pytest.raises(ShapeMismatch, match="no place for.*layers.2"):
        load_adapter(path, ARCH)


def test_adapter_for_fewer_layers(tmp_path):
    path = _adapter(tmp_path, ModelArch(hidden=12, layers=1, heads=3, kv_heads=1, intermediate=7, vocab=19), CFG)
    with pytest.raises(MissingWeights, match="layers.1"):
        load_adapter(path, ARCH)


def test_rank_in_config_disagrees_with_tensors(tmp_path):
    path = _adapter(tmp_path, ARCH, CFG)
    doc = json.loads((path / CONFIG_NAME).read_text())
    doc["r"] = 3
    (path / CONFIG_NAME).write_text(json.dumps(doc))
    with pytest.raises(ShapeMismatch):
        load_adapter(path, ARCH)


@pytest.mark.parametrize(("edit", "error", "match"), [
    (lambda p: (p / CONFIG_NAME).unlink(), MissingWeights, CONFIG_NAME),
    (lambda p: (p / WEIGHTS_NAME).unlink(), MissingWeights, WEIGHTS_NAME),
    (lambda p: (p / CONFIG_NAME).write_text("{"), BadInput, "not valid JSON"),
    (lambda p: (p / WEIGHTS_NAME).write_bytes(b"nonsense"), BadInput, "not a readable safetensors"),
    (lambda p: _edit_config(p, use_dora=True), BadInput, "use_dora"),
    (lambda p: _edit_config(p, peft_type="IA3"), BadInput, "IA3"),
    (lambda p: _edit_config(p, bias="all"), BadInput, "bias"),
    (lambda p: _edit_config(p, target_modules=["q_proj", "lm_head"]), BadInput, "lm_head"),
], ids=["no-config", "no-weights", "bad-json", "bad-safetensors", "dora", "ia3", "bias", "target"])
def test_bad_adapter_files(tmp_path, edit, error, match):
    path = _adapter(tmp_path, ARCH, CFG)
    edit(path)
    with pytest.raises(error, match=match):
        load_adapter(path, ARCH)


def _edit_config(path, **changes):
    doc = json.loads((path / CONFIG_NAME).read_text())
    doc.update(changes)
    (path / CONFIG_NAME).write_text(json.dumps(doc))


def test_peft_config_matches_peft_defaults_we_rely_on():
    cfg = LoraConfig(rank=4, alpha=8.0, targets=("k_proj",), use_rslora=True)
    pc = peft_config(cfg)
    assert pc.r == 4 and pc.lora_alpha == 8.0 and pc.lora_dropout == 0.0 and pc.use_rslora
