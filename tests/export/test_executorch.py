"""The exported ExecuTorch program, run on the real runtime through the host's layer loop, against
the same methods run eagerly, against the MeSP step and against Hugging Face + PEFT (float64).
Exports are small (3 layers, T=16) and shared per module."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import hf_peft_sgd, max_rel_diff

from toolchain.text.dataset import DataRow
from toolchain.errors import BadInput
from toolchain.export.build import ExportSpec, export_program
from toolchain.lcsb.plan import make_plan
from toolchain.lora import LoraConfig, init_lora, lora_state_dict
from toolchain.mesp import mesp_step
from toolchain.models import ModelArch, random_weights
from toolchain.optim import OptimizerConfig
from toolchain.program import ProgramDir
from toolchain.program.spec import QuantSpec
from toolchain.runtime import EagerRuntime, LayerLoop
from toolchain.runtime.executorch_runtime import ExecuTorchRuntime
from toolchain.training import TrainRun, pad_row, run_program

ARCH = ModelArch(hidden=32, layers=3, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
T = 16
CFG = LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "o_proj", "down_proj"))


def _examples(n: int, seed: int) -> list[DataRow]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = T - (i % 3)  # some rows shorter than T: exercises padding
        ids = torch.randint(0, ARCH.vocab, (t,), generator=g)
        out.append(DataRow(ids, ids.clone()))
    return out


def _export(tmp_path_factory, name: str, *, arch=ARCH, quant="none", optimizer=OptimizerConfig(), plan=None,
            xnnpack=True):
    weights = random_weights(arch, seed=3)
    lora = init_lora(arch, CFG, seed=4, zero_b=False)
    out = tmp_path_factory.mktemp(name) / "prog"
    spec = ExportSpec(source="test", init="random", seed=3, seq_len=T, quant=QuantSpec(quant, 16), optimizer=optimizer,
                      plan=plan, pad_token_id=0, xnnpack=xnnpack)
    export_program(arch, weights, CFG, lora, spec, out)
    return out, weights, lora


@pytest.fixture(scope="module")
def fp32_sgd(tmp_path_factory):
    return _export(tmp_path_factory, "fp32")


@pytest.fixture(scope="module")
def int4_adamw(tmp_path_factory):
    return _export(tmp_path_factory, "int4", quant="int4", optimizer=OptimizerConfig("adamw", weight_decay=0.01),
                   plan=make_plan(ARCH.layers, 1, "cyclic"))


def _runtime(prog):
    pdir = ProgramDir(prog)
    return pdir, ExecuTorchRuntime(pdir.program_file("executorch"), list(pdir.methods))


def _run_both(prog, examples, steps, lr, **kw):
    """(pdir, result on ExecuTorch, result with the same methods run eagerly), driven alike."""
    pdir, runtime = _runtime(prog)
    res = run_program(pdir, runtime, examples, TrainRun(steps=steps, lr=lr, **kw))
    ref = run_program(pdir, EagerRuntime(pdir.spec), examples, TrainRun(steps=steps, lr=lr, **kw))
    return pdir, res, ref


def _hf_model(weights):
    """Hugging Face Qwen2 in float64 holding the program's frozen weights."""
    from transformers import Qwen2ForCausalLM

    from toolchain.models import state_dict_from_weights

    hf = Qwen2ForCausalLM._from_config(ARCH.to_hf_config(), attn_implementation="eager")
    hf.load_state_dict({k: v.double() for k, v in state_dict_from_weights(weights).items()}, strict=False)
    hf = hf.double().eval()
    if ARCH.tie_embeddings:
        hf.tie_weights()
    return hf


def test_program_holds_no_weight_and_has_the_layer_generic_methods(fp32_sgd):
    prog, _, _ = fp32_sgd
    pdir = ProgramDir(prog)
    assert list(pdir.methods) == ["embed", "block_forward", "head_loss", "block_backward"]  # SGD: no skip update
    assert pdir.program("executorch").delegate == "xnnpack"  # the default
    from executorch.runtime import Runtime

    assert set(Runtime.get().load_program(pdir.program_file("executorch")).method_names) == set(pdir.methods)
    weights_bytes = pdir.weights_bytes
    assert weights_bytes >= 4 * sum(t.numel() for t in pdir.weights().values())
    # the .pte is code only: far smaller than any one layer's weights
    layer0 = sum(t.numel() * t.element_size() for k, t in pdir.weights().items() if k.startswith("layers.0."))
    assert (prog / "model.pte").stat().st_size < layer0 + 200_000


