#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: watch a starting vLLM unit for a while; report health, progress and the root cause."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_service_probe
short_description: Watch a vLLM systemd unit start (read-only)
description:
  - Polls the unit state and the /health URL for at most O(wait) seconds, then returns the status
    (C(healthy), C(loading) or C(failed)), the recent progress lines of the journal and, on failure,
    the root-cause lines (for vLLM's KV-cache ValueError also the estimated maximum model length).
  - Changes nothing; safe in check mode.
options:
  unit: {description: systemd unit name, type: str, required: true}
  url: {description: health URL, type: str, required: true}
  wait: {description: seconds to watch in this call, type: int, default: 15}
  since: {description: unix time the current start began (from a previous call); default the unit's InactiveExitTimestamp, type: int}
  restarts: {description: NRestarts seen at the first call; a higher count means the start failed, type: int}
  not_invocation: {description: InvocationID of the process replaced by a restart; it never counts as healthy, type: str}
author: vllm-node
"""

import re
import subprocess
import time
import urllib.error
import urllib.request
from typing import Optional

from ansible.module_utils.basic import AnsibleModule

# Lines worth showing while vLLM loads (shard loading, memory, KV cache, compile, readiness).
PROGRESS_RE = re.compile(
    r"Loading (safetensors )?checkpoint shards|Loading weights took|Model loading took|"
    r"Available KV cache memory|KV cache size|Maximum concurrency|torch\.compile takes|"
    r"Compiling a graph|Capturing CUDA graph|Graph capturing finished|init engine|Initializing a V1 LLM engine|"
    r"Starting vLLM API server|Application startup complete|Started vllm|Starting vllm"
)
EXCEPTION_RE = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
SYSTEMD_FAIL_RE = re.compile(r"Main process exited|Failed with result|Control process exited|Start-post operation timed out")
# Warnings that merely mention an exception name (e.g. the fd-limit hint naming OSError) are not causes.
NOISE_RE = re.compile(r"\b(WARNING|INFO|DEBUG)\b")
MAX_SEQ_RE = re.compile(r"max seq len \((\d+)\)")
ESTIMATED_RE = re.compile(r"estimated maximum model length is (\d+)")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def parse_show(text: str) -> dict:
    """Parse `systemctl show` KEY=VALUE output into a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def shorten(line: str, width: int = 180) -> str:
    """One journal line, cut to `width` characters (vLLM's config dump is kilobytes long)."""
    line = line.strip()
    return line if len(line) <= width else line[: width - 3] + "..."


def progress_lines(lines: list[str], limit: int = 4) -> list[str]:
    """The last `limit` journal lines that tell how far the start has come."""
    picked = [shorten(line) for line in lines if PROGRESS_RE.search(line)]
    return picked[-limit:]


def root_cause(lines: list[str], limit: int = 6) -> list[str]:
    """The lines that explain a failed start: the last distinct exception messages plus systemd's verdict.

    vLLM prints the same exception from several processes (EngineCore, APIServer); keep each message once.
    """
    seen: set[str] = set()
    causes: list[str] = []
    for line in reversed(lines):
        match = None if NOISE_RE.search(line) else EXCEPTION_RE.search(line)
        if match and match.group(0) not in seen:
            seen.add(match.group(0))
            causes.append(shorten(line, 600))
        if len(causes) >= limit:
            break
    causes.reverse()
    verdict = [line.strip() for line in lines if SYSTEMD_FAIL_RE.search(line)][-2:]
    return causes + verdict


def kv_cache_error(lines: list[str]) -> Optional[dict]:
    """vLLM's "max seq len ... estimated maximum model length is E" error as numbers, else None."""
    for line in reversed(lines):
        estimated = ESTIMATED_RE.search(line)
        if estimated:
            requested = MAX_SEQ_RE.search(line)
            return {
                "requested_max_model_len": int(requested.group(1)) if requested else None,
                "estimated_max_model_len": int(estimated.group(1)),
            }
    return None


def kv_fix(error: dict) -> str:
    """The concrete fix for a KV-cache startup failure."""
    estimate = error["estimated_max_model_len"]
    return (
        f"vLLM can hold at most {estimate} tokens of context with this memory budget "
        f"(requested {error['requested_max_model_len']}). Set vllm_node_max_model_len: {estimate} or lower "
        "(or 'auto' to let the plan choose), or make room for the KV cache: raise vllm_node_gpu_memory_utilization, "
        "use vllm_node_kv_cache_dtype: fp8_e4m3 where supported, or add GPUs (vllm_node_tensor_parallel_size)."
    )


def classify(state: dict, job_pending: bool, restarts: int, not_invocation: Optional[str]) -> str:
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


def healthy(url: str) -> bool:
    """True when GET url answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main() -> None:
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
        rc, out, err = module.run_command(
            ["systemctl", "show", unit, "--timestamp=unix", "-p",
             "ActiveState,SubState,MainPID,NRestarts,Result,InactiveExitTimestamp,ActiveEnterTimestamp,LoadState,InvocationID"]
        )
        if rc != 0:
            module.fail_json(msg=f"systemctl show {unit} failed: {err}")
        return parse_show(out)

    state = show()
    since = module.params["since"]
    if since is None:
        stamp = state.get("InactiveExitTimestamp", "").lstrip("@")
        since = int(stamp) if stamp.isdigit() else int(time.time())
    restarts = module.params["restarts"]
    if restarts is None:
        restarts = int(state.get("NRestarts") or 0)

    def pending_job() -> bool:
        rc, out, _err = module.run_command(["systemctl", "list-jobs", "--no-legend", unit])
        return rc == 0 and unit in out

    deadline = time.monotonic() + max(module.params["wait"], 0)
    status = "loading"
    while True:
        state = show()
        status = classify(state, pending_job(), restarts, module.params["not_invocation"])
        if status == "healthy" and not healthy(module.params["url"]):
            status = "loading"
        if status != "loading" or time.monotonic() >= deadline:
            break
        time.sleep(2)

    rc, out, _err = module.run_command(
        ["journalctl", "-u", unit, "--since", f"@{since}", "-o", "cat", "--no-pager", "-n", "5000"]
    )
    lines = [ANSI_RE.sub("", line) for line in out.splitlines()] if rc == 0 else []
    result = {
        "changed": False,
        "status": status,
        "since": since,
        "restarts": restarts,
        "elapsed": int(time.time()) - since,
        "active_state": state.get("ActiveState"),
        "sub_state": state.get("SubState"),
        "main_pid": int(state.get("MainPID") or 0),
        "progress": progress_lines(lines),
        "latest": shorten(lines[-1]) if lines else "",
        "cause": [],
        "kv_cache_error": None,
        "fix": "",
    }
    if status == "failed":
        result["cause"] = root_cause(lines)
        error = kv_cache_error(lines)
        if error:
            result["kv_cache_error"] = error
            result["fix"] = kv_fix(error)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
