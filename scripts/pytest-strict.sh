#!/usr/bin/env bash
# pytest, but "no tests collected" (exit 5) is a failure: an empty suite must never pass as green.
set -uo pipefail
pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest-strict: no tests were collected from: $*" >&2
fi
exit "$rc"
