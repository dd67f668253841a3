#!/usr/bin/env bash
# Make sure a Docker engine answers and debootstrap and gpg exist (the molecule scenarios and `make demo` need them).
# On Debian/Ubuntu as root: install Debian's docker.io + debootstrap when missing and start dockerd in the
# background. Elsewhere: stop and print the exact commands to run.
set -euo pipefail
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker || echo /usr/bin/docker)

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
missing=()
[ -x /usr/bin/dockerd ] || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
# The driver scenario signs its stand-in NVIDIA apt repository with a throwaway key.
command -v gpg >/dev/null || missing+=(gnupg)
if [ ${#missing[@]} -gt 0 ]; then
  echo "ensure-docker: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  DOCKER=/usr/bin/docker
fi
if ! engine_up; then
  echo "ensure-docker: starting dockerd"
  if [ -d /run/systemd/system ] && systemctl start docker 2>/dev/null; then :; else
    nohup /usr/bin/dockerd >/var/log/dockerd.log 2>&1 &
  fi
  for _ in $(seq 1 60); do engine_up && break; sleep 1; done
  engine_up || { echo "ensure-docker: dockerd did not come up; see /var/log/dockerd.log" >&2; exit 1; }
fi
