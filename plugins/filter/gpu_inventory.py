"""Ansible filters over plugins/module_utils/gpu_inventory.py, gpu_topology.py and nvidia_driver_state.py: tool
output in, one GPU record schema out. Documented per filter in plugins/filter/<name>.yml
(ansible-doc -t filter vllm_node.vllm_node.<name>).

Bad input raises AnsibleFilterError with the parser's message (what was expected).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import (
    gpu_inventory,
    gpu_topology,
    nvidia_driver_state,
)
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input


def nvidia_smi_gpus(text: str, fields: Any = gpu_inventory.NVIDIA_SMI_FIELDS) -> dict[str, Any]:
    """nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits -> {gpus, driver_version, unparsed}."""
    return gpu_inventory.parse_nvidia_smi(text, list(fields))


def lspci_devices(text: str, vendor_ids: Any = (), classes: Any = ()) -> list[dict[str, Any]]:
    """lspci -Dnn -> PCI device records of the vendors and classes (empty = all)."""
    return gpu_inventory.select_pci_devices(gpu_inventory.parse_lspci(text), list(vendor_ids), list(classes))


def lspci_gpus(text: str, vendor_ids: Any = ("10de",), classes: Any = ("0300", "0302")) -> list[dict[str, Any]]:
    """lspci -Dnn -> GPU records (vendor and class filtered, indexed in bus order)."""
    return gpu_inventory.lspci_gpus(text, list(vendor_ids), list(classes))


def gpu_catalog_match(gpus: Any, catalog: Any) -> list[dict[str, Any]]:
    """GPU records -> the same records with key: the matching GPU catalog entry, or None."""
    return gpu_inventory.match_catalog(list(gpus or []), dict(catalog or {}))


def gpu_architecture(gpu: Any, catalog: Any, blackwell_pci_prefixes: Any = (),
                     blackwell_min_capability: float = 10.0) -> str:
    """A GPU record -> its architecture (catalog first, then compute capability / PCI id for Blackwell)."""
    return gpu_inventory.gpu_architecture(dict(gpu), dict(catalog or {}), list(blackwell_pci_prefixes),
                                          float(blackwell_min_capability))


def nvidia_proc_version(text: str) -> dict[str, str]:
    """/proc/driver/nvidia/version -> {version, flavour}."""
    return gpu_inventory.parse_proc_version(text)


def deb_upstream_version(version: str) -> str:
    """A Debian version without epoch and revision."""
    return gpu_inventory.deb_upstream_version(version)


def nvidia_driver_installed_state(packages: Any, wanted: Any, kmod_package: str, loaded_version: str,
                                  version_glob: str, disk_license: str, kernel_modules: str) -> dict[str, Any]:
    """package_facts' packages + probes -> {satisfied, missing, kmod_version, reasons}."""
    return nvidia_driver_state.driver_state(dict(packages or {}), list(wanted), str(kmod_package),
                                            str(loaded_version or ""), str(version_glob), str(disk_license or ""),
                                            str(kernel_modules))


def nvidia_smi_topology(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -m` -> {gpus: [{index, numa, cpu_affinity}], links: GPU x GPU matrix}; {} when none."""
    return gpu_topology.parse_topology(text)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {func.__name__: reports_bad_input(func) for func in (
            nvidia_smi_gpus, nvidia_smi_topology, lspci_devices, lspci_gpus, gpu_catalog_match, gpu_architecture,
            nvidia_proc_version, deb_upstream_version, nvidia_driver_installed_state)}
