"""What the nvidia_driver role left on the simulated GPU nodes (run by molecule's testinfra verifier).

nvdrv-noble: 8 x RTX PRO 6000 Blackwell, install type full (nvidia-open, Ubuntu's 580 package names).
nvdrv-bookworm: HGX B200 with NVSwitches, compute-only, Fabric Manager + NVLSM, CUDA toolkit 12.8.
The repository offers branch 590 too: every "580" assertion below also proves the pinning works.
"""
from __future__ import annotations

import json

import pytest

WANTED = "580.95.05"
OPEN_LICENSE = "Dual MIT/GPL"
PACKAGES = {
    "nvdrv-noble": ["nvidia-driver-pinning-580", "nvidia-open", "libnvidia-compute-580", "nvidia-dkms-580-open",
                    "nvidia-utils-580", "nvidia-compute-utils-580"],
    "nvdrv-bookworm": ["nvidia-driver-pinning-580", "nvidia-driver-cuda", "nvidia-kernel-open-dkms",
                       "nvidia-persistenced", "nvidia-fabricmanager-580", "nvlsm", "libnvsdm", "cuda-toolkit-12-8"],
}
NEVER = ["cuda", "cuda-drivers", "cuda-drivers-580", "nvidia-kernel-dkms", "nvidia-dkms-580", "nvidia-fabricmanager"]
# The GPU record schema of node_facts_gpus: bus id as lspci -D prints it, PCI id as lspci -nn does.
GPUS = {
    "nvdrv-noble": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "12.0", "0000:01:00.0", "10de:2bb5"),
    "nvdrv-bookworm": ("NVIDIA B200", 183359, "10.0", "0000:18:00.0", "10de:2901"),
}


def name(host) -> str:
    return host.backend.get_hostname()


def facts(host) -> dict:
    return json.loads(host.file("/var/lib/vllm-node-fake/facts.json").content_string)


def test_repository_is_a_deb822_source_signed_by_the_checked_key(host):
    source = host.file("/etc/apt/sources.list.d/nvidia-cuda.sources")
    assert source.exists
    text = source.content_string
    repo_dir = "ubuntu2404" if name(host) == "nvdrv-noble" else "debian12"
    assert f"URIs: http://127.0.0.1:8765/repos/{repo_dir}/x86_64/" in text
    assert "Suites: /" in text
    assert "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc" in text
    key = host.file("/etc/apt/keyrings/nvidia-cuda.asc")
    assert key.mode == 0o644 and "BEGIN PGP PUBLIC KEY BLOCK" in key.content_string
    # apt really trusts the repository through that key: the index was fetched and verified.
    policy = host.check_output("apt-cache policy nvidia-open")
    assert "127.0.0.1:8765" in policy


@pytest.mark.parametrize("index", range(8))
def test_packages_installed_at_the_pinned_branch(host, index):
    wanted = PACKAGES[name(host)]
    if index >= len(wanted):
        pytest.skip("fewer packages on this host")
    package = host.package(wanted[index])
    assert package.is_installed
    if package.name.startswith(("nvidia-", "libnvidia-", "libnvsdm")):
        assert package.version.startswith(WANTED + "-"), f"{package.name} {package.version}: pinning failed"


