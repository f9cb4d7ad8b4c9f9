"""Eager training on preference pairs (DPO, `toolchain.mesp.dpo`), optionally mixed with SFT rows.

The run's items are the pairs followed by the SFT rows (`--sft-data`); the shared loop visits them as it visits
rows (file order cycling, or `--shuffle`). A step on a row is the SFT step (`eager.train_step`, mean next-token
cross-entropy); a step on a pair is the DPO step with its loss multiplied by `dpo_weight`, every selected
layer's optimizer update applied right after that layer's backward of both sequences (so the update sees the
exact DPO gradient). With pairs only, `dpo_weight` just scales the gradient (with AdamW it barely matters; with
SGD it is a learning-rate factor); with rows mixed in, it is the weight of a DPO step relative to an SFT step.

The reference log-probabilities lp0 of a pair are the pair's own (`ref_chosen_logp`, `ref_rejected_logp`, e.g.
computed at data preparation) or, when absent, computed once at the start of the run with the adapter disabled
(every B zero), whatever adapter the run starts from: the base model is the reference.

The evaluation gate of a DPO run (`--eval-data` held-out pairs) measures the held-out DPO loss: the mean over the
held-out pairs of -log sigmoid(beta ((lp(c) - lp0(c)) - (lp(r) - lp0(r)))) with the live adapter (forward only,
`dpo_weight` not applied; lp0 computed once with the adapter disabled, as for the training pairs): the objective
the run optimizes, on pairs it does not train on. Under memory pressure (`--memory-budget`) a DPO run lowers its
checkpoint groups, then LCSB's layers per step (`PAIR_KNOBS`); not the sequence length, since a pair's sequences
cut short would no longer be the ones its reference log-probs are of.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from toolchain.errors import BadInput
from toolchain.lora.config import LoraConfig
from toolchain.lora.weights import LoraPair, LoraWeights
from toolchain.mesp.dpo import check_beta, dpo_step, pair_rows, reference_logps, sequence_logp
from toolchain.models.presets import ModelArch
from toolchain.models.weights import ModelWeights
from toolchain.optim import OptState, update_layer
from toolchain.text.dataset import DataRow
from toolchain.training.checkpoint import rows_sha256
from toolchain.training.eager import EagerTrainer, RunState, assign_update, run_optimizer, run_step_options, train_step
from toolchain.training.loop import TrainRun

__all__ = ["PAIR_KNOBS", "PairItem", "load_pairs", "read_pair_items", "train_pair_step", "PreferenceTrainer",
           "held_out_pairs", "program_pair_logps", "program_reference_logps", "program_preference_trainer"]

# The working-set knobs a DPO run lowers under memory pressure (memory.fallback; not seq_len: module docstring).
PAIR_KNOBS = ("layers_per_checkpoint", "lcsb_k")


class PairItem(NamedTuple):
    chosen: DataRow               # prompt + chosen, labels -100 on the prompt
    rejected: DataRow
    ref: tuple[float, float] | None   # lp0(chosen), lp0(rejected); None: not known yet (the program trainer's)


def load_pairs(path: Path, arch: ModelArch, weights: ModelWeights, cfg: LoraConfig,
               lora: LoraWeights) -> list[PairItem]:
    """The pairs of a preference_pair JSONL file as items, with their reference log-probs (module docstring).

    Raises:
        BadInput: as `read_pairs` (a bad pair names its line).
    """
    from toolchain.text.feedback import read_pairs

    items = []
    for pair in read_pairs(path, arch.vocab, arch.max_positions):
        chosen, rejected = pair_rows(pair["prompt_ids"], pair["chosen_ids"], pair["rejected_ids"])
        ref = ((float(pair["ref_chosen_logp"]), float(pair["ref_rejected_logp"])) if "ref_chosen_logp" in pair
               else reference_logps(arch, weights, cfg, lora, chosen, rejected))
        items.append(PairItem(chosen, rejected, ref))
    return items


def read_pair_items(path: Path, vocab: int, max_len: int) -> list[PairItem]:
    """The pairs of a file as items, ref None where the pair has no reference log-probs (to be computed)."""
    from toolchain.text.feedback import read_pairs

    items = []
    for pair in read_pairs(path, vocab, max_len):
        chosen, rejected = pair_rows(pair["prompt_ids"], pair["chosen_ids"], pair["rejected_ids"])
        ref = ((float(pair["ref_chosen_logp"]), float(pair["ref_rejected_logp"])) if "ref_chosen_logp" in pair
               else None)
        items.append(PairItem(chosen, rejected, ref))
    return items


def held_out_pairs(items: Sequence[PairItem], logps: Sequence[tuple[float, float]], beta: float) -> dict[str, Any]:
    """{"loss", "rows", "tokens"} of held-out pairs (the gate's figure, module docstring) from their log-probs
    under the live adapter: loss the mean DPO loss over the pairs (nan when any log-prob is), rows the pairs,
    tokens both sequences' targets.

    Raises:
        BadInput: no pair, or a pair without its reference log-probs.
    """
    if not items:
        raise BadInput("evaluation data has no preference pair")
    losses, tokens = [], 0
    for p, (lp_c, lp_r) in zip(items, logps, strict=True):
        if p.ref is None:
            raise BadInput("a held-out pair has no reference log-probs")
        margin = beta * ((lp_c - p.ref[0]) - (lp_r - p.ref[1]))
        losses.append(float(torch.nn.functional.softplus(-torch.tensor(margin, dtype=torch.float64))))
        tokens += int((p.chosen.labels[1:] != -100).sum() + (p.rejected.labels[1:] != -100).sum())
    return {"loss": sum(losses) / len(losses), "rows": len(items), "tokens": tokens}


def _is_pairs(items) -> bool:
    return bool(items) and isinstance(items[0], PairItem)


def train_pair_step(arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, state: RunState, pair: PairItem, *,
                    beta: float, scale: float, layers: Sequence[int] | None, config: TrainRun) -> tuple[RunState, float,
                                                                                                         float]:
    """One DPO step (as `eager.train_step` for a row): (new state, loss before the update, margin)."""
    opt = run_optimizer(config)
    step = state.opt.step + 1
    selected = set(range(arch.layers)) if layers is None else set(layers)

    def update(i: int, grads: dict[str, LoraPair] | None) -> None:
        assign_update(state.lora[i], state.opt.slots[i], *update_layer(opt, state.lora[i], grads, state.opt.slots[i],
                                                                       step))

    with torch.no_grad():
        res = dpo_step(arch, weights, cfg, state.lora, pair.chosen, pair.rejected, pair.ref, beta=beta, scale=scale,
                       options=run_step_options(config), backward_layers=selected, on_layer_grads=update,
                       keep_grads=False, layers_per_checkpoint=config.layers_per_checkpoint)
        for i in sorted(set(range(arch.layers)) - selected):
            update(i, None)
    return RunState(state.lora, OptState(step, state.opt.slots)), float(res.loss), float(res.margin)


class PreferenceTrainer(EagerTrainer):
    """`EagerTrainer` over pairs (DPO steps) and rows (SFT steps); `margins` holds each DPO step's margin."""

    def __init__(self, arch: ModelArch, weights: ModelWeights, cfg: LoraConfig, lora: LoraWeights,
                 pairs: Sequence[PairItem], rows: Sequence[DataRow], config: TrainRun, *, beta: float,
                 dpo_weight: float = 1.0, model_name: str = "custom") -> None:
        if not pairs:
            raise BadInput("--objective dpo needs at least one preference pair")
        if not dpo_weight > 0:
            raise BadInput(f"--dpo-weight must be > 0, got {dpo_weight}")
        super().__init__(arch, weights, cfg, lora, list(rows) or [pairs[0].chosen], config, model_name=model_name)
        self.pairs, self.sft_rows = list(pairs), list(rows)
        self.beta, self.dpo_weight = check_beta(beta), float(dpo_weight)
        self.rows = len(self.pairs) + len(self.sft_rows)
        self.margins: list[float] = []

    pressure_knobs = PAIR_KNOBS

    def step(self, step: int, row: int, layers: tuple[int, ...] | None) -> tuple[float, int]:
        config = self.config
        ws = self.working
        if ws is not None and ws.layers_per_checkpoint != config.layers_per_checkpoint:   # lowered under pressure
            config = replace(config, layers_per_checkpoint=ws.layers_per_checkpoint)
        if row >= len(self.pairs):
            ex = self.sft_rows[row - len(self.pairs)]
            self._state, loss = train_step(self.arch, self.weights, self.cfg, self._state, ex, layers=layers,
                                           config=config)
            return loss, int((ex.labels != -100).sum())
        pair = self.pairs[row]
        self._state, loss, margin = train_pair_step(self.arch, self.weights, self.cfg, self._state, pair,
                                                    beta=self.beta, scale=self.dpo_weight, layers=layers,
                                                    config=config)
        self.margins.append(margin)
        return loss, int((pair.chosen.labels != -100).sum() + (pair.rejected.labels != -100).sum())

    def row_tokens(self, row: int) -> int:
        """Tokens of step `row`'s longest sequence (a pair's chosen or rejected one, or an SFT row)."""
        if row >= len(self.pairs):
            return int(self.sft_rows[row - len(self.pairs)].input_ids.shape[0])
        pair = self.pairs[row]
        return int(max(pair.chosen.input_ids.shape[0], pair.rejected.input_ids.shape[0]))

    def held_out(self, rows) -> dict[str, Any]:
        """Held-out pairs: their DPO loss (`held_out_pairs`); rows: the mean next-token loss (`EagerTrainer`)."""
        if not _is_pairs(rows):
            return super().held_out(rows)
        opts = run_step_options(self.config)
        with torch.no_grad():
            lps = [(float(sequence_logp(self.arch, self.weights, self.cfg, self.lora, p.chosen, options=opts)),
                    float(sequence_logp(self.arch, self.weights, self.cfg, self.lora, p.rejected, options=opts)))
                   for p in rows]
        return held_out_pairs(rows, lps, self.beta)

    def predict_peak_mb(self, ws) -> float | None:
        """`EagerTrainer.predict_peak_mb` for the DPO step: both sequences' layer inputs alive at once
        (`mesp.step.pair_inputs_alive_bound`), at the longest sequence of the run."""
        from toolchain.mesp.step import pair_inputs_alive_bound

        tokens = ws.seq_len or max(self.row_tokens(r) for r in range(self.rows))
        alive = pair_inputs_alive_bound(ws.selected(self.arch.layers), ws.layers_per_checkpoint)
        return alive * tokens * self.arch.hidden * self.weights.final_norm.element_size() / 2**20

    def settings(self) -> dict[str, Any]:
        if self._settings is None:
            base = super().settings()
            base.update(data=rows_sha256([r for p in self.pairs for r in (p.chosen, p.rejected)] + self.sft_rows),
                        objective={"kind": "dpo", "beta": self.beta, "dpo_weight": self.dpo_weight,
                                   "pairs": len(self.pairs), "sft_rows": len(self.sft_rows),
                                   "ref": [list(p.ref) for p in self.pairs]})
            self._settings = base
        return self._settings

    def run_info(self) -> dict[str, Any]:
        info = super().run_info()
        info["seq_len"] = max(int(r.input_ids.shape[0]) for p in self.pairs for r in (p.chosen, p.rejected))
        return info


# -- on an exported program (programs exported with --preference) --------------------------------------

def program_pair_logps(pdir, loop, pairs: Sequence[PairItem], state, *, disable_adapter: bool = False
                       ) -> list[tuple[float, float]]:
    """(lp(chosen), lp(rejected)) of each pair on the program's own methods (embed, block_forward, head_loss; the
    forward only) with the flat `state` (read, never written); `disable_adapter`: with every LoRA B zeroed in a
    copy, i.e. the base model (the reference lp0)."""
    from toolchain.runtime.evaluate import evaluate_program

    if disable_adapter:
        state = state.clone()
        for e in pdir.state_entries:
            if e.role == "param" and "lora_B" in e.key:
                state[e.offset:e.offset + e.numel] = 0.0
    out = []
    for p in pairs:
        lps = []
        for row in (p.chosen, p.rejected):
            got = evaluate_program(pdir, loop.runtime, state, [row], loop=loop)
            lps.append(-got["tokens"] * got["loss"])
        out.append((lps[0], lps[1]))
    return out


def program_reference_logps(pdir, loop, pairs: Sequence[PairItem], state) -> list[tuple[float, float]]:
    """lp0 of each pair on the program with the adapter disabled (`program_pair_logps`)."""
    return program_pair_logps(pdir, loop, pairs, state, disable_adapter=True)


def program_preference_trainer(pdir, runtime, pairs: Sequence[PairItem], rows: Sequence[DataRow], run: TrainRun, *,
                               beta: float, dpo_weight: float = 1.0):
    """A program trainer whose items are `pairs` then `rows` (module docstring). Pairs without their own reference
    log-probs (ref None) get them from the program with the adapter disabled, once, here.

    Raises:
        BadInput: no pair, a bad beta or weight, a program without block_backward_pair, a sequence longer than
            the program's seq_len.
    """
    from toolchain.mesp.dpo import dpo_margin_and_weights
    from toolchain.text.dataset import pad_row
    from toolchain.training.program import ProgramTrainer

    if not pairs:
        raise BadInput("--objective dpo needs at least one preference pair")
    beta = check_beta(beta)
    if not dpo_weight > 0:
        raise BadInput(f"--dpo-weight must be > 0, got {dpo_weight}")
    if "block_backward_pair" not in pdir.methods:
        raise BadInput(f"{pdir.path} was exported without block_backward_pair; re-export it with --preference for "
                       f"preference (DPO) training")

    class _Trainer(ProgramTrainer):
        def __init__(self) -> None:
            seqs = [r for p in pairs for r in (p.chosen, p.rejected)]
            super().__init__(pdir, runtime, list(rows) + seqs, run)
            self.pairs, self.sft_rows = list(pairs), list(rows)
            self.rows = len(self.pairs) + len(self.sft_rows)
            self.margins: list[float] = []
            missing = [i for i, p in enumerate(self.pairs) if p.ref is None]
            if missing:
                refs = program_reference_logps(pdir, self.loop, [self.pairs[i] for i in missing], self._state)
                for i, ref in zip(missing, refs):
                    self.pairs[i] = self.pairs[i]._replace(ref=ref)
            self._padded = [tuple(pad_row(r, pdir.seq_len, pdir.pad_token_id, f"pair {i + 1}")
                                  for r in (p.chosen, p.rejected)) for i, p in enumerate(self.pairs)]

        pressure_knobs = PAIR_KNOBS

        def step(self, step: int, row: int, layers):
            every = (self.run_options.layers_per_checkpoint if self.working is None
                     else self.working.layers_per_checkpoint)
            if row >= len(self.pairs):
                ids, labels = self._rows[row - len(self.pairs)]
                loss = self.loop.train_step(ids, labels, self.lr, self._state, layers, layers_per_checkpoint=every)
                return loss, int((labels != -100).sum())
            pair, padded = self.pairs[row], self._padded[row]
            n = tuple(int((lab[1:] != -100).sum()) for _, lab in padded)
            got = {}

            def weigh(loss_c: float, loss_r: float) -> tuple[float, float]:
                lp = [torch.tensor(-k * loss, dtype=torch.float64) for k, loss in zip(n, (loss_c, loss_r))]
                loss, margin, w_c, w_r = dpo_margin_and_weights(lp[0], lp[1], pair.ref, beta, n, dpo_weight)
                got.update(loss=float(loss), margin=float(margin))
                return w_c, w_r

            self.loop.pair_step(padded, weigh, self.lr, self._state, layers, layers_per_checkpoint=every)
            self.margins.append(got["margin"])
            return got["loss"], n[0] + n[1]

        def with_reference(self, items: Sequence[PairItem]) -> list[PairItem]:
            """`items` with their reference log-probs (computed on the program where missing)."""
            items = list(items)
            missing = [i for i, p in enumerate(items) if p.ref is None]
            if missing:
                refs = program_reference_logps(pdir, self.loop, [items[i] for i in missing], self._state)
                for i, ref in zip(missing, refs):
                    items[i] = items[i]._replace(ref=ref)
            return items

        def held_out(self, rows):
            """Held-out pairs (with their reference): their DPO loss on the program (`held_out_pairs`); rows
            (the forgetting probe): the mean next-token loss."""
            if not _is_pairs(rows):
                return super().held_out(rows)
            return held_out_pairs(rows, program_pair_logps(pdir, self.loop, rows, self._state), beta)

        def predict_peak_mb(self, ws):
            """The planner's host figure of the DPO step (`memory.fit.program_peak(..., pair=True)`)."""
            from toolchain.errors import ToolchainError
            from toolchain.memory.fit import program_peak

            key = ("pair", ws.lcsb_k, ws.layers_per_checkpoint)
            if key not in self._predicted:
                try:
                    self._predicted[key] = program_peak(pdir.path, lcsb_k=ws.lcsb_k, pair=True,
                                                        layers_per_checkpoint=ws.layers_per_checkpoint).host_peak_mb
                except ToolchainError:
                    self._predicted[key] = None
            return self._predicted[key]

        def settings(self):
            if self._settings is None:
                base = super().settings()
                refs = torch.tensor([p.ref for p in self.pairs], dtype=torch.float64)
                base["objective"] = {"kind": "dpo", "beta": beta, "dpo_weight": float(dpo_weight),
                                     "pairs": len(self.pairs), "sft_rows": len(self.sft_rows),
                                     "ref": [list(r) for r in refs.tolist()]}
                self._settings = base
            return self._settings

    return _Trainer()