def test_fp32_program_trains_like_eager_and_hf_peft(fp32_sgd):
    prog, weights, lora = fp32_sgd
    examples, steps, lr = _examples(3, seed=5), 5, 0.05
    pdir, res, ref = _run_both(prog, examples, steps, lr)
    trained = lora_state_dict(pdir.lora_from_state(res.state))
    eager_sd = lora_state_dict(pdir.lora_from_state(ref.state))
    hf_losses, hf_sd = hf_peft_sgd(_hf_model(weights), CFG, lora, examples, steps, lr)
    print("runtime vs eager", max_rel_diff(trained, eager_sd), "runtime vs HF+PEFT", max_rel_diff(trained, hf_sd))
    assert max_rel_diff(trained, eager_sd) <= 1e-5
    assert max_rel_diff(trained, hf_sd) <= 1e-4
    assert set(trained) == set(hf_sd)
    for a, b, c in zip(res.losses, ref.losses, hf_losses):
        assert math.isclose(a, b, rel_tol=1e-5) and math.isclose(a, c, rel_tol=1e-5)
    assert max_rel_diff(trained, lora_state_dict(lora)) > 1e-3  # the adapter really moved


def test_eager_layer_loop_is_mesp_step_plus_sgd(fp32_sgd):
    """The loop itself (checkpoints, the LCSB skip, the stop below the lowest selected layer) against
    mesp_step's gradients: one step with layers {1, 2} selected, then the SGD rule by hand."""
    prog, weights, lora = fp32_sgd
    pdir = ProgramDir(prog)
    state = pdir.state_init()
    ids, labels = pad_row(_examples(1, seed=11)[0], T, 0, "row")
    loss = LayerLoop(pdir, EagerRuntime(pdir.spec)).train_step(ids, labels, 0.5, state, {1, 2})
    ref = mesp_step(ARCH, weights, CFG, lora, ids, labels, backward_layers={1, 2})
    assert math.isclose(loss, float(ref.loss), rel_tol=1e-6)
    new = pdir.lora_from_state(state)
    for i in range(ARCH.layers):
        for t in CFG.targets:
            for which in ("a", "b"):
                before = getattr(lora[i][t], which)
                expect = before - 0.5 * getattr(ref.grads[i][t], which) if i in (1, 2) else before
                torch.testing.assert_close(getattr(new[i][t], which), expect, rtol=1e-5, atol=1e-6)


def test_int4_adamw_lcsb_at_run_time_matches_eager(int4_adamw):
    """LCSB chosen at run time (the manifest's default plan, k=1 of 3) with AdamW: unselected layers move
    by momentum (block_skip_update), the step counter counts, the runtime equals eager."""
    prog, _, _ = int4_adamw
    examples, steps, lr = _examples(2, seed=6), 4, 1e-2
    pdir = ProgramDir(prog)
    plan = pdir.default_plan()
    assert plan is not None and plan.k == 1
    assert "block_skip_update" in pdir.methods
    _, res, ref = _run_both(prog, examples, steps, lr, plan=plan)
    for s, (a, b) in enumerate(zip(res.losses, ref.losses)):
        assert math.isclose(a, b, rel_tol=1e-5), (s, a, b)
    diff = float((res.state - ref.state).abs().max() / ref.state.abs().max())
    print("state rel diff", diff)
    assert diff <= 1e-4
    views = pdir.state_views(res.state)
    assert float(views["adam_step"][0]) == steps
    init = pdir.state_views(pdir.state_init())
    # step 0 selected only layer 0 (cyclic); layer 2 was selected at step 2 only, yet its moments
    # and weights moved on every step: all of them differ from the start
    assert all(not torch.equal(views[f"{p}_2_q_proj_a"], init[f"{p}_2_q_proj_a"]) for p in ("lora", "adam_m", "adam_v"))


class _ThreadsSeen:
    """A runtime that runs the eager methods and records torch's intra-op thread count at every call."""

    def __init__(self, inner, backend: str) -> None:
        self.inner, self.backend, self.seen = inner, backend, []

    def execute(self, method, inputs):
        self.seen.append(torch.get_num_threads())
        return self.inner.execute(method, inputs)


