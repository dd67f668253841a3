"""GPU health verdict: PASS / WARN / FAIL per GPU from ``nvidia-smi -q -x``, the kernel log's Xid lines and,
optionally, ``dcgmi diag -r 1``.

Pure functions (stdlib only, no Ansible import). The gpu_health module collects the inputs on a node; a preflight
gate, a systemd watch and an HAProxy agent can all call :func:`evaluate` and :func:`refusal_message`.

Sources for the meaning of each rule (learned from, not copied):

* nvidia-smi(1), "GPU ATTRIBUTES" (driver 550/570/580 man page): Remapped Rows (Pending = a remap waits for a GPU
  reset; Remapping Failure = no spare row left), Retired Pages (Pending Page Blacklist/Retirement, pre-Ampere), ECC
  Errors (Volatile = since the driver loaded, Aggregate = lifetime), Clocks Event Reasons (called Clocks Throttle
  Reasons before driver 550: HW Slowdown, HW Thermal Slowdown, HW Power Brake Slowdown, SW Thermal Slowdown, GPU Idle),
  Temperature (GPU Slowdown / Shutdown thresholds), PCI "GPU Link Info" (Max / Current link generation and width:
  "the current link generation may be reduced when the GPU is not in use"), GPU Reset Status.
* NVIDIA "Xid Errors" and the Xid catalog (docs.nvidia.com/deploy/xid-errors/, "Analyzing Xid Errors with the Xid
  Catalog"): each Xid's mnemonic and its resolution bucket (RESTART_APP, RESET_GPU, RESTART_BM/reboot,
  CONTACT_SUPPORT); NVIDIA "GPU Memory Error Management" (row remapping: Xid 63/64, contained/uncontained ECC:
  Xid 94/95).
* NVIDIA Health Validation, "Xid Checks" (docs.nvidia.com/health-validation/reference/checks/xid): Xid 46/48/79/...
  are CRITICAL with the action "drain, reset GPU, then service if it persists".
* DCGM user guide, "GPU Diagnostics" (dcgmi diag run levels; each test reports Pass / Fail / Warn / Skip).

The report::

    {"verdict": "FAIL",                        # worst of all GPUs and node findings, after accepted WARNs
     "gpus": [{"index": 3, "name": "NVIDIA H100 80GB HBM3", "serial": "1654...", "uuid": "GPU-...",
               "pci_bus_id": "0000:1b:00.0", "verdict": "FAIL",
               "findings": [{"code": "xid_79", "severity": "FAIL", "reason": "...", "next_step": "...",
                             "accepted": False}]}],
     "node_findings": [...]}                   # findings not tied to one listed GPU (dcgmi, nvidia-smi failing)
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

PASS = "PASS"
WARN = "WARN"
FAIL = "FAIL"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}

# Clock event reasons that mean the GPU is being slowed by hardware protection, with the severity and the fix.
# HW slowdown / HW thermal / power brake cut clocks by half or more (nvidia-smi(1)); SW thermal is the driver
# keeping the GPU under its max operating temperature: a warning that cooling is marginal.
_CLOCK_EVENTS: dict[str, tuple[str, str, str]] = {
    "hw_slowdown": (FAIL, "HW slowdown is active (clocks cut by half or more: temperature, power brake or an "
                          "external power signal)",
                    "check the cooling and the power supply of this GPU (fans, airflow, PSU/power cables), "
                    "then check again under load"),
    "hw_thermal_slowdown": (FAIL, "HW thermal slowdown is active (the GPU is too hot, clocks cut)",
                            "check the cooling: fans, airflow, blanking panels, inlet temperature, heatsink; "
                            "then check again under load"),
    "hw_power_brake_slowdown": (FAIL, "HW power brake slowdown is active (an external power brake signal, "
                                      "usually the chassis/PSU)",
                                "check the chassis power supplies and the BMC's power-capping events"),
    "sw_thermal_slowdown": (WARN, "SW thermal slowdown is active (the driver lowers clocks to stay under the "
                                  "maximum operating temperature)",
                            "check the cooling (fans, airflow, inlet temperature); accept this code only if "
                            "it is expected on this chassis"),
}

# Xid catalog: code -> (severity, what it means, what the operator does). Codes not listed are WARN.
_XID: dict[int, tuple[str, str, str]] = {
    13: (WARN, "Graphics Engine Exception (usually an application fault)",
         "check the application that ran (pid/name in the log); reset the GPU if it repeats without one"),
    31: (WARN, "GPU memory page fault (usually an application or driver fault)",
         "check the application that ran (pid/name in the log); reset the GPU if it repeats"),
    43: (WARN, "GPU stopped processing (a channel was reset, usually after an application fault)",
         "restart the application; reset the GPU if it repeats"),
    45: (WARN, "Preemptive cleanup after a previous error or a killed process",
         "nothing if it follows a stopped process; otherwise look at the Xid before it"),
    46: (FAIL, "GPU stopped processing (the GPU needs a reset)",
         "drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot; service the GPU if it recurs"),
    48: (FAIL, "double-bit (uncorrectable) ECC error",
         "drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot, check again; RMA if it recurs"),
    61: (WARN, "internal micro-controller breakpoint/warning",
         "watch for Xid 62; reset the GPU if it repeats"),
    62: (FAIL, "internal micro-controller halt",
         "drain the node, reset the GPU or reboot; service the GPU if it recurs"),
    63: (FAIL, "row remapping (or page retirement) recorded: a remap waits for a GPU reset",
         "drain the node and reset the GPU (nvidia-smi -r -i <index>) or reboot to apply the remap"),
    64: (FAIL, "row remapping (or page retirement) failed to be recorded",
         "drain the node, reset the GPU; if nvidia-smi then shows a remapping failure, RMA the GPU"),
    74: (FAIL, "NVLink error",
         "drain the node, reset the GPUs (or reboot); check the NVLink/NVSwitch and Fabric Manager logs"),
    79: (FAIL, "GPU has fallen off the bus (it no longer answers on PCIe)",
         "drain the node, reset the GPU or reboot; check the slot, riser and power; RMA if it recurs"),
    92: (WARN, "high single-bit ECC error rate",
         "watch the ECC counts; reset the GPU at the next maintenance to let remapping act"),
    94: (FAIL, "contained uncorrectable ECC error (the application that touched the memory was stopped)",
         "drain the node, reset the GPU (nvidia-smi -r -i <index>) to apply the row remap, check again"),
    95: (FAIL, "uncontained uncorrectable ECC error (every application on this GPU may be affected)",
         "drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot, check again; RMA if it recurs"),
    119: (FAIL, "GSP RPC timeout (the GPU's firmware stopped answering)",
          "drain the node, reset the GPU or reboot; update the driver if it recurs"),
    120: (FAIL, "GSP error", "drain the node, reset the GPU or reboot; update the driver if it recurs"),
    140: (FAIL, "unrecovered ECC error", "drain the node, reset the GPU or reboot, check again; RMA if it recurs"),
    154: (FAIL, "the driver asks for a recovery action (GPU reset, drain and reset, or reboot)",
          "read the recovery action in the log line, drain the node and do it"),
}

# NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
# Older drivers print the bus without "PCI:" (Xid (0000:01:00): 3, ...).
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]+:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): "
                     r"(?P<xid>[0-9]+)(?:,\s*(?P<detail>.*))?$")
_BUS_RE = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$")
_NUMBER_RE = re.compile(r"^(-?[0-9]+(?:\.[0-9]+)?)")
# dcgmi diag's table rows: "| Persistence Mode          | Pass   |" and "| Warning | GPU 0 ... |".
_DCGM_ROW_RE = re.compile(r"^\|\s*(?P<name>[^|]+?)\s*\|\s*(?P<result>[^|]*?)\s*\|\s*$")
_DCGM_RESULTS = {"pass": PASS, "skip": PASS, "warn": WARN, "fail": FAIL}


def finding(code: str, severity: str, reason: str, next_step: str) -> dict[str, Any]:
    """One finding; ``accepted`` is set by :func:`accept_warnings`."""
    return {"code": code, "severity": severity, "reason": reason, "next_step": next_step, "accepted": False}


def normalise_bus_id(bus_id: str) -> str | None:
    """``00000000:1B:00.0`` (nvidia-smi) or ``0000:1b:00`` (Xid lines) as ``0000:1b:00.0``; None if not an address."""
    match = _BUS_RE.match(bus_id.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}.{function or '0'}"


def _text(node: ET.Element | None, path: str) -> str | None:
    """The stripped text at ``path`` under ``node``; None when absent, empty or a placeholder (N/A, [..])."""
    if node is None:
        return None
    child = node.find(path)
    if child is None or child.text is None:
        return None
    value = child.text.strip()
    if not value or value == "N/A" or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def _number(node: ET.Element | None, path: str) -> float | None:
    """The leading number of a value such as ``45 C``, ``16x`` or ``0``; None when unknown."""
    value = _text(node, path)
    match = _NUMBER_RE.match(value) if value is not None else None
    return float(match.group(1)) if match else None


def _int(node: ET.Element | None, path: str) -> int | None:
    value = _number(node, path)
    return int(value) if value is not None else None


def _yes(node: ET.Element | None, path: str) -> bool | None:
    """``Yes``/``No`` (also Enabled/Disabled, Active/Not Active) as a bool; None when unknown."""
    value = _text(node, path)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("yes", "enabled", "active"):
        return True
    if lowered in ("no", "disabled", "not active"):
        return False
    return None


def _sum(values: Iterable[int | None]) -> int | None:
    """The sum of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _uncorrectable(node: ET.Element | None) -> int | None:
    """Uncorrectable ECC count of an ``<ecc_errors>/<volatile>`` or ``<aggregate>`` block.

    Driver 535+ reports ``dram_uncorrectable`` and ``sram_uncorrectable_parity``/``_secded`` (550+), older ones
    ``sram_uncorrectable``; before that ``total/uncorrectable`` (or ``double_bit/total``).
    """
    if node is None:
        return None
    current = _sum([_int(node, "dram_uncorrectable"), _int(node, "sram_uncorrectable"),
                    _int(node, "sram_uncorrectable_parity"), _int(node, "sram_uncorrectable_secded")])
    return current if current is not None else _sum([_int(node, "total/uncorrectable"),
                                                      _int(node, "double_bit/total")])


