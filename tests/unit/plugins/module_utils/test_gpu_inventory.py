"""The GPU inventory parsers (plugins/module_utils/gpu_inventory.py) on the formats the real tools print."""
from __future__ import annotations

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gpu_inventory as gi

FIELDS = list(gi.NVIDIA_SMI_FIELDS)
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
CATALOG = {
    "rtx-pro-6000-blackwell": {"names": [RTX], "pci_ids": ["10de:2bb5", "10de:2bb1"], "architecture": "blackwell"},
    "h100-80gb": {"names": ["NVIDIA H100 80GB HBM3"], "pci_ids": ["10de:2330"], "architecture": "hopper"},
    "cpu": {"names": [], "pci_ids": [], "architecture": "x86_64"},
}


def test_nvidia_smi_rows_become_records() -> None:
    text = (f"0, {RTX}, 97887, 12.0, 00000000:01:00.0, 0x2BB510DE, 580.95.05\n"
            f"1, {RTX}, 97887, 12.0, 00000000:02:00.0, 0x2BB510DE, 580.95.05\n")
    parsed = gi.parse_nvidia_smi(text, FIELDS)
    assert parsed["driver_version"] == "580.95.05" and parsed["unparsed"] == []
    assert parsed["gpus"][0] == {"index": 0, "name": RTX, "memory_total_mib": 97887, "compute_capability": "12.0",
                                 "pci_bus_id": "0000:01:00.0", "pci_device_id": "10de:2bb5"}
    assert [g["pci_bus_id"] for g in parsed["gpus"]] == ["0000:01:00.0", "0000:02:00.0"]
    assert set(parsed["gpus"][1]) == set(gi.GPU_RECORD_KEYS)


def test_nvidia_smi_unavailable_values_and_pci_domains() -> None:
    """[N/A] and friends become None; a non-zero PCI domain (nvidia-smi: 8 hex digits, upper case) is kept."""
    text = ("1, NVIDIA H100 80GB HBM3, [N/A], [Not Supported], 00000001:A1:00.0, 0x233010DE, 580.95.05\n"
            "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 00010000:E1:00.0, [N/A], 580.95.05\n")
    gpus = gi.parse_nvidia_smi(text, FIELDS)["gpus"]
    assert [g["index"] for g in gpus] == [0, 1], "sorted by index"
    assert (gpus[1]["memory_total_mib"], gpus[1]["compute_capability"]) == (None, None)
    assert gpus[1]["pci_bus_id"] == "0001:a1:00.0"
    assert gpus[0]["pci_bus_id"] == "10000:e1:00.0", "a VMD domain above 0xffff is not truncated"
    assert gpus[0]["pci_device_id"] is None


def test_nvidia_smi_name_with_commas() -> None:
    parsed = gi.parse_nvidia_smi("0, Vendor GPU, Rev. B, 4096, 8.6, 00000000:03:00.0, 0x220410DE, 570.1\n", FIELDS)
    assert parsed["gpus"][0]["name"] == "Vendor GPU, Rev. B" and parsed["gpus"][0]["memory_total_mib"] == 4096


@pytest.mark.parametrize("text", [
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "index, name, memory.total [MiB], compute_cap, pci.bus_id, pci.device_id, driver_version\n",
    f"0, {RTX}, 97887 MiB, 12.0, 00000000:01:00.0, 0x2BB510DE, 580.95.05",  # units were not switched off
    f"0, {RTX}, 97887, twelve, 00000000:01:00.0, 0x2BB510DE, 580.95.05",
    f"0, {RTX}, 97887, 12.0, not-a-bus, 0x2BB510DE, 580.95.05",
    "0, 97887",                                                            # fewer fields than asked
])
def test_nvidia_smi_lines_that_are_not_an_answer_are_reported(text: str) -> None:
    parsed = gi.parse_nvidia_smi(text, FIELDS)
    assert parsed["gpus"] == [] and parsed["unparsed"] == [text.strip()] and parsed["driver_version"] == ""


def test_nvidia_smi_other_field_lists_and_empty_output() -> None:
    parsed = gi.parse_nvidia_smi("0, 12.0\n1, 10.0\n", ["index", "compute_cap"])
    assert [g["compute_capability"] for g in parsed["gpus"]] == ["12.0", "10.0"]
    assert parsed["gpus"][0]["name"] == "" and parsed["gpus"][0]["pci_device_id"] is None
    assert gi.parse_nvidia_smi("", FIELDS) == {"gpus": [], "driver_version": "", "unparsed": []}
    with pytest.raises(gi.GpuInventoryError, match="must include index"):
        gi.parse_nvidia_smi("12.0\n", ["compute_cap"])


LSPCI = "".join(line + "\n" for line in [
    "0000:00:00.0 Host bridge [0600]: Intel Corporation Ice Lake Memory Map/VT-d [8086:09a2] (rev 04)",
    "0000:01:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition]"
    " [10de:2bb5] (rev a1)",
    "0000:01:00.1 Audio device [0403]: NVIDIA Corporation GB202 High Definition Audio Controller [10de:22e8] (rev a1)",
    "0001:02:00.0 VGA compatible controller [0300]: NVIDIA Corporation Device [10de:2bb1] (rev a1)"
    " (prog-if 00 [VGA controller])",
    "0000:c1:00.0 VGA compatible controller [0300]: ASPEED Technology, Inc. ASPEED Graphics Family [1a03:2000]"
    " (rev 52)",
    "0000:d1:00.0 Processing accelerators [1200]: Advanced Micro Devices, Inc. [AMD/ATI] Aqua Vanjaram"
    " [Instinct MI300X] [1002:74a1]",
    "0000:18:00.0 Bridge [0680]: NVIDIA Corporation GB100 [NVSwitch] [10de:22a3] (rev a1)",
    "00:1f.0 ISA bridge [0601]: Intel Corporation C620 Series Chipset Family LPC/eSPI Controller [8086:a1cb] (rev 0a)",
    "0000:41:00.0 Ethernet controller: Mellanox Technologies MT2892 Family",
])


