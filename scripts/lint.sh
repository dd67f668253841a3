#!/usr/bin/env bash
# Every linter of `make lint`, each timed. All of them run; the script fails when any failed, naming which.
# Tools come from requirements.txt (.venv); settings: pyproject.toml (ruff, mypy), .yamllint, .ansible-lint,
# .aar_doc.yml (role README tables).
set -euo pipefail
cd "$(dirname "$0")/.."

# Shell scripts: files whose first line is a sh/bash shebang (*.sh, .ci/run, the fixtures' stand-in commands),
# outside the caches and venvs .gitignore lists (CI may run from a tree without .git).
shell_scripts() {
  # shellcheck disable=SC2016  # $0 is awk's, in single quotes on purpose
  find . \( -name .git -o -name .venv -o -name .cache -o -name .ansible -o -name '.*_cache' -o -name .hypothesis \
    -o -name __pycache__ -o -path ./artifacts -o -path ./collections \) -prune -o -type f -print0 |
    xargs -0 awk 'FNR == 1 { if ($0 ~ /^#!.*[\/ ](ba|da)?sh( |$)/) print substr(FILENAME, 3); nextfile }' | sort
}

failed=()
run() {
  local name=$1 t0=$SECONDS
  shift
  if "$@"; then
    echo "== lint $name: ok in $((SECONDS - t0)) s"
  else
    echo "== lint $name: FAILED in $((SECONDS - t0)) s"
    failed+=("$name")
  fi
}

mapfile -t scripts < <(shell_scripts)
run ruff ruff check --no-cache .
run mypy mypy
run shellcheck shellcheck "${scripts[@]}"
run role-docs bash scripts/role-docs.sh --check
run yamllint yamllint --strict .
run ansible-lint ansible-lint --offline --profile production

if [ "${#failed[@]}" -gt 0 ]; then
  echo "lint: failed: ${failed[*]}" >&2
  exit 1
fi
