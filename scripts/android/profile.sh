#!/usr/bin/env bash
# One profiled run, start to report:
#   deploy -> telemetry server + adb reverse -> start training -> sample dumpsys meminfo until the run
#   ends -> pull telemetry and adapter -> toolchain telemetry import -> toolchain telemetry report.
#   scripts/android/profile.sh PROGRAM_DIR TEXT_FILE [--steps N] [--lr LR] [--budget-mb MB] [--chat]
#       [--held-out F] [--lcsb POLICY] [--k K] [--lcsb-seed S] [--lcsb-period N] [--layers-per-checkpoint S|auto]
#       [--run-id ID] [--apk APP.apk] [--out DIR] [--db FILE]
#       [--port P] [--interval S] [--timeout S] [--no-server] [--via service|activity]
# Output: DIR (default android-runs/RUN_ID) with telemetry.jsonl, dumpsys.jsonl, adapter/, report/index.html.
# --no-server skips the live upload: the pulled log carries the same events.
source "$(dirname "$0")/common.sh"

[ $# -ge 2 ] || die "usage: profile.sh PROGRAM_DIR TEXT_FILE [options]; see the header of $0"
program="${1%/}"; data="$2"; shift 2
run_id="adb-$(date -u +%Y%m%dT%H%M%SZ)-$$"; out=""; db=""; port=8765; interval=2; timeout=3600; server=1
deploy_opts=(); start_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
        --steps|--lr|--budget-mb|--checkpoint-every|--shuffle-seed|--device-profile|--via|--held-out|--held-out-seed|--lcsb|--k|--lcsb-seed|--lcsb-period|--layers-per-checkpoint)
            start_opts+=("$1" "$2"); shift 2 ;;
        --chat) start_opts+=(--chat); shift ;;
        --apk) deploy_opts+=(--apk "$2"); shift 2 ;;
        --run-id) run_id="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --db) db="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --interval) interval="$2"; shift 2 ;;
        --timeout) timeout="$2"; shift 2 ;;
        --no-server) server=0; shift ;;
        *) die "unknown option $1" ;;
    esac
done
out="${out:-android-runs/$run_id}"; db="${db:-$out/telemetry.sqlite3}"
mkdir -p "$out"
need_device

name="$("$HERE/deploy.sh" "$program" "$data" "${deploy_opts[@]}")"

server_pid=""
cleanup() {  # stop the server and wait, so its database is closed before the import
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
if [ $server = 1 ]; then
    token="$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))')"
    tc="$(toolchain_bin)"
    TOOLCHAIN_TELEMETRY_TOKEN="$token" "$tc" telemetry serve --host 127.0.0.1 --port "$port" --db "$db" \
        >"$out/server.log" 2>&1 &
    server_pid=$!
    "$PYTHON" - "$port" <<'PY' || die "telemetry server did not come up on port $port (see $out/server.log)"
import sys, time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/health", timeout=1).read()
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit(1)
PY
    url="$("$HERE/reverse.sh" "$port")"
    start_opts+=(--telemetry-url "$url" --token "$token")
fi

"$HERE/start.sh" --program "$name" --data "$(basename "$data")" --run-id "$run_id" "${start_opts[@]}" >/dev/null
note "profiling run $run_id (dumpsys every ${interval}s, timeout ${timeout}s)"
remote_log="$REMOTE/runs/$run_id/telemetry.jsonl"
started=$(date +%s); deadline=$(( started + timeout ))
while :; do
    "$HERE/sample_meminfo.sh" --run-id "$run_id" --out "$out/dumpsys.jsonl" --count 1 --tries 1 --interval 0 2>/dev/null || true
    last="$(adb_ shell tail -n 1 "$remote_log" 2>/dev/null || true)"
    case "$last" in *'"type":"run_end"'*) break ;; esac
    if [ -z "$last" ] && [ $(( $(date +%s) - started )) -gt 60 ]; then
        die "the app wrote no telemetry for run $run_id in 60 s; see 'adb logcat -s Trainer'"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || { note "timeout: the run has not ended; stopping it"; "$HERE/stop.sh" || true; sleep "$interval"; break; }
    sleep "$interval"
done

cleanup; server_pid=""
"$HERE/pull.sh" --run-id "$run_id" --out "$out" >/dev/null
files=("$out/telemetry.jsonl")
[ -s "$out/dumpsys.jsonl" ] && files+=("$out/dumpsys.jsonl")
toolchain_ telemetry import "${files[@]}" --db "$db" >&2
toolchain_ telemetry report "$run_id" --db "$db" --out "$out/report" >&2
note "run $run_id: $out/report/index.html"
echo "$out"
