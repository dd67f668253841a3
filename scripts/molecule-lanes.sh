#!/usr/bin/env bash
# Run molecule scenarios, optionally in two lanes so the slowest ones overlap the others.
# Usage: scripts/molecule-lanes.sh JOBS "HEAVY SCENARIOS" SCENARIO...
#   JOBS=1: every scenario one after another, in the given order.
#   JOBS=2: the given scenarios that are named in HEAVY run in order in one lane, the rest in order in the
#   other. Much of a scenario's time is docker-exec round trips and downloads, not CPU, so two lanes overlap
#   well even on 2 cores; scenarios use distinct container names and their own hubs.
# Each scenario's output is prefixed with its name and kept in artifacts/molecule/<scenario>.log.
set -uo pipefail
jobs=$1; heavy_names=" $2 "; shift 2
logdir=artifacts/molecule
mkdir -p "$logdir"

run_one() {
  local s=$1 t0=$SECONDS rc
  molecule test -s "$s" 2>&1 | tee "$logdir/$s.log" | sed -u "s/^/[$s] /"
  rc=${PIPESTATUS[0]}
  echo "== stage molecule $s: $((SECONDS - t0)) s (exit $rc)"
  return "$rc"
}

run_lane() {
  local s
  for s in "$@"; do run_one "$s" || return 1; done
}

heavy=() light=()
for s in "$@"; do
  if [[ $heavy_names == *" $s "* ]]; then heavy+=("$s"); else light+=("$s"); fi
done
if [ "$jobs" -le 1 ] || [ ${#heavy[@]} -eq 0 ] || [ ${#light[@]} -eq 0 ]; then
  run_lane "$@"; exit $?
fi
run_lane "${heavy[@]}" & heavy_pid=$!
run_lane "${light[@]}"; light_rc=$?
wait "$heavy_pid"; heavy_rc=$?
[ "$light_rc" -eq 0 ] && [ "$heavy_rc" -eq 0 ]
