"""bench/lcsb.py pieces that the CLI test does not pin down: merging an adapter into the base, and
that both arms start from the same pretrained base with the same fresh adapter."""

from __future__ import annotations

import torch
from helpers import lora_for, our_weights, random_hf_model

from toolchain.bench.lcsb import LcsbBenchConfig, merge_lora, run_lcsb_bench, text_pretrain_rows
from toolchain.text.dataset import text_examples
from toolchain.lora import LoraConfig, init_lora
from toolchain.mesp import model_loss
from toolchain.models import ModelArch
from toolchain.text.shuffle import permutation
from toolchain.text.tokenizer import ByteTokenizer


def test_merged_adapter_gives_the_same_model_as_base_plus_adapter():
    arch = ModelArch(hidden=16, layers=3, heads=4, kv_heads=2, intermediate=24, vocab=37, max_positions=64)
    cfg = LoraConfig(rank=3, alpha=7.0, targets=("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"))
    weights = our_weights(arch, random_hf_model(arch, torch.Generator().manual_seed(0)), torch.float64)
    lora = lora_for(arch, cfg, seed=2)
    ids = torch.randint(0, arch.vocab, (11,), generator=torch.Generator().manual_seed(1))
    merged = merge_lora(weights, cfg, lora)
    fresh = init_lora(arch, cfg, seed=0, dtype=torch.float64)  # B = 0: the identity adapter
    torch.testing.assert_close(model_loss(arch, merged, cfg, fresh, ids, ids),
                               model_loss(arch, weights, cfg, lora, ids, ids))
    assert merged.lm_head is merged.embed  # tying kept
    assert not torch.equal(merged.layers[0].q_proj, weights.layers[0].q_proj)
    assert torch.equal(merged.layers[0].v_proj, weights.layers[0].v_proj)  # not a target: untouched


def test_pretraining_changes_the_base_and_both_arms_start_together():
    config = LcsbBenchConfig(model="tiny", steps=10, seq_len=128, k=4, lr=1e-2, pretrain_steps=3)
    seen = []
    report = run_lcsb_bench(config, on_step=lambda phase, step, losses: seen.append((phase, step, sorted(losses))))
    assert seen[:3] == [("pretrain", s, ["full"]) for s in (1, 2, 3)]
    assert seen[3:] == [("compare", s, ["full", "lcsb"]) for s in range(1, 11)]
    assert report["losses_full"][0] == report["losses_lcsb"][0]
    # Fresh adapter (B = 0) on the merged base: the first fine-tuning loss is the pretrained model's.
    no_pretrain = run_lcsb_bench(LcsbBenchConfig(model="tiny", steps=10, seq_len=128, k=4, lr=1e-2, pretrain_steps=0))
    assert report["losses_full"][0] != no_pretrain["losses_full"][0]
    assert no_pretrain["config"]["pretrain"] is None
    assert torch.get_num_threads() >= 1


def test_text_pretrain_rows_are_the_texts_windows_in_a_seeded_order():
    text = "".join(f"line {i} of some other text\n" for i in range(200))
    config = LcsbBenchConfig(model="tiny", seq_len=32)
    rows = text_pretrain_rows(config, text)
    windows = text_examples(text, ByteTokenizer(), seq_len=32)
    order = permutation(len(windows), config.seed)
    assert [r.input_ids.tolist() for r in rows] == [windows[i].input_ids.tolist() for i in order]
    assert order != sorted(order)
    other = text_pretrain_rows(LcsbBenchConfig(model="tiny", seq_len=32, seed=1), text)
    assert [r.input_ids.tolist() for r in other] != [r.input_ids.tolist() for r in rows]
