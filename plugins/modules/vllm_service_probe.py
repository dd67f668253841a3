#!/usr/bin/python
"""Ansible module: watch a starting vLLM unit for a while; report health, progress and the root cause."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_service_probe
short_description: Watch a vLLM systemd unit start (read-only)
description:
  - Polls the unit state and the C(/health) URL for at most O(wait) seconds, then returns the status
    (V(healthy), V(loading) or V(failed)), the recent progress lines of the journal and, on failure,
    the root-cause lines (for vLLM's KV-cache C(ValueError) also the estimated maximum model length and the fix).
  - With O(wait=0) it looks once; that call also stamps the node's clock (RV(now)) and the running
    invocation (RV(invocation_id)), which a later watch passes back as O(since) and O(not_invocation).
  - The action P(vllm_node.vllm_node.vllm_service_wait#module) calls this module repeatedly and prints progress.
  - Changes nothing.
options:
  wait:
    description: Seconds to watch in this call; the call returns earlier when the unit is healthy or failed.
    type: int
    default: 15
  since:
    description:
      - Unix time (node clock) the current start began; the journal is read from there.
      - Default the unit's C(InactiveExitTimestamp).
    type: int
  restarts:
    description: C(NRestarts) seen at the first call of a watch; a higher count means the start failed.
    type: int
  not_invocation:
    description: >-
      C(InvocationID) of the process replaced by a restart; it never counts as healthy, and its journal lines are
      left out of RV(progress), RV(latest) and RV(cause).
    type: str
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
  - vllm_node.vllm_node.read_only.service_watch
notes:
  - Needs C(systemctl) and C(journalctl) on the node, and root to read the unit's journal.
author: vllm-node
"""

EXAMPLES = r"""
- name: Note the unit's invocation and the node time before a restart
  vllm_node.vllm_node.vllm_service_probe:
    unit: vllm
    url: http://127.0.0.1:8000/health
    wait: 0
  register: before

- name: Watch one 15 s step of the start that follows
  vllm_node.vllm_node.vllm_service_probe:
    unit: vllm
    url: http://127.0.0.1:8000/health
    wait: 15
    since: "{{ before.now - 1 }}"
    not_invocation: "{{ before.invocation_id }}"
  register: probe
"""

