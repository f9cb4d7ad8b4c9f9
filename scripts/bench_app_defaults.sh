#!/usr/bin/env bash
# The apps' default run on the host, against the demo's: does it change the held-out loss and the generated text?
# (issue 42 item 3). Exports the bundled demo model (toolchain/assets/demo_model, `--model demo`: 4 layers, byte
# tokenizer, seq_len 128, fp32) twice, with the export's default optimizer and lr (`toolchain export`: SGD, 1e-4)
# and with the demo's (AdamW, weight decay 0, 3e-3), makes the rows of the bundled user text and of its held-out
# part (`toolchain data`), then runs each program as the apps do (`toolchain train --program`: the manifest's
# optimizer and default_lr) for the apps' default 100 steps, and the AdamW program for the demo's 400 too; prints
# the held-out loss before / after and the greedy generation of the demo's prompt before / after.
# Usage: scripts/bench_app_defaults.sh [WORKDIR]   (default /tmp/app-defaults; ~minutes on 2 cores)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
W="${1:-/tmp/app-defaults}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
tc() { (cd "$REPO" && PYTHONPATH="$REPO" "$PY" -m toolchain "$@"); }
mkdir -p "$W"
PROMPT="Thursday. Wind from the"
for variant in sgd adamw; do
    P="$W/prog-$variant"
    if [ ! -f "$P/manifest.json" ]; then
        if [ "$variant" = sgd ]; then extra=(); else extra=(--optimizer adamw --weight-decay 0 --lr 0.003); fi
        tc export --model demo --seq-len 128 --quant none --target executorch --generate "${extra[@]}" --out "$P" >/dev/null
    fi
done
P="$W/prog-sgd"
tc data --program "$P" --text toolchain/assets/user_text.txt --out "$W/train.jsonl" --force >/dev/null
tc data --program "$P" --text toolchain/assets/user_text_held_out.txt --out "$W/held.jsonl" --force >/dev/null
echo "rows: $(wc -l < "$W/train.jsonl") train, $(wc -l < "$W/held.jsonl") held out"
gen() { tc generate --program "$1" ${2:+--adapter "$2"} --prompt "$PROMPT" --max-new-tokens 60 2>/dev/null | tail -1; }
echo "before (state_init): $(gen "$W/prog-sgd")"
for run in sgd:100 adamw:100 adamw:400; do
    v=${run%%:*}; n=${run#*:}
    out="$W/adapter-$v-$n"
    tc train --program "$W/prog-$v" --data "$W/train.jsonl" --eval-data "$W/held.jsonl" --eval-every "$n" --steps "$n" \
        --adapter-out "$out" --force --json > "$W/train-$v-$n.json"
    "$PY" - "$W/train-$v-$n.json" "$v" "$n" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
ev = r.get("evals") or r.get("eval") or []
print(f"{sys.argv[2]} {sys.argv[3]} steps: held-out loss {json.dumps(ev)}; first/last train loss "
      f"{r['losses'][0]:.4f} / {r['losses'][-1]:.4f}" if r.get("losses") else json.dumps(r)[:600])
PYEOF
    echo "  after: $(gen "$W/prog-$v" "$out")"
done
