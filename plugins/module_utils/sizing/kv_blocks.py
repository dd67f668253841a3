"""The KV cache pinned to a number of blocks: vLLM's --num-gpu-blocks-override (vllm_node_kv_cache_blocks).

vLLM (v1/core/kv_cache_utils.py, get_kv_cache_configs, 0.32) sets the pool's block count to the override and, so
that the max-model-len auto-fit, the admission check ("X GiB KV cache is needed") and the per-worker allocation
plan against what is really allocated, replaces each worker's available KV memory by override x that worker's bytes
per pool block; a worker without KV layers keeps its own. The plan does the same to each pipeline stage's KV bytes,
and everything after it (num_blocks, tokens, concurrency, the safe length, the length check) follows.

vLLM does not compare the override with the memory it profiled: a larger one allocates past the budget
(--gpu-memory-utilization, VLLM_CPU_KVCACHE_SPACE). The plan refuses it instead, naming the blocks that fit.
"""

from __future__ import annotations

from .errors import SizingError
from .kv_layout import KVLayout
from .units import format_bytes


def pinned_bytes(layout: KVLayout, stage_available: tuple[int, ...], blocks: int) -> tuple[int, ...]:
    """Each stage's KV bytes with the cache pinned: blocks x that stage's bytes per block (a stage without KV layers
    keeps what it had)."""
    return tuple(blocks * layout.bytes_per_block(stage) if layout.bytes_per_block(stage) > 0 else available
                 for stage, available in enumerate(stage_available))


def budget_blocks(layout: KVLayout, stage_available: tuple[int, ...]) -> int:
    """Blocks the memory budget holds: each stage's KV bytes // its bytes per block, the minimum over stages."""
    return max(layout.num_blocks(stage_available), 0)


def blocks_for(layout: KVLayout, max_model_len: int) -> int:
    """The smallest pin that holds one request of max_model_len: its blocks plus the null block the pool keeps."""
    return layout.blocks_per_request(max(max_model_len, 1)) + 1


def pin(layout: KVLayout, stage_available: tuple[int, ...], ceiling: tuple[int, ...], blocks: int,
        budget_text: str, where: str) -> tuple[int, ...]:
    """The stages' KV bytes pinned to `blocks`; SizingError when the most the budget can give (`ceiling`, per stage;
    `budget_text` says what sets it) holds fewer blocks."""
    fit = budget_blocks(layout, ceiling)
    if blocks > fit:
        stage = min(layout.active_stages(), key=lambda s: (layout.stage_blocks(ceiling, s), -s))
        per_block = layout.bytes_per_block(stage)
        raise SizingError(
            f"vllm_node_kv_cache_blocks={blocks:,} is more KV cache than the memory budget holds: {blocks:,} blocks x "
            f"{format_bytes(per_block)} = {format_bytes(blocks * per_block)} {where}, but {budget_text} leaves "
            f"{format_bytes(max(ceiling[stage], 0))} for the KV cache, {fit:,} blocks. Set vllm_node_kv_cache_blocks "
            f"to at most {fit:,}, or leave it null (the cache sized from the memory budget).")
    return pinned_bytes(layout, stage_available, blocks)


def pinned_note(layout: KVLayout, blocks: int, fit: int, where: str) -> str:
    """The plan's note: the cache is pinned, to how much, and what the budget would have held."""
    return (f"KV cache pinned to {blocks:,} blocks of {layout.block_size} tokens (vllm_node_kv_cache_blocks, "
            f"--num-gpu-blocks-override): {format_bytes(blocks * layout.worst_block_bytes())} {where} of the "
            f"{fit:,} blocks the memory budget holds; max-model-len, tokens and concurrency follow the pinned blocks")