RETURN = r"""
status:
  description: V(healthy) (active and C(/health) answers 200), V(loading) or V(failed).
  returned: success
  type: str
  sample: loading
now:
  description: The node's clock (unix seconds) when the call returned.
  returned: success
  type: int
  sample: 1764600123
since:
  description: Unix time the watched start began (pass it to the next call).
  returned: success
  type: int
  sample: 1764600000
restarts:
  description: C(NRestarts) the watch compares with (pass it to the next call).
  returned: success
  type: int
  sample: 0
elapsed:
  description: Seconds from O(since) to RV(now).
  returned: success
  type: int
  sample: 123
active_state:
  description: The unit's C(ActiveState).
  returned: success
  type: str
  sample: activating
sub_state:
  description: The unit's C(SubState).
  returned: success
  type: str
  sample: start-post
main_pid:
  description: The unit's C(MainPID) (0 when none).
  returned: success
  type: int
  sample: 4242
invocation_id:
  description: The unit's current C(InvocationID) (empty when it never ran).
  returned: success
  type: str
  sample: 0d6c3b1b2f6a4a58a5b2f4f0c2b1e9aa
progress:
  description: The last journal lines that tell how far loading has come (at most 4, shortened).
  returned: success
  type: list
  elements: str
  sample: ["Loading safetensors checkpoint shards: 100% Completed | 1/1"]
latest:
  description: The last journal line since O(since) (shortened).
  returned: success
  type: str
ended:
  description:
    - How the unit ended when it is inactive or failed (its C(Result), how its main process exited or which signal
      killed it), e.g. C(result success, main process killed by signal 15); empty otherwise.
  returned: success
  type: str
cause:
  description: Root-cause lines (distinct exceptions, then systemd's verdict) when RV(status) is V(failed).
  returned: success
  type: list
  elements: str
kv_cache_error:
  description: vLLM's KV-cache start-up error as numbers, else null.
  returned: success
  type: dict
  contains:
    requested_max_model_len:
      description: The context vLLM was asked to hold.
      type: int
    estimated_max_model_len:
      description: The context vLLM says fits.
      type: int
fix:
  description: The concrete fix for RV(kv_cache_error), else empty.
  returned: success
  type: str
processes:
  description:
    - While the unit is not healthy, its processes (MainPID and its descendants, read from C(/proc)), so a start
      that takes long shows whether it is stuck (sleeping, CPU time not growing) or starved (running, CPU time
      growing slowly); empty when healthy or when there is no MainPID.
  returned: success
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
    name:
      description: The process name (vLLM names its engine core and workers, e.g. C(VLLM::EngineCore)).
      type: str
    state:
      description: The kernel's state letter (R running, S sleeping, D waiting on I/O, Z zombie).
      type: str
    cpu_seconds:
      description: CPU time used so far (user + system).
      type: float
    wchan:
      description: The kernel function a sleeping process waits in, when the kernel shows it.
      type: str
    cpus:
      description: The CPUs the process may run on (C(Cpus_allowed_list)).
      type: str
processes_summary:
  description: RV(processes) as one line, e.g. C(VLLM::Worker 812 running, 301.2 CPU-s, CPUs 0); empty when none.
  returned: success
  type: str
phases:
  description:
    - The start so far in parts from vLLM's own log (module_utils/startup_phases.py), C(parts) (each C(name),
      C(seconds), C(vllm_seconds), C(status) ran / not run / unknown), C(total_seconds), C(compile_cache),
      C(summary); a part the log has not reached yet is unknown.
  returned: success
  type: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import proc_tree, startup_phases, systemd, vllm_log

PROPERTIES = (
    "ActiveState", "SubState", "MainPID", "NRestarts", "Result", "InactiveExitTimestamp",
    "ActiveEnterTimestamp", "LoadState", "InvocationID", "ExecMainCode", "ExecMainStatus",
)
# systemd's ExecMainCode: how the main process ended (CLD_* of waitid(2)).
EXIT_CODES = {"1": "exited", "2": "killed", "3": "dumped"}
POLL_SECONDS = 2


def classify(state: dict, job_pending: bool, restarts: int, not_invocation: str | None) -> str:
    """healthy / failed / loading from `systemctl show` properties (health URL checked separately).

    A queued or running start job (ExecStartPost waits for /health) means loading; "auto-restart" or a higher
    NRestarts means the start failed even though systemd will try again; the replaced process never counts.
    """
    active, sub = state.get("ActiveState"), state.get("SubState")
    if sub == "auto-restart" or int(state.get("NRestarts") or 0) > restarts:
        return "failed"
    if job_pending:
        return "loading"
    if active == "active" and sub == "running":
        if not_invocation and state.get("InvocationID") == not_invocation:
            return "loading"
        return "healthy"
    if active in ("failed", "inactive"):
        return "failed"
    return "loading"


def main_process_end(state: dict) -> str:
    """How the unit ended, from `systemctl show` (Result, ExecMainCode, ExecMainStatus), e.g.
    "result success, main process killed by signal 15"; empty while the unit is neither inactive nor failed.

    Said when the journal holds no error: a clean stop or a signal from outside leaves none."""
    if state.get("ActiveState") not in ("inactive", "failed"):
        return ""
    code, status = EXIT_CODES.get(str(state.get("ExecMainCode") or "")), str(state.get("ExecMainStatus") or "")
    if code == "exited":
        how = f"main process exited with status {status}"
    elif code in ("killed", "dumped"):
        how = f"main process {code} by signal {status}"
    else:
        how = "main process never started"
    return f"result {state.get('Result') or 'unknown'}, {how}"


def healthy(url: str) -> bool:
    """True when GET url answers 200 (any error, refusal or timeout is "not yet")."""
    try:
        with open_url(url, method="GET", timeout=5, validate_certs=False) as response:
            return response.status == 200
    except Exception:  # pylint: disable=broad-except  # HTTPError, URLError, socket errors alike mean "not yet"
        return False


def main() -> None:
    """Watch the unit for at most `wait` seconds and report."""
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "wait": {"type": "int", "default": 15},
            "since": {"type": "int"},
            "restarts": {"type": "int"},
            "not_invocation": {"type": "str"},
        },
        supports_check_mode=True,
    )
    unit = module.params["unit"]

    def show() -> dict:
        try:
            return systemd.show(module.run_command, unit, PROPERTIES)
        except RuntimeError as exc:
            module.fail_json(msg=str(exc))
            raise  # not reached: fail_json exits

    def pending_job() -> bool:
        rc, out, _err = module.run_command(["systemctl", "list-jobs", "--no-legend", unit])
        return rc == 0 and unit in out

    state = show()
    since = module.params["since"]
    if since is None:
        since = systemd.unix_time(state.get("InactiveExitTimestamp")) or int(time.time())
    restarts = module.params["restarts"]
    if restarts is None:
        restarts = int(state.get("NRestarts") or 0)

    deadline = time.monotonic() + max(module.params["wait"], 0)
    while True:
        state = show()
        status = classify(state, pending_job(), restarts, module.params["not_invocation"])
        if status == "healthy" and not healthy(module.params["url"]):
            status = "loading"
        if status != "loading" or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)

    def journal() -> tuple[int, str, list[str]]:
        # JSON, so the replaced invocation's lines (the killed process's last words) are left out of the cause
        rc, out, _err = module.run_command(
            ["journalctl", "-u", unit, "--since", f"@{since}", "-o", "json", "--no-pager", "-n", "5000",
             "--output-fields", "MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID"]
        )
        messages = vllm_log.journal_messages(out.splitlines(), module.params["not_invocation"]) if rc == 0 else []
        return rc, out, vllm_log.strip_colors(messages)

    rc, out, lines = journal()
    if status == "failed" and not vllm_log.root_cause(lines):
        # journald writes asynchronously: on a busy node the last words of a process that just ended come late
        time.sleep(POLL_SECONDS)
        rc, out, lines = journal()
    now = int(time.time())
    result = {
        "changed": False,
        "status": status,
        "now": now,
        "since": since,
        "restarts": restarts,
        "elapsed": now - since,
        "active_state": state.get("ActiveState"),
        "sub_state": state.get("SubState"),
        "main_pid": int(state.get("MainPID") or 0),
        "invocation_id": state.get("InvocationID") or "",
        "ended": main_process_end(state),
        "progress": vllm_log.progress_lines(lines),
        "latest": vllm_log.shorten(lines[-1]) if lines else "",
        "cause": [],
        "kv_cache_error": None,
        "fix": "",
        "processes": proc_tree.service_processes(int(state.get("MainPID") or 0)) if status != "healthy" else [],
    }
    result["processes_summary"] = "; ".join(proc_tree.describe(process) for process in result["processes"])
    entries = startup_phases.journal_entries(out.splitlines(), module.params["not_invocation"]) if rc == 0 else []
    healthy_at = systemd.unix_time(state.get("ActiveEnterTimestamp")) if status == "healthy" else None
    result["phases"] = startup_phases.startup_phases(entries, since, healthy_at)
    if status == "failed":
        result["cause"] = vllm_log.root_cause(lines)
        error = vllm_log.kv_cache_error(lines)
        if error:
            result["kv_cache_error"] = error
            result["fix"] = vllm_log.kv_fix(error)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
