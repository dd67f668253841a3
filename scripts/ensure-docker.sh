#!/usr/bin/env bash
# Make sure a Docker engine answers and debootstrap and gpg exist (the molecule scenarios, `make demo`, `make bundle`
# and the bundle signing tests need them).
# On Debian/Ubuntu as root: install Debian's docker.io + debootstrap when missing and start dockerd in the
# background. Elsewhere: stop and print the exact commands to run.
set -euo pipefail
# The overrides exist for tests/unit/test_foundation.py, which runs this script against stand-in tools.
DOCKER=${ENSURE_DOCKER_CLIENT:-/usr/bin/docker}
[ -x "$DOCKER" ] || DOCKER=$(command -v docker || echo /usr/bin/docker)
SBIN_DIRS=${ENSURE_DOCKER_SBIN_DIRS:-/usr/sbin:/usr/bin:/sbin}
WAIT_SECONDS=${ENSURE_DOCKER_WAIT_SECONDS:-90}
LOG=${ENSURE_DOCKER_LOG:-/var/log/dockerd.log}

engine_up() { "$DOCKER" info >/dev/null 2>&1; }

if engine_up && command -v debootstrap >/dev/null && command -v gpg >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  cat >&2 <<'MSG'
ensure-docker: a running Docker engine and debootstrap are needed. Run as root (Debian/Ubuntu):
  apt-get update && apt-get install -y docker.io debootstrap
  systemctl start docker        # or, without systemd: nohup dockerd >/var/log/dockerd.log 2>&1 &
MSG
  exit 1
fi
# Debian's docker.io puts the engine in /usr/sbin, which a non-login PATH may lack.
find_dockerd() { PATH="$PATH:$SBIN_DIRS" command -v dockerd || true; }
missing=()
[ -n "$(find_dockerd)" ] || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
# The driver scenario signs its stand-in NVIDIA apt repository with a throwaway key; make bundle signs the bundle's
# apt repository (scripts/bundle.py); the unit tests sign and check with gpg/gpgv.
command -v gpg >/dev/null || missing+=(gnupg)
if [ ${#missing[@]} -gt 0 ]; then
  echo "ensure-docker: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  DOCKER=${ENSURE_DOCKER_CLIENT:-/usr/bin/docker}
fi
if ! engine_up; then
  echo "ensure-docker: starting dockerd"
  if [ -z "${ENSURE_DOCKER_CLIENT:-}" ] && [ -d /run/systemd/system ] && systemctl start docker 2>/dev/null; then :; else
    dockerd_bin=$(find_dockerd)
    [ -n "$dockerd_bin" ] || { echo "ensure-docker: docker.io is installed but no dockerd binary was found" >&2; exit 1; }
    nohup "$dockerd_bin" >"$LOG" 2>&1 &
    dockerd_pid=$!
  fi
  # Stop waiting as soon as an engine we started has exited: its log already says why.
  for _ in $(seq 1 "$WAIT_SECONDS"); do
    engine_up && break
    [ -z "${dockerd_pid:-}" ] || kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 1
  done
  if ! engine_up; then
    if [ -n "${dockerd_pid:-}" ] && ! kill -0 "$dockerd_pid" 2>/dev/null; then
      echo "ensure-docker: dockerd exited before it answered; the end of $LOG:" >&2
    else
      echo "ensure-docker: dockerd did not come up within $WAIT_SECONDS s; the end of $LOG:" >&2
    fi
    tail -n 30 "$LOG" >&2 || true
    exit 1
  fi
fi
