"""Held-out eval and generation with the live adapter on exported programs: the ExecuTorch runtime,
ONNX Runtime and the eager methods against Hugging Face `Qwen2ForCausalLM` + PEFT (float64 reference,
the program in float32): eval loss <= 1e-4 relative, greedy output ids equal to HF's
`generate(do_sample=False)`. One export (ExecuTorch + ONNX, with the generation methods) per config and
module; the int4 programs (int4 embedding and head too) run the stock generation methods on ONNX Runtime and
eager against HF on the program's own dequantized weights, and the fused ones (the native W4A8 kernel:
activations rounded to int8 per group) on ExecuTorch against the eager fused methods (the kernel's PyTorch
reference) on the same stored weights; the untied int4 config is marked slow."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import float64_faithful_hf, lora_for, peft_wrap, random_hf_model

from toolchain.cli import cli
from toolchain.contract import GENERATION_ROLES
from toolchain.text.dataset import DataRow
from toolchain.errors import BadInput
from toolchain.export.build import ExportSpec, export_program
from toolchain.lora import LoraConfig, save_adapter
from toolchain.mesp.ops.quant import QuantWeight, dequantize
from toolchain.models import ModelArch
from toolchain.program import ProgramDir
from toolchain.program.spec import QuantSpec
from toolchain.runtime import LayerLoop
from toolchain.runtime.evaluate import evaluate_program
from toolchain.runtime.generate import generate, new_cache
from toolchain.runtime.program_runtime import open_runtime
from toolchain.training.session import state_from_adapter
from helpers import our_weights

T = 24
CFG = LoraConfig(rank=4, alpha=8.0)  # all seven projections
# GQA 4:2, q/k/v biases, tied head; MQA 3:1, untied head, int4 weights
TIED = ModelArch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48, vocab=80, max_positions=64)
UNTIED = ModelArch(hidden=36, layers=2, heads=3, kv_heads=1, intermediate=40, vocab=70, max_positions=64,
                    tie_embeddings=False)
RUNTIMES = ("executorch", "onnx", "eager")


class Case:
    def __init__(self, tmp_path_factory, name: str, arch: ModelArch, quant: str, seed: int,
                 prefill_chunk: int = 32) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.arch, self.hf = arch, random_hf_model(arch, gen)               # float64, float32-exact values
        self.weights = our_weights(arch, self.hf, torch.float32)
        self.lora = lora_for(arch, CFG, seed, torch.float32)
        self.prog = tmp_path_factory.mktemp(name) / "prog"
        spec = ExportSpec(source="test", init="random", seed=seed, seq_len=T, quant=QuantSpec(quant, 4),
                          targets=("executorch", "onnx"), generation=True, pad_token_id=0,
                          options=__import__("toolchain.mesp", fromlist=["StepOptions"]).StepOptions(
                              vocab_chunk=32, mlp_chunk=16))
        spec = __import__("dataclasses").replace(spec, prefill_chunk=prefill_chunk)
        export_program(arch, self.weights, CFG, self.lora, spec, self.prog)
        self.pdir = ProgramDir(self.prog)
        if quant != "none":  # the reference holds the program's own (dequantized) weights
            sd = self.hf.state_dict()
            w = self.pdir.weights()
            for key in [k for k in w if k.endswith(".qweight")]:
                base = key[:-len(".qweight")]
                deq = dequantize(QuantWeight(w[key], w[base + ".scales"], 4 if quant == "int4" else 8))
                if base in ("embed", "lm_head"):                          # int4 programs: the head too
                    for k in ("model.embed_tokens.weight", "lm_head.weight") if base == "embed" and \
                            arch.tie_embeddings else ({"embed": "model.embed_tokens.weight"}.get(base, "lm_head.weight"),):
                        sd[k] = deq.double()
                    continue
                i, name = base.split(".")[1], base.split(".")[2]
                mod = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                sd[f"model.layers.{i}.{mod}.{name}.weight"] = deq.double()
            self.hf.load_state_dict(sd)
        self.runtimes = {}

    def runtime(self, target: str, use: str, fused: bool | None = None):
        if (target, use, fused) not in self.runtimes:
            self.runtimes[target, use, fused] = open_runtime(self.pdir, target, threads=1, use=use, fused=fused)
        return self.runtimes[target, use, fused]

    def hf_peft(self, lora):
        import copy

        model = copy.deepcopy(self.hf)
        return peft_wrap(model, CFG, tuple({t: p._replace(a=p.a.double(), b=p.b.double()) for t, p in layer.items()}
                                           for layer in lora))


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return Case(tmp_path_factory, "tied", TIED, "none", seed=14)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return Case(tmp_path_factory, "untied", UNTIED, "int4", seed=17)


@pytest.fixture(scope="module")
def tied_int4(tmp_path_factory):
    """int4 layers, embedding and head; prefill in chunks of 5 (the test prompt: one full, one padded)."""
    return Case(tmp_path_factory, "tied_int4", TIED, "int4", seed=21, prefill_chunk=5)


def _rows(arch, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in (T, T - 5, 9, 4):
        ids = torch.randint(0, arch.vocab, (n,), generator=g)
        labels = ids.clone()
        labels[: n // 3] = -100                                           # a prompt without loss
        rows.append(DataRow(ids, labels))
    rows.append(DataRow(torch.tensor([1, 2, 3]), torch.tensor([-100, -100, -100])))  # no target: skipped
    return rows


def _hf_eval(model, rows) -> tuple[float, int]:
    total, n = 0.0, 0
    with torch.no_grad(), float64_faithful_hf():
        for ex in rows:
            logits = model(input_ids=ex.input_ids[None]).logits[0, :-1]
            tgt = ex.labels[1:]
            valid = tgt != -100
            if valid.any():
                total += float(torch.nn.functional.cross_entropy(logits[valid], tgt[valid], reduction="sum"))
                n += int(valid.sum())
    return total / n, n


def _hf_greedy(model, prompt, n_new, eos=None) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad(), float64_faithful_hf():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                             do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _check_case(case: Case, runtimes=RUNTIMES) -> None:
    pdir = case.pdir
    int4 = pdir.spec.quant.kind == "int4"
    assert set(GENERATION_ROLES) <= set(pdir.methods)
    fused = ["block_prefill_fused", "block_decode_fused", "head_logits_fused"] if int4 else []
    assert pdir.generate.methods == GENERATION_ROLES + tuple(fused)
    assert pdir.spec.quant.head == int4 and ("embed.qweight" in pdir.weights()) == int4
    state = pdir.state_init()
    hf = case.hf_peft(case.lora)
    rows = _rows(case.arch, 3)
    ref_loss, ref_tokens = _hf_eval(hf, rows)
    prompt = [5, 17, 3, 42, 8, 1, 9]
    ref_ids = _hf_greedy(hf, prompt, T - len(prompt))
    assert len(set(ref_ids)) > 3, ref_ids                                  # not a degenerate repetition
    # the fused methods' reference: the same methods in eager PyTorch (the W4A8 op's reference implementation)
    fused_ids = generate(pdir, case.runtime("eager", "generate", fused=True), state, prompt, T - len(prompt))
    assert fused_ids.fused == int4
    for target in runtimes:
        ev = evaluate_program(pdir, case.runtime(target, "eval"), state, rows)
        assert (ev["rows"], ev["tokens"], ev["skipped_rows"]) == (4, ref_tokens, 1)
        assert math.isclose(ev["loss"], ref_loss, rel_tol=1e-4), (target, ev["loss"], ref_loss)
        got = generate(pdir, case.runtime(target, "generate"), state, prompt, T - len(prompt))
        assert got.fused == (int4 and target == "executorch"), target         # the native kernel on ExecuTorch
        want = fused_ids.output_ids if got.fused else ref_ids
        assert got.output_ids == want, (target, got.output_ids, want)
        assert got.prefill_chunks == -(-len(prompt) // pdir.spec.prefill_chunk)
    if not int4:
        assert fused_ids.output_ids == ref_ids                                # no fused methods: the stock ones
    assert torch.equal(state, pdir.state_init())                          # eval and generate only read the state


def test_tied_gqa_eval_and_greedy_equal_hf_peft_on_executorch_onnx_eager(tied):
    _check_case(tied)


def test_tied_int4_eval_and_greedy_equal_hf_peft_on_executorch_fused_onnx_eager(tied_int4):
    _check_case(tied_int4)


def test_stock_generation_methods_equal_hf_and_the_fused_ones_their_reference_on_executorch(tied_int4):
    """The stock int4 methods (embedding_4bit + linear: what a runtime without the kernel runs) give HF's
    greedy ids; the fused ones (W4A8) give the eager fused methods' head logits to float32 rounding, and
    the stock ones' within the activations' int8 rounding (tests/mesp/ops/test_quant.py bounds it)."""
    from toolchain.runtime.executorch_runtime import ExecuTorchRuntime
    from toolchain.runtime.generate import generation_names
    from toolchain.runtime.program_runtime import role_methods

    pdir, state = tied_int4.pdir, tied_int4.pdir.state_init()
    stock_names = role_methods(pdir, "generate", fused=False)
    stock = ExecuTorchRuntime(pdir.program_file("executorch"), stock_names, threads=1)
    stock.methods_loaded = tuple(stock_names)
    assert generation_names(pdir, stock_names)["block_decode"] == "block_decode"
    fused = tied_int4.runtime("executorch", "generate")
    prompt = [4, 9, 2, 33, 1, 8]
    a = generate(pdir, stock, state, prompt, 12)
    b = generate(pdir, fused, state, prompt, 12)
    c = generate(pdir, tied_int4.runtime("eager", "generate", fused=True), state, prompt, 12)
    assert (a.fused, b.fused, c.fused) == (False, True, True)
    assert a.output_ids == _hf_greedy(tied_int4.hf_peft(tied_int4.lora), prompt, 12) and b.output_ids == c.output_ids
    loop_a, loop_b = LayerLoop(pdir, stock), LayerLoop(pdir, fused)
    loop_c = LayerLoop(pdir, tied_int4.runtime("eager", "generate", fused=True))
    views = pdir.state_views(state)
    x = torch.randn(1, TIED.hidden, generator=torch.Generator().manual_seed(1))
    la = loop_a.call_method("head_logits", None, {"x": x}, views)["logits"]
    lb = loop_b.call_method("head_logits_fused", None, {"x": x}, views)["logits"]
    lc = loop_c.call_method("head_logits_fused", None, {"x": x}, views)["logits"]
    torch.testing.assert_close(lb, lc)                                   # the kernel = its reference
    assert not torch.equal(la, lb)                                       # the activations were rounded
    torch.testing.assert_close(la, lb, rtol=0, atol=0.05 * float(la.abs().max()))


def test_bound_decode_equals_binding_the_inputs_every_call_bit_for_bit(tied_int4):
    """On ExecuTorch generate binds each layer's decode method once (ExecuTorchRuntime.bind: an instance per
    layer, inputs set once, the hidden state and position rewritten in place): every step's logits equal
    those of binding the inputs on every call (LayerLoop.bind unavailable, as on the other runtimes)."""
    pdir, state = tied_int4.pdir, tied_int4.pdir.state_init()
    runtime = tied_int4.runtime("executorch", "generate")
    prompt = [4, 9, 2, 33, 1, 8]

    def run(bind: bool):
        loop = LayerLoop(pdir, runtime)
        logits, bound_calls = [], []
        call, call_bound = loop.call_method, loop.call_bound

        def spy(name, *args, **kwargs):
            out = call(name, *args, **kwargs)
            if name.startswith("head_logits"):
                logits.append(out["logits"].clone())
            return out

        loop.call_method = spy
        loop.call_bound = lambda *args, **kwargs: (bound_calls.append(1), call_bound(*args, **kwargs))[1]
        if not bind:
            loop.bind = lambda *args, **kwargs: None
        return generate(pdir, runtime, state, prompt, 12, loop=loop).output_ids, logits, len(bound_calls)

    ids_bound, logits_bound, n_bound = run(True)
    ids_each, logits_each, n_each = run(False)
    assert (n_bound, n_each) == (11 * TIED.layers, 0)                  # 11 decode steps, every layer bound
    assert ids_bound == ids_each and len(logits_bound) == len(logits_each) == 12
    assert all(torch.equal(a, b) for a, b in zip(logits_bound, logits_each))
    views, cache = pdir.state_views(state), new_cache(pdir)
    loop = LayerLoop(pdir, runtime)
    first = loop.bind("block_decode_fused", 0, {"x": torch.zeros(1, TIED.hidden), "pos": torch.zeros(1, dtype=torch.int64)},
                      views, cache)
    loop.bind("block_decode_fused", 0, {"x": torch.zeros(1, TIED.hidden), "pos": torch.zeros(1, dtype=torch.int64)},
              views, cache)
    with pytest.raises(RuntimeError, match="bound again"):                # its pointers may be freed tensors'
        first.execute()


@pytest.mark.slow
def test_untied_mqa_int4_eval_and_greedy_equal_hf_peft_on_executorch_onnx_eager(untied):
    _check_case(untied)


def test_generation_mid_training_uses_the_live_state_and_stops_at_eos(tied):
    """Train two steps on the ExecuTorch runtime, then generate with the very same state array."""
    pdir, case = tied.pdir, tied
    state = pdir.state_init()
    loop = LayerLoop(pdir, case.runtime("executorch", "train"))
    for ex in _rows(case.arch, 4)[:2]:
        ids = torch.zeros(T, dtype=torch.int64)
        labels = torch.full((T,), -100, dtype=torch.int64)
        ids[:len(ex.input_ids)], labels[:len(ex.labels)] = ex.input_ids, ex.labels
        loop.train_step(ids, labels, 0.5, state)
    trained = pdir.lora_from_state(state)
    assert not torch.equal(state, pdir.state_init())
    hf = case.hf_peft(trained)
    prompt = [7, 7, 30, 2]
    free = _hf_greedy(hf, prompt, 12)
    eos = free[5]
    expected = _hf_greedy(hf, prompt, 12, eos=eos)
    assert expected == free[:free.index(eos) + 1]
    for target in ("executorch", "onnx"):
        got = generate(pdir, case.runtime(target, "generate"), state, prompt, 12, stop_ids=[eos])
        assert got.output_ids == expected and got.stopped == "eos"
        assert got.output_ids == generate(pdir, case.runtime(target, "generate"), state, prompt, 12).output_ids[:len(expected)]


def test_sampling_is_seeded_and_in_vocabulary(tied):
    pdir, state = tied.pdir, tied.pdir.state_init()
    r = tied.runtime("executorch", "generate")
    a = generate(pdir, r, state, [1, 2], 10, temperature=1.0, seed=3).output_ids
    b = generate(pdir, r, state, [1, 2], 10, temperature=1.0, seed=3).output_ids
    c = generate(pdir, r, state, [1, 2], 10, temperature=1.0, seed=4).output_ids
    assert a == b and a != c and all(0 <= t < tied.arch.vocab for t in a)
    e = generate(pdir, tied.runtime("eager", "generate"), state, [1, 2], 10, temperature=1.0, seed=3).output_ids
    assert e == a  # same logits (to float rounding), same draws


def test_limits_are_clear_errors(tied):
    pdir, state = tied.pdir, tied.pdir.state_init()
    r = tied.runtime("eager", "generate")
    with pytest.raises(BadInput, match="exceeds the program's seq_len 24"):
        generate(pdir, r, state, list(range(20)), 5)
    with pytest.raises(BadInput, match="outside the vocabulary"):
        generate(pdir, r, state, [1, 999], 2)
    with pytest.raises(BadInput, match="empty"):
        generate(pdir, r, state, [], 2)


def test_cli_eval_and_generate_with_an_adapter(tied, tmp_path):
    """`toolchain eval` / `toolchain generate` with --adapter PEFT_DIR: equal to HF + PEFT with that adapter."""
    other = lora_for(tied.arch, CFG, 99, torch.float32)
    adapter = save_adapter(tmp_path / "adapter", CFG, other)
    hf = tied.hf_peft(other)
    rows = _rows(tied.arch, 5)[:4]  # the JSONL loader refuses a row without a target
    data = tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps({"input_ids": ex.input_ids.tolist(), "labels": ex.labels.tolist()}) + "\n"
                            for ex in rows))
    res = CliRunner().invoke(cli, ["eval", "--program", str(tied.prog), "--data", str(data), "--adapter", str(adapter),
                                   "--json", str(tmp_path / "ev.json")])
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "ev.json").read_text())
    ref_loss, ref_tokens = _hf_eval(hf, rows)
    assert ev["tokens"] == ref_tokens and math.isclose(ev["loss"], ref_loss, rel_tol=1e-4)
    assert ev["backend"] == "executorch"
    prompt = [3, 1, 4, 1, 5]
    res = CliRunner().invoke(cli, ["generate", "--program", str(tied.prog), "--adapter", str(adapter), "--prompt-ids",
                                   ",".join(map(str, prompt)), "--max-new-tokens", "9", "--target", "onnx",
                                   "--json", str(tmp_path / "g.json")])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "g.json").read_text())
    assert out["prompt_ids"] == prompt and out["output_ids"] == _hf_greedy(hf, prompt, 9)
    assert " ".join(map(str, out["output_ids"])) in res.output                  # streamed as ids (no tokenizer)
    assert torch.equal(state_from_adapter(tied.pdir, adapter)[:10], torch.cat(
        [other[0]["q_proj"].a.reshape(-1)])[:10])                               # q_proj A of layer 0 comes first
    res = CliRunner().invoke(cli, ["generate", "--program", str(tied.prog), "--prompt-ids", "1,2",
                                   "--max-new-tokens", "30"])
    assert res.exit_code == 2 and "exceeds the program's seq_len" in res.output


def test_training_runtime_does_not_load_the_generation_methods(tied):
    r = open_runtime(tied.pdir, "executorch", use="train")
    assert set(r.methods) == {"embed", "block_forward", "head_loss", "block_backward"}
    arenas = tied.pdir.memory_plan.planned_arena_bytes["executorch"]
    assert set(GENERATION_ROLES) <= set(arenas)
    gen = tied.pdir.generate
    assert gen.cache_bytes == 2 * 4 * TIED.layers * TIED.kv_heads * T * TIED.head_dim
    assert gen.targets == ("executorch", "onnx")
    assert gen.fused is None and gen.prefill_chunk == T   # float32: no kernel; the chunk clamped to seq_len


def test_train_program_logs_eval_events_beside_the_loss(tied, tmp_path):
    """`toolchain train --program --eval-data --eval-every`: `eval` telemetry events (valid, before the first
    step, every N steps and after the last; the first equals `toolchain eval` on the initial state), plotted
    in the report beside the training loss."""
    from toolchain.schemas import validate
    from toolchain.telemetry.figures import loss_figure

    rows = _rows(tied.arch, 6)[:4]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": ex.input_ids.tolist(), "labels": ex.labels.tolist()}) + "\n"
                            for ex in rows))
    tele = tmp_path / "t.jsonl"
    res = CliRunner().invoke(cli, ["train", "--program", str(tied.prog), "--data", str(data), "--steps", "5",
                                   "--lr", "0.5", "--eval-data", str(data), "--eval-every", "2", "--telemetry-out",
                                   str(tele), "--adapter-out", str(tmp_path / "ad"), "--json"])
    assert res.exit_code == 0, res.output
    events = [json.loads(line) for line in tele.read_text().splitlines()]
    for e in events:
        validate("telemetry_event", e)
    evals = [e for e in events if e["type"] == "eval"]
    assert [e["step"] for e in evals] == [0, 2, 4, 5]
    before = evaluate_program(tied.pdir, tied.runtime("eager", "eval"), tied.pdir.state_init(), rows)
    assert math.isclose(evals[0]["loss"], before["loss"], rel_tol=1e-5) and evals[0]["tokens"] == before["tokens"]
    assert evals[-1]["loss"] < evals[0]["loss"]                                  # training on the same rows
    out = json.loads(res.output[res.output.index("{"):])
    assert [e["step"] for e in out["evals"]] == [0, 2, 4, 5]
    fig = loss_figure(events)
    assert any(line.get_label() == "held-out loss (eval)" for line in fig.axes[0].get_lines())


def test_cli_generate_reports_timings_that_add_up(tied_int4, tmp_path):
    """`toolchain generate --json` on an int4 program (the fused methods on ExecuTorch): the timing fields,
    the counts they come from, and one line of them on stderr."""
    prompt = list(range(1, 12))                                  # 11 tokens: three prefill chunks of 5
    res = CliRunner().invoke(cli, ["generate", "--program", str(tied_int4.prog), "--prompt-ids",
                                   ",".join(map(str, prompt)), "--max-new-tokens", "8", "--json",
                                   str(tmp_path / "g.json")])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "g.json").read_text())
    assert out["fused"] is True and out["backend"] == "executorch"
    assert (out["prompt_tokens"], out["new_tokens"], out["prefill_chunks"]) == (11, 8, 3)
    assert out["decode_tokens"] == out["new_tokens"] - 1                 # the first token comes from prefill
    assert 0 < out["prefill_s"] <= out["ttft_s"] <= out["seconds"]
    assert out["decode_s"] <= out["seconds"] and out["load_s"] > 0
    assert math.isclose(out["decode_tokens_per_s"], out["decode_tokens"] / out["decode_s"], rel_tol=2e-3)
    from toolchain.native import kernel_path

    assert out["kernel_path"] == kernel_path()
    assert "| prefill " in res.output and "first token" in res.output
    assert f"tokens/s (executorch, kernels: {kernel_path()})" in res.output


def test_cli_generate_with_a_forced_kernel_path_the_cpu_lacks_is_one_error_line(tied_int4):
    """$TOOLCHAIN_KERNEL_PATH naming a path this CPU lacks (an arm64 one on x86, an x86 one on arm64) is one
    `Error:` line naming the path, not a silent run of another path or of the stock methods."""
    import os
    import platform
    import subprocess
    import sys

    path = "neon" if platform.machine() in ("x86_64", "AMD64") else "avx2"
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "toolchain", "generate", "--program", str(tied_int4.prog),
                           "--prompt-ids", "1,2,3", "--max-new-tokens", "2"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(repo), "TOOLCHAIN_KERNEL_PATH": path}, cwd=repo,
                          timeout=600)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and f"kernel path {path} is not available" in lines[0]


def test_programs_from_before_chunked_prefill_or_the_int4_head_are_refused(tied, tied_int4, tmp_path):
    import shutil

    for case, edit in ((tied, lambda m: m["generate"].pop("prefill_chunk")),
                       (tied_int4, lambda m: m["quant"].pop("head"))):
        old = tmp_path / case.prog.parent.name
        shutil.copytree(case.prog, old)
        m = json.loads((old / "manifest.json").read_text())
        edit(m)
        (old / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(BadInput, match="re-export"):
            ProgramDir(old)


def test_without_the_native_kernel_generation_runs_the_stock_methods(tied_int4, monkeypatch):
    monkeypatch.setenv("TOOLCHAIN_NATIVE_KERNELS", "0")
    r = open_runtime(tied_int4.pdir, "executorch", threads=1, use="generate")
    assert not any(n.endswith("_fused") for n in r.methods_loaded) and r.fused_unavailable is None
    got = generate(tied_int4.pdir, r, tied_int4.pdir.state_init(), [3, 1, 4], 6)
    assert not got.fused and got.output_ids == _hf_greedy(tied_int4.hf_peft(tied_int4.lora), [3, 1, 4], 6)


def test_a_program_whose_fused_methods_call_the_float_activation_kernel_is_refused(tied_int4, tmp_path):
    """Programs exported before the W4A8 kernel list `toolchain::int4_linear.out` (no longer built): one
    "re-export" error, not a fused method that fails to load."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(tied_int4.prog, old)
    m = json.loads((old / "manifest.json").read_text())
    for spec in m["methods"]:
        if spec.get("kernels"):
            spec["kernels"] = ["toolchain::int4_linear.out"]
    m["generate"]["fused"]["kernels"] = ["toolchain::int4_linear.out"]
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BadInput, match="re-export"):
        ProgramDir(old)
    res = CliRunner().invoke(cli, ["generate", "--program", str(old), "--prompt-ids", "1,2", "--max-new-tokens", "3"])
    assert res.exit_code != 0 and "re-export" in res.output


def test_a_kernel_that_cannot_be_built_falls_back_to_the_stock_methods_with_a_note(tied_int4, monkeypatch, tmp_path):
    import toolchain.runtime.program_runtime as program_runtime

    monkeypatch.setattr(program_runtime, "_native_kernels", lambda: "no C++ compiler found (g++ or $CXX)")
    r = open_runtime(tied_int4.pdir, "executorch", threads=1, use="generate")
    assert r.fused_unavailable.startswith("no C++ compiler") and not any(n.endswith("_fused") for n in r.methods_loaded)
    res = CliRunner().invoke(cli, ["generate", "--program", str(tied_int4.prog), "--prompt-ids", "1,2",
                                   "--max-new-tokens", "3"])
    assert res.exit_code == 0, res.output
    assert "note: the int4 generation kernel is unavailable (no C++ compiler" in res.output
