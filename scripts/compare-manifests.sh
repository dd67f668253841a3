#!/usr/bin/env bash
# Compare two node manifests field by field outside their host section (roles/node_manifest/README.md).
#   scripts/compare-manifests.sh artifacts/node-a/manifest.json artifacts/node-b/manifest.json [--ignore PATH ...]
# Exit 0 = the same node, 1 = differences (printed one per line), 2 = a file could not be read.
# The comparison is the collection's own Python (plugins/module_utils/node_manifest.py), run from the checkout's
# collections/ link stub; it needs only the standard library.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
[ -x "$root/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && python=$root/.venv/bin/python
PYTHONPATH="$root/collections${PYTHONPATH:+:$PYTHONPATH}" \
  exec "$python" -m ansible_collections.vllm_node.vllm_node.plugins.module_utils.node_manifest "$@"
