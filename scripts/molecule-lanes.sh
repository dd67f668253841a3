#!/usr/bin/env bash
# Run molecule scenarios, optionally in two lanes so the slowest one overlaps the others.
# Usage: scripts/molecule-lanes.sh JOBS SCENARIO...   (scenarios ordered cheapest first)
#   JOBS=1: one after another.  JOBS=2: the last (heaviest) scenario in its own lane, the rest in order in
#   the other. Much of a scenario's time is docker-exec round trips and downloads, not CPU, so two lanes
#   overlap well even on 2 cores; scenarios use distinct container names and their own hubs.
# Each scenario's output is prefixed with its name and kept in artifacts/molecule/<scenario>.log.
set -uo pipefail
jobs=$1; shift
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

if [ "$jobs" -le 1 ] || [ $# -le 1 ]; then
  run_lane "$@"; exit $?
fi
heavy=${!#}
rest=("${@:1:$#-1}")
run_one "$heavy" & heavy_pid=$!
run_lane "${rest[@]}"; rest_rc=$?
wait "$heavy_pid"; heavy_rc=$?
[ "$rest_rc" -eq 0 ] && [ "$heavy_rc" -eq 0 ]
