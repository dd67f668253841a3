"""GPU inventory: parse what nvidia-smi, lspci, the loaded NVIDIA driver and dpkg report, once, into one schema.

Pure functions (no Ansible state, stdlib only) used by the node_facts, nvidia_driver and preflight roles through
the filters of ``plugins/filter/gpu_inventory.py``.

The GPU record (one per GPU, the same keys whichever tool found it)::

    {"index": 0,                                   # nvidia-smi's index; lspci: position in bus order
     "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",   # lspci: its vendor + device text
     "memory_total_mib": 97887,                    # None when unknown (lspci, or nvidia-smi said [N/A])
     "compute_capability": "12.0",                 # "major.minor", None when unknown
     "pci_bus_id": "0000:01:00.0",                 # lower case, domain as lspci -D prints it (>= 4 hex digits)
     "pci_device_id": "10de:2bb5"}                 # "vendor:device" as lspci -nn prints it; None when unknown
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# The fields node_facts and nvidia_driver ask nvidia-smi for (--format=csv,noheader,nounits), in this order.
NVIDIA_SMI_FIELDS: tuple[str, ...] = (
    "index", "name", "memory.total", "compute_cap", "pci.bus_id", "pci.device_id", "driver_version",
)
GPU_RECORD_KEYS: tuple[str, ...] = (
    "index", "name", "memory_total_mib", "compute_capability", "pci_bus_id", "pci_device_id",
)
# Values nvidia-smi prints instead of a number: [N/A], [Not Supported], [Unknown Error], [Insufficient Permissions].
_UNAVAILABLE_RE = re.compile(r"^\[.*\]$|^N/A$")
_INT_RE = re.compile(r"^[0-9]+$")
_CC_RE = re.compile(r"^[0-9]+\.[0-9]+$")
_HEX_RE = re.compile(r"^[0-9a-f]+$")
_BUS_ID_RE = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_SMI_DEVICE_ID_RE = re.compile(r"^0x([0-9a-fA-F]{4})([0-9a-fA-F]{4})$")
# `lspci -Dnn`: <bus id> <class name> [<class>]: <vendor and device names> [<vendor>:<device>] (rev xx)...
_LSPCI_RE = re.compile(
    r"^(?P<bus>\S+)\s+(?P<class_name>.*?)\s*\[(?P<class>[0-9a-fA-F]{4})\]:\s+(?P<name>.*?)\s*"
    r"\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\](?P<rest>(?:\s.*)?)$"
)
# /proc/driver/nvidia/version, first line:
#   NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (...)
#   NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Mon Sep 29 ...
_PROC_VERSION_RE = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)")
_DEB_EPOCH_RE = re.compile(r"^[0-9]+:")


class GpuInventoryError(ValueError):
    """Input that cannot be what the tool prints; the message says what was expected."""


def _unavailable(value: str) -> bool:
    """True for nvidia-smi's placeholders of a value it cannot report ([N/A], [Not Supported], ...)."""
    return not value or bool(_UNAVAILABLE_RE.match(value))


def normalise_pci_bus_id(bus_id: str) -> str:
    """A PCI address as lspci -D prints it: lower case, domain with at least 4 hex digits.

    nvidia-smi prints ``00000000:01:00.0`` (8-digit domain, upper case), lspci ``0000:01:00.0``; an address without
    a domain (lspci without -D) is in domain 0. Raises GpuInventoryError for anything else.
    """
    match = _BUS_ID_RE.match(bus_id.strip())
    if not match:
        raise GpuInventoryError(f"'{bus_id}' is not a PCI address (expected [domain:]bus:slot.function, "
                                "e.g. 0000:01:00.0)")
    domain, bus, slot, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{slot.lower()}.{function}"


def smi_pci_device_id(value: str) -> str | None:
    """nvidia-smi's pci.device_id (``0x2BB510DE``: device then vendor) as ``vendor:device`` (``10de:2bb5``)."""
    match = _SMI_DEVICE_ID_RE.match(value.strip())
    return f"{match.group(2).lower()}:{match.group(1).lower()}" if match else None


def gpu_record(index: int | None, name: str, memory_total_mib: int | None = None,
               compute_capability: str | None = None, pci_bus_id: str = "",
               pci_device_id: str | None = None) -> dict[str, Any]:
    """One GPU in the shared schema (see the module docstring)."""
    return {"index": index, "name": name, "memory_total_mib": memory_total_mib,
            "compute_capability": compute_capability, "pci_bus_id": pci_bus_id, "pci_device_id": pci_device_id}


