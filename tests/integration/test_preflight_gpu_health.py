"""The GPU health gate: the preflight on a simulated GPU node (tests/fixtures/gpu_node's nvidia-smi answering -q -x
with a tests/fixtures/gpu_health fixture, its dmesg printing a kernel log) refuses every fault fixture before the
first change, naming the GPU (index, serial, bus id), the reason and the fix; a healthy node and a WARN go on.

The real ansible-playbook, node_facts and preflight roles, connection local (no container): the gate reads the node
only through the simulated tools, the boundary the molecule scenarios simulate too."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness import gpu_node, playbook

PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "gpu_health_gate.yml"


def gate(tmp_path: Path, card: str, smi_xml: str, kernel_log: str = "kern-clean.log",
         **knobs: Any) -> tuple[int, str, Path]:
    """The playbook on the simulated node; (rc, output with whitespace folded, the marker's path)."""
    marker = tmp_path / "first-change.json"
    extra = {**gpu_node.simulated(tmp_path, card, smi_xml, kernel_log), "marker": str(marker), **knobs}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = playbook.environment(ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    rc, out, _ = playbook.run(PLAYBOOK, "-e", f"@{tmp_path / 'extra.json'}", inventory="gpu-node-01,", env=env,
                              timeout=300)
    return rc, re.sub(r"\s+", " ", out), marker


FAULTS = [
    ("h100", "h100-healthy.xml", "kern-xid79.log", "xid_79",
     "Xid 79 since boot: GPU has fallen off the bus (it no longer answers on PCIe)", "check the slot, riser and power"),
    ("h100", "h100-remap-pending.xml", "kern-clean.log", "remap_pending", "row remaps are pending",
     "reset the GPU (nvidia-smi -r -i 1) or reboot to apply them"),
    ("h200", "h200-ecc-uncorrectable.xml", "kern-clean.log", "ecc_uncorrectable",
     "uncorrectable ECC error(s) since the driver loaded", "RMA if they come back"),
    ("b200", "b200-pcie-x8.xml", "kern-clean.log", "pcie_width_degraded",
     "PCIe link trained at x8, the GPU supports x16", "reseat the GPU and check its riser/cable and slot"),
    ("rtx-pro-6000", "rtx-pro-6000-thermal.xml", "kern-clean.log", "hw_thermal_slowdown",
     "HW thermal slowdown is active", "check the cooling"),
]


@pytest.mark.parametrize(("card", "smi_xml", "kernel_log", "code", "reason", "fix"), FAULTS,
                         ids=[f[3] for f in FAULTS])
def test_each_fault_is_refused_before_the_first_change(tmp_path: Path, card: str, smi_xml: str, kernel_log: str,
                                                       code: str, reason: str, fix: str) -> None:
    rc, out, marker = gate(tmp_path, card, smi_xml, kernel_log)
    assert rc != 0, out[-3000:]
    serial = gpu_node.CARDS[card][4] + 1
    message = re.search(r"GPU health check FAILED, refusing to continue: (.*?)\"", out)
    assert message, out[-3000:]
    text = message.group(1)
    assert f"GPU 1 (serial {serial}, bus 0000:28:00.0): " in text and reason in text and f"[{code}]" in text
    assert "Fix: " in text and fix in text
    assert "GPU 0 " not in text, "the healthy GPU is named"
    assert not marker.exists(), "the refused run reached the first change"
    assert re.search(r"gpu-node-01 : ok=\d+ changed=0 unreachable=0 failed=1", out), out[-1500:]


def test_a_healthy_node_and_an_accepted_warning_go_on(tmp_path: Path) -> None:
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    rc, out, marker = gate(healthy, "rtx-pro-6000", "rtx-pro-6000-healthy.xml")
    assert rc == 0, out[-3000:]
    assert json.loads(marker.read_text())["verdict"] == "PASS"
    warned = tmp_path / "warned"
    warned.mkdir()
    rc, out, marker = gate(warned, "rtx-pro-6000", "rtx-pro-6000-gen-loaded.xml")
    assert rc == 0, out[-3000:]
    report = json.loads(marker.read_text())
    assert report["verdict"] == "WARN" and report["gpus"][1]["findings"] == ["pcie_gen_degraded"]
    assert "GPU 1 (serial 1792525000001, bus 0000:28:00.0): WARN PCIe link at generation 3 under load" in out
    accepted = tmp_path / "accepted"
    accepted.mkdir()
    rc, out, marker = gate(accepted, "rtx-pro-6000", "rtx-pro-6000-gen-loaded.xml",
                           vllm_node_gpu_health_accepted_warnings=["pcie_gen_degraded"])
    assert rc == 0, out[-3000:]
    report = json.loads(marker.read_text())
    assert report["verdict"] == "PASS" and report["gpus"][1]["accepted"] == ["pcie_gen_degraded"]


def test_the_gate_is_off_on_the_cpu_device_and_with_the_knob(tmp_path: Path) -> None:
    """The demo serves the CPU build on a simulated GPU node: the gate does not run (a faulty GPU is not used)."""
    rc, out, marker = gate(tmp_path, "b200", "b200-pcie-x8.xml", vllm_node_vllm_variant="cpu")
    assert rc == 0, out[-3000:]
    assert json.loads(marker.read_text()) == {}
    other = tmp_path / "off"
    other.mkdir()
    rc, out, marker = gate(other, "b200", "b200-pcie-x8.xml", vllm_node_gpu_health=False)
    assert rc == 0 and json.loads(marker.read_text()) == {}, out[-3000:]
