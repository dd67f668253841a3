"""Is the wanted NVIDIA driver installed and loaded? Pure functions for the nvidia_driver role.

Inputs are what the role already probed: the installed packages (``ansible.builtin.package_facts``), the loaded
module (/proc/driver/nvidia/version, parsed by gpu_inventory.parse_proc_version) and the license of the module on
disk (``modinfo -F license nvidia``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.gpu_inventory import deb_upstream_version

# `modinfo -F license nvidia` of NVIDIA's open kernel modules; the proprietary ones say "NVIDIA".
OPEN_LICENSE = "Dual MIT/GPL"


def installed_versions(packages: Mapping[str, Any]) -> dict[str, str]:
    """{name: version} from package_facts' ``ansible_facts.packages`` ({name: [{version: ...}, ...]}).

    A name installed for several architectures keeps its first version; plain {name: version} passes through.
    """
    out = {}
    for name, entries in (packages or {}).items():
        if isinstance(entries, str):
            out[str(name)] = entries
        elif entries:
            out[str(name)] = str(entries[0].get("version", ""))
    return out


def version_matches_glob(version: str, glob: str) -> bool:
    """Whether a Debian version (epoch dropped) matches an apt version glob such as ``580.*`` or ``580.95.05-*``.

    apt's ``name=<glob>`` compares the whole version string with shell-style wildcards; ``.`` is literal.
    """
    text = re.sub(r"^[0-9]+:", "", str(version or "").strip())
    return bool(text) and fnmatch.fnmatchcase(text, glob)


def driver_state(packages: Mapping[str, Any], wanted: Iterable[str], kmod_package: str, loaded_version: str,
                 version_glob: str, disk_license: str, kernel_modules: str) -> dict[str, Any]:
    """Compare what the host has with what is wanted.

    Returns ``{"satisfied": bool, "missing": [package, ...], "kmod_version": "580.95.05" or "",
    "reasons": [why not satisfied, ...]}``. Satisfied means: every wanted package installed, a driver loaded whose
    version equals the kernel module package's upstream version, that package's version matches version_glob (the
    wanted branch or exact version), and the module on disk is the wanted flavour (kernel_modules: open or
    proprietary).
    """
    if kernel_modules not in ("open", "proprietary"):
        raise ValueError(f"kernel_modules must be open or proprietary, got '{kernel_modules}'")
    installed = installed_versions(packages)
    missing = [name for name in wanted if name not in installed]
    kmod_full = installed.get(kmod_package, "")
    kmod_version = deb_upstream_version(kmod_full)
    reasons = []
    if missing:
        reasons.append("not installed: " + ", ".join(missing))
    if not loaded_version:
        reasons.append("no NVIDIA module loaded")
    elif loaded_version != kmod_version:
        reasons.append(f"loaded {loaded_version} but {kmod_package} is {kmod_version or 'not installed'}")
    if kmod_full and not version_matches_glob(kmod_full, version_glob):
        reasons.append(f"{kmod_package} {kmod_full} is not the wanted {version_glob}")
    if (disk_license == OPEN_LICENSE) != (kernel_modules == "open"):
        reasons.append(f"the module on disk has license '{disk_license}', not the {kernel_modules} flavour")
    return {"satisfied": not reasons, "missing": missing, "kmod_version": kmod_version, "reasons": reasons}
