"""LoRA adapters (--enable-lora, --max-loras, --max-lora-rank): the adapter slots vLLM keeps on every GPU.

vLLM preallocates, for each of max_loras slots, the A and B matrices of every LoRA-wrapped linear layer at
max_lora_rank, in the model dtype (lora/layers: column-parallel layers keep A whole and shard B over TP,
row-parallel layers shard A and keep B whole). Estimated for the dense attention and MLP projections
(qkv, o, gate_up, down) of each pipeline stage's layers; MoE expert adapters and the embeddings are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import SizingError
from .model import ModelShape, kv_bytes, text_config
from .units import to_int

# vLLM's LoRAConfig.max_lora_rank choices.
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoRA:
    """The plan's LoRA settings."""

    max_loras: int
    max_lora_rank: int

    def args(self) -> list[str]:
        """The vLLM flags that run them."""
        return ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank)]


def resolve(enable_lora: Any, max_loras: Any, max_lora_rank: Any) -> LoRA | None:
    """Validated LoRA settings (None when LoRA is off); vLLM's defaults are 1 slot of rank 16."""
    if not enable_lora:
        return None
    loras = to_int("max_loras", 1 if max_loras in (None, "") else max_loras)
    rank = to_int("max_lora_rank", 16 if max_lora_rank in (None, "") else max_lora_rank)
    if loras < 1:
        raise SizingError("max_loras must be >= 1")
    if rank not in RANKS:
        raise SizingError(f"max_lora_rank {rank} is not one vLLM accepts; choose one of {', '.join(map(str, RANKS))}")
    return LoRA(loras, rank)


def slot_bytes_per_gpu(config: dict[str, Any], shape: ModelShape, lora: LoRA, tp: int, layers: int) -> int:
    """Bytes of all adapter slots on one GPU for `layers` decoder layers at tensor parallel size tp."""
    tc = text_config(config)
    hidden = shape.hidden_size or int(tc.get("hidden_size") or 0)
    if not hidden:
        raise SizingError("LoRA sizing needs hidden_size in config.json")
    inter = int(tc.get("intermediate_size") or 4 * hidden)
    heads = shape.num_heads * (shape.head_dim if not shape.mla else int(tc.get("v_head_dim") or shape.head_dim))
    kv = 0 if shape.mla else shape.num_kv_heads * shape.head_dim
    r = lora.max_lora_rank
    per_layer = (3 * r * hidden + (heads + 2 * kv) * r // tp     # qkv: A whole (3 slices), B sharded
                 + r * heads // tp + hidden * r                # o: A sharded, B whole
                 + 2 * r * hidden + 2 * inter * r // tp        # gate_up: A whole (2 slices), B sharded
                 + r * inter // tp + hidden * r)               # down: A sharded, B whole
    return lora.max_loras * layers * per_layer * kv_bytes(shape.dtype)
