"""The four KV cache questions the filters answer (vllm_kv_cache_bytes, vllm_max_model_len,
vllm_kv_cache_tokens, vllm_max_concurrency), for one request on the most loaded rank."""

from __future__ import annotations

from typing import Any

from .errors import SizingError
from .kv_layout import KVLayout, LayoutInputs, build_layout
from .model import model_shape, require_max_len
from .units import is_auto, to_int
from .versions import rule


def kv_layout(config: dict[str, Any], **kwargs: Any) -> KVLayout:
    """The KV cache layout for config.json and the layout keyword arguments (LayoutInputs; releases required)."""
    shape = model_shape(config)
    return build_layout(config, shape, LayoutInputs.from_kwargs(**kwargs))


def _stage(pp_rank: Any) -> int | None:
    return None if pp_rank is None else to_int("pp_rank", pp_rank)


def kv_cache_bytes(config: dict[str, Any], max_model_len: Any, tensor_parallel_size: Any = 1,
                   pipeline_parallel_size: Any = 1, decode_context_parallel_size: Any = 1,
                   kv_cache_dtype: str = "auto", block_size: Any = None, pp_rank: Any = None,
                   **kwargs: Any) -> int:
    """Bytes of KV cache one request of max_model_len needs on the most loaded rank (or on pp_rank)."""
    layout = kv_layout(config, tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size,
                       decode_context_parallel_size=decode_context_parallel_size,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, **kwargs)
    length = to_int("max_model_len", max_model_len)
    if length < 1:
        raise SizingError("max_model_len must be >= 1")
    return layout.needed_bytes(length, _stage(pp_rank))


def max_model_len(config: dict[str, Any], available_kv_bytes: Any, tensor_parallel_size: Any = 1,
                  pipeline_parallel_size: Any = 1, decode_context_parallel_size: Any = 1,
                  kv_cache_dtype: str = "auto", block_size: Any = None, max_model_len: Any = None,
                  pp_rank: Any = None, **kwargs: Any) -> int:
    """vLLM's "estimated maximum model length" for available_kv_bytes per rank (0: not one token).

    The search runs in [1, max_model_len] (default: the model's own maximum), after holding back the null
    block, like vLLM's auto-fit and its "estimated maximum model length" error text.
    """
    layout = kv_layout(config, tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size,
                       decode_context_parallel_size=decode_context_parallel_size,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, **kwargs)
    upper = require_max_len(model_shape(config)) if is_auto(max_model_len) \
        else to_int("max_model_len", max_model_len)
    return layout.estimate_max_model_len(int(available_kv_bytes), upper, _stage(pp_rank))


def kv_cache_tokens(config: dict[str, Any], available_kv_bytes: Any, max_model_len: Any,
                    tensor_parallel_size: Any = 1, pipeline_parallel_size: Any = 1,
                    decode_context_parallel_size: Any = 1, kv_cache_dtype: str = "auto",
                    block_size: Any = None, **kwargs: Any) -> int:
    """vLLM's "KV cache size: N tokens" (0.33: int(num_blocks / blocks_per_request * max_model_len))."""
    layout = kv_layout(config, tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size,
                       decode_context_parallel_size=decode_context_parallel_size,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, **kwargs)
    inputs = LayoutInputs.from_kwargs(**kwargs)
    formula = str(rule(inputs.releases, "kv_cache_tokens_formula", inputs.vllm_version))
    return layout.tokens(int(available_kv_bytes), to_int("max_model_len", max_model_len), formula)


def max_concurrency(config: dict[str, Any], available_kv_bytes: Any, max_model_len: Any,
                    tensor_parallel_size: Any = 1, pipeline_parallel_size: Any = 1,
                    decode_context_parallel_size: Any = 1, kv_cache_dtype: str = "auto",
                    block_size: Any = None, **kwargs: Any) -> float:
    """vLLM's "Maximum concurrency for L tokens per request: Cx", as printed (two decimals).

    The release's formula: blocks_per_request = num_blocks / (blocks one request of max_model_len holds,
    summed over the KV cache groups: get_max_concurrency_for_kv_cache_config); tokens_over_len (V0 and early V1)
    = num_blocks x block_size / max_model_len.
    """
    layout = kv_layout(config, tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size,
                       decode_context_parallel_size=decode_context_parallel_size,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, **kwargs)
    inputs = LayoutInputs.from_kwargs(**kwargs)
    length = to_int("max_model_len", max_model_len)
    if length < 1:
        raise SizingError("max_model_len must be >= 1")
    formula = str(rule(inputs.releases, "max_concurrency_formula", inputs.vllm_version))
    return round(layout.max_concurrency(int(available_kv_bytes), length, formula), 2)