def _split_smi_line(line: str, fields: list[str]) -> list[str] | None:
    """Split one CSV line into len(fields) values; the name field may itself contain commas (it absorbs them)."""
    parts = [part.strip() for part in line.split(",")]
    extra = len(parts) - len(fields)
    if extra < 0 or (extra > 0 and "name" not in fields):
        return None
    at = fields.index("name") if "name" in fields else 0
    return parts[:at] + [", ".join(parts[at:at + extra + 1])] + parts[at + extra + 1:]


def _smi_record(values: Mapping[str, str]) -> dict[str, Any] | None:
    """A GPU record from one row of named nvidia-smi values; None when the row cannot be nvidia-smi's answer."""
    index = values.get("index", "")
    if not _INT_RE.match(index):
        return None
    memory = values.get("memory.total", "")
    capability = values.get("compute_cap", "")
    bus_id = values.get("pci.bus_id", "")
    if memory and not _unavailable(memory) and not _INT_RE.match(memory):
        return None
    if capability and not _unavailable(capability) and not _CC_RE.match(capability):
        return None
    try:
        bus = normalise_pci_bus_id(bus_id) if bus_id and not _unavailable(bus_id) else ""
    except GpuInventoryError:
        return None
    return gpu_record(
        index=int(index),
        name=values.get("name", ""),
        memory_total_mib=int(memory) if _INT_RE.match(memory) else None,
        compute_capability=capability if _CC_RE.match(capability) else None,
        pci_bus_id=bus,
        pci_device_id=smi_pci_device_id(values.get("pci.device_id", "")),
    )


def parse_nvidia_smi(text: str, fields: Iterable[str] = NVIDIA_SMI_FIELDS) -> dict[str, Any]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``.

    Returns ``{"gpus": [GPU record, ...], "driver_version": "580.95.05" or "", "unparsed": [line, ...]}``;
    GPUs sorted by index. ``unparsed`` lists the non-empty lines that are not such a row (an error text, a
    header, a row of another field list): callers decide whether that means "no answer" or an error.
    Unavailable values ([N/A], [Not Supported]) become None.
    """
    names = [str(f).strip() for f in fields]
    if "index" not in names:
        raise GpuInventoryError(f"the nvidia-smi fields {names} must include index")
    gpus: list[dict[str, Any]] = []
    unparsed: list[str] = []
    driver = ""
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = _split_smi_line(line, names)
        values = dict(zip(names, parts, strict=True)) if parts is not None else {}
        record = _smi_record(values) if values else None
        if record is None:
            unparsed.append(line.strip())
            continue
        gpus.append(record)
        version = values.get("driver_version", "")
        driver = driver or ("" if _unavailable(version) else version)
    return {"gpus": sorted(gpus, key=lambda g: g["index"]), "driver_version": driver, "unparsed": unparsed}


def parse_lspci(text: str) -> list[dict[str, Any]]:
    """Parse ``lspci -Dnn`` into PCI device records, in bus order.

    Each record: ``{"pci_bus_id": "0000:01:00.0", "pci_class": "0302", "class_name": "3D controller",
    "pci_device_id": "10de:2bb5", "vendor_id": "10de", "name": "NVIDIA Corporation GB202GL [...]"}``.
    Lines without the numeric ids (lspci without -nn) are skipped.
    """
    devices = []
    for line in (text or "").splitlines():
        match = _LSPCI_RE.match(line.strip())
        if not match:
            continue
        try:
            bus = normalise_pci_bus_id(match["bus"])
        except GpuInventoryError:
            continue
        vendor, device = match["vendor"].lower(), match["device"].lower()
        devices.append({"pci_bus_id": bus, "pci_class": match["class"].lower(), "class_name": match["class_name"],
                        "pci_device_id": f"{vendor}:{device}", "vendor_id": vendor, "name": match["name"]})
    return sorted(devices, key=lambda d: d["pci_bus_id"])


def _check_hex_ids(values: Iterable[str], what: str) -> list[str]:
    """Lower-case hex ids, or a GpuInventoryError naming the bad one."""
    out = []
    for value in values:
        text = str(value).strip().lower()
        if not _HEX_RE.match(text) or len(text) > 4:
            raise GpuInventoryError(f"{what} must be 1 to 4 hex digits, got '{value}'")
        out.append(text)
    return out


def select_pci_devices(devices: Iterable[Mapping[str, Any]], vendor_ids: Iterable[str] = (),
                       classes: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The devices of one of the vendors and one of the classes; empty lists select everything.

    A class matches by prefix: ``"0302"`` is the 3D controller class, ``"03"`` every display controller.
    """
    vendors = _check_hex_ids(vendor_ids, "a PCI vendor id")
    prefixes = _check_hex_ids(classes, "a PCI class")
    return [dict(d) for d in devices
            if (not vendors or d["vendor_id"] in vendors)
            and (not prefixes or any(d["pci_class"].startswith(p) for p in prefixes))]


