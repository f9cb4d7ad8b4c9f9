"""The layer loop, exactly as the apps run it (manifest `loop`): the host's reference driver.

`LayerLoop.train_step` binds every method input from the manifest (app inputs, activations, views of
the memory-mapped weights, views of the flat state), calls the runtime, and copies what the app must
keep: the state outputs back into their slices, the checkpoints of the selected layers, the running
hidden state and gradient. Any runtime with `execute(method, inputs) -> outputs` plugs in; outputs
may live in the runtime's arena (ExecuTorch), so everything kept across calls is copied.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from toolchain.contract import LAYER, IoSpec, MethodSpec
from toolchain.errors import BadInput
from toolchain.mesp.step import checkpoint_groups, second_sequence_groups
from toolchain.program.directory import ProgramDir

__all__ = ["LayerLoop", "driver_on_one_thread"]


@contextmanager
def driver_on_one_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 inside (restored after): the layer loop's own torch work (binding, the
    copies of outputs and checkpoints) runs on the calling thread, as the apps' Kotlin / Swift drivers do.
    With N threads, torch runs a [T, d] copy on its OpenMP workers, which then spin-wait for the next parallel
    region and hold a core the runtime's thread pool needs: on the 2-core host at `--threads 2`, the first
    toolchain ops of every method (RMSNorm, the q / k / v projections) ran at 1-thread speed (the q projection
    of the int8 0.5B program 1.66 ms a call with torch at 2 threads, 1.09 ms with this; docs/kernels.md).
    Not for the eager runtime, whose methods are torch ops themselves (`LayerLoop.driver`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _in_driver(fn):
    """A LayerLoop entry point run inside `self.driver()`."""
    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        with self.driver():
            return fn(self, *args, **kwargs)
    return run


class _MethodPlan(NamedTuple):
    """One method bound for one layer (`LayerLoop._plan`)."""

    inputs: tuple[tuple[str | None, object, IoSpec], ...]    # (None, weight view, spec) or (bind, ref, spec)
    outputs: tuple[tuple[str, str, IoSpec, int], ...]        # (bind, ref, spec, element count)


class LayerLoop:
    """One program directory's methods bound to a runtime, driving full or LCSB steps."""

    def __init__(self, pdir: ProgramDir, runtime, *, prefetch: bool = False) -> None:
        """`prefetch`: madvise(MADV_WILLNEED) the next layer's weight pages before each layer's call
        (runtime/prefetch.py), for weights the page cache cannot keep resident. Default: off."""
        self.pdir, self.runtime = pdir, runtime
        self.methods: dict[str, MethodSpec] = pdir.methods
        self.weights = pdir.weights()
        self.layers = pdir.arch.layers
        self.moves_unselected = pdir.moves_unselected
        self.step_entry = pdir.step_entry
        self._plans: dict[tuple[str, int | None], _MethodPlan] = {}
        self.prefetcher = None
        if prefetch:
            from toolchain.runtime.prefetch import LayerPrefetcher

            self.prefetcher = LayerPrefetcher(self.weights, self.layers)
        missing = {io.ref.replace(LAYER, "0") for m in self.methods.values() for io in m.inputs
                   if io.bind == "weight"} - set(self.weights)
        if missing:
            raise BadInput(f"{pdir.path}: the weights file lacks {', '.join(sorted(missing)[:3])}; re-export the program")

    def driver(self) -> AbstractContextManager:
        """The context every entry point runs in: `driver_on_one_thread`, except on the eager runtime (its
        methods are torch ops and keep torch's threads)."""
        return nullcontext() if getattr(self.runtime, "backend", None) == "eager" else driver_on_one_thread()

    def _plan(self, method: MethodSpec, layer: int | None) -> _MethodPlan:
        """The method's inputs and outputs for `layer`, resolved once per (method, layer), not per call: a
        generated token calls block_decode once per layer, and binding ~45 inputs by name each time cost ~0.1 ms
        a call at Qwen2.5-0.5B. Inputs: weights resolved to their (shape-checked) views, the other binds as
        (bind, ref) to look up per call; outputs as (bind, ref with the layer filled in, spec, element count)."""
        key = (method.name, layer)
        plan = self._plans.get(key)
        if plan is None:
            inputs = []
            for io in method.inputs:
                ref = io.ref if layer is None else io.ref.replace(LAYER, str(layer))
                if io.bind == "weight":
                    t = self.weights[ref]
                    if io.rows is not None:
                        t = t[io.rows[0]:io.rows[1]]
                    _check_shape(method, io, ref, t)
                    inputs.append((None, t, io))
                else:
                    inputs.append((io.bind, ref, io))
            outputs = [(io.bind, io.ref if layer is None or io.bind not in ("state", "cache") else
                        io.ref.replace(LAYER, str(layer)), io, _numel(io.shape)) for io in method.outputs]
            plan = self._plans[key] = _MethodPlan(tuple(inputs), tuple(outputs))
        return plan

    def _inputs(self, method: MethodSpec, layer: int | None, values: dict[str, Tensor],
                views: dict[str, Tensor], cache: dict[str, Tensor] | None = None) -> list[Tensor]:
        out = []
        for bind, ref, io in self._plan(method, layer).inputs:
            if bind is None:          # a weight, resolved once
                out.append(ref)
                continue
            if bind == "state":
                t = views[ref]
            elif bind == "cache":
                t = cache[ref]
            else:  # input / activation
                t = values[ref]
            _check_shape(method, io, ref, t)
            out.append(t)
        return out

    def call_method(self, name: str, layer: int | None, values: dict[str, Tensor], views: dict[str, Tensor],
                    cache: dict[str, Tensor] | None = None, pos: int | None = None,
                    into: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Run one method; state outputs are copied into their slices, cache outputs of C rows into the
        layer's cache at rows pos .. pos + C - 1 (those < seq_len), an activation output named in `into` into
        that tensor, the others returned (copied). Outputs are copied only after the method has run, so an
        `into` tensor may be one of the call's inputs. Also the binding of runtime/evaluate.py and
        runtime/generate.py."""
        method = self.methods[name]
        outputs = self.runtime.execute(name, self._inputs(method, layer, values, views, cache))
        return self._outputs(method, layer, outputs, views, cache, pos, into)

    def bind(self, name: str, layer: int | None, values: dict[str, Tensor], views: dict[str, Tensor],
             cache: dict[str, Tensor] | None = None):
        """`name` for `layer` with every input set once (the runtime's `bind`), or None where the runtime cannot
        (ONNX Runtime, eager). `values` are the caller's tensors, changed in place between `call_bound`s."""
        if not hasattr(self.runtime, "bind"):
            return None
        return self.runtime.bind(name, layer, self._inputs(self.methods[name], layer, values, views, cache))

    def call_bound(self, bound, name: str, layer: int | None, views: dict[str, Tensor],
                   cache: dict[str, Tensor] | None = None, pos: int | None = None,
                   into: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """`call_method` of a bound method (`bind`): the same outputs, written the same way; an activation
        output named in `into` is copied into that tensor (e.g. the next call's bound input) instead of returned."""
        return self._outputs(self.methods[name], layer, bound.execute(), views, cache, pos, into)

    def _outputs(self, method: MethodSpec, layer: int | None, outputs: list[Tensor], views: dict[str, Tensor],
                 cache: dict[str, Tensor] | None, pos: int | None,
                 into: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        name = method.name
        plan = self._plan(method, layer).outputs
        if len(outputs) != len(plan):
            raise BadInput(f"{name} returned {len(outputs)} outputs, the manifest lists {len(plan)}; "
                           f"re-export the program")
        kept = {}
        for (bind, ref, io, numel), value in zip(plan, outputs):
            if value.numel() != numel:
                raise BadInput(f"{name} returned {value.numel()} values for {io.name}, the manifest says "
                               f"{list(io.shape)}; re-export the program")
            if value.shape != io.shape:
                value = value.reshape(io.shape)
            if bind == "state":
                views[ref].copy_(value)
            elif bind == "cache":
                target = cache[ref]
                n = min(io.shape[1], target.shape[1] - pos)  # the chunk's rows pos .. pos + C - 1 that fit
                target[:, pos:pos + n].copy_(value if n == io.shape[1] else value[:, :n])
            elif into is not None and ref in into:
                if into[ref].shape != value.shape or into[ref].dtype != value.dtype:
                    raise BadInput(f"{name} output {io.name} is {value.dtype}{list(value.shape)}, its destination "
                                   f"{ref} {into[ref].dtype}{list(into[ref].shape)}; re-export the program")
                into[ref].copy_(value)
            else:
                kept[ref] = value.clone()
        return kept

    @_in_driver
    def forward(self, input_ids: Tensor, keep: Iterable[int], views: dict[str, Tensor]) -> tuple[Tensor, dict[int, Tensor]]:
        """embed + every block_forward; returns the last hidden state and the checkpoints of `keep`. A layer's
        output goes into its input's tensor unless that input is kept: one [T, d] besides the checkpoints."""
        keep = set(keep)
        self._prefetch(0)
        x = self.call_method("embed", None, {"input_ids": input_ids}, views)["x"]
        checkpoints = {}
        for i in range(self.layers):
            self._prefetch(i + 1 if i + 1 < self.layers else "globals")   # the next layer's, or the LM head's
            if i in keep:
                checkpoints[i] = x
            x = self._block_forward(i, x, views, keep_input=i in keep)
        return x, checkpoints

    def _block_forward(self, i: int, x: Tensor, views: dict[str, Tensor], *, keep_input: bool) -> Tensor:
        """Layer i's block_forward of x: its output goes into x's tensor unless x is kept (a checkpoint)."""
        if keep_input:
            return self.call_method("block_forward", i, {"x": x}, views)["x"]
        self.call_method("block_forward", i, {"x": x}, views, into={"x": x})
        return x

    @_in_driver
    def train_step(self, input_ids: Tensor, labels: Tensor, lr: float, state: Tensor,
                   selected: Iterable[int] | None = None, *, layers_per_checkpoint: int = 1) -> float:
        """One training step on `state` (the flat float32 state, updated in place); returns the loss.

        Args:
            selected: layers to backpropagate (LCSB); None: all.
            layers_per_checkpoint: keep the input of every s-th selected layer only; when the backward
                reaches a group's top layer, rerun `block_forward` from the group's kept input to
                rebuild the others (`mesp_step`'s checkpoint groups, mesp/step.py). Before any layer
                of the group is updated, so the rebuilt inputs are the first forward's. Default: 1.
        """
        selected = set(range(self.layers)) if selected is None else set(selected)
        if not selected or not selected <= set(range(self.layers)):
            raise BadInput(f"selected layers must be a non-empty subset of 0..{self.layers - 1}, got {sorted(selected)}")
        groups = checkpoint_groups(sorted(selected), layers_per_checkpoint)
        top_of = {g[-1]: g for g in groups}
        views = self.pdir.state_views(state)
        if self.step_entry is not None:
            views[self.step_entry] += 1.0
        x, checkpoints = self.forward(input_ids, [g[0] for g in groups], views)
        # head_loss's d goes into x's tensor and each block_backward's d into the incoming d's: neither input is
        # needed after its call, so the step holds one [T, d] activation besides the checkpoints, not two.
        d = x
        out = self.call_method("head_loss", None, {"x": x, "labels": labels}, views, into={"d": d})
        del x
        values = {"d": d, "lr": torch.tensor([lr], dtype=torch.float32)}
        for i in reversed(range(self.layers)):
            if i > 0:
                self._prefetch(i - 1)
            if i in top_of:
                checkpoints.update(self._rerun(top_of[i], checkpoints.pop(top_of[i][0]), views))
            if i in selected:
                values["checkpoint"] = checkpoints.pop(i)
                self.call_method("block_backward", i, values, views, into={"d": d})
            elif self.moves_unselected:
                self.call_method("block_skip_update", i, values, views)
        return float(out["loss"].reshape(-1)[0])

    @_in_driver
    def pair_step(self, seqs: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]],
                  weigh: Callable[[float, float], tuple[float, float]], lr: float, state: Tensor,
                  selected: Iterable[int] | None = None, *, layers_per_checkpoint: int = 1,
                  second_groups: Literal["graded", "same"] = "graded") -> tuple[float, float]:
        """One optimizer step on two sequences (a DPO pair): the forward and head_loss of each, their head
        gradients d scaled by `weigh(loss_0, loss_1)` (the step's loss is a function of the two mean losses whose
        gradient is w_0 dloss_0 + w_1 dloss_1), then per layer top-down `block_backward_pair`, which backpropagates
        both and applies one update on the summed gradient. Both sequences' checkpoints are alive together, so the
        second sequence's are in graded groups by default (`mesp.step.second_sequence_groups`: at most n + G layer
        inputs alive, n the selected layers, G = 4 at 24, instead of 2n), rebuilt by `block_forward` when the
        backward reaches a group's top, before any of its layers is updated (the method contract is unchanged).

        Args:
            seqs: ((input_ids, labels), (input_ids, labels)), padded to seq_len.
            weigh: the weights of the two sequences' mean-CE gradients, from their mean losses.
            lr, state, selected, layers_per_checkpoint: as `train_step` (layers_per_checkpoint: the first
                sequence's groups).
            second_groups: "graded" (default) or "same" (the first sequence's groups), as `mesp.dpo.dpo_step`.

        Returns:
            The two mean losses (before the update).

        Raises:
            BadInput: a program exported without --preference, or a bad layer selection.
        """
        if "block_backward_pair" not in self.methods:
            raise BadInput(f"{self.pdir.path} was exported without block_backward_pair; re-export it with --preference "
                           f"for preference (DPO) training")
        selected = set(range(self.layers)) if selected is None else set(selected)
        if not selected or not selected <= set(range(self.layers)):
            raise BadInput(f"selected layers must be a non-empty subset of 0..{self.layers - 1}, got {sorted(selected)}")
        groups = (checkpoint_groups(sorted(selected), layers_per_checkpoint),
                  checkpoint_groups(sorted(selected), layers_per_checkpoint) if second_groups == "same"
                  else second_sequence_groups(sorted(selected), layers_per_checkpoint))
        tops = [{g[-1]: g for g in seq_groups} for seq_groups in groups]
        views = self.pdir.state_views(state)
        if self.step_entry is not None:
            views[self.step_entry] += 1.0
        ds, checkpoints, losses = [], [], []
        for (ids, labels), seq_groups in zip(seqs, groups):
            x, kept = self.forward(ids, [g[0] for g in seq_groups], views)
            out = self.call_method("head_loss", None, {"x": x, "labels": labels}, views, into={"d": x})
            ds.append(x)
            checkpoints.append(kept)
            losses.append(float(out["loss"].reshape(-1)[0]))
        weights = weigh(losses[0], losses[1])
        for d, w in zip(ds, weights):
            d.mul_(w)
        values = {"d": ds[0], "d_pair": ds[1], "lr": torch.tensor([lr], dtype=torch.float32)}
        for i in reversed(range(self.layers)):
            for kept, top_of in zip(checkpoints, tops):
                if i in top_of:
                    kept.update(self._rerun(top_of[i], kept.pop(top_of[i][0]), views))
            if i in selected:
                values["checkpoint"], values["checkpoint_pair"] = checkpoints[0].pop(i), checkpoints[1].pop(i)
                self.call_method("block_backward_pair", i, values, views, into={"d": ds[0], "d_pair": ds[1]})
            elif self.moves_unselected:
                self.call_method("block_skip_update", i, values, views)
        return losses[0], losses[1]

    def _prefetch(self, what: int | str) -> None:
        if self.prefetcher is not None:
            self.prefetcher(what)

    def _rerun(self, group: list[int], x: Tensor, views: dict[str, Tensor]) -> dict[int, Tensor]:
        """The inputs of `group`'s layers, rebuilt from the first one's input `x`."""
        inputs = {group[0]: x}
        for j in range(group[0], group[-1]):
            x = self._block_forward(j, x, views, keep_input=j in inputs)
            if j + 1 in group:
                inputs[j + 1] = x
        return inputs


def _check_shape(method: MethodSpec, io: IoSpec, ref: str, t: Tensor) -> None:
    if tuple(t.shape) != io.shape:
        raise BadInput(f"{method.name} input {io.name} ({ref}) has shape {list(t.shape)}, the manifest says "
                       f"{list(io.shape)}; re-export the program")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
