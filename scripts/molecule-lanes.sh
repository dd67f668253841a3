#!/usr/bin/env bash
# Run molecule scenarios, optionally in lanes so the slowest ones overlap the others.
# Usage: scripts/molecule-lanes.sh JOBS "LANES" SCENARIO...
#   A SCENARIO named make:<target> runs `make <target>` in its place (make test puts the integration tests in the
#   lightest lane instead of before every scenario).
#   JOBS=1: every scenario one after another, in the given order.
#   JOBS>1: LANES is a ';'-separated list of lanes, each a space-separated list of scenario names, e.g.
#   "model_pipeline site_e2e;day2". The given scenarios named in a lane run in order in that lane, the rest in order
#   in one more lane; all lanes run at once. Much of a scenario's time is docker-exec round trips, downloads and
#   waiting for vLLM, not CPU, so lanes overlap well even on 2 cores; scenarios use distinct container names and
#   their own hubs.
# Each scenario's output is prefixed with its name and kept in artifacts/molecule/<scenario>.log.
set -uo pipefail
jobs=$1; lanes_spec=$2; shift 2
logdir=artifacts/molecule
mkdir -p "$logdir"
: > "$logdir/recap.txt"
# CPU per container and for the whole machine while the lanes run (2 cores: the run is bound by CPU); the table ends
# the recap. The sampler reads cgroup counters every 15 s and stops with the lanes.
: > "$logdir/cpu-samples.jsonl"
python3 "$(dirname "$0")/cpu_account.py" sample "$logdir/cpu-samples.jsonl" & sampler=$!
trap 'kill "$sampler" 2>/dev/null' EXIT   # also when the run is interrupted before its recap
# ...and each scenario's own process tree on this machine (molecule, ansible-playbook, pytest, the docker CLI)
: > "$logdir/controller-cpu.txt"
measured=(python3 "$(dirname "$0")/cpu_account.py" run "$logdir/controller-cpu.txt")

run_one() {
  local s=$1 t0=$SECONDS rc
  if [[ $s == make:* ]]; then
    "${measured[@]}" "$s" -- make --no-print-directory "${s#make:}" 2>&1 | tee "$logdir/${s#make:}.log" |
      sed -u "s/^/[$s] /"
  else
    "${measured[@]}" "$s" -- molecule test -s "$s" 2>&1 | tee "$logdir/$s.log" | sed -u "s/^/[$s] /"
  fi
  rc=${PIPESTATUS[0]}
  echo "== stage molecule $s: $((SECONDS - t0)) s (exit $rc)"
  echo "$s $((SECONDS - t0)) $rc" >> "$logdir/recap.txt"
  return "$rc"
}

# The lanes' output interleaves and CI keeps only its tail, so the end repeats each scenario's result and, for a
# failed one, the lines that say why.
recap() {
  local s secs rc
  kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
  python3 "$(dirname "$0")/cpu_account.py" report "$logdir/cpu-samples.jsonl" | tee "$logdir/cpu-account.txt"
  echo "== molecule recap (scenario, seconds, exit)"
  while read -r s secs rc; do
    echo "   $s $secs s exit $rc"
  done < "$logdir/recap.txt"
  while read -r s secs rc; do
    [ "$rc" -eq 0 ] && continue
    echo "== $s failed; its failing lines ($logdir/${s#make:}.log):"
    grep -E '^(FAILED|ERROR) |^E  +[A-Za-z]|fatal: \[|failed: \[|Executed: Failed|CRITICAL|Error [0-9]' \
      "$logdir/${s#make:}.log" | tail -n 40 | cut -c1-400
  done < "$logdir/recap.txt"
}

run_lane() {
  local s
  for s in "$@"; do run_one "$s" || return 1; done
}

if [ "$jobs" -le 1 ]; then
  run_lane "$@"; rc=$?; recap; exit "$rc"
fi

# lane i = the given scenarios named in the i-th part of LANES (in the given order); the rest form the last lane
IFS=';' read -r -a parts <<< "$lanes_spec"
lanes=() rest=()
for _ in "${parts[@]}"; do lanes+=(""); done
for s in "$@"; do
  placed=0
  for i in "${!parts[@]}"; do
    if [[ " ${parts[$i]} " == *" $s "* ]]; then lanes[i]+="$s "; placed=1; break; fi
  done
  [ "$placed" -eq 1 ] || rest+=("$s")
done
[ ${#rest[@]} -eq 0 ] || lanes+=("${rest[*]}")

pids=()
for lane in "${lanes[@]}"; do
  [ -n "${lane// /}" ] || continue
  # shellcheck disable=SC2086  # a lane is a space-separated list of scenario names
  run_lane $lane & pids+=("$!")
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
recap
exit "$rc"
