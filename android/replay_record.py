"""Record training steps of a real exported program as the host drives it (ProgramDir.call_train_method,
the contract's reference), for ReplayCheck (trainer-core tests): the Kotlin Trainer replays them and
must build the same inputs and end with the same state, bit for bit. Run by android/test.sh when
ANDROID_TEST_PROGRAM names a program directory exported with --target executorch.

Usage: python replay_record.py PROGRAM_DIR OUT_DIR [STEPS]
Writes OUT_DIR/{data.jsonl, steps.json, s<k>_in.bin (the state passed to step k), s<k>_out<i>.bin,
final.bin}: raw little-endian float32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from toolchain.runtime.executorch_runner import ExecutorchRunner
from toolchain.runtime.program_dir import ProgramDir

LR = 0.05  # exact in float32, passed to the Kotlin side by ReplayCheck


def main(program: Path, out: Path, steps: int) -> None:
    raise SystemExit(
        "replay_record.py replays contract v2 programs (whole-step train methods, manifest schema_version 2); the "
        "toolchain now exports contract v3 (layer-generic methods) and the Kotlin trainer core moves to v3 with the apps "
        "(issue 16). Until then this check cannot run against a current export.")
    pdir = ProgramDir(program)
    out.mkdir(parents=True, exist_ok=True)
    t, pad = pdir.seq_len, pdir.manifest["tokenizer"]["pad_token_id"]
    vocab = pdir.manifest["tokenizer"]["vocab"]
    rows = [[72, 101, 108, 108, 111], [87, 111, 114, 108, 100, 33, 10], [65, 66, 67]]
    rows = [[tok % vocab for tok in r][:t] for r in rows]
    (out / "data.jsonl").write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
    runner = ExecutorchRunner(pdir.program_file("executorch"), pdir.train_methods())
    state = pdir.state_init()
    record: list[dict] = []

    def execute(method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        k = len(record)
        np.concatenate([x.reshape(-1).numpy() for x in inputs[3:]]).astype("<f4").tofile(out / f"s{k}_in.bin")
        outputs = runner.execute(method, inputs)
        for i, o in enumerate(outputs):
            o.reshape(-1).numpy().astype("<f4").tofile(out / f"s{k}_out{i}.bin")
        record.append({"method": method, "ids": inputs[0].tolist(), "labels": inputs[1].tolist(),
                       "shapes": [list(o.shape) for o in outputs]})
        return outputs

    for s in range(steps):
        r = rows[s % len(rows)]  # the app's file order (no shuffle)
        ids = torch.tensor(r + [pad] * (t - len(r)), dtype=torch.long)
        labels = torch.tensor(r + [-100] * (t - len(r)), dtype=torch.long)
        method, _ = pdir.method_for_step(s)
        loss = pdir.call_train_method(execute, method, ids, labels, LR, state)
        record[-1]["loss"] = loss
    state.numpy().astype("<f4").tofile(out / "final.bin")
    (out / "steps.json").write_text(json.dumps(record))
    print(f"recorded {steps} steps of {program}: " + ", ".join(f"{r['method']} loss {r['loss']:.4f}" for r in record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 5)
