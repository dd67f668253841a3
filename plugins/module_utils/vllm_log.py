"""What vLLM's journal lines say: loading progress, the root cause of a failed start, its startup numbers.

Pure functions over lists of lines (no I/O), shared by vllm_service_probe and inference_check_measure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

# Lines worth showing while vLLM loads (shard loading, memory, KV cache, compile, readiness).
PROGRESS_RE = re.compile(
    r"Loading (safetensors )?checkpoint shards|Loading weights took|Model loading took|"
    r"Available KV cache memory|KV cache size|Maximum concurrency|torch\.compile takes|"
    r"Compiling a graph|Capturing CUDA graph|Graph capturing finished|init engine|Initializing a V1 LLM engine|"
    r"Starting vLLM API server|Application startup complete|Started vllm|Starting vllm"
)
EXCEPTION_RE = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
# argparse refusing the command line (an unknown or malformed flag): `<prog>: error: unrecognized arguments: --x`,
# printed once before the process exits with status 2; no exception names it.
ARGPARSE_RE = re.compile(r": error: (?:unrecognized arguments|argument |invalid choice|the following arguments).*$")
SYSTEMD_FAIL_RE = re.compile(
    r"Main process exited|Failed with result|Control process exited|Start-post operation timed out"
)
# Warnings that merely mention an exception name (e.g. the fd-limit hint naming OSError) are not causes.
NOISE_RE = re.compile(r"\b(WARNING|INFO|DEBUG)\b")
MAX_SEQ_RE = re.compile(r"max seq len \((\d+)\)")
ESTIMATED_RE = re.compile(r"estimated maximum model length is (\d+)")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")

KV_TOKENS_RE = re.compile(r"\b(GPU|CPU) KV cache size: ([\d,]+) tokens")
CONCURRENCY_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
AVAILABLE_RE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
CPU_SPACE_RE = re.compile(r"Explicitly set \(([\d.]+)/([\d.]+)\) GiB for KV cache")
MODEL_LOADING_RE = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds")
WEIGHTS_RE = re.compile(r"Loading weights took ([\d.]+) seconds")
GIB = 1024 ** 3


def strip_colors(lines: Iterable[str]) -> list[str]:
    """Journal lines without ANSI colour codes (vLLM colours its log prefix on some terminals)."""
    return [ANSI_RE.sub("", line) for line in lines]


def journal_records(json_lines: Iterable[str],
                    exclude_invocation: str | None = None) -> list[tuple[dict[str, Any], str]]:
    """(entry, message) of each `journalctl -o json` line, without those of one invocation of the unit.

    A restarted unit's journal holds the stopped process's last words too (an EngineDeadError when it was killed);
    they are not the new start's cause. Its processes' entries carry `_SYSTEMD_INVOCATION_ID`, systemd's own lines
    about the unit `INVOCATION_ID`. A message journald stored as bytes (not UTF-8) comes as a list of ints; a line that
    is not a JSON object, or has no message, is skipped.
    """
    records = []
    for line in json_lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        invocations = (entry.get("_SYSTEMD_INVOCATION_ID"), entry.get("INVOCATION_ID"))
        if exclude_invocation and exclude_invocation in invocations:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):
            message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
        if isinstance(message, str):
            records.append((entry, message))
    return records


def journal_messages(json_lines: Iterable[str], exclude_invocation: str | None = None) -> list[str]:
    """The messages of `journalctl -o json` output, without those of one invocation of the unit (journal_records)."""
    return [message for _entry, message in journal_records(json_lines, exclude_invocation)]


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
        match = None if NOISE_RE.search(line) else (EXCEPTION_RE.search(line) or ARGPARSE_RE.search(line))
        if match and match.group(0) not in seen:
            seen.add(match.group(0))
            causes.append(shorten(line, 600))
        if len(causes) >= limit:
            break
    causes.reverse()
    verdict = [line.strip() for line in lines if SYSTEMD_FAIL_RE.search(line)][-2:]
    return causes + verdict


def kv_cache_error(lines: list[str]) -> dict | None:
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


def _num(text: str) -> float:
    """'2,097,152' -> 2097152.0"""
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