def _clock_events(gpu: ET.Element) -> dict[str, bool | None]:
    """Clock event reasons by short name (``hw_slowdown``...), from the 550+ or the older throttle block."""
    block = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
        prefix = "clocks_throttle_reason_"
    names = (*_CLOCK_EVENTS, "gpu_idle")
    return {name: _yes(block, prefix + name) for name in names}


def parse_gpu(gpu: ET.Element, position: int) -> dict[str, Any]:
    """One ``<gpu>`` element as a flat record; every value is None when nvidia-smi did not report it."""
    bus = _text(gpu, "pci/pci_bus_id") or gpu.get("id") or ""
    minor = _int(gpu, "minor_number")
    link = gpu.find("pci/pci_gpu_link_info")
    ecc = gpu.find("ecc_errors")
    return {
        "index": minor if minor is not None else position,
        "name": _text(gpu, "product_name"),
        "serial": _text(gpu, "serial"),
        "uuid": _text(gpu, "uuid"),
        "pci_bus_id": normalise_bus_id(bus) or bus,
        "persistence_mode": _yes(gpu, "persistence_mode"),
        "reset_required": _yes(gpu, "gpu_reset_status/reset_required"),
        "drain_and_reset_recommended": _yes(gpu, "gpu_reset_status/drain_and_reset_recommended"),
        "remapped_row_pending": _yes(gpu, "remapped_rows/remapped_row_pending"),
        "remapped_row_failure": _yes(gpu, "remapped_rows/remapped_row_failure"),
        "remapped_row_correctable": _int(gpu, "remapped_rows/remapped_row_corr"),
        "remapped_row_uncorrectable": _int(gpu, "remapped_rows/remapped_row_unc"),
        "retired_pages_pending": _yes(gpu, "retired_pages/pending_retirement"),
        "ecc_mode": _yes(gpu, "ecc_mode/current_ecc"),
        "ecc_volatile_uncorrectable": _uncorrectable(ecc.find("volatile") if ecc is not None else None),
        "ecc_aggregate_uncorrectable": _uncorrectable(ecc.find("aggregate") if ecc is not None else None),
        "clock_events": _clock_events(gpu),
        "temperature_c": _number(gpu, "temperature/gpu_temp"),
        "temperature_slowdown_c": _number(gpu, "temperature/gpu_temp_slow_threshold"),
        "temperature_shutdown_c": _number(gpu, "temperature/gpu_temp_max_threshold"),
        "pcie_gen_current": _int(link, "pcie_gen/current_link_gen"),
        "pcie_gen_max": _int(link, "pcie_gen/max_link_gen"),
        "pcie_width_current": _int(link, "link_widths/current_link_width"),
        "pcie_width_max": _int(link, "link_widths/max_link_width"),
        "utilization_gpu_pct": _number(gpu, "utilization/gpu_util"),
    }


