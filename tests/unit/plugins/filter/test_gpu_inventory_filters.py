"""The gpu_inventory filters on what the simulated tools (tests/fixtures/gpu_node) print, and their ansible-doc
files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.filter import gpu_inventory as gf
from repo_root import ROOT

GPU_NODE = ROOT / "tests" / "fixtures" / "gpu_node"
FILTERS = gf.FilterModule().filters()
NODE_FACTS_FIELDS = yaml.safe_load((ROOT / "roles/node_facts/vars/main.yml").read_text())["__node_facts_smi_fields"]
CATALOG = yaml.safe_load((ROOT / "roles/vllm_node/vars/main/gpus.yml").read_text())["vllm_node_catalog_gpus"]


def tool(name: str, *args: str, data: str = "gpus.json") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, VLLM_NODE_FAKE_GPUS=str(GPU_NODE / data))
    return subprocess.run([sys.executable, str(GPU_NODE / name), *args], env=env, capture_output=True, text=True,
                          check=False)


def expected_records(data: str = "gpus.json") -> list[dict[str, Any]]:
    """What the data file says, in the GPU record schema."""
    gpus = json.loads((GPU_NODE / data).read_text())["gpus"]
    return [{"index": g["index"], "name": g["name"], "memory_total_mib": g["memory_total_mib"],
             "compute_capability": g["compute_cap"], "pci_bus_id": g["pci_bus_id"],
             "pci_device_id": g["pci_device_id"]} for g in gpus]


def test_both_roles_ask_nvidia_smi_for_the_same_fields() -> None:
    """One query, one schema: node_facts_gpus and nvidia_driver_gpus are the same records."""
    driver_vars = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/main.yml").read_text())
    assert NODE_FACTS_FIELDS == list(gf.gpu_inventory.NVIDIA_SMI_FIELDS) == driver_vars["__nvidia_driver_smi_fields"]


def test_nvidia_smi_answer_of_the_simulated_node() -> None:
    out = tool("nvidia-smi", f"--query-gpu={','.join(NODE_FACTS_FIELDS)}", "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stdout
    parsed = FILTERS["nvidia_smi_gpus"](out.stdout, NODE_FACTS_FIELDS)
    assert parsed == {"gpus": expected_records(), "driver_version": "580.95.05", "unparsed": []}


def test_nvidia_smi_driver_down_is_not_an_answer() -> None:
    out = tool("nvidia-smi", f"--query-gpu={','.join(NODE_FACTS_FIELDS)}", "--format=csv,noheader,nounits",
               data="gpus-proprietary.json")
    assert out.returncode == 9
    parsed = FILTERS["nvidia_smi_gpus"](out.stdout)
    assert parsed["gpus"] == [] and "couldn't communicate" in parsed["unparsed"][0]


@pytest.mark.parametrize("data", ["gpus.json", "gpus-no-driver.json"])
def test_lspci_answer_of_the_simulated_node(data: str) -> None:
    out = tool("lspci", "-Dnn", data=data)
    gpus = FILTERS["lspci_gpus"](out.stdout, ["10de"], ["0300", "0302"])
    expected = [dict(g, memory_total_mib=None, compute_capability=None,
                     name="NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition]")
                for g in expected_records(data)]
    assert gpus == expected
    # The BMC's VGA (vendor 1a03) is on the bus too: only the vendor filter keeps it out.
    assert len(FILTERS["lspci_devices"](out.stdout, [], ["0300"])) == 1
    assert FILTERS["lspci_gpus"]("") == []


def test_the_simulated_node_matches_the_catalog_and_is_blackwell() -> None:
    out = tool("lspci", "-Dnn")
    matched = FILTERS["gpu_catalog_match"](FILTERS["lspci_gpus"](out.stdout), CATALOG)
    assert {g["key"] for g in matched} == {"rtx-pro-6000-blackwell"}
    assert {FILTERS["gpu_architecture"](g, CATALOG) for g in matched} == {"blackwell"}


def test_blackwell_prefixes_agree_with_the_catalog() -> None:
    """nvidia_driver's fallback prefixes (GPUs not in the catalog) must say what the catalog says for those in it."""
    defaults = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())
    prefixes = defaults["nvidia_driver_blackwell_pci_device_id_prefixes"]
    for key, entry in CATALOG.items():
        for pci_id in entry["pci_ids"]:
            by_prefix = FILTERS["gpu_architecture"]({"pci_device_id": pci_id}, {}, prefixes)
            assert (by_prefix == "blackwell") == (entry["architecture"] == "blackwell"), (key, pci_id)


def test_bad_input_is_a_filter_error() -> None:
    with pytest.raises(Exception, match="lspci_gpus: a PCI vendor id must be 1 to 4 hex digits"):
        FILTERS["lspci_gpus"]("", ["nvidia"])


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_every_filter_has_ansible_doc(name: str) -> None:
    doc = yaml.safe_load((ROOT / "plugins" / "filter" / f"{name}.yml").read_text())
    assert set(doc) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    assert doc["DOCUMENTATION"]["name"] == name and doc["DOCUMENTATION"]["short_description"]
    assert f"vllm_node.vllm_node.{name}" in doc["EXAMPLES"]
