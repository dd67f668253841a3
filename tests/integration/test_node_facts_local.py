"""node_facts on the controller itself (connection local, no container): the parsing of nvidia-smi and lspci
answers, including odd ones the molecule scenario does not cover ([N/A] values, PCI domains, other vendors)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
GPU_NODE = ROOT / "tests" / "fixtures" / "gpu_node"

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  environment:
    VLLM_NODE_FAKE_GPUS: "{{ fake_gpus }}"
  roles:
    - role: node_facts
  tasks:
    - ansible.builtin.copy:
        content: "{{ {'gpus': node_facts_gpus, 'source': node_facts_gpu_source, 'driver': node_facts_driver_version,
                      'topology': node_facts_gpu_topology,
                      'disk_path': node_facts_disk_path, 'disk_free': node_facts_disk_free_bytes,
                      'cpus': node_facts_cpu_count, 'memory': node_facts_memory_total_mib,
                      'amx': node_facts_cpu_amx} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def facts_play(tmp_path: Path, data: dict[str, Any], **extra: Any) -> tuple[playbook.Run, dict[str, Any]]:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "gpus.json").write_text(json.dumps(data))
    out = tmp_path / "facts.json"
    variables = {"fake_gpus": str(tmp_path / "gpus.json"), "out": str(out),
                 "node_facts_nvidia_smi": str(GPU_NODE / "nvidia-smi"), "node_facts_lspci": str(GPU_NODE / "lspci"),
                 "node_facts_model_root": str(tmp_path / "no" / "such" / "dir"),
                 "ansible_python_interpreter": str(BIN / "python"), **extra}
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = playbook.environment(ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    proc = playbook.run(tmp_path / "play.yml", "-e", f"@{tmp_path / 'vars.json'}", inventory="localhost,", env=env,
                        timeout=300)
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def default_data() -> dict[str, Any]:
    return json.loads((GPU_NODE / "gpus.json").read_text())


def test_nvidia_smi_with_unavailable_values_and_a_pci_domain(tmp_path: Path) -> None:
    data = default_data()
    data["gpus"] = data["gpus"][:2]
    data["gpus"][1].update(memory_total_mib="[N/A]", compute_cap="[N/A]", pci_bus_id="0001:a1:00.0")
    data["gpus"][1]["memory_used_mib"] = 0
    proc, facts = facts_play(tmp_path, data)
    assert proc.rc == 0, proc.output
    assert facts["source"] == "nvidia-smi" and facts["driver"] == "580.95.05"
    first, second = facts["gpus"]
    assert first == {"index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_total_mib": 97887,
                     "compute_capability": "12.0", "pci_bus_id": "0000:01:00.0", "pci_device_id": "10de:2bb5"}
    assert (second["memory_total_mib"], second["compute_capability"]) == (None, None)
    assert second["pci_bus_id"] == "0001:a1:00.0"
    # The model root does not exist: the walk-up reaches tmp_path.
    assert facts["disk_path"] == str(tmp_path)
    assert isinstance(facts["disk_free"], int) and facts["disk_free"] > 0
    assert facts["cpus"] >= 1 and facts["memory"] > 0
    assert facts["amx"] is ("amx_tile" in Path("/proc/cpuinfo").read_text().split())
    # `nvidia-smi topo -m` of the two GPUs: one PCIe switch, NUMA node 0
    assert facts["topology"] == {"gpus": [{"index": i, "numa": 0, "cpu_affinity": "0-31,64-95"} for i in (0, 1)],
                                 "links": [["X", "PIX"], ["PIX", "X"]]}


def test_lspci_fallback_filters_vendor_and_class(tmp_path: Path) -> None:
    data = default_data() | {"driver_loaded": False}
    data["gpus"] = data["gpus"][:3]
    # A non-NVIDIA 3D controller and an NVIDIA audio function must not count as GPUs.
    data["other_pci_devices"] = data["other_pci_devices"] + [
        {"bus_id": "0000:d1:00.0", "class": "0302", "class_name": "3D controller", "vendor": "1002",
         "vendor_name": "Advanced Micro Devices, Inc. [AMD/ATI]", "device": "74a1",
         "device_name": "Aqua Vanjaram [Instinct MI300X]", "revision": "00"},
        {"bus_id": "0000:01:00.1", "class": "0403", "class_name": "Audio device", "vendor": "10de",
         "vendor_name": "NVIDIA Corporation", "device": "22e8", "device_name": "GB202 High Definition Audio Controller",
         "revision": "a1"},
    ]
    proc, facts = facts_play(tmp_path, data)
    assert proc.rc == 0, proc.output
    assert facts["source"] == "lspci" and facts["driver"] == ""
    assert [g["pci_bus_id"] for g in facts["gpus"]] == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
    assert facts["gpus"][0]["name"] == "NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition]"
    assert {g["pci_device_id"] for g in facts["gpus"]} == {"10de:2bb5"}
    assert facts["topology"] == {}   # no driver: nvidia-smi is not asked for the topology


@pytest.mark.parametrize(
    "bad", [{"node_facts_model_root": "relative/models"}, {"node_facts_gpu_vendor_ids": ["NVIDIA"]}]
)
def test_bad_input_is_refused_with_a_fix(tmp_path: Path, bad: dict[str, Any]) -> None:
    proc, facts = facts_play(tmp_path, default_data(), **bad)
    assert proc.rc != 0 and facts == {}
    assert "Fix the variables" in proc.output


def test_an_nvidia_smi_answer_that_is_not_the_asked_csv_falls_back_to_lspci(tmp_path: Path) -> None:
    """A tool that answers rc 0 with something else (here: units left on) is not trusted; lspci is asked."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB, 12.0, "
                   "00000000:01:00.0, 0x2BB510DE, 580.95.05'\n")
    smi.chmod(0o755)
    data = default_data()
    data["gpus"] = data["gpus"][:2]
    proc, facts = facts_play(tmp_path, data, node_facts_nvidia_smi=str(smi))
    assert proc.rc == 0, proc.output
    assert (facts["source"], facts["driver"], len(facts["gpus"])) == ("lspci", "", 2)
    assert facts["gpus"][0]["memory_total_mib"] is None