def test_lspci_devices_in_bus_order_with_names_and_ids() -> None:
    devices = gi.parse_lspci(LSPCI)
    assert [d["pci_bus_id"] for d in devices] == ["0000:00:00.0", "0000:00:1f.0", "0000:01:00.0", "0000:01:00.1",
                                                  "0000:18:00.0", "0000:c1:00.0", "0000:d1:00.0", "0001:02:00.0"]
    gpu = devices[2]
    assert gpu == {"pci_bus_id": "0000:01:00.0", "pci_class": "0302", "class_name": "3D controller",
                   "pci_device_id": "10de:2bb5", "vendor_id": "10de",
                   "name": "NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition]"}
    assert devices[6]["name"] == "Advanced Micro Devices, Inc. [AMD/ATI] Aqua Vanjaram [Instinct MI300X]"
    assert devices[7]["name"] == "NVIDIA Corporation Device", "the (prog-if ...) tail is not part of the name"


def test_lspci_gpus_filter_vendor_and_class() -> None:
    gpus = gi.lspci_gpus(LSPCI, ["10de"], ["0300", "0302"])
    assert [(g["index"], g["pci_bus_id"], g["pci_device_id"]) for g in gpus] == [
        (0, "0000:01:00.0", "10de:2bb5"), (1, "0001:02:00.0", "10de:2bb1")]
    assert all(g["memory_total_mib"] is None and g["compute_capability"] is None for g in gpus)
    nvswitches = gi.select_pci_devices(gi.parse_lspci(LSPCI), ["10de"], ["0680"])
    assert [d["pci_bus_id"] for d in nvswitches] == ["0000:18:00.0"]
    # A class prefix selects the whole family (every display controller).
    assert len(gi.select_pci_devices(gi.parse_lspci(LSPCI), [], ["03"])) == 3
    with pytest.raises(gi.GpuInventoryError, match="PCI vendor id must be 1 to 4 hex digits, got 'NVIDIA'"):
        gi.lspci_gpus(LSPCI, ["NVIDIA"], ["0302"])


def test_pci_bus_id_normalisation() -> None:
    assert gi.normalise_pci_bus_id("00000000:01:00.0") == "0000:01:00.0"
    assert gi.normalise_pci_bus_id("01:00.0") == "0000:01:00.0"
    with pytest.raises(gi.GpuInventoryError, match="not a PCI address"):
        gi.normalise_pci_bus_id("01:00")


def test_catalog_match_by_pci_id_then_name() -> None:
    gpus = [gi.gpu_record(0, "whatever lspci says", pci_device_id="10DE:2BB1"),
            gi.gpu_record(1, "NVIDIA H100 80GB HBM3"),
            gi.gpu_record(2, "NVIDIA Future GPU", pci_device_id="10de:ffff")]
    assert [g["key"] for g in gi.match_catalog(gpus, CATALOG)] == ["rtx-pro-6000-blackwell", "h100-80gb", None]
    assert gi.match_catalog(gpus, CATALOG)[0]["name"] == "whatever lspci says", "the record is kept"


@pytest.mark.parametrize(("gpu", "expected"), [
    (gi.gpu_record(0, "", pci_device_id="10de:2330"), "hopper"),                     # catalogued
    (gi.gpu_record(0, RTX), "blackwell"),                                             # catalogued by name
    (gi.gpu_record(0, "", pci_device_id="10de:2941"), "blackwell"),                  # not catalogued, PCI prefix
    (gi.gpu_record(0, "", compute_capability="10.3", pci_device_id="10de:9999"), "blackwell"),
    (gi.gpu_record(0, "", compute_capability="8.9", pci_device_id="10de:26b9"), "unknown"),
    (gi.gpu_record(0, "", pci_device_id="1002:2941"), "unknown"),                    # another vendor's 29xx
])
def test_gpu_architecture(gpu: dict, expected: str) -> None:
    assert gi.gpu_architecture(gpu, CATALOG, ["29", "2b"]) == expected


OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Thu Sep 25 19:39:12 UTC 2025\nGCC version:  gcc version 13.3.0\n")
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  Mon Aug 11 20:10:25 UTC 2025\n"


def test_proc_version() -> None:
    assert gi.parse_proc_version(OPEN) == {"version": "580.95.05", "flavour": "open"}
    assert gi.parse_proc_version(PROPRIETARY) == {"version": "550.163.01", "flavour": "proprietary"}
    assert gi.parse_proc_version("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  590.44  Release")[
        "version"] == "590.44"
    assert gi.parse_proc_version("") == {"version": "", "flavour": ""}


@pytest.mark.parametrize(("version", "upstream"), [
    ("580.95.05-1", "580.95.05"), ("1:580.95.05-0ubuntu1", "580.95.05"), ("580.95.05", "580.95.05"),
    ("2.4-rc1-3", "2.4-rc1"), ("", ""),
])
def test_deb_upstream_version(version: str, upstream: str) -> None:
    assert gi.deb_upstream_version(version) == upstream


def test_catalog_match_fills_in_the_schema() -> None:
    """preflight_node_gpus may be written by hand: missing keys become None, so the role can map over them."""
    matched = gi.match_catalog([{"pci_device_id": "10de:2330"}], CATALOG)
    assert matched == [{"index": None, "name": "", "memory_total_mib": None, "compute_capability": None,
                        "pci_bus_id": "", "pci_device_id": "10de:2330", "key": "h100-80gb"}]