@pytest.mark.parametrize("backend, inside", [("executorch", 1), ("onnx", 1), ("eager", 2)])
def test_the_loop_does_its_torch_work_on_one_thread_except_on_the_eager_runtime(fp32_sgd, backend, inside):
    """LayerLoop.driver: torch's threads are 1 through a step on a native runtime (its OpenMP workers would spin on
    the cores the runtime's pool needs) and restored after; the eager runtime's methods keep torch's threads."""
    prog, _, _ = fp32_sgd
    pdir = ProgramDir(prog)
    runtime = _ThreadsSeen(EagerRuntime(pdir.spec), backend)
    ids, labels = pad_row(_examples(1, seed=11)[0], T, 0, "row")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        LayerLoop(pdir, runtime).train_step(ids, labels, 0.1, pdir.state_init())
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert runtime.seen and set(runtime.seen) == {inside}


def test_sgd_lcsb_leaves_unselected_layers_untouched(fp32_sgd):
    prog, _, _ = fp32_sgd
    pdir, runtime = _runtime(prog)
    state = pdir.state_init()
    ids, labels = pad_row(_examples(1, seed=12)[0], T, 0, "row")
    LayerLoop(pdir, runtime).train_step(ids, labels, 0.1, state, {2})
    after, init = pdir.state_views(state), pdir.state_views(pdir.state_init())
    for name in after:
        moved = not torch.equal(after[name], init[name])
        assert moved == name.startswith("lora_2_"), name


def test_methods_are_pure_functions_of_their_inputs(fp32_sgd):
    """No hidden state: the same inputs give the same outputs on a second call and on a freshly loaded
    program, and no input is written in place (the weights and state the app passes stay as they are)."""
    from executorch.runtime import Runtime

    prog, _, _ = fp32_sgd
    pdir, runtime = _runtime(prog)
    loop = LayerLoop(pdir, runtime)
    state = pdir.state_init()
    views = pdir.state_views(state)
    x = torch.randn(T, ARCH.hidden, generator=torch.Generator().manual_seed(0))
    d = torch.randn(T, ARCH.hidden, generator=torch.Generator().manual_seed(1))
    values = {"x": x, "d": d, "checkpoint": x.clone(), "lr": torch.tensor([0.1])}
    inputs = loop._inputs(pdir.methods["block_backward"], 1, values, views)
    before = [t.clone() for t in inputs]
    first = [t.clone() for t in runtime.execute("block_backward", inputs)]
    second = [t.clone() for t in runtime.execute("block_backward", inputs)]
    fresh = Runtime.get().load_program(pdir.program_file("executorch")).load_method("block_backward").execute(inputs)
    spec = pdir.methods["block_backward"].outputs
    assert [tuple(t.shape) for t in first] == [o.shape for o in spec]
    for a, b, c in zip(first, second, fresh):
        assert torch.equal(a, b) and torch.equal(a, c)
    for a, b in zip(inputs, before):
        assert torch.equal(a, b)


def test_weights_are_passed_without_copying(tmp_path_factory):
    """A program whose embedding alone is 32 MiB: running a step grows anonymous memory by far less than
    the weights (they stay file-backed pages of the memory map), while the file pages do come in."""
    from toolchain.memory.measure import read_status

    arch = ModelArch(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=65536, max_positions=64)
    prog, _, _ = _export(tmp_path_factory, "big-embed", arch=arch)
    pdir, runtime = _runtime(prog)
    loop = LayerLoop(pdir, runtime)
    state = pdir.state_init()
    ids = torch.randint(0, arch.vocab, (T,), generator=torch.Generator().manual_seed(0))
    weights_bytes = pdir.weights_bytes
    before = read_status()
    loop.train_step(ids, ids.clone(), 0.1, state)
    after = read_status()
    print(f"weights {weights_bytes / 2**20:.1f} MiB; anon +{(after.rss_anon - before.rss_anon) / 2**20:.1f} MiB, "
          f"file +{(after.rss_file - before.rss_file) / 2**20:.1f} MiB")
    assert weights_bytes > 32 * 2**20
    assert after.rss_anon - before.rss_anon < weights_bytes / 4
    assert after.rss_file - before.rss_file > weights_bytes / 2  # the LM head pass read every page of the map


