#!/usr/bin/env bash
# Start a training run on the phone (foreground service). Prints the run id.
#   scripts/android/start.sh --program NAME --data FILE [--chat] [--steps N] [--lr LR] [--run-id ID]
#       [--budget-mb MB] [--held-out F] [--held-out-seed S] [--lcsb full|cyclic|strided|last|random] [--k K]
#       [--lcsb-seed S] [--lcsb-period N] [--layers-per-checkpoint S|auto]
#       [--checkpoint-every N] [--shuffle-seed S] [--telemetry-url URL] [--token T]
#       [--device-profile NAME] [--no-verify] [--via service|activity]
#   scripts/android/start.sh --resume [--via ...]     # resume the app's latest run (no run id needed)
# NAME and FILE are what deploy.sh pushed (FILE: plain text, or chat JSONL with --chat); the app makes the
# rows and the held-out split on the phone. Restarting with the same --run-id resumes from its checkpoint.
# --via activity starts it through the app's Activity, for phones that refuse a foreground-service start
# from the shell. --lcsb-seed/--lcsb-period: the random policy's (default 0 and 4 * ceil(layers / k), as
# `toolchain plan lcsb`). --layers-per-checkpoint S: keep one layer input per S selected layers and rerun the
# forward for the others (less memory, more compute, the same result); auto = round(sqrt(layers per step)).
source "$(dirname "$0")/common.sh"

run_id=""; via=service; extras=(); resume=0
add() { safe "$1" "$2"; extras+=(--es "$1" "$2"); }
while [ $# -gt 0 ]; do
    case "$1" in
        --program) add program "$2"; shift 2 ;;
        --data|--text) add text "$2"; shift 2 ;;
        --chat) add chat true; shift ;;
        --held-out) add held_out "$2"; shift 2 ;;
        --held-out-seed) add held_out_seed "$2"; shift 2 ;;
        --lcsb) add lcsb "$2"; shift 2 ;;
        --k) add k "$2"; shift 2 ;;
        --lcsb-seed) add lcsb_seed "$2"; shift 2 ;;
        --lcsb-period) add lcsb_period "$2"; shift 2 ;;
        --layers-per-checkpoint)
            [[ "$2" =~ ^([1-9][0-9]*|auto)$ ]] || die "--layers-per-checkpoint must be a positive integer or auto, got '$2'"
            add layers_per_checkpoint "$2"; shift 2 ;;
        --resume) resume=1; shift ;;
        --steps) add steps "$2"; shift 2 ;;
        --lr) add lr "$2"; shift 2 ;;
        --run-id) run_id="$2"; shift 2 ;;
        --budget-mb) add budget_mb "$2"; shift 2 ;;
        --checkpoint-every) add checkpoint_every "$2"; shift 2 ;;
        --shuffle-seed) add shuffle_seed "$2"; shift 2 ;;
        --telemetry-url) add telemetry_url "$2"; shift 2 ;;
        --token) add telemetry_token "$2"; shift 2 ;;
        --device-profile) add device_profile "$2"; shift 2 ;;
        --no-verify) add verify false; shift ;;
        --via) via="$2"; shift 2 ;;
        *) die "unknown option $1" ;;
    esac
done
if [ $resume = 1 ]; then
    [ -z "$run_id" ] || extras+=(--es run_id "$run_id")
else
    printf '%s\n' "${extras[@]}" | grep -qx program || die "--program is required (or --resume)"
    printf '%s\n' "${extras[@]}" | grep -qx text || die "--data is required (or --resume)"
    [ -n "$run_id" ] || run_id="adb-$(date -u +%Y%m%dT%H%M%SZ)-$$"
    [[ "$run_id" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$ ]] || die "--run-id '$run_id' must be letters, digits, '.', '_', '-' (at most 128)"
    extras+=(--es run_id "$run_id")
fi
need_device
case "$via" in
    service) adb_ shell am start-foreground-service -n "$SERVICE" -a "$ACTION_START" "${extras[@]}" >&2 ;;
    activity) adb_ shell am start -n "$ACTIVITY" -a "$ACTION_START" "${extras[@]}" >&2 ;;
    *) die "--via must be service or activity" ;;
esac
note "started run ${run_id:-(latest)}"
echo "${run_id:-latest}"
