#!/usr/bin/env bash
# The apps' default run on the host: does it change the held-out loss and the generated text? (issue 42 item 3).
# Exports the bundled demo model (toolchain/assets/demo_model, `--model demo`: 4 layers, byte tokenizer, seq_len 128,
# fp32) twice, with the export's default optimizer (`toolchain export`: SGD) and with the demo's (AdamW, weight decay
# 0), makes the rows of the bundled user text and of its held-out part (`toolchain data`), then runs each program as
# the apps do (`toolchain train --program`, the lr given explicitly since it is a step input) at each RUNS entry
# `optimizer:lr:steps`; prints per run the held-out loss before / after and the greedy generation of the demo's
# prompt after, and one summary line per run at the end.
# With MODEL=qwen2.5-0.5b: the program as the apps' walkthrough exports it (docs/android.md, docs/ios.md: `toolchain
# export --model qwen2.5-0.5b --seq-len 256`, int4, executorch, generation methods) but `--init random` (seeded random
# weights: no pretrained weights are reachable on the host), only the SGD program, the rows through its (Qwen2.5)
# tokenizer; ~8-10 CPU-s per step.
# Usage: scripts/bench_app_defaults.sh [WORKDIR]   (default /tmp/app-defaults; demo: ~1 min per 100 steps on 2 cores)
# Env: RUNS (default below; MODEL=qwen2.5-0.5b: "sgd:1e-4:100 sgd:1e-1:200", the old and the new default),
#      MODEL (demo, default, or qwen2.5-0.5b), TRAIN_ROWS (use only the first N training rows; default all),
#      PYTHON (default REPO/.venv/bin/python).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
W="${1:-/tmp/app-defaults}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
MODEL="${MODEL:-demo}"
case "$MODEL" in
    demo) RUNS="${RUNS:-sgd:1e-4:100 sgd:3e-3:100 sgd:1e-2:100 sgd:3e-2:100 sgd:1e-1:100 adamw:3e-3:100 adamw:3e-3:400}"
          EXPORT=(--model demo --seq-len 128 --quant none --target executorch --generate) ;;
    qwen2.5-0.5b) RUNS="${RUNS:-sgd:1e-4:100 sgd:1e-1:200}"
          EXPORT=(--model qwen2.5-0.5b --init random --seq-len 256) ;;
    *) echo "Error: MODEL must be demo or qwen2.5-0.5b, not '$MODEL'" >&2; exit 2 ;;
esac
tc() { (cd "$REPO" && PYTHONPATH="$REPO" "$PY" -m toolchain "$@"); }
mkdir -p "$W"
PROMPT="Thursday. Wind from the"
for variant in sgd adamw; do
    P="$W/prog-$variant"
    case " $RUNS" in *" $variant:"*) ;; *) continue ;; esac
    if [ ! -f "$P/manifest.json" ]; then
        if [ "$variant" = sgd ]; then extra=(); else extra=(--optimizer adamw --weight-decay 0); fi
        tc export "${EXPORT[@]}" "${extra[@]}" --out "$P" >/dev/null
    fi
done
P="$(ls -d "$W"/prog-* | head -1)"
tc data --program "$P" --text toolchain/assets/user_text.txt --out "$W/train.jsonl" --force >/dev/null
tc data --program "$P" --text toolchain/assets/user_text_held_out.txt --out "$W/held.jsonl" --force >/dev/null
if [ -n "${TRAIN_ROWS:-}" ]; then
    head -n "$TRAIN_ROWS" "$W/train.jsonl" > "$W/train.capped" && mv "$W/train.capped" "$W/train.jsonl"
fi
echo "rows: $(wc -l < "$W/train.jsonl") train, $(wc -l < "$W/held.jsonl") held out"
gen() { tc generate --program "$1" ${2:+--adapter "$2"} --prompt "$PROMPT" --max-new-tokens 60 2>/dev/null; }   # the whole text (it may hold newlines)
echo "before (state_init): $(gen "$P")"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) MODEL=$MODEL RUNS=$RUNS TRAIN_ROWS=${TRAIN_ROWS:-all}" >> "$W/summary.txt"   # appended: runs of several calls stay
for run in $RUNS; do
    IFS=: read -r v lr n <<< "$run"
    out="$W/adapter-$v-$lr-$n"
    tc train --program "$W/prog-$v" --lr "$lr" --data "$W/train.jsonl" --eval-data "$W/held.jsonl" --eval-every "$n" \
        --steps "$n" --adapter-out "$out" --force --json > "$W/train-$v-$lr-$n.json"
    text="$(gen "$W/prog-$v" "$out")"
    "$PY" - "$W/train-$v-$lr-$n.json" "$v lr $lr, $n steps" "$text" <<'PYEOF' | tee -a "$W/summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))
ev = r["evals"]
print(f"{sys.argv[2]}: held-out loss {ev[0]['loss']:.4f} -> {ev[-1]['loss']:.4f}; "
      f"train loss first/last {r['losses'][0]:.4f} / {r['losses'][-1]:.4f}; after: {sys.argv[3]!r}")
PYEOF
done
echo "--- summary ($W/summary.txt, every call's)"
cat "$W/summary.txt"
