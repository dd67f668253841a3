"""The GPU health verdict: nvidia-smi -q -x fixtures per catalog GPU, Xid lines, dcgmi diag, accepted WARNs."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gpu_health as gh
from repo_root import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "gpu_health"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def codes(report: dict, index: int) -> list[str]:
    gpu = next(g for g in report["gpus"] if g["index"] == index)
    return [f["code"] for f in gpu["findings"] if not f["accepted"]]


@pytest.mark.parametrize("name", ["rtx-pro-6000-healthy.xml", "b200-healthy.xml", "h100-healthy.xml",
                                  "h200-healthy.xml", "h100-loaded-healthy.xml"])
def test_healthy_catalog_gpus_pass(name: str) -> None:
    report = gh.evaluate(read(name), read("kern-clean.log"))
    assert report["verdict"] == gh.PASS
    assert [g["verdict"] for g in report["gpus"]] == [gh.PASS, gh.PASS]
    assert gh.refusal_message(report) is None


def test_the_parser_reads_identity_and_health_fields() -> None:
    parsed = gh.parse_smi_xml(read("h100-healthy.xml"))
    assert parsed["driver_version"] == "580.95.05"
    gpu = parsed["gpus"][1]
    assert gpu["index"] == 1 and gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["serial"] == "1654723000001"
    assert gpu["pci_bus_id"] == "0000:28:00.0" and gpu["uuid"].startswith("GPU-")
    assert (gpu["pcie_width_current"], gpu["pcie_width_max"], gpu["pcie_gen_current"], gpu["pcie_gen_max"]) == \
        (16, 16, 1, 5)
    assert gpu["remapped_row_pending"] is False and gpu["retired_pages_pending"] is None
    assert gpu["ecc_volatile_uncorrectable"] == 0 and gpu["temperature_slowdown_c"] == 87
    assert gpu["clock_events"]["gpu_idle"] is True and gpu["clock_events"]["hw_slowdown"] is False


@pytest.mark.parametrize(("xml", "log", "code", "words"), [
    ("h100-healthy.xml", "kern-xid79.log", "xid_79", "fallen off the bus"),
    ("h100-remap-pending.xml", "kern-clean.log", "remap_pending", "row remaps are pending"),
    ("h200-ecc-uncorrectable.xml", "kern-clean.log", "ecc_uncorrectable", "2 uncorrectable ECC error(s)"),
    ("b200-pcie-x8.xml", "kern-clean.log", "pcie_width_degraded", "PCIe link trained at x8, the GPU supports x16"),
    ("rtx-pro-6000-thermal.xml", "kern-clean.log", "hw_thermal_slowdown", "HW thermal slowdown is active"),
])
def test_each_fault_fails_gpu_1_only_and_the_refusal_names_it(xml: str, log: str, code: str, words: str) -> None:
    report = gh.evaluate(read(xml), read(log))
    assert report["verdict"] == gh.FAIL
    gpu0, gpu1 = report["gpus"]
    assert gpu0["verdict"] == gh.PASS and gpu1["verdict"] == gh.FAIL
    assert code in codes(report, 1)
    message = gh.refusal_message(report)
    assert message is not None and message.startswith("GPU health check FAILED")
    assert f"GPU 1 (serial {gpu1['serial']}, bus {gpu1['pci_bus_id']})" in message
    assert words in message and f"[{code}]" in message
    assert "Fix: drain" in message or "Fix: check" in message
    assert "GPU 0 " not in message


def test_fault_messages_name_the_fix() -> None:
    xid = gh.refusal_message(gh.evaluate(read("h100-healthy.xml"), read("kern-xid79.log")))
    assert xid is not None and "reset the GPU or reboot" in xid and "RMA if it recurs" in xid
    remap = gh.refusal_message(gh.evaluate(read("h100-remap-pending.xml")))
    assert remap is not None and "nvidia-smi -r -i 1" in remap and "<index>" not in remap
    thermal = gh.evaluate(read("rtx-pro-6000-thermal.xml"))
    assert codes(thermal, 1) == ["hw_thermal_slowdown", "sw_thermal_slowdown", "temperature_slowdown"]
    assert "check the cooling" in str(gh.refusal_message(thermal))
    ecc = gh.evaluate(read("h200-ecc-uncorrectable.xml"))
    assert codes(ecc, 1) == ["reset_required", "remap_pending", "ecc_uncorrectable"]


def test_pcie_generation_below_max_is_a_fault_only_under_load() -> None:
    idle = gh.parse_smi_xml(read("rtx-pro-6000-healthy.xml"))["gpus"][0]
    assert idle["pcie_gen_current"] < idle["pcie_gen_max"]
    assert "pcie_gen_degraded" not in [f["code"] for f in gh.gpu_findings(idle)]
    report = gh.evaluate(read("rtx-pro-6000-gen-loaded.xml"))
    assert report["verdict"] == gh.WARN and codes(report, 1) == ["pcie_gen_degraded"]
    assert gh.refusal_message(report) is None


def test_xid_lines_map_to_gpus_by_bus_id_and_unlisted_buses_get_an_entry() -> None:
    events = gh.parse_xid_lines(read("kern-xid-mixed.log"))
    assert [(e["pci_bus_id"], e["xid"]) for e in events] == [
        ("0000:18:00.0", 13), ("0000:18:00.0", 13), ("0000:28:00.0", 94), ("0000:28:00.0", 63)]
    report = gh.evaluate(read("h100-healthy.xml"), read("kern-xid-mixed.log"))
    assert report["gpus"][0]["verdict"] == gh.WARN and codes(report, 0) == ["xid_13"]
    assert "[2 times]" in report["gpus"][0]["findings"][0]["reason"]
    assert codes(report, 1) == ["xid_94", "xid_63"]
    old_style = "kernel: [ 26.5] NVRM: Xid (0000:38:00): 79, GPU has fallen off the bus.\n"
    lost = gh.evaluate(read("h100-healthy.xml"), old_style)
    assert lost["gpus"][2]["index"] is None and lost["gpus"][2]["pci_bus_id"] == "0000:38:00.0"
    assert "GPU ? (serial unknown, bus 0000:38:00.0)" in str(gh.refusal_message(lost))


def test_unknown_xid_is_a_warning() -> None:
    report = gh.evaluate(read("b200-healthy.xml"), "NVRM: Xid (PCI:0000:18:00): 999, something new\n")
    assert report["verdict"] == gh.WARN and codes(report, 0) == ["xid_999"]


def test_accepted_warnings_do_not_count_and_fails_cannot_be_accepted() -> None:
    report = gh.evaluate(read("rtx-pro-6000-gen-loaded.xml"), accepted=["pcie_gen_degraded"])
    assert report["verdict"] == gh.PASS and report["gpus"][1]["findings"][0]["accepted"]
    failing = gh.evaluate(read("b200-pcie-x8.xml"), accepted=["pcie_width_degraded"])
    assert failing["verdict"] == gh.FAIL and not failing["gpus"][1]["findings"][0]["accepted"]
    again = gh.accept_warnings(report, [])
    assert again["verdict"] == gh.WARN


def test_dcgm_diag_table() -> None:
    failing = gh.parse_dcgm_diag(read("dcgm-diag-r1-fail.txt"))
    assert [f["code"] for f in failing] == ["dcgm_software", "dcgm_page_retirement_row_remap"]
    assert "GPU 1 has uncorrectable memory errors" in failing[0]["reason"]
    assert gh.parse_dcgm_diag(read("dcgm-diag-r1-pass.txt")) == []
    report = gh.evaluate(read("h100-healthy.xml"), "", read("dcgm-diag-r1-fail.txt"))
    assert report["verdict"] == gh.FAIL and "node: dcgmi diag: Software: Fail" in str(gh.refusal_message(report))


def test_no_or_bad_nvidia_smi_output_fails_the_node() -> None:
    for text in (None, "NVIDIA-SMI has failed", "<other/>"):
        report = gh.evaluate(text)
        assert report["verdict"] == gh.FAIL and report["node_findings"][0]["code"] == "nvidia_smi_failed"


def test_ecc_disabled_and_persistence_off_warn() -> None:
    text = read("h100-healthy.xml").replace("<current_ecc>Enabled", "<current_ecc>Disabled", 1)
    text = text.replace("<persistence_mode>Enabled", "<persistence_mode>Disabled", 1)
    report = gh.evaluate(text)
    assert report["verdict"] == gh.WARN and codes(report, 0) == ["ecc_disabled", "persistence_mode_off"]


def test_pre_550_throttle_reason_tags_are_read() -> None:
    text = read("h100-healthy.xml").replace("clocks_event_reason", "clocks_throttle_reason")
    text = text.replace("<clocks_throttle_reason_hw_slowdown>Not Active", "<clocks_throttle_reason_hw_slowdown>Active",
                        1)
    assert codes(gh.evaluate(text), 0) == ["hw_slowdown"]


# Elements whose absence (or N/A) must never let a GPU pass: each is one health signal.
SIGNALS = ["persistence_mode", "remapped_rows/remapped_row_pending", "ecc_errors/volatile", "clocks_event_reasons",
           "temperature/gpu_temp", "pci/pci_gpu_link_info/link_widths/current_link_width",
           "pci/pci_gpu_link_info/link_widths/max_link_width", "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
           "pci/pci_gpu_link_info/pcie_gen/max_link_gen"]


def _without(text: str, paths: list[str], na: bool) -> str:
    root = ET.fromstring(text)
    gpu = root.find("gpu")
    assert gpu is not None
    for path in paths:
        parent_path, _, leaf = path.rpartition("/")
        parent = gpu.find(parent_path) if parent_path else gpu
        child = parent.find(leaf) if parent is not None else None
        if parent is None or child is None:
            continue
        if na and len(child) == 0:
            child.text = "N/A"
        else:
            parent.remove(child)
    return ET.tostring(root, encoding="unicode")


@FAST
@given(name=st.sampled_from(["rtx-pro-6000-healthy.xml", "b200-healthy.xml", "h100-healthy.xml",
                             "h200-healthy.xml"]),
       removed=st.lists(st.sampled_from(SIGNALS), min_size=1, max_size=4, unique=True), na=st.booleans())
def test_a_missing_signal_is_never_a_pass(name: str, removed: list[str], na: bool) -> None:
    report = gh.evaluate(_without(read(name), removed, na))
    assert report["gpus"][0]["verdict"] != gh.PASS
    assert any(f["code"].startswith("unknown_") for f in report["gpus"][0]["findings"])
    assert report["gpus"][1]["verdict"] == gh.PASS


@FAST
@given(data=st.data())
def test_random_omissions_never_crash(data: st.DataObject) -> None:
    root = ET.fromstring(read("h200-ecc-uncorrectable.xml"))
    elements = [(parent, child) for parent in root.iter() for child in parent]
    chosen = data.draw(st.lists(st.integers(0, len(elements) - 1), max_size=25, unique=True))
    for position in sorted(chosen, reverse=True):
        parent, child = elements[position]
        if child in list(parent):
            parent.remove(child)
    report = gh.evaluate(ET.tostring(root, encoding="unicode"), read("kern-xid-mixed.log"))
    assert report["verdict"] in (gh.WARN, gh.FAIL)
    for gpu in report["gpus"]:
        assert gpu["verdict"] in (gh.PASS, gh.WARN, gh.FAIL)
        if gpu["pci_bus_id"] == "0000:28:00.0":
            assert gpu["verdict"] == gh.FAIL, "the Xid 94 of GPU 1 is in the kernel log whatever nvidia-smi says"


def test_summary_names_each_finding_and_marks_the_accepted_ones() -> None:
    report = gh.evaluate(read("rtx-pro-6000-thermal.xml"), read("kern-clean.log"),
                         accepted=["sw_thermal_slowdown"])
    lines = gh.summary_lines(report)
    assert lines[0] == "GPU health FAIL over 2 GPU(s)"
    assert ("GPU 1 (serial 1792525000001, bus 0000:28:00.0): WARN SW thermal slowdown is active (the driver lowers "
            "clocks to stay under the maximum operating temperature) [sw_thermal_slowdown] (accepted)") in lines
    assert any(line.startswith("GPU 1 (serial 1792525000001, bus 0000:28:00.0): FAIL HW thermal slowdown")
               for line in lines)
    assert len(lines) == 1 + sum(len(g["findings"]) for g in report["gpus"]) + len(report["node_findings"])
    assert gh.summary_lines(gh.evaluate(read("h100-healthy.xml"), read("kern-clean.log"))) == [
        "GPU health PASS over 2 GPU(s)"]


def test_brief_keeps_identity_verdicts_and_codes() -> None:
    report = gh.evaluate(read("rtx-pro-6000-gen-loaded.xml"), read("kern-clean.log"))
    brief = gh.brief(report)
    assert brief["verdict"] == "WARN"
    assert brief["gpus"][1] == {"index": 1, "serial": "1792525000001", "pci_bus_id": "0000:28:00.0",
                                "verdict": "WARN", "findings": ["pcie_gen_degraded"], "accepted": []}
    accepted = gh.brief(gh.evaluate(read("rtx-pro-6000-gen-loaded.xml"), read("kern-clean.log"),
                                    accepted=["pcie_gen_degraded"]))
    assert accepted["verdict"] == "PASS"
    assert accepted["gpus"][1]["findings"] == [] and accepted["gpus"][1]["accepted"] == ["pcie_gen_degraded"]
    assert brief["summary"] == gh.summary_lines(report)
