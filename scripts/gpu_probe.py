#!/usr/bin/env python3
"""The GPU probe's Python half (scripts/gpu-probe.sh runs it): measure with PyTorch what the plan assumes per GPU, and
write the one JSON report, plan vs measured. Stdlib only (torch is imported when present).

  gpu_probe.py measure OUT_DIR   -> OUT_DIR/measured.json (null fields and the reason without CUDA)
  gpu_probe.py report OUT_DIR    -> OUT_DIR/gpu-probe-report.json from facts/health/plan/assumptions/measured.json

Measured on GPU 0 in a fresh process, the way vLLM sees a GPU: the CUDA context is the memory the device lost when
torch created its context, less what torch's allocator holds; the non-torch memory is the same difference after a
bf16 matmul (cuBLAS handles and workspaces included); torch's total (cudaMemGetInfo) is what vLLM budgets from.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

GiB = 2**30
MiB = 2**20
SCHEMA = "vllm-node/gpu-probe/1"
# The stand-in nvidia-smi of tests/fixtures/gpu_node says what it is in its help text.
SIMULATED_MARK = "fake for vllm-node tests"
MEASURED_FIELDS = ("torch_total_bytes", "free_after_init_bytes", "cuda_context_bytes", "non_torch_bytes",
                   "non_torch_growth_bytes")


def run(argv: list[str]) -> tuple[int, str]:
    """A command's exit status and stdout (127 when it is missing)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 127, str(err)
    return proc.returncode, proc.stdout


def simulated(help_text: str) -> str | None:
    """Why this host's GPUs are simulated (the stand-in nvidia-smi answered), None on a real driver."""
    if SIMULATED_MARK in help_text:
        return "nvidia-smi is the stand-in of tests/fixtures/gpu_node (no real GPU, no CUDA)"
    return None


def used_bytes_smi(answer: str) -> int | None:
    """GPU 0's memory.used in bytes from `nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits`."""
    try:
        return int(float(answer.splitlines()[0].strip()) * MiB)
    except (IndexError, ValueError):
        return None


def null_measurement(reason: str) -> dict[str, Any]:
    """Every measured field null, with the reason."""
    return {**dict.fromkeys(MEASURED_FIELDS), "reason": reason}


def measure(torch: Any, used_before: int | None) -> dict[str, Any]:
    """The measurement on GPU 0 with an imported torch (see the module docstring); `used_before`: nvidia-smi's
    memory.used before this process touched the GPU (other processes, the driver's own)."""
    if not torch.cuda.is_available():
        return null_measurement("torch.cuda.is_available() is False (no CUDA device or driver)")
    torch.cuda.init()
    torch.empty(1, device="cuda:0")
    torch.cuda.synchronize(0)
    free1, total = torch.cuda.mem_get_info(0)
    reserved1 = torch.cuda.memory_reserved(0)
    a = torch.randn(4096, 4096, device="cuda:0", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize(0)
    free2, _ = torch.cuda.mem_get_info(0)
    reserved2 = torch.cuda.memory_reserved(0)
    base = used_before or 0
    context = total - free1 - reserved1 - base
    non_torch = total - free2 - reserved2 - base
    return {"torch_total_bytes": int(total), "free_after_init_bytes": int(free1), "cuda_context_bytes": int(context),
            "non_torch_bytes": int(non_torch), "non_torch_growth_bytes": int(non_torch - context),
            "used_before_bytes": used_before, "device_name": torch.cuda.get_device_name(0),
            "torch_version": str(torch.__version__), "cuda_version": str(torch.version.cuda), "reason": None}


def measure_host(importer: Callable[[str], Any] = __import__) -> dict[str, Any]:
    """measure() on this host, or null fields with the reason (simulated GPUs, no torch)."""
    _, help_text = run(["nvidia-smi", "-h"])
    why = simulated(help_text)
    if why:
        return null_measurement(f"simulated: {why}")
    rc, answer = run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"])
    used = used_bytes_smi(answer) if rc == 0 else None
    try:
        torch = importer("torch")
    except ImportError as err:
        return null_measurement(f"PyTorch is not importable: {err}")
    return measure(torch, used)


def _gib(value: Any) -> int | None:
    return int(round(float(value) * GiB)) if value is not None else None


def compare(plan_value: int | None, measured_value: int | None) -> dict[str, Any]:
    """One plan-vs-measured line: both values and measured - plan (null when either is unknown)."""
    diff = measured_value - plan_value if plan_value is not None and measured_value is not None else None
    return {"plan_bytes": plan_value, "measured_bytes": measured_value, "measured_minus_plan_bytes": diff}


def report(facts: Mapping[str, Any], health: Mapping[str, Any], plan: Mapping[str, Any] | None,
           assumptions: Mapping[str, Any], measured: Mapping[str, Any], simulated_reason: str | None,
           seconds: float, now: str) -> dict[str, Any]:
    """The report (its fields are described in the README, "GPU probe")."""
    gpus = list(facts.get("gpus") or [])
    first = gpus[0] if gpus else {}
    per_gpu = (plan or {}).get("per_gpu") or {}
    planned = {"torch_total_bytes": _gib(assumptions.get("torch_memory_gib")),
               "cuda_context_bytes": _gib(assumptions.get("cuda_context_gib")),
               "non_torch_growth_bytes": _gib(assumptions.get("non_torch_growth_gib"))}
    return {
        "schema": SCHEMA, "generated_at": now, "duration_s": round(seconds, 1),
        "simulated": simulated_reason is not None, "simulated_reason": simulated_reason,
        "host": {"python": facts.get("python"), "ansible_core": facts.get("ansible_core"), "os": facts.get("os"),
                 "driver_version": facts.get("driver_version")},
        "gpu": {"count": len(gpus), "name": first.get("name"), "pci_device_id": first.get("pci_device_id"),
                "memory_total_mib": first.get("memory_total_mib"), "detected_by": facts.get("gpu_source"),
                "catalog_key": assumptions.get("gpu")},
        "health": {"verdict": health.get("verdict"), "summary": health.get("summary") or []},
        "plan": {"model": assumptions.get("model"), "fits": (plan or {}).get("fits"),
                 "error": assumptions.get("plan_error"), "per_gpu": per_gpu, **planned},
        "measured": dict(measured),
        "compare": {name: compare(planned[name], measured.get(name)) for name in planned},
    }


def read_json(path: Path) -> Any:
    """A JSON file, None when it is not there."""
    return json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str]) -> int:
    """measure OUT_DIR | report OUT_DIR STARTED_EPOCH."""
    if len(argv) < 2 or argv[0] not in ("measure", "report"):
        sys.stderr.write(__doc__ or "")
        return 2
    out = Path(argv[1])
    if argv[0] == "measure":
        (out / "measured.json").write_text(json.dumps(measure_host(), indent=2) + "\n")
        return 0
    started = float(argv[2]) if len(argv) > 2 else time.time()
    _, help_text = run(["nvidia-smi", "-h"])
    document = report(read_json(out / "facts.json") or {}, read_json(out / "health.json") or {},
                      read_json(out / "plan.json"), read_json(out / "assumptions.json") or {},
                      read_json(out / "measured.json") or null_measurement("not measured"), simulated(help_text),
                      time.time() - started, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (out / "gpu-probe-report.json").write_text(json.dumps(document, indent=2) + "\n")
    sys.stdout.write(json.dumps({k: document[k] for k in ("simulated", "gpu", "compare")}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
