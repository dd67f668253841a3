#!/usr/bin/env bash
# Build the systemd base images the molecule scenarios use, without Docker Hub:
# debootstrap a minimal root filesystem and `docker import` it. Cached: an image that exists is not rebuilt. The
# suites build side by side (each waits on the mirror, not the CPU), each under its own lock, so a second caller
# (make venv-image wants bookworm alone, beside make images) waits for the first and finds the image built.
#   local/debian-systemd:bookworm  (Debian 12)     local/debian-systemd:trixie (Debian 13, on request)
#   local/ubuntu-systemd:noble     (Ubuntu 24.04)  local/ubuntu-systemd:jammy (Ubuntu 22.04, on request)
# Usage: tests/images/build-base-images.sh [bookworm] [noble] [trixie] [jammy]   (default: bookworm noble)
set -euo pipefail

DOCKER=${DOCKER:-$(command -v /usr/bin/docker || command -v docker)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
UBUNTU_MIRROR=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
WORK=${BASE_IMAGE_WORKDIR:-/var/tmp/vllm-node-images}
INCLUDE=python3,systemd,systemd-sysv,sudo,ca-certificates

die() { echo "build-base-images: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root (sudo $0 $*)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
"$DOCKER" info >/dev/null 2>&1 || die "no Docker engine answers: apt-get install -y docker.io && dockerd &"

# Ubuntu's archive keyring, so debootstrap verifies Ubuntu's Release file. Debian 12 does not package it;
# Debian 13 does, so fetch it through apt (which checks trixie's signature) from a throwaway source list.
ubuntu_keyring() {
  local dir=$WORK/ubuntu-keyring keyring
  keyring=$dir/root/usr/share/keyrings/ubuntu-archive-keyring.gpg
  if [ ! -s "$keyring" ]; then
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    echo "deb $DEBIAN_MIRROR trixie main" > "$dir/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o APT::Sandbox::User=root -qq)
    apt-get "${opts[@]}" update >&2
    (cd "$dir" && apt-get "${opts[@]}" download ubuntu-keyring >&2)
    dpkg-deb -x "$dir"/ubuntu-keyring_*.deb "$dir/root"
  fi
  echo "$keyring"
}

build() {
  local suite=$1 image mirror script=() keyring=()
  case $suite in
    bookworm|trixie) image=local/debian-systemd:$suite; mirror=$DEBIAN_MIRROR ;;
    noble|jammy)
      image=local/ubuntu-systemd:$suite; mirror=$UBUNTU_MIRROR
      keyring=(--keyring="$(ubuntu_keyring)")
      # Debian 12's debootstrap has no script for these suites; gutsy is the generic Ubuntu one.
      [ -e "/usr/share/debootstrap/scripts/$suite" ] || script=(/usr/share/debootstrap/scripts/gutsy) ;;
    *) die "unknown suite '$suite' (choose: bookworm trixie noble jammy)" ;;
  esac
  exec {lock}>"$WORK/$suite.lock"
  flock "$lock"
  if "$DOCKER" image inspect "$image" >/dev/null 2>&1; then
    echo "$image: cached"; return
  fi
  local start=$SECONDS rootfs=$WORK/rootfs-$suite
  rm -rf "$rootfs"; mkdir -p "$rootfs"
  debootstrap --variant=minbase --include="$INCLUDE" "${keyring[@]}" "$suite" "$rootfs" "$mirror" "${script[@]}" \
    > "$WORK/debootstrap-$suite.log" 2>&1 || { tail -20 "$WORK/debootstrap-$suite.log" >&2; die "debootstrap $suite failed"; }
  # A fresh machine-id on first boot of each container.
  rm -f "$rootfs"/etc/machine-id && touch "$rootfs"/etc/machine-id
  tar -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV container=docker' --change 'CMD ["/lib/systemd/systemd"]' \
    - "$image" >/dev/null
  rm -rf "$rootfs"
  echo "$image: built in $((SECONDS - start)) s"
}

mkdir -p "$WORK"
suites=("$@"); [ ${#suites[@]} -gt 0 ] || suites=(bookworm noble)
if [[ " ${suites[*]} " == *" noble "* || " ${suites[*]} " == *" jammy "* ]]; then
  ubuntu_keyring >/dev/null   # once, before the suites that use it build side by side
fi
pids=()
for s in "${suites[@]}"; do build "$s" & pids+=("$!"); done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit "$rc"
