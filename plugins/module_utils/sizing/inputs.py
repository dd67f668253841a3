"""The plan's inputs as one value object, and the device they describe."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .errors import SizingError, refuse_unknown_keywords
from .units import GiB, MiB, is_auto, to_int
from .versions import Releases, releases_data, version_tuple


@dataclass(frozen=True)
class PlanInputs:
    """Everything vllm_memory_plan takes (its keyword arguments; see plugins/filter/vllm_memory_plan.yml)."""

    config: dict[str, Any]                 # config.json as shipped (text_config nesting kept)
    releases: Releases                     # vllm_node_vllm_releases
    checkpoint_bytes: Any = None
    gpu: dict[str, Any] | None = None      # a GPU catalog entry; the explicit values below win over it
    gpu_memory_bytes: Any = None
    compute_capability: Any = None
    gpu_count: Any = 1
    device: str | None = None              # cuda | cpu (default: from gpu.kind / vllm_variant)
    cpu_kv_cache_space_gib: Any = None
    vllm_version: str = "0.33.0"
    vllm_variant: str | None = None
    quant: dict[str, Any] | None = None
    tensor_parallel_size: Any = "auto"
    pipeline_parallel_size: Any = 1
    decode_context_parallel_size: Any = "auto"
    kv_cache_dtype: Any = "auto"
    gpu_memory_utilization: Any = "auto"
    max_model_len: Any = "auto"
    block_size: Any = None
    max_num_batched_tokens: Any = None
    max_num_seqs: Any = None
    mamba_cache_mode: Any = None
    speculative_config: dict[str, Any] | None = None   # vLLM's --speculative-config as a dict (speculative.py)
    cpu_amx: bool = False                  # cpu device: the CPU has AMX tiles (x86 flag amx_tile)
    enable_lora: bool = False              # --enable-lora (adapter slots enter the budget)
    max_loras: Any = None                  # --max-loras (vLLM default 1)
    max_lora_rank: Any = None              # --max-lora-rank (vLLM default 16)
    pp_layer_partition: Any = None
    node_count: Any = 1                    # nodes one replica spans (gpu_count is per node); PP across them
    load_mib_per_second: Any = None        # weights one GPU loads per second (start-up budget); None: 138
    enforce_eager: bool = False
    model_key: str = ""
    repo: str = ""
    served_model_name: str = ""
    gpu_key: str = ""
    gpu_name: str = ""

    @classmethod
    def from_kwargs(cls, config: dict[str, Any], **kwargs: Any) -> PlanInputs:
        """Inputs from the filter's keyword arguments; unknown names and a non-version are refused."""
        known = {f.name for f in fields(cls)} - {"config"}
        refuse_unknown_keywords(kwargs, known)
        values = dict(kwargs, releases=releases_data(kwargs.get("releases")))
        values["vllm_version"] = str(kwargs.get("vllm_version") or "0.33.0")
        version_tuple(values["vllm_version"])
        return cls(config=config, **values)


@dataclass(frozen=True)
class Device:
    """What the plan runs on: cuda GPUs (memory per GPU) or the cpu backend (its fixed KV space)."""

    kind: str                  # cuda | cpu
    variant: str               # the vLLM build: cuda | cpu
    gpu_name: str
    compute_capability: Any
    total: int                 # bytes per GPU; on cpu the KV space (VLLM_CPU_KVCACHE_SPACE)
    count: int


def _cuda_memory(gpu: dict[str, Any], gpu_memory_bytes: Any) -> int:
    if gpu_memory_bytes in (None, "", "auto"):
        if gpu.get("memory_mib") is None:
            raise SizingError("the GPU's total memory is unknown: pass gpu_memory_bytes (nvidia-smi MiB * 2**20) "
                              "or a GPU catalog entry with memory_mib")
        gpu_memory_bytes = int(gpu["memory_mib"]) * MiB
    total = to_int("gpu_memory_bytes", gpu_memory_bytes)
    if total <= 0:
        raise SizingError("gpu_memory_bytes must be > 0")
    return total


def _cpu_kv_space(gpu: dict[str, Any], cpu_kv_cache_space_gib: Any) -> int:
    space = cpu_kv_cache_space_gib if cpu_kv_cache_space_gib is not None else gpu.get("kv_cache_space_gib")
    if space is None:
        raise SizingError("device cpu needs cpu_kv_cache_space_gib (VLLM_CPU_KVCACHE_SPACE, whole GiB)")
    space_gib = to_int("cpu_kv_cache_space_gib", space)
    if space_gib < 1:
        raise SizingError("cpu_kv_cache_space_gib must be >= 1 (vLLM reads VLLM_CPU_KVCACHE_SPACE as whole GiB)")
    return space_gib * GiB


def resolve_device(inputs: PlanInputs) -> Device:
    """The device, its memory and the GPU count, from the knobs and the GPU catalog entry."""
    gpu = dict(inputs.gpu or {})
    kind = inputs.device
    if kind is None:
        kind = "cpu" if gpu.get("kind") == "cpu" or inputs.vllm_variant == "cpu" else "cuda"
    if kind not in ("cuda", "cpu"):
        raise SizingError(f"device {kind!r} is not supported; choose cuda or cpu")
    variant = inputs.vllm_variant or ("cpu" if kind == "cpu" else "cuda")
    cc = inputs.compute_capability if inputs.compute_capability not in (None, "") else gpu.get("compute_capability")
    total = _cuda_memory(gpu, inputs.gpu_memory_bytes) if kind == "cuda" \
        else _cpu_kv_space(gpu, inputs.cpu_kv_cache_space_gib)
    if is_auto(inputs.gpu_count):
        raise SizingError("gpu_count must be a number here (the preflight role resolves 'auto' from the node's GPUs)")
    count = to_int("gpu_count", inputs.gpu_count)
    if count < 1:
        raise SizingError("gpu_count must be >= 1")
    return Device(kind, variant, inputs.gpu_name or str(gpu.get("name") or ""), cc, total, count)