def test_pin_file_and_no_driver_pulling_meta_packages(host):
    pin = host.file("/etc/apt/preferences.d/nvidia-driver-pin")
    assert "Pin: version 580.*" in pin.content_string
    for package in NEVER:
        assert not host.package(package).is_installed, package
    # 590 is in the repository, yet neither pin nor holds let an upgrade through.
    simulated = host.check_output("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert "Inst nvidia" not in simulated and "Inst libnvidia" not in simulated


def test_nvidia_packages_are_held_and_others_are_not(host):
    held = set(host.check_output("apt-mark showhold").split())
    assert set(PACKAGES[name(host)]) <= held
    assert "dkms" not in held and not any(p.startswith("linux-headers") for p in held)


def test_dkms_built_the_open_module_for_the_running_kernel(host):
    kernel = host.check_output("uname -r")
    assert f"nvidia/{WANTED}, {kernel}, x86_64: installed" in host.check_output("dkms status -m nvidia")
    assert host.check_output("modinfo -F license nvidia") == OPEN_LICENSE


def test_nouveau_blacklisted_and_initramfs_rebuilt_once(host):
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string
    assert "blacklist nouveau" in conf and "options nouveau modeset=0" in conf
    assert conf.startswith("#") and "Ansible" in conf
    updates = host.file("/var/lib/vllm-node-fake/initramfs-updates").content_string.splitlines()
    assert len(updates) == 1, updates  # converge only: idempotence and check mode did not rebuild


def test_rebooted_exactly_once_into_the_open_module(host):
    reboots = host.file("/var/lib/vllm-node-fake/reboots").content_string.splitlines()
    assert len(reboots) == 1, reboots
    assert f"loaded={WANTED} flavour=open" in reboots[0]
    loaded = host.file("/var/lib/vllm-node-fake/proc/driver/nvidia/version").content_string
    assert f"Open Kernel Module for x86_64  {WANTED}" in loaded
    # nouveau stayed out after the reboot thanks to the blacklist.
    assert "nouveau" not in host.file("/var/lib/vllm-node-fake/proc/modules").content_string


def test_persistenced_runs_with_the_drop_in(host):
    service = host.service("nvidia-persistenced")
    assert service.is_enabled and service.is_running
    assert "--user root --persistence-mode --verbose" in host.file("/run/nvidia-persistenced/args").content_string


def test_fabric_manager_only_with_nvswitches(host):
    if name(host) == "nvdrv-bookworm":
        service = host.service("nvidia-fabricmanager")
        assert service.is_enabled and service.is_running
    else:
        assert not host.package("nvidia-fabricmanager-580").is_installed
        assert not host.file("/lib/systemd/system/nvidia-fabricmanager.service").exists


def test_cuda_toolkit_only_where_asked(host):
    nvcc = host.file("/usr/local/cuda-12.8/bin/nvcc")
    assert nvcc.exists == (name(host) == "nvdrv-bookworm")


def test_published_facts_come_from_nvidia_smi(host):
    data = facts(host)
    gpu_name, memory, capability, bus_id, device_id = GPUS[name(host)]
    assert data["version"] == WANTED and data["installed_version"] == WANTED
    assert data["flavour"] == "open" and data["blackwell"] is True and data["reboot_required"] is False
    assert len(data["gpus"]) == 8
    first = data["gpus"][0]
    assert first == {"index": 0, "name": gpu_name, "memory_total_mib": memory, "compute_capability": capability,
                     "pci_bus_id": bus_id, "pci_device_id": device_id}
    assert [g["index"] for g in data["gpus"]] == list(range(8))
    assert data["cuda_home"] == ("/usr/local/cuda-12.8" if name(host) == "nvdrv-bookworm" else "")


def test_no_reboot_when_forbidden_and_pending_state_reported(host):
    """noble's first play had nvidia_driver_reboot: false: packages in, no reboot, facts say a reboot is pending."""
    if name(host) != "nvdrv-noble":
        pytest.skip("only the Ubuntu node runs the play with reboots forbidden")
    first = json.loads(host.file("/var/lib/vllm-node-fake/facts-no-reboot.json").content_string)
    assert first == {"gpus": [], "version": "", "flavour": "", "installed_version": WANTED, "reboot_required": True}
    # The one reboot on record is the second play's (test_rebooted_exactly_once_into_the_open_module).


def test_dcgm_exporter_from_the_driver_repository_on_loopback(host):
    """nvdrv-bookworm asks for dcgm-exporter: NVIDIA's packages at the repository's version, held with the driver,
    the unit enabled and running with the drop-in's loopback address, /metrics serving DCGM fields. nvdrv-noble
    (the role alone, default off) has none of it."""
    core, exporter = host.package("datacenter-gpu-manager-4-core"), host.package("datacenter-gpu-manager-exporter")
    if name(host) != "nvdrv-bookworm":
        assert not core.is_installed and not exporter.is_installed
        assert not host.file("/etc/systemd/system/nvidia-dcgm-exporter.service.d/listen.conf").exists
        return
    assert core.is_installed and exporter.is_installed
    held = host.check_output("dpkg --get-selections datacenter-gpu-manager-exporter datacenter-gpu-manager-4-core")
    assert held.split() == ["datacenter-gpu-manager-exporter", "hold", "datacenter-gpu-manager-4-core", "hold"]
    drop_in = host.file("/etc/systemd/system/nvidia-dcgm-exporter.service.d/listen.conf").content_string
    assert "Environment=DCGM_EXPORTER_LISTEN=127.0.0.1:9400" in drop_in
    service = host.service("nvidia-dcgm-exporter")
    assert service.is_enabled and service.is_running
    # Bound to loopback only: it answers on 127.0.0.1 and refuses on the container's own address (docker maps the
    # hostname to it in /etc/hosts).
    probe = host.check_output(
        "python3 -c \"import socket; ip = socket.gethostbyname(socket.gethostname()); "
        "print(ip, socket.socket().connect_ex(('127.0.0.1', 9400)), socket.socket().connect_ex((ip, 9400)))\"").split()
    assert not probe[0].startswith("127."), probe
    assert probe[1] == "0" and probe[2] != "0", probe
    metrics = host.check_output(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9400/metrics').read().decode())\"")
    assert 'DCGM_FI_DEV_XID_ERRORS{gpu="0"' in metrics and "DCGM_FI_DEV_GPU_TEMP" in metrics
