"""Action plugin: watch a starting vLLM unit until it is healthy, failed or out of time, printing progress.

Runs the read-only module vllm_node.vllm_node.vllm_service_probe on the node step after step (each step watches
`interval` seconds) and prints one progress line per step on the controller: one task in the log, no task file
that includes itself, and a hard bound on the number of steps.
"""

from __future__ import annotations

import math

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

PROBE = "vllm_node.vllm_node.vllm_service_probe"
ARGUMENT_SPEC = {
    "unit": {"type": "str", "required": True},
    "url": {"type": "str", "required": True},
    "timeout": {"type": "int", "required": True},
    "interval": {"type": "int", "default": 15},
    "since": {"type": "int"},
    "not_invocation": {"type": "str"},
}


def max_steps(timeout: int, interval: int) -> int:
    """Upper bound of probe calls: the steps the timeout allows, plus slack for steps that return early."""
    return math.ceil(max(timeout, 0) / max(interval, 1)) + 3


def progress_line(host: str, probe: dict) -> str:
    """One line per step: status, time since the start, unit state, the newest loading line."""
    shown = []
    for line in probe.get("progress", [])[-1:] + [probe.get("latest", "")]:
        if line and line not in shown:
            shown.append(line)
    processes = probe.get("processes") or []
    cpu = f" [{len(processes)} processes, {sum(p['cpu_seconds'] for p in processes):.0f} CPU-s]" if processes else ""
    return (
        f"{host}: {probe.get('status')} after {probe.get('elapsed')} s "
        f"({probe.get('active_state')}/{probe.get('sub_state')}){cpu}: {' | '.join(shown)}"
    )


def finished(probe: dict, timeout: int) -> bool:
    """The watch ends when the unit is healthy or failed, or the start has used its time."""
    return probe.get("status") != "loading" or int(probe.get("elapsed") or 0) >= timeout


class ActionModule(ActionBase):
    """Loop over vllm_service_probe on the node; return its last result plus `steps`."""

    TRANSFERS_FILES = False
    _requires_connection = True
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        """Watch step by step; the result is the last probe's (status healthy/loading/failed)."""
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "node")
        probe_args = {"unit": args["unit"], "url": args["url"], "wait": args["interval"]}
        for key in ("since", "not_invocation"):
            if args[key] not in (None, ""):
                probe_args[key] = args[key]
        probe: dict = {}
        steps = 0
        try:
            for _ in range(max_steps(args["timeout"], args["interval"])):
                steps += 1
                probe = self._execute_module(module_name=PROBE, module_args=probe_args, task_vars=task_vars)
                if probe.get("failed"):
                    break
                display.display(progress_line(host, probe))
                if probe.get("status") == "healthy" and (probe.get("phases") or {}).get("summary"):
                    display.display(f"{host}: where the start went: {probe['phases']['summary']}")
                if finished(probe, args["timeout"]):
                    break
                # The next step continues the same watch: same start time, same restart count.
                probe_args["since"] = probe["since"]
                probe_args["restarts"] = probe["restarts"]
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(probe)
        result["steps"] = steps
        result["changed"] = False
        return result
