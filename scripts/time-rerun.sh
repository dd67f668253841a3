#!/usr/bin/env bash
# Time an idempotent re-run of playbooks/site.yml on a converged node and print the figure the README quotes:
# wall time, tasks run, changed count, the machine's load average during the run and the 20 slowest tasks.
# Usage: scripts/time-rerun.sh [INVENTORY] [extra ansible-playbook arguments...]
#   INVENTORY  default inventories/demo/hosts.yml (the node `make demo` converged)
#   RERUN_MAX_SECONDS  fail above this wall time on an idle machine (default 60, the target); stretched by the
#                      mean load average per CPU above 1, so a busy machine does not flake (as the site_e2e test does)
#   RERUN_LOG          keep the whole ansible output there (default a temporary file, removed)
# Fails when the run fails, changes anything (changed != 0) or takes longer than the bound.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg" ANSIBLE_FORCE_COLOR=0
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks PROFILE_TASKS_TASK_OUTPUT_LIMIT=20

inventory=${1:-inventories/demo/hosts.yml}
shift || true
max=${RERUN_MAX_SECONDS:-60}
log=${RERUN_LOG:-$(mktemp)}
[ -n "${RERUN_LOG:-}" ] || trap 'rm -f "$log"' EXIT

# The 1-minute load average every 2 s while the run lasts: the figure means little without it.
loads=$(mktemp)
( while :; do cut -d' ' -f1 /proc/loadavg >>"$loads"; sleep 2; done ) &
sampler=$!

start=$(date +%s.%N)
rc=0
ansible-playbook -i "$inventory" playbooks/site.yml "$@" >"$log" 2>&1 || rc=$?
end=$(date +%s.%N)
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true

wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
tasks=$(grep -c '^TASK \[' "$log" || true)
handlers=$(grep -c '^RUNNING HANDLER \[' "$log" || true)
recap=$(sed -n '/^PLAY RECAP/,/^$/p' "$log" | grep -E 'ok=' || true)
changed=$(sed -nE 's/.*changed=([0-9]+).*/\1/p' <<<"$recap" | awk '{ s += $1 } END { print s + 0 }')
load=$(awk '{ s += $1; if (NR == 1 || $1 < lo) lo = $1; if ($1 > hi) hi = $1 }
            END { if (NR) printf "mean %.2f (min %.2f, max %.2f, %d samples)", s / NR, lo, hi, NR; else print "unknown" }' "$loads")
cpus=$(nproc)
bound=$(awk -v m="$max" -v c="$cpus" '{ s += $1 } END { f = NR ? s / NR / c : 1; printf "%.0f", m * (f > 1 ? f : 1) }' "$loads")
rm -f "$loads"

echo "== slowest tasks"
sed -n '/^TASKS RECAP/,$p' "$log" | grep -E -- '-+ [0-9.]+s$' | head -n 20
echo "== recap"
echo "$recap"
echo "== site.yml re-run on $inventory: ${wall} s wall, $tasks tasks ($handlers handlers), changed=$changed," \
     "load average $load, $cpus CPUs (bound ${bound} s)"

if [ "$rc" -ne 0 ]; then
  tail -n 40 "$log" >&2
  echo "time-rerun: ansible-playbook failed (rc $rc)" >&2
  exit 1
fi
if [ "$changed" -ne 0 ]; then
  grep -E '^changed:' -B3 "$log" | grep -E '^TASK' >&2 || true
  echo "time-rerun: the re-run changed $changed thing(s); a converged node must report changed=0" >&2
  exit 1
fi
if awk -v w="$wall" -v m="$bound" 'BEGIN { exit !(w > m) }'; then
  echo "time-rerun: ${wall} s is above ${bound} s (RERUN_MAX_SECONDS=$max at this load)" >&2
  exit 1
fi