def lspci_gpus(text: str, vendor_ids: Iterable[str] = ("10de",), classes: Iterable[str] = ("0300", "0302")
               ) -> list[dict[str, Any]]:
    """GPU records from ``lspci -Dnn``: devices of the vendors and classes, indexed in bus order.

    lspci knows neither memory nor compute capability (None); ``name`` is lspci's vendor and device text.
    """
    chosen = select_pci_devices(parse_lspci(text), vendor_ids, classes)
    return [gpu_record(index=i, name=d["name"], pci_bus_id=d["pci_bus_id"], pci_device_id=d["pci_device_id"])
            for i, d in enumerate(chosen)]


def match_catalog(gpus: Iterable[Mapping[str, Any]], catalog: Mapping[str, Mapping[str, Any]]
                  ) -> list[dict[str, Any]]:
    """Each GPU record with ``key``: the catalog entry whose ``pci_ids`` hold its PCI id, else whose ``names``
    hold its name (first entry in catalog order), else None. The catalog is ``vllm_node_gpus``.

    Keys of the GPU record schema that a hand-written record leaves out are filled in (None, name "").
    """
    out = []
    for gpu in gpus:
        device = str(gpu.get("pci_device_id") or "").lower()
        name = str(gpu.get("name") or "")
        key = next((k for k, e in catalog.items()
                    if device and device in [str(p).lower() for p in e.get("pci_ids") or []]), None)
        if key is None:
            key = next((k for k, e in catalog.items() if name and name in (e.get("names") or [])), None)
        out.append({**gpu_record(index=None, name=""), **gpu, "key": key})
    return out


def _capability_at_least(capability: Any, minimum: float) -> bool:
    """True when a "major.minor" compute capability is >= minimum; unknown values are not."""
    try:
        major, minor = (int(p) for p in str(capability).split("."))
    except (TypeError, ValueError):
        return False
    return major + minor / 10 >= minimum


def gpu_architecture(gpu: Mapping[str, Any], catalog: Mapping[str, Mapping[str, Any]],
                     blackwell_pci_prefixes: Iterable[str] = (), blackwell_min_capability: float = 10.0) -> str:
    """The GPU's architecture: the catalog entry's ``architecture`` when its PCI id or name is catalogued;
    else ``blackwell`` when the compute capability is >= blackwell_min_capability or the PCI device id (vendor
    10de) starts with one of blackwell_pci_prefixes (GPUs newer than the catalog); else ``unknown``."""
    key = match_catalog([gpu], catalog)[0]["key"]
    if key is not None and catalog[key].get("architecture"):
        return str(catalog[key]["architecture"])
    vendor, _, device = str(gpu.get("pci_device_id") or "").lower().partition(":")
    prefixes = _check_hex_ids(blackwell_pci_prefixes, "a Blackwell PCI device id prefix")
    if _capability_at_least(gpu.get("compute_capability"), blackwell_min_capability):
        return "blackwell"
    if vendor == "10de" and device and any(device.startswith(p) for p in prefixes):
        return "blackwell"
    return "unknown"


def parse_proc_version(text: str) -> dict[str, str]:
    """Parse /proc/driver/nvidia/version: ``{"version": "580.95.05", "flavour": "open" | "proprietary"}``;
    both "" when no NVIDIA module is loaded (empty or unrelated text)."""
    match = _PROC_VERSION_RE.search(text or "")
    if not match:
        return {"version": "", "flavour": ""}
    return {"version": match.group(1), "flavour": "open" if "Open Kernel Module" in text else "proprietary"}


def deb_upstream_version(version: str) -> str:
    """A Debian package version without its epoch and Debian revision: ``1:580.95.05-1ubuntu1`` -> ``580.95.05``.

    The revision is what follows the last hyphen (the upstream part may contain hyphens); "" stays "".
    """
    text = _DEB_EPOCH_RE.sub("", str(version or "").strip())
    return text.rsplit("-", 1)[0] if "-" in text else text
