"""A simulated GPU node on this machine (connection local): tests/fixtures/gpu_node's nvidia-smi and dmesg answer
from a data file with a tests/fixtures/gpu_health fixture (nvidia-smi -q -x) and kernel log, for the tests that run
the real node_facts and preflight roles without a container."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from harness import playbook
from harness.project import PROJECT

GPU_NODE = PROJECT / "tests" / "fixtures" / "gpu_node"
HEALTH = PROJECT / "tests" / "fixtures" / "gpu_health"
TEST_MODELS = yaml.safe_load((PROJECT / "tests/fixtures/catalog/models.yml").read_text())["vllm_node_extra_models"]
# The fixtures' two GPUs per card (tests/fixtures/gpu_health/make_fixtures.py): name, PCI id, MiB, cc, serial base.
CARDS = {
    "h100": ("NVIDIA H100 80GB HBM3", "10de:2330", 81559, "9.0", 1654723000000),
    "h200": ("NVIDIA H200", "10de:2335", 143771, "9.0", 1655024000000),
    "b200": ("NVIDIA B200", "10de:2901", 183359, "10.0", 1654924000000),
    "rtx-pro-6000": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "10de:2bb5", 97887, "12.0", 1792525000000),
}


def node_data(card: str, smi_xml: str, kernel_log: str) -> dict[str, Any]:
    """The simulated node's data file: the card's two GPUs as the fixture XML has them."""
    name, device, mib, cc, serial = CARDS[card]
    gpus = [{"index": i, "name": name, "memory_total_mib": mib, "memory_used_mib": 0, "compute_cap": cc,
             "pci_bus_id": bus, "pci_device_id": device, "uuid": f"GPU-00000000-0000-0000-0000-00000000000{i}",
             "serial": str(serial + i)} for i, bus in enumerate(("0000:18:00.0", "0000:28:00.0"))]
    return {"driver_version": "580.95.05", "cuda_version": "13.0", "kernel_module": "open", "driver_loaded": True,
            "gpus": gpus, "smi_xml": smi_xml, "kernel_log": kernel_log}


def simulated(tmp_path: Path, card: str, smi_xml: str, kernel_log: str = "kern-clean.log") -> dict[str, Any]:
    """Set up the node's files in tmp_path; the variables that point the roles at them (tiny-llama, the test
    catalog, the fake tools; fake_gpus and fake_bin for a play's `environment`)."""
    for name in (smi_xml, kernel_log):
        shutil.copy(HEALTH / name, tmp_path / name)
    (tmp_path / "gpus.json").write_text(json.dumps(node_data(card, smi_xml, kernel_log)))
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "dmesg").symlink_to(GPU_NODE / "dmesg")
    return {"fake_gpus": str(tmp_path / "gpus.json"), "fake_bin": str(fake_bin),
            "ansible_python_interpreter": str(Path(playbook.command()).with_name("python")),
            "node_facts_nvidia_smi": str(GPU_NODE / "nvidia-smi"), "node_facts_lspci": str(GPU_NODE / "lspci"),
            "node_facts_model_root": str(tmp_path / "models"),
            "preflight_plan_file": "", "vllm_node_model": "tiny-llama",
            "vllm_node_extra_models": TEST_MODELS, "vllm_node_max_model_len": 4096,
            "vllm_node_gpu_health_kernel_log": "dmesg"}