def parse_smi_xml(text: str) -> dict[str, Any]:
    """``nvidia-smi -q -x`` as ``{"driver_version": str|None, "gpus": [record, ...]}``.

    Raises ValueError when the text is not an ``<nvidia_smi_log>`` document (the DOCTYPE line is ignored).
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise ValueError(f"nvidia-smi -q -x did not print XML: {err}") from err
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"nvidia-smi -q -x printed <{root.tag}>, expected <nvidia_smi_log>")
    gpus = [parse_gpu(gpu, position) for position, gpu in enumerate(root.findall("gpu"))]
    return {"driver_version": _text(root, "driver_version"), "gpus": gpus}


def parse_xid_lines(text: str) -> list[dict[str, Any]]:
    """The ``NVRM: Xid`` lines of a kernel log: ``[{"pci_bus_id", "xid", "detail", "line"}]`` in log order."""
    events = []
    for line in text.splitlines():
        match = _XID_RE.search(line.strip())
        if match:
            events.append({"pci_bus_id": normalise_bus_id(match.group("bus")), "xid": int(match.group("xid")),
                           "detail": (match.group("detail") or "").strip(), "line": line.strip()})
    return events


def parse_dcgm_diag(text: str) -> list[dict[str, Any]]:
    """Findings from ``dcgmi diag -r 1``'s table: one per test whose result is Warn or Fail.

    The detail rows that follow a test (``| Warning | GPU 0 ... |``, ``| Error | ... |``) are appended to its reason.
    """
    findings: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    for line in text.splitlines():
        match = _DCGM_ROW_RE.match(line.strip())
        if not match:
            continue
        name, result = match.group("name"), match.group("result")
        if name in ("Warning", "Error", "Info") and last is not None:
            last["reason"] += f"; {result}"
            continue
        severity = _DCGM_RESULTS.get(result.split()[0].lower()) if result else None
        last = None
        if severity in (WARN, FAIL):
            code = "dcgm_" + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
            last = finding(code, str(severity), f"dcgmi diag: {name}: {result}",
                           "read dcgmi diag's message for this test; drain the node and fix the named GPU "
                           "before serving" if severity == FAIL else "read dcgmi diag's message for this test")
            findings.append(last)
    return findings


def _unknown(what: str) -> dict[str, Any]:
    return finding(f"unknown_{what}", WARN, f"nvidia-smi did not report {what.replace('_', ' ')}",
                   "check the driver (nvidia-smi -q) and its version; accept this code if this GPU cannot report it")


def _memory_findings(gpu: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Row remapping, page retirement and ECC rules (nvidia-smi(1) and NVIDIA's GPU memory error management)."""
    out = []
    if gpu["remapped_row_failure"]:
        out.append(finding("remap_failure", FAIL, "row remapping failed (no spare rows left in a memory bank)",
                           "drain the node and RMA the GPU"))
    if gpu["remapped_row_pending"]:
        out.append(finding("remap_pending", FAIL, "row remaps are pending: the faulty memory rows stay in use "
                                                  "until the GPU is reset",
                           "drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot to apply them, "
                           "check again"))
    if gpu["retired_pages_pending"]:
        out.append(finding("retired_pages_pending", FAIL, "retired pages are pending (take effect at the next "
                                                          "driver load)",
                           "drain the node and reset the GPU or reboot to retire them, check again"))
    if gpu["remapped_row_pending"] is None and gpu["retired_pages_pending"] is None:
        out.append(_unknown("memory_remapping_state"))
    if gpu["ecc_mode"] is False:
        out.append(finding("ecc_disabled", WARN, "ECC is disabled: memory errors go undetected",
                           "enable it (nvidia-smi -e 1 -i <index>, then reset the GPU), or accept this code"))
        return out
    volatile = gpu["ecc_volatile_uncorrectable"]
    if volatile:
        out.append(finding("ecc_uncorrectable", FAIL, f"{volatile} uncorrectable ECC error(s) since the driver "
                                                      "loaded",
                           "drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot, check again; "
                           "RMA if they come back"))
    elif volatile is None:
        out.append(_unknown("volatile_ecc_errors"))
    aggregate = gpu["ecc_aggregate_uncorrectable"]
    if aggregate and not volatile:
        out.append(finding("ecc_uncorrectable_history", WARN, f"{aggregate} uncorrectable ECC error(s) over the "
                                                              "GPU's life, none since the driver loaded",
                           "watch it; RMA if the count grows"))
    return out