def test_manifest_checksums_and_version_are_verified(fp32_sgd, tmp_path):
    import shutil

    prog, _, _ = fp32_sgd
    copy = tmp_path / "prog"
    shutil.copytree(prog, copy)
    with open(copy / "weights.safetensors", "r+b") as f:
        f.seek(200)
        f.write(b"\x00\x01\x02")
    with pytest.raises(BadInput, match="checksum"):
        ProgramDir(copy)
    old = tmp_path / "v2"
    shutil.copytree(prog, old)
    doc = json.loads((old / "manifest.json").read_text())
    doc["schema_version"] = 2
    (old / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(BadInput, match="schema_version 2.*re-export"):
        ProgramDir(old)


def test_an_int4_program_of_the_planar_packing_is_refused(int4_adamw, tmp_path):
    """Exports before `quant.int4_packing` stored int4 nibbles planar: their weights would be misread."""
    import shutil

    prog, _, _ = int4_adamw
    assert json.loads((prog / "manifest.json").read_text())["quant"]["int4_packing"] == "interleaved"
    old = tmp_path / "planar"
    shutil.copytree(prog, old)
    doc = json.loads((old / "manifest.json").read_text())
    del doc["quant"]["int4_packing"]
    (old / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(BadInput, match="older packing.*re-export"):
        ProgramDir(old)


def _write_jsonl(path, examples):
    path.write_text("".join(json.dumps({"input_ids": ex.input_ids.tolist()}) + "\n" for ex in examples))
    return path


def _adapter_tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def test_resume_after_kill_equals_uninterrupted_run(int4_adamw, tmp_path):
    """A run (int4, AdamW, LCSB at run time, shuffled) SIGKILLed mid-way and resumed from its checkpoint
    ends with the very adapter of a run that was never interrupted (the CLI, in subprocesses)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    prog, _, _ = int4_adamw
    data = _write_jsonl(tmp_path / "data.jsonl", _examples(5, seed=8))
    steps = 200
    base = [sys.executable, "-m", "toolchain", "train", "--program", str(prog), "--data", str(data),
            "--steps", str(steps), "--lr", "0.01", "--checkpoint-every", "1", "--shuffle", "3", "--lcsb-k", "2"]
    subprocess.run(base + ["--adapter-out", str(tmp_path / "whole")], check=True, capture_output=True)

    telemetry = tmp_path / "killed.jsonl"
    cmd = base + ["--adapter-out", str(tmp_path / "killed"), "--telemetry-out", str(telemetry)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        lines = telemetry.read_text().splitlines() if telemetry.exists() else []
        if sum('"type":"step"' in line for line in lines) >= 20:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (tmp_path / "killed").exists()
    subprocess.run(cmd + ["--resume"], check=True, capture_output=True)
    whole, resumed = _adapter_tensors(tmp_path / "whole"), _adapter_tensors(tmp_path / "killed")
    assert whole.keys() == resumed.keys()
    for k in whole:
        torch.testing.assert_close(resumed[k], whole[k], rtol=0, atol=0)
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    steps_seen = sorted({e["step"] for e in events if e["type"] == "step"})
    assert steps_seen == list(range(steps))   # the resumed run continued where the checkpoint was
    seqs = [e["seq"] for e in events]
    assert len(seqs) == len(set(seqs))         # no (run_id, seq) reused after the resume
    assert events[-1]["type"] == "run_end"


def test_int8_program_without_xnnpack_matches_eager(tmp_path_factory):
    prog, _, _ = _export(tmp_path_factory, "int8", quant="int8", xnnpack=False)
    assert "delegate" not in ProgramDir(prog).program("executorch").to_json()
    _, res, ref = _run_both(prog, _examples(2, seed=9), 3, 0.05)
    for a, b in zip(res.losses, ref.losses):
        assert math.isclose(a, b, rel_tol=1e-5)
    assert float((res.state - ref.state).abs().max() / ref.state.abs().max()) <= 1e-5


def test_xnnpack_takes_only_weight_matmuls():
    """The partition rule: every delegated matmul multiplies by a frozen weight (or its dequantized chunk),
    none is attention's or LoRA's (activation x activation / state), whatever their FLOPs; a weight operand
    too large to pack (a whole LM head) is never delegated."""
    from executorch.exir import EdgeCompileConfig, to_edge

    from toolchain.export.executorch import (_matmul_flops, _target_name, _weight_operand, _weight_placeholders,
                                             exported_methods, weight_derived, xnnpack_partitioner)
    from toolchain.program.spec import ProgramSpec, method_specs

    spec = ProgramSpec(ARCH, CFG, T, quant=QuantSpec("int4", 16))
    methods = method_specs(spec)
    eps = exported_methods(spec)
    edge = to_edge(eps, compile_config=EdgeCompileConfig(_check_ir_validity=False,
                                                         preserve_ops=[torch.ops.aten.linear.default]))
    for name in ("block_forward", "block_backward", "head_loss"):
        ep = edge.exported_program(name)
        weights = _weight_placeholders(ep, methods[name])
        assert weights and all(methods[name].inputs[i].bind == "weight"
                               for i, n in enumerate(ep.graph_signature.user_inputs) if n in weights)
        derived = weight_derived(ep.graph, weights, set(ep.graph_signature.user_inputs))
        mats = [n for n in ep.graph.nodes if _matmul_flops(n) > 0]
        with_weight = {n for n in mats if _weight_operand(n, derived) is not None}
        assert with_weight
        if name.startswith("block"):
            assert len(with_weight) < len(mats)                   # attention / LoRA matmuls exist and are out
        taken = {n for p in xnnpack_partitioner(weights, min_flops=0).generate_partitions(ep) for n in p.nodes
                 if _matmul_flops(n) > 0}
        assert taken == with_weight, name
        assert not xnnpack_partitioner(weights, min_flops=0, max_packed_bytes=0, elementwise_ops=()
                                       ).generate_partitions(ep)
        # the elementwise ops: one op per delegate, exactly the large-enough nodes of the listed targets
        ops = ("_softmax.default", "sigmoid.default", "permute_copy.default", "exp.default")
        for least in (0, 200):
            parts = xnnpack_partitioner(weights, max_packed_bytes=0, elementwise_ops=ops,
                                        min_elements=least).generate_partitions(ep)
            got = [n for p in parts for n in p.nodes if n.op == "call_function"]
            want = [n for n in ep.graph.nodes if _target_name(n) in ops and n.meta["val"].numel() >= least]
            assert len(got) == len(parts) and set(got) == set(want), (name, least)
            if least == 0 and name.startswith("block"):
                assert {_target_name(n) for n in got} >= {"_softmax.default", "sigmoid.default", "permute_copy.default"}
        # the default list: softmax, sigmoid and transposes, never exp (each delegate is ~1.8 KB resident;
        # exp, the head's online softmax, gains the least time per delegate: CHANGELOG.md 2026-12-03)
        parts = xnnpack_partitioner(weights, max_packed_bytes=0, min_elements=0).generate_partitions(ep)
        kinds = {_target_name(n) for p in parts for n in p.nodes if n.op == "call_function"}
        assert "exp.default" not in kinds, name
        if name == "head_loss":
            assert any(_target_name(n) == "exp.default" for n in ep.graph.nodes)    # it is there, not taken
        else:
            assert kinds == {"_softmax.default", "sigmoid.default", "permute_copy.default"}, name
    with pytest.raises(ValueError, match="no XNNPACK config for tanh"):
        xnnpack_partitioner(set(), elementwise_ops=("tanh.default",))


@pytest.mark.parametrize("quant", ["none", "int4"])
def test_program_with_xnnpack_delegates_trains_like_eager(tmp_path_factory, monkeypatch, quant):
    """The lowering path at full use: with the FLOP threshold at 0 every weight matmul of the tiny methods is
    an XNNPACK delegate (the 3-layer test programs have none otherwise: all below 16 MFLOP), lowered without
    ExecuTorch's per-partition re-sort (`_no_relegalizing_single_op_partitions`); two SGD steps on the
    runtime equal the same methods run eagerly. SGD: AdamW's m / sqrt(v) turns the rounding of near-zero
    gradients (XNNPACK sums in another order) into sign flips of whole updates, which says nothing about
    the lowering."""
    import toolchain.export.executorch as et

    monkeypatch.setattr(et, "XNNPACK_MIN_FLOPS", 0.0)
    monkeypatch.setattr(et, "XNNPACK_MIN_ELEMENTS", 0)     # softmax, sigmoid, transposes, exp on XNNPACK too
    prog, _, _ = _export(tmp_path_factory, f"xnn-{quant}", quant=quant)
    manifest = json.loads((prog / "manifest.json").read_text())
    assert manifest["programs"][0]["delegate"] == "xnnpack"
    # one backend id per delegate in the flatbuffer: projections, MLP chunks and head chunks, fwd and bwd
    assert (prog / "model.pte").read_bytes().count(b"XnnpackBackend") >= 20
    pdir, res, ref = _run_both(prog, _examples(4, seed=11), steps=2, lr=1e-2)
    assert res.losses == pytest.approx(ref.losses, rel=1e-5)
    assert float((res.state - ref.state).abs().max() / ref.state.abs().max()) <= 1e-5


@pytest.mark.parametrize("selected", [None, {0, 2}])
def test_checkpoint_groups_in_the_loop_equal_the_plain_loop_on_the_runtime(int4_adamw, selected):
    """LayerLoop.train_step(layers_per_checkpoint=2) keeps fewer layer inputs and reruns block_forward
    before the group's first update (AdamW moves unselected layers too): same loss, same state, bit for bit."""
    prog, _, _ = int4_adamw
    pdir, runtime = _runtime(prog)
    loop = LayerLoop(pdir, runtime)
    calls = []
    execute = runtime.execute
    runtime.execute = lambda name, inputs: calls.append(name) or execute(name, inputs)
    states = []
    for every in (1, 2):
        state = pdir.state_init()
        losses = [loop.train_step(*pad_row(ex, T, 0, "row"), 0.05, state, selected, layers_per_checkpoint=every)
                  for ex in _examples(2, seed=8)]
        states.append((losses, state))
    (plain_losses, plain), (group_losses, grouped) = states
    assert plain_losses == group_losses
    assert torch.equal(plain, grouped)
    # per step: embed, L forwards, head, L backward/skip updates; groups add the reruns (0 -> 1 for [0, 1];
    # [0, 2] reruns blocks 0 and 1 for layer 2's input)
    reruns = {None: 1, frozenset({0, 2}): 2}[None if selected is None else frozenset(selected)]
    per_step = 2 + 2 * ARCH.layers
    assert calls.count("block_forward") == 2 * (2 * ARCH.layers) + 2 * reruns
    assert len(calls) == 4 * per_step + 2 * reruns


def test_prefetching_the_next_layers_weights_changes_nothing_but_the_page_cache(int4_adamw):
    """`LayerLoop(prefetch=True)` (madvise(MADV_WILLNEED) one layer ahead, runtime/prefetch.py): the same loss and
    state bit for bit; one advice per layer ahead of its call (forward: layers 1..L-1 and the head's globals before
    the last layer, layer 0 before embed; backward: layers L-2..0), each over exactly that layer's tensors."""
    from toolchain.runtime.prefetch import layer_ranges

    prog, _, _ = int4_adamw
    pdir, runtime = _runtime(prog)
    ids, labels = pad_row(_examples(1, seed=13)[0], T, 0, "row")
    plain, ahead = pdir.state_init(), pdir.state_init()
    loss = LayerLoop(pdir, runtime).train_step(ids, labels, 0.1, plain)
    loop = LayerLoop(pdir, runtime, prefetch=True)
    assert loop.train_step(ids, labels, 0.1, ahead) == loss
    assert torch.equal(plain, ahead)
    L = ARCH.layers
    assert loop.prefetcher.calls == 1 + L + (L - 1)
    ranges = layer_ranges(pdir.weights(), L)
    assert set(ranges) == set(range(L)) | {"globals"}
    page = __import__("mmap").PAGESIZE
    for key, t in pdir.weights().items():
        start, length = ranges[int(key.split(".")[1]) if key.startswith("layers.") else "globals"]
        assert start % page == 0 and start <= t.data_ptr()
        assert t.data_ptr() + t.numel() * t.element_size() <= start + length, key
    ends = sorted((s, s + n) for s, n in ranges.values())
    assert all(a[1] <= b[0] + page for a, b in zip(ends, ends[1:]))   # layers apart (a shared page at most)


def test_traced_methods_do_not_keep_their_tracing_inputs(monkeypatch):
    """`exported_methods` returns every method's ExportedProgram with no reference left to its tracing inputs
    (zeros of every input at full size, the frozen weights' included: 2.77 GiB over Qwen2.5-7B's 12 methods if
    kept until the .pte is written), so the export's memory holds at most one method's inputs at a time."""
    import gc
    import weakref

    import toolchain.export.executorch as et
    from toolchain.program.spec import ProgramSpec

    made = []

    def tracked(method):
        xs = et.example_inputs.__wrapped__(method)
        made.extend(weakref.ref(x) for x in xs)
        return xs

    tracked.__wrapped__ = et.example_inputs
    monkeypatch.setattr(et, "example_inputs", tracked)
    eps = et.exported_methods(ProgramSpec(ARCH, CFG, T, quant=QuantSpec("int4", 16), generation=True))
    gc.collect()
    assert len(eps) >= 4 and len(made) > len(eps)
    assert all(ep.example_inputs is None for ep in eps.values())
    alive = [r() for r in made if r() is not None]
    assert not alive, f"{len(alive)} of {len(made)} tracing inputs still referenced"
