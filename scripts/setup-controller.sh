#!/usr/bin/env bash
# Create the pinned controller venv (.venv) from requirements.txt when missing; when requirements.txt changed, install
# it into the existing venv (the tools stay usable meanwhile; a package dropped from the file stays until
# `rm -rf .venv`, CI always starts without one).
# Current ansible (14.x, ansible-core 2.21) needs Python >= 3.12: find one on this machine or say what to install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP=$VENV/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)

if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

supported() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; }
install() { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt; }

if [ -x "$VENV/bin/python" ] && supported "$VENV/bin/python"; then
  echo "setup: requirements.txt changed: installing it into $VENV"
  install
  echo "$want" > "$STAMP"
  exit 0
fi

find_python() {
  local c
  for c in "${PYTHON:-}" python3.14 python3.13 python3.12 python3; do
    # Resolved: `make` puts .venv/bin first on PATH, and the venv's python must not be the base of a new venv.
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && supported "$(command -v "$c")" &&
      { readlink -f "$(command -v "$c")"; return; }
  done
  # pyenv installs (present on these build machines) without relying on a shim being active.
  # Newest first; an unmatched glob stays literal and fails the probe.
  while IFS= read -r c; do
    supported "$c" && { echo "$c"; return; }
  done < <(printf '%s\n' "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python | sort -rV)
  return 1
}

if ! PY=$(find_python); then
  cat >&2 <<'MSG'
setup: no Python >= 3.12 found (ansible 14 / ansible-core 2.21 needs it).
  Debian 13 / Ubuntu 24.04: apt-get install -y python3 python3-venv
  Debian 12:                install one with pyenv (pyenv install 3.12) or uv (uv python install 3.12),
                            then re-run with PYTHON=/path/to/python3.12 make ...
MSG
  exit 1
fi
echo "setup: creating $VENV with $PY ($("$PY" --version))"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
install
echo "$want" > "$STAMP"
