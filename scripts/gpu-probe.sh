#!/usr/bin/env bash
# The GPU probe (issue 28; `make gpu-probe GPU_PROBE_DIR=<dir>`): on a host with an NVIDIA GPU, no network and a
# Python >= 3.11 with PyTorch, it runs the project's own code there through `ansible-playbook -c local`
# (playbooks/gpu_probe.yml: node facts, GPU detection against the catalog, the health verdict, the plan for one
# catalog model on one GPU) from the wheels it carries, measures with PyTorch what the plan assumes per GPU
# (scripts/gpu_probe.py) and writes <dir>/gpu-probe-report.json (fields: README.md, "GPU probe"), the raw tool
# outputs under <dir>/raw/ (fixtures for the parsers) and the playbook's files beside the report.
#   scripts/gpu-probe.sh wheels   on a connected machine: ansible-core and its dependencies for CPython 3.11-3.13
#                                 into .cache/gpu-probe/wheels (the probe carries that directory; ~25 MiB)
#   scripts/gpu-probe.sh DIR      the probe (GPU_PROBE_PYTHON: the Python with PyTorch, default python3)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheels=${GPU_PROBE_WHEELS:-$root/.cache/gpu-probe/wheels}
python=${GPU_PROBE_PYTHON:-python3}

if [[ ${1:-} == wheels ]]; then
    mkdir -p "$wheels"
    # The controller's ansible-core for 3.12+, the last one that runs on 3.11 (Debian 12's Python) for 3.11.
    core=$("$root/.venv/bin/python" -c 'import ansible.release; print(ansible.release.__version__)')
    for version in 3.11 3.12 3.13; do
        spec="ansible-core==$core"
        [[ $version == 3.11 ]] && spec='ansible-core>=2.19,<2.20'
        "$root/.venv/bin/python" -m pip download --quiet --dest "$wheels" --only-binary=:all: \
            --python-version "$version" --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$spec" pip
    done
    du -sh "$wheels"
    exit 0
fi

out=${1:?usage: scripts/gpu-probe.sh OUT_DIR | wheels}
started=$(date +%s)
mkdir -p "$out/raw"
out=$(cd "$out" && pwd)
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "gpu-probe: $python is $("$python" -V 2>&1); ansible-core needs Python >= 3.11 (set GPU_PROBE_PYTHON)" >&2
    exit 2
fi
pip_wheel=$(find "$wheels" -maxdepth 1 -name 'pip-*.whl' | sort | tail -1)
if [[ -z $pip_wheel ]]; then
    echo "gpu-probe: no wheels in $wheels: run 'scripts/gpu-probe.sh wheels' on a connected machine first" >&2
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "gpu-probe: installing ansible-core from $wheels (no index)"
"$python" "$pip_wheel/pip" install --quiet --disable-pip-version-check --no-index --find-links "$wheels" \
    --target "$work/site" ansible-core

echo "gpu-probe: raw outputs to $out/raw"
capture() {  # capture NAME COMMAND...: stdout to raw/NAME, the exit status beside it; a failing tool is recorded
    local name=$1
    shift
    local rc=0
    "$@" >"$out/raw/$name" 2>"$out/raw/$name.stderr" || rc=$?
    echo "$rc" >"$out/raw/$name.rc"
}
capture nvidia-smi-q-x.xml nvidia-smi -q -x
capture nvidia-smi-query.csv nvidia-smi \
    --query-gpu=index,name,memory.total,memory.used,memory.free,compute_cap,pci.bus_id,pci.device_id,driver_version,uuid,serial \
    --format=csv
capture nvidia-smi.txt nvidia-smi
capture lspci-nn.txt lspci -nn -d 10de:
capture proc-driver-nvidia-version.txt cat /proc/driver/nvidia/version

echo "gpu-probe: playbooks/gpu_probe.yml (ansible-playbook -c local)"
PYTHONPATH="$work/site" ANSIBLE_CONFIG="$root/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$root/collections" \
    ANSIBLE_ROLES_PATH="$root/roles" ANSIBLE_HOME="$work/ansible-home" ANSIBLE_LOCAL_TEMP="$work/ansible-tmp" \
    ANSIBLE_NOCOLOR=1 ANSIBLE_LOCALHOST_WARNING=false \
    "$python" -m ansible playbook -i localhost, -c local -e "ansible_python_interpreter=$python" \
    -e "gpu_probe_dir=$out" "$root/playbooks/gpu_probe.yml" 2>&1 | tee "$out/raw/ansible-playbook.log"

echo "gpu-probe: measuring with PyTorch"
"$python" "$root/scripts/gpu_probe.py" measure "$out"
"$python" "$root/scripts/gpu_probe.py" report "$out" "$started"
echo "gpu-probe: wrote $out/gpu-probe-report.json in $(($(date +%s) - started)) s"
