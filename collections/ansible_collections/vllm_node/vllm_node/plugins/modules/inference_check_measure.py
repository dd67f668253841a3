#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: time a streamed chat completion and read vLLM's startup numbers from the journal."""

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_check_measure
short_description: Time to first token, tokens/s and vLLM's logged startup numbers (read-only)
description:
  - Sends one streamed chat completion to an OpenAI-compatible endpoint and measures the time to the
    first token and the decode rate from the usage vLLM reports.
  - Reads the journal of the unit's current invocation and extracts the numbers vLLM logged while
    starting (KV cache memory and tokens, model loading), and the time from start to healthy.
options:
  url: {description: base URL, e.g. http://127.0.0.1:8000, type: str, required: true}
  api_key: {description: bearer key, type: str, no_log: true}
  model: {description: served model name, type: str, required: true}
  prompt: {description: user message, type: str, default: Say hello.}
  max_tokens: {description: tokens to generate, type: int, default: 64}
  unit: {description: systemd unit whose journal is read, type: str, default: vllm}
  timeout: {description: request timeout in seconds, type: int, default: 300}
  plan: {description: the vllm_node_plan to compare with, type: dict, default: {}}
author: vllm-node
"""

import json
import re
import time
import urllib.error
import urllib.request
from typing import Iterable, Optional

from ansible.module_utils.basic import AnsibleModule

KV_TOKENS_RE = re.compile(r"\b(GPU|CPU) KV cache size: ([\d,]+) tokens")
CONCURRENCY_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
AVAILABLE_RE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
CPU_SPACE_RE = re.compile(r"Explicitly set \(([\d.]+)/([\d.]+)\) GiB for KV cache")
MODEL_LOADING_RE = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
WEIGHTS_RE = re.compile(r"Loading weights took ([\d.]+) seconds")
GIB = 1024 ** 3


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def parse_startup(lines: Iterable[str]) -> dict:
    """vLLM's own startup numbers from its log lines (every rank's value kept where ranks differ)."""
    out: dict = {
        "kv_cache_tokens": None, "kv_cache_device": None, "max_concurrency": None, "concurrency_tokens": None,
        "available_kv_cache_bytes": [], "model_loading_bytes": [], "model_loading_seconds": [],
        "weights_loading_seconds": [],
    }
    for line in lines:
        match = KV_TOKENS_RE.search(line)
        if match:
            out["kv_cache_device"] = match.group(1).lower()
            out["kv_cache_tokens"] = int(_num(match.group(2)))
        match = CONCURRENCY_RE.search(line)
        if match:
            out["concurrency_tokens"] = int(_num(match.group(1)))
            out["max_concurrency"] = float(match.group(2))
        match = AVAILABLE_RE.search(line) or CPU_SPACE_RE.search(line)
        if match:
            out["available_kv_cache_bytes"].append(int(float(match.group(1)) * GIB))
        match = MODEL_LOADING_RE.search(line)
        if match:
            out["model_loading_bytes"].append(int(float(match.group(1)) * GIB))
            out["model_loading_seconds"].append(float(match.group(2)))
        match = WEIGHTS_RE.search(line)
        if match:
            out["weights_loading_seconds"].append(float(match.group(1)))
    return out


def relative_difference(actual: Optional[float], planned: Optional[float]) -> Optional[float]:
    """(actual - planned) / planned, or None when either side is unknown or the plan is zero."""
    if actual is None or planned in (None, 0):
        return None
    return (actual - planned) / planned


def compare_with_plan(startup: dict, plan: dict) -> dict:
    """Plan vs what vLLM reported: KV tokens, KV bytes (smallest rank), weights per GPU."""
    kv = plan.get("kv") or {}
    per_gpu = plan.get("per_gpu") or {}
    available = min(startup["available_kv_cache_bytes"]) if startup["available_kv_cache_bytes"] else None
    weights = max(startup["model_loading_bytes"]) if startup["model_loading_bytes"] else None
    rows = {
        "kv_cache_tokens": (startup["kv_cache_tokens"], kv.get("tokens")),
        "kv_cache_bytes": (available, kv.get("available_bytes") or per_gpu.get("kv_cache_bytes")),
        "weights_bytes_per_gpu": (weights, per_gpu.get("weights_bytes")),
        "max_concurrency": (startup["max_concurrency"], kv.get("max_concurrency")),
    }
    return {
        name: {"actual": actual, "planned": planned, "relative_difference": relative_difference(actual, planned)}
        for name, (actual, planned) in rows.items()
    }


def sse_events(response) -> Iterable[dict]:
    """Decoded `data:` events of a server-sent-event stream, until [DONE]."""
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def stream_completion(url: str, key: Optional[str], model: str, prompt: str, max_tokens: int, timeout: int) -> dict:
    """One streamed chat completion: time to first token, decode tokens/s, the text."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Random-weight test models may emit EOS at once; a fixed length keeps the rate meaningful.
        "ignore_eos": True,
    }
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)
    start = time.monotonic()
    first = None
    text, reasoning, usage = [], [], {}
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for event in sse_events(response):
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                if (piece or thought) and first is None:
                    first = time.monotonic()
                text.append(piece)
                reasoning.append(thought)
            if event.get("usage"):
                usage = event["usage"]
    end = time.monotonic()
    tokens = int(usage.get("completion_tokens") or 0)
    decode_seconds = end - first if first is not None else None
    return {
        "time_to_first_token_s": round(first - start, 4) if first is not None else None,
        "total_s": round(end - start, 4),
        "completion_tokens": tokens,
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        # tokens after the first one, over the time after the first one
        "tokens_per_second": round((tokens - 1) / decode_seconds, 2) if decode_seconds and tokens > 1 else None,
        "text": "".join(text),
        "reasoning": "".join(reasoning),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "model": {"type": "str", "required": True},
            "prompt": {"type": "str", "default": "Say hello."},
            "max_tokens": {"type": "int", "default": 64},
            "unit": {"type": "str", "default": "vllm"},
            "timeout": {"type": "int", "default": 300},
            "plan": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    rc, out, err = module.run_command(
        ["systemctl", "show", p["unit"], "--timestamp=unix", "-p",
         "InvocationID,InactiveExitTimestamp,ActiveEnterTimestamp,MainPID,NRestarts"]
    )
    state = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    started = state.get("InactiveExitTimestamp", "").lstrip("@")
    active = state.get("ActiveEnterTimestamp", "").lstrip("@")
    lines: list[str] = []
    if state.get("InvocationID"):
        rc, out, err = module.run_command(
            ["journalctl", f"_SYSTEMD_INVOCATION_ID={state['InvocationID']}", "-o", "cat", "--no-pager"]
        )
        lines = out.splitlines() if rc == 0 else []
    startup = parse_startup(lines)
    try:
        stream = stream_completion(p["url"], p["api_key"], p["model"], p["prompt"], p["max_tokens"], p["timeout"])
    except (urllib.error.URLError, OSError, ValueError) as exc:
        module.fail_json(msg=f"streamed chat completion failed: {exc}", startup=startup)
    module.exit_json(
        changed=False,
        stream=stream,
        startup=startup,
        plan_vs_actual=compare_with_plan(startup, p["plan"]),
        unit={
            "main_pid": int(state.get("MainPID") or 0),
            "restarts": int(state.get("NRestarts") or 0),
            "invocation_id": state.get("InvocationID"),
            "started_at": int(started) if started.isdigit() else None,
            "healthy_at": int(active) if active.isdigit() else None,
            "seconds_to_healthy": int(active) - int(started) if started.isdigit() and active.isdigit() else None,
        },
    )


if __name__ == "__main__":
    main()
