#!/usr/bin/python
"""Ansible module: the health verdict (PASS / WARN / FAIL) of each NVIDIA GPU of a node, read-only."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_health
short_description: Health verdict of each NVIDIA GPU (PASS / WARN / FAIL with the reason and the fix; read-only)
description:
  - Runs C(nvidia-smi -q -x) and reads the kernel log since boot (C(journalctl -k -b -o cat), else C(dmesg)) for
    the driver's NVRM Xid lines; optionally runs C(dcgmi diag -r 1) (about 10 s, needs DCGM).
  - Per GPU, a verdict and findings from pending or failed row remaps, pending retired pages, uncorrectable ECC
    errors, Xid events mapped to the GPU by PCI bus id, active HW/thermal/power-brake clock slowdowns, the
    temperature against the GPU's slowdown and shutdown thresholds, the PCIe link width (and generation when the
    GPU is busy, since idle GPUs lower it on purpose) against its maximum, the persistence mode and the driver's reset
    status. A value nvidia-smi does not report is a WARN (C(unknown_*)), never a PASS.
  - Xid lines for a bus id that nvidia-smi does not list (a GPU fallen off the bus may vanish from it) become a GPU
    entry with index, serial and UUID null.
  - Never fails on a FAIL verdict; the caller decides (a preflight gate uses RV(refusal)).
  - Changes nothing; safe in check mode.
options:
  accepted_warnings:
    description:
      - WARN finding codes the operator accepts (for example C(persistence_mode_off), C(pcie_gen_degraded),
        C(unknown_volatile_ecc_errors)); they are reported with C(accepted=true) and do not count in the verdicts.
      - FAIL findings cannot be accepted.
    type: list
    elements: str
    default: []
  dcgm_diag:
    description: Also run C(dcgmi diag -r 1) and add its Warn/Fail tests to RV(node_findings).
    type: bool
    default: false
  kernel_log:
    description:
      - Where the Xid lines come from. C(auto) tries C(journalctl -k -b -o cat), then C(dmesg);
        C(none) skips them (a finding says so).
    type: str
    choices: [auto, journalctl, dmesg, none]
    default: auto
  nvidia_smi:
    description: The nvidia-smi command (name on the PATH or absolute path).
    type: str
    default: nvidia-smi
  dcgmi:
    description: The dcgmi command (name on the PATH or absolute path).
    type: str
    default: dcgmi
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
author: vllm-node
"""

EXAMPLES = r"""
- name: Check the health of the GPUs
  vllm_node.vllm_node.gpu_health:
    accepted_warnings: [persistence_mode_off]
  register: gpu_health

- name: Refuse to go on with a failed GPU
  ansible.builtin.assert:
    that: gpu_health.verdict != 'FAIL'
    fail_msg: "{{ gpu_health.refusal }}"
"""

RETURN = r"""
verdict:
  description: PASS, WARN or FAIL, the worst over all GPUs and node findings (accepted WARNs left out).
  type: str
  returned: always
  sample: FAIL
gpus:
  description:
    - One entry per GPU, with C(index), C(name), C(serial), C(uuid), C(pci_bus_id) (C(0000:1b:00.0)), C(verdict)
      and C(findings), each C({code, severity, reason, next_step, accepted}).
  type: list
  elements: dict
  returned: always
  sample:
    - index: 1
      name: NVIDIA H100 80GB HBM3
      serial: "1654723000001"
      uuid: GPU-68313130-0001-4c1e-9a0b-5d3f00000001
      pci_bus_id: "0000:28:00.0"
      verdict: FAIL
      findings:
        - code: remap_pending
          severity: FAIL
          reason: "row remaps are pending: the faulty memory rows stay in use until the GPU is reset"
          next_step: "drain the node, reset the GPU (nvidia-smi -r -i <index>) or reboot to apply them, check again"
          accepted: false
node_findings:
  description: Findings not tied to one GPU (nvidia-smi failing, the kernel log unreadable, dcgmi diag tests).
  type: list
  elements: dict
  returned: always
  sample: []
refusal:
  description: One message naming each FAIL (GPU index, serial, bus id, reason and fix); null without a FAIL.
  type: str
  returned: always
  sample: "GPU health check FAILED, refusing to continue: GPU 1 (serial 1654723000001, bus 0000:28:00.0): ..."
kernel_log_source:
  description: The command the Xid lines were read from (C(journalctl), C(dmesg)) or C(none).
  type: str
  returned: always
  sample: journalctl
summary:
  description: The verdict line, then one line per finding that is not PASS (GPU index, serial, bus id, severity,
    reason, code; C((accepted)) after an accepted WARN).
  type: list
  elements: str
  returned: always
  sample: ["GPU health WARN over 2 GPU(s)", "GPU 1 (serial 1792525000001, bus 0000:28:00.0): WARN PCIe link ..."]
brief:
  description: What a manifest keeps, C({verdict, gpus, node_findings, summary}); each GPU as C({index, serial,
    pci_bus_id, verdict, findings, accepted}) with the codes of its findings (accepted WARNs apart).
  type: dict
  returned: always
  sample: {verdict: PASS, gpus: [], node_findings: [], summary: ["GPU health PASS over 0 GPU(s)"]}
"""

from collections.abc import Sequence
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gpu_health

Runner = gpu_health.Runner


def check(run: Runner, nvidia_smi: str = "nvidia-smi", kernel_log: str = "auto", dcgm_diag: bool = False,
          dcgmi: str = "dcgmi", accepted: Sequence[str] = ()) -> dict[str, Any]:
    """Collect the inputs with ``run`` (argv -> rc, stdout, stderr) and return the module's result."""
    report = gpu_health.collect(run, nvidia_smi, kernel_log, dcgm_diag, dcgmi, accepted)
    return dict(report, summary=gpu_health.summary_lines(report), brief=gpu_health.brief(report))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "accepted_warnings": {"type": "list", "elements": "str", "default": []},
            "dcgm_diag": {"type": "bool", "default": False},
            "kernel_log": {"type": "str", "default": "auto", "choices": ["auto", "journalctl", "dmesg", "none"]},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "dcgmi": {"type": "str", "default": "dcgmi"},
        },
        supports_check_mode=True,
    )
    params = module.params

    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"}, handle_exceptions=False)
        except OSError as err_:
            return 127, "", str(err_)
        return rc, out, err

    result = check(run, params["nvidia_smi"], params["kernel_log"], params["dcgm_diag"], params["dcgmi"],
                   params["accepted_warnings"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
