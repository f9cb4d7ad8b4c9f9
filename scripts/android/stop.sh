#!/usr/bin/env bash
# Ask the running trainer to checkpoint and stop after its current step (run_end status 'cancelled').
#   scripts/android/stop.sh
source "$(dirname "$0")/common.sh"
need_device
adb_ shell am broadcast -a "$ACTION_STOP" -p "$PKG" >&2
note "stop requested"