def _thermal_findings(gpu: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Clock event reasons and temperature vs the GPU's own slowdown/shutdown thresholds (nvidia-smi(1))."""
    out = []
    events = gpu["clock_events"]
    for name, (severity, reason, next_step) in _CLOCK_EVENTS.items():
        if events.get(name):
            out.append(finding(name, severity, reason, next_step))
    if all(events.get(name) is None for name in _CLOCK_EVENTS):
        out.append(_unknown("clock_event_reasons"))
    temp, slow, shutdown = gpu["temperature_c"], gpu["temperature_slowdown_c"], gpu["temperature_shutdown_c"]
    if temp is None:
        out.append(_unknown("temperature"))
    elif shutdown is not None and temp >= shutdown:
        out.append(finding("temperature_shutdown", FAIL, f"{temp:g} C is at or above the shutdown threshold "
                                                         f"({shutdown:g} C)",
                           "stop the load and check the cooling now"))
    elif slow is not None and temp >= slow:
        out.append(finding("temperature_slowdown", WARN, f"{temp:g} C is at or above the slowdown threshold "
                                                         f"({slow:g} C)",
                           "check the cooling: fans, airflow, inlet temperature"))
    return out


def _pcie_findings(gpu: Mapping[str, Any]) -> list[dict[str, Any]]:
    """PCIe link width and generation vs their maximum.

    A link may downtrain its generation when idle to save power (nvidia-smi(1)), so a lower generation is a
    finding only when the GPU is not idle; a narrower width is a fault at any time (a seating or riser problem).
    """
    out = []
    width, width_max = gpu["pcie_width_current"], gpu["pcie_width_max"]
    if width is None or width_max is None:
        out.append(_unknown("pcie_link_width"))
    elif width < width_max:
        out.append(finding("pcie_width_degraded", FAIL, f"PCIe link trained at x{width}, the GPU supports "
                                                        f"x{width_max}",
                           "drain the node, reseat the GPU and check its riser/cable and slot, check again"))
    gen, gen_max = gpu["pcie_gen_current"], gpu["pcie_gen_max"]
    idle = gpu["clock_events"].get("gpu_idle")
    busy = idle is False or (gpu["utilization_gpu_pct"] or 0) > 0
    if gen is None or gen_max is None:
        out.append(_unknown("pcie_link_generation"))
    elif gen < gen_max and busy:
        out.append(finding("pcie_gen_degraded", WARN, f"PCIe link at generation {gen} under load, the link "
                                                      f"supports {gen_max}",
                           "reseat the GPU and check its riser/cable and the slot's BIOS setting"))
    return out


def _xid_finding(event: Mapping[str, Any]) -> dict[str, Any]:
    xid = int(event["xid"])
    severity, meaning, next_step = _XID.get(
        xid, (WARN, "an Xid the catalog here does not classify", "look it up in NVIDIA's Xid catalog"))
    detail = f" ({event['detail']})" if event.get("detail") else ""
    return finding(f"xid_{xid}", severity, f"Xid {xid} since boot: {meaning}{detail}", next_step)


def _xid_findings(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One finding per Xid code (the first line of each code, with its count)."""
    by_code: dict[int, tuple[Mapping[str, Any], int]] = {}
    for event in events:
        first, count = by_code.get(event["xid"], (event, 0))
        by_code[event["xid"]] = (first, count + 1)
    out = []
    for first, count in by_code.values():
        item = _xid_finding(first)
        if count > 1:
            item["reason"] += f" [{count} times]"
        out.append(item)
    return out


def gpu_findings(gpu: Mapping[str, Any], xids: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """All findings of one parsed GPU record (see :func:`parse_gpu`) and its Xid events."""
    out = _xid_findings(xids)
    if gpu.get("reset_required") or gpu.get("drain_and_reset_recommended"):
        out.append(finding("reset_required", FAIL, "the driver reports that this GPU needs a reset",
                           "drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot, check again"))
    out += _memory_findings(gpu) + _thermal_findings(gpu) + _pcie_findings(gpu)
    if gpu["persistence_mode"] is False:
        out.append(finding("persistence_mode_off", WARN, "persistence mode is off: the driver state is torn "
                                                         "down whenever no client holds the GPU",
                           "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)"))
    elif gpu["persistence_mode"] is None:
        out.append(_unknown("persistence_mode"))
    return out


def verdict_of(findings: Iterable[Mapping[str, Any]]) -> str:
    """The worst severity of the findings not accepted; PASS without any."""
    worst = PASS
    for item in findings:
        if not item.get("accepted") and _RANK[item["severity"]] > _RANK[worst]:
            worst = item["severity"]
    return worst


def _gpu_entry(gpu: Mapping[str, Any], findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"index": gpu.get("index"), "name": gpu.get("name"), "serial": gpu.get("serial"),
            "uuid": gpu.get("uuid"), "pci_bus_id": gpu.get("pci_bus_id"), "verdict": verdict_of(findings),
            "findings": findings}


def evaluate(smi_xml: str | None, kernel_log: str = "", dcgm_diag: str | None = None,
             accepted: Sequence[str] = ()) -> dict[str, Any]:
    """The health report of a node (see the module docstring).

    ``smi_xml`` None or unparsable is a node FAIL (the driver does not answer). An Xid for a bus id that
    nvidia-smi does not list (a GPU fallen off the bus often vanishes from it) becomes a GPU entry of its own,
    with index, serial and UUID None.
    """
    node: list[dict[str, Any]] = []
    gpus: list[Mapping[str, Any]] = []
    if smi_xml is None:
        node.append(finding("nvidia_smi_failed", FAIL, "nvidia-smi -q -x did not answer",
                            "check the driver (nvidia-smi, dmesg); reboot if it is wedged"))
    else:
        try:
            gpus = parse_smi_xml(smi_xml)["gpus"]
        except ValueError as err:
            node.append(finding("nvidia_smi_failed", FAIL, str(err), "check the driver (nvidia-smi -q -x)"))
    events = parse_xid_lines(kernel_log)
    entries = []
    listed = {gpu["pci_bus_id"] for gpu in gpus}
    for gpu in gpus:
        own = [e for e in events if e["pci_bus_id"] == gpu["pci_bus_id"]]
        entries.append(_gpu_entry(gpu, gpu_findings(gpu, own)))
    unlisted: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["pci_bus_id"] not in listed:
            unlisted.setdefault(str(event["pci_bus_id"]), []).append(event)
    for bus_id, own in unlisted.items():
        entries.append(_gpu_entry({"pci_bus_id": bus_id}, _xid_findings(own)))
    if dcgm_diag is not None:
        node += parse_dcgm_diag(dcgm_diag)
    return accept_warnings({"verdict": PASS, "gpus": entries, "node_findings": node}, accepted)


def accept_warnings(report: Mapping[str, Any], accepted: Sequence[str]) -> dict[str, Any]:
    """A copy of ``report`` where WARN findings whose code is in ``accepted`` no longer count.

    FAIL findings cannot be accepted: a code that is FAIL stays FAIL. Verdicts are recomputed.
    """
    codes = set(accepted)

    def mark(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [dict(item, accepted=item["severity"] == WARN and item["code"] in codes) for item in items]

    gpus = [dict(gpu, findings=mark(gpu["findings"])) for gpu in report["gpus"]]
    for gpu in gpus:
        gpu["verdict"] = verdict_of(gpu["findings"])
    node = mark(report["node_findings"])
    worst = verdict_of(node)
    for gpu in gpus:
        if _RANK[gpu["verdict"]] > _RANK[worst]:
            worst = gpu["verdict"]
    return {"verdict": worst, "gpus": gpus, "node_findings": node}


def gpu_label(gpu: Mapping[str, Any]) -> str:
    """``GPU 3 (serial 1654..., bus 0000:1b:00.0)``; unknown parts say so."""
    index = gpu.get("index")
    return (f"GPU {index if index is not None else '?'} (serial {gpu.get('serial') or 'unknown'}, "
            f"bus {gpu.get('pci_bus_id') or 'unknown'})")


def refusal_message(report: Mapping[str, Any]) -> str | None:
    """One message naming every FAIL finding (GPU index, serial and bus id, the reason and the fix); None if none."""
    parts = []
    for gpu in report["gpus"]:
        for item in gpu["findings"]:
            if item["severity"] == FAIL:
                step = str(item["next_step"]).replace("<index>", str(gpu.get("index", "?")))
                parts.append(f"{gpu_label(gpu)}: {item['reason']} [{item['code']}]. Fix: {step}.")
    for item in report["node_findings"]:
        if item["severity"] == FAIL:
            parts.append(f"node: {item['reason']} [{item['code']}]. Fix: {item['next_step']}.")
    if not parts:
        return None
    return "GPU health check FAILED, refusing to continue: " + " ".join(parts)


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report for a person: a first line with the verdict, then one line per finding that is not PASS
    (``GPU 1 (serial ..., bus ...): WARN <reason> [<code>]``, ``(accepted)`` after an accepted WARN)."""
    gpus = report["gpus"]
    lines = [f"GPU health {report['verdict']} over {len(gpus)} GPU(s)"]
    for gpu in gpus:
        for item in gpu["findings"]:
            lines.append(f"{gpu_label(gpu)}: {item['severity']} {item['reason']} [{item['code']}]"
                         + (" (accepted)" if item.get("accepted") else ""))
    for item in report["node_findings"]:
        lines.append(f"node: {item['severity']} {item['reason']} [{item['code']}]"
                     + (" (accepted)" if item.get("accepted") else ""))
    return lines


def brief(report: Mapping[str, Any]) -> dict[str, Any]:
    """What a manifest keeps of a report: the verdict, each GPU's identity and verdict, the codes that are not PASS
    per GPU (accepted ones apart) and the summary lines."""
    def codes(items: Iterable[Mapping[str, Any]], accepted: bool) -> list[str]:
        return sorted(str(i["code"]) for i in items if bool(i.get("accepted")) == accepted)

    return {"verdict": report["verdict"],
            "gpus": [{"index": g.get("index"), "serial": g.get("serial"), "pci_bus_id": g.get("pci_bus_id"),
                      "verdict": g["verdict"], "findings": codes(g["findings"], False),
                      "accepted": codes(g["findings"], True)} for g in report["gpus"]],
            "node_findings": codes(report["node_findings"], False),
            "summary": summary_lines(report)}


# argv -> (rc, stdout, stderr); 127 when the command is not there.
Runner = Callable[[list[str]], tuple[int, str, str]]
KERNEL_LOG_COMMANDS: dict[str, list[str]] = {
    "journalctl": ["journalctl", "-k", "-b", "-o", "cat", "--no-pager"],
    "dmesg": ["dmesg"],
}


def read_kernel_log(run: Runner, source: str) -> tuple[str, str | None]:
    """(the source used, its text); the text is None when no source answered. ``auto``: journalctl, else dmesg."""
    names = ["journalctl", "dmesg"] if source == "auto" else [source]
    for name in names:
        rc, out, _err = run(KERNEL_LOG_COMMANDS[name])
        if rc == 0:
            return name, out
    return "none", None


def collect(run: Runner, nvidia_smi: str = "nvidia-smi", kernel_log: str = "auto", dcgm_diag: bool = False,
            dcgmi: str = "dcgmi", accepted: Sequence[str] = ()) -> dict[str, Any]:
    """Run the probes with ``run`` and return the report plus ``refusal`` and ``kernel_log_source``.

    The gpu_health module and the node's watch (gpu_watch.py) both call this.
    """
    rc, smi_out, smi_err = run([nvidia_smi, "-q", "-x"])
    smi_xml = smi_out if rc == 0 else None
    extra: list[dict[str, Any]] = []
    if rc != 0:
        text = (smi_out.strip() or smi_err.strip() or f"exit {rc}").splitlines()[0]
        extra.append(finding("nvidia_smi_failed", FAIL, f"nvidia-smi -q -x failed: {text}",
                             "check the driver (nvidia-smi, the kernel log); reboot if it is wedged"))
    source, log_text = ("none", None) if kernel_log == "none" else read_kernel_log(run, kernel_log)
    if log_text is None:
        extra.append(finding("unknown_xid_events", WARN, "the kernel log was not read (Xid events unknown)",
                             "run as root (journalctl -k needs it), or accept this code"))
    dcgm_text = None
    if dcgm_diag:
        dcgm_rc, dcgm_out, dcgm_err = run([dcgmi, "diag", "-r", "1"])
        dcgm_text = dcgm_out
        if dcgm_rc != 0 and not parse_dcgm_diag(dcgm_out):
            extra.append(finding("dcgm_diag_failed", WARN,
                                 f"dcgmi diag -r 1 exited {dcgm_rc}: {(dcgm_out.strip() or dcgm_err.strip())[:200]}",
                                 "check that DCGM (nv-hostengine) runs, or set dcgm_diag to false"))
    report = evaluate(smi_xml, log_text or "", dcgm_text)
    if smi_xml is None:
        report["node_findings"] = [f for f in report["node_findings"] if f["code"] != "nvidia_smi_failed"]
    report["node_findings"] = extra + report["node_findings"]
    report = accept_warnings(report, accepted)
    return dict(report, refusal=refusal_message(report), kernel_log_source=source)
