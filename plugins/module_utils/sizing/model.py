"""The KV-relevant facts of a model, read from its config.json (text_config nesting as shipped)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import SizingError
from .units import cdiv

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "fp8_inc": 1}
KV_DTYPE_ALIASES = {"fp8": "fp8_e4m3", "half": "float16", "bf16": "bfloat16", "fp16": "float16",
                    "float": "float32"}

# Config keys vLLM reads for the model's own context length (smallest wins).
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# rope types whose factor is already folded into max_position_embeddings.
_ROPE_TYPES_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "gdn",
                "chunked_attention": "chunked", "attention": "full"}
# Nemotron-H hybrid_override_pattern: one character per layer (vLLM's nemotron_h.py): M Mamba2 (recurrent state),
# * attention (KV), - MLP and E MoE (no cache of their own).
_PATTERN_KINDS = {"M": "mamba2", "*": "full", "-": "shared", "E": "shared"}
# Layer kinds that keep a recurrent state per request instead of KV per token.
STATE_KINDS = ("gdn", "kda", "mamba2")
_MAMBA2_KEYS = ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel")
_GDN_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "linear_conv_kernel_dim")
# Hybrid families whose state layout is not modelled: refused rather than charged as full attention.
_UNMODELLED = (("layers_block_type", "Mamba hybrid (layers_block_type)"),
               ("attn_layer_period", "Jamba Mamba hybrid"), ("ssm_cfg", "Mamba/SSM"))


def kv_bytes(dtype: str) -> int:
    """Bytes per element of a KV dtype (2 for anything unknown: the conservative bf16 size)."""
    return DTYPE_BYTES.get(dtype, 2)


@dataclass(frozen=True)
class ModelShape:
    """The KV-relevant facts of a model, read from config.json."""

    num_layers: int
    kinds: tuple[str, ...]          # per layer: full | sliding | chunked | gdn | kda | mamba2 | shared (no own KV:
                                    # a KV-shared layer, a Nemotron-H MLP / MoE layer)
    mla: bool
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mla_dim: int                    # kv_lora_rank + qk_rope_head_dim (MLA only)
    sliding_window: int
    chunk_size: int
    max_len: int
    dtype: str
    hidden_size: int
    vocab_size: int
    top_k: int
    has_vision: bool
    replicated_bytes: int           # weights every TP rank keeps whole (MLA low-rank projections)
    indexer_bytes: int = 0          # sparse-attention (DSA) indexer key bytes per token per layer
    gdn: dict[str, Any] = field(default_factory=dict)
    kda: dict[str, int] = field(default_factory=dict)
    mamba2: dict[str, Any] = field(default_factory=dict)
    model_type: str = ""
    # Per-layer (head_dim, KV heads) where a layer type has its own geometry (Gemma 4 full-attention layers:
    # global_head_dim / num_global_key_value_heads); empty = head_dim / num_kv_heads on every layer.
    layer_heads: tuple[tuple[int, int], ...] = ()
    tie_word_embeddings: bool = False   # lm_head shares the input embedding's weights (one copy, on stage 0)
    intermediate_size: int = 0      # a dense model's MLP width (config intermediate_size; 0: MoE or not stated)

    def heads_of(self, layer: int) -> tuple[int, int]:
        """(head_dim, KV heads) of one attention layer."""
        return self.layer_heads[layer] if self.layer_heads else (self.head_dim, self.num_kv_heads)

    @property
    def min_kv_heads(self) -> int:
        """The fewest KV heads any attention layer has (what tensor parallelism must divide or replicate)."""
        return min(h for _, h in self.layer_heads) if self.layer_heads else self.num_kv_heads

    @property
    def hybrid_state(self) -> bool:
        return any(k in STATE_KINDS for k in self.kinds)

    @property
    def attention(self) -> str:
        """Dominant KV layer kind for the plan: mla | full | hybrid | sliding | chunked."""
        if self.hybrid_state:
            return "hybrid"
        if self.mla:
            return "mla"
        if "sliding" in self.kinds:
            return "sliding" if all(k == "sliding" for k in self.kinds) else "hybrid"
        if "chunked" in self.kinds:
            return "chunked"
        return "full"


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: `text_config` (or `llm_config`) merged over the top level.

    Multimodal checkpoints (Kimi-K2.5, Llama 4, Qwen3.5) keep the language model under text_config; the top
    level may still carry dtype / quantization_config, so the text config wins and the top level fills gaps.
    """
    if not isinstance(config, dict):
        raise SizingError(f"config must be the parsed config.json (a mapping), got {type(config).__name__}")
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, dict) and inner:
            merged = {k: v for k, v in config.items() if k not in ("text_config", "llm_config",
                                                                    "language_config", "vision_config")}
            merged.update(inner)
            return merged
    return dict(config)


def _require(tc: dict[str, Any], keys: tuple[str, ...], why: str) -> None:
    missing = [k for k in keys if tc.get(k) is None]
    if missing:
        raise SizingError(
            f"config.json is missing {', '.join(missing)} ({why}); add the field(s) from the model's "
            f"config.json (for multimodal models under text_config) to the catalog entry")


def _model_max_len(tc: dict[str, Any]) -> int:
    found = [int(tc[k]) for k in _MAX_LEN_KEYS if tc.get(k) is not None]
    if not found:
        return 0   # unknown: callers that need it raise (require_max_len)
    length = min(found)
    rope = tc.get("rope_scaling") or tc.get("rope_parameters")
    if isinstance(rope, dict):
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        factor = rope.get("factor")
        scaled = rope_type not in _ROPE_TYPES_PRESCALED and rope_type != "default"
        if scaled and factor and "gemma3" not in str(tc.get("model_type", "")):
            length = int(length * float(factor))
    return int(length)


def _listed_layer_kinds(layer_types: list[Any], num_layers: int) -> tuple[str, ...]:
    kinds = []
    for item in layer_types[:num_layers]:
        if item not in _LAYER_TYPES:
            raise SizingError(f"layer_types entry {item!r} is not supported; known: " + ", ".join(sorted(_LAYER_TYPES)))
        kinds.append(_LAYER_TYPES[item])
    if len(kinds) < num_layers:
        raise SizingError(f"layer_types lists {len(kinds)} layers but num_hidden_layers is {num_layers}")
    return tuple(kinds)


def layer_kinds(tc: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """Per-layer KV kind, following each architecture's config convention."""
    pattern = tc.get("hybrid_override_pattern")
    if pattern:
        return _pattern_kinds(str(pattern), num_layers)
    lin = tc.get("linear_attn_config")
    if isinstance(lin, dict) and lin.get("kda_layers"):
        kda = {int(i) for i in lin["kda_layers"]}            # Kimi-Linear: 1-based layer numbers
        return tuple("kda" if (i + 1) in kda else "full" for i in range(num_layers))
    layer_types = tc.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return _listed_layer_kinds(layer_types, num_layers)
    interval = tc.get("full_attention_interval")
    if interval and tc.get("linear_num_value_heads"):
        return tuple("full" if (i + 1) % int(interval) == 0 else "gdn" for i in range(num_layers))
    if tc.get("attention_chunk_size"):
        # Llama 4: RoPE layers use chunked local attention; every 4th layer (NoPE) is global.
        no_rope = tc.get("no_rope_layers")
        if not no_rope:
            step = int(tc.get("no_rope_layer_interval") or 4)
            no_rope = [int((i + 1) % step != 0) for i in range(num_layers)]
        return tuple("chunked" if no_rope[i] else "full" for i in range(num_layers))
    window = tc.get("sliding_window")
    pattern = _sliding_pattern(tc)
    if window and pattern:
        # transformers' Gemma 2 / Gemma 3 / Cohere2 / gpt-oss configs: layer i slides unless (i + 1) % pattern == 0
        return tuple("sliding" if (i + 1) % pattern else "full" for i in range(num_layers))
    if window and tc.get("use_sliding_window", True) is not False:
        max_window_layers = tc.get("max_window_layers")
        if tc.get("use_sliding_window") is True and max_window_layers is not None:
            return tuple("sliding" if i >= int(max_window_layers) else "full" for i in range(num_layers))
        return tuple("sliding" for _ in range(num_layers))
    return tuple("full" for _ in range(num_layers))


def _pattern_kinds(pattern: str, num_layers: int) -> tuple[str, ...]:
    """Nemotron-H: the kind of each layer from hybrid_override_pattern (vLLM builds len(pattern) layers)."""
    unknown = sorted(set(pattern) - set(_PATTERN_KINDS))
    if unknown:
        raise SizingError(f"hybrid_override_pattern has unknown layer type(s) {', '.join(unknown)}; known: "
                          "M (Mamba2), * (attention), - (MLP), E (MoE)")
    if len(pattern) != num_layers:
        raise SizingError(f"hybrid_override_pattern describes {len(pattern)} layers but num_hidden_layers is "
                          f"{num_layers}")
    return tuple(_PATTERN_KINDS[c] for c in pattern)


# model_type -> the sliding-window pattern transformers uses when config.json has no layer_types
# (Gemma2Config: 2; Gemma3TextConfig / Gemma4TextConfig: sliding_window_pattern, default 6; Cohere2Config: 4;
# gpt-oss: every other layer, vLLM's gpt_oss.py slides on even layers).
_DEFAULT_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "gemma4": 6, "gemma4_text": 6, "cohere2": 4,
                     "gpt_oss": 2}


def _sliding_pattern(tc: dict[str, Any]) -> int:
    """The interleave period of sliding / full layers, or 0 when every layer slides alike."""
    explicit = tc.get("sliding_window_pattern") or tc.get("_sliding_window_pattern")
    if explicit:
        return int(explicit)
    return _DEFAULT_PATTERNS.get(str(tc.get("model_type") or ""), 0)


def _kv_shared(tc: dict[str, Any], kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Gemma 3n / Gemma 4: the last num_kv_shared_layers layers reuse an earlier layer's KV (no cache)."""
    shared = int(tc.get("num_kv_shared_layers") or 0)
    if shared <= 0:
        return kinds
    if shared >= len(kinds):
        raise SizingError(f"num_kv_shared_layers ({shared}) must be below num_hidden_layers ({len(kinds)})")
    return kinds[:len(kinds) - shared] + tuple("shared" for _ in range(shared))


def _layer_heads(tc: dict[str, Any], kinds: tuple[str, ...], head_dim: int,
                 num_kv: int) -> tuple[tuple[int, int], ...]:
    """Per-layer (head_dim, KV heads): Gemma 4 gives full-attention layers global_head_dim (default 512) and,
    when attention_k_eq_v is set, num_global_key_value_heads (transformers' Gemma4TextConfig per_layer_config,
    which vLLM's gemma4.py reads)."""
    if not str(tc.get("model_type") or "").startswith("gemma4") and tc.get("global_head_dim") is None:
        return ()
    global_dim = int(tc.get("global_head_dim") or 512)
    global_kv = tc.get("num_global_key_value_heads") if tc.get("attention_k_eq_v") else None
    full = (global_dim, int(global_kv) if global_kv else num_kv)
    return tuple(full if kind == "full" else (head_dim, num_kv) for kind in kinds)


def model_dtype(tc: dict[str, Any]) -> str:
    """The dtype vLLM serves the model in (float32 checkpoints are served in bfloat16 by default)."""
    raw = str(tc.get("torch_dtype") or tc.get("dtype") or "bfloat16").replace("torch.", "")
    raw = KV_DTYPE_ALIASES.get(raw, raw)
    return "bfloat16" if raw == "float32" else raw


def require_max_len(shape: ModelShape) -> int:
    """The model's own maximum context, or a SizingError naming the missing field."""
    if shape.max_len <= 0:
        raise SizingError("config.json has no context length field (one of: " + ", ".join(_MAX_LEN_KEYS)
                          + "); add max_position_embeddings")
    return shape.max_len


def _refuse_unmodelled(tc: dict[str, Any]) -> None:
    if tc.get("compress_ratios"):
        raise SizingError("DeepSeek-V4-style compressed sparse attention (compress_ratios) is not modelled by "
                          "the sizing maths; plan this model with vLLM's --max-model-len auto on the node")
    for key, family in _UNMODELLED:
        if tc.get(key):
            raise SizingError(f"{family} models ({key} in config.json) are not modelled by the sizing maths; "
                              "supported: full/GQA, MLA, sliding window, chunked local, Qwen3-Next/Qwen3.5 "
                              "Gated DeltaNet, Kimi-Linear KDA and Nemotron-H Mamba2 hybrids")
    if isinstance(tc.get("attn_type_list"), list) and 0 in tc["attn_type_list"]:
        raise SizingError("MiniMax lightning (linear) attention layers (attn_type_list with 0) are not modelled "
                          "by the sizing maths")


def _attention_geometry(tc: dict[str, Any], mla: bool) -> tuple[int, int, int]:
    """(head_dim, KV heads, MLA latent width) per layer."""
    if mla:
        _require(tc, ("kv_lora_rank", "qk_rope_head_dim", "num_attention_heads"), "MLA latent cache size")
        mla_dim = int(tc["kv_lora_rank"]) + int(tc["qk_rope_head_dim"])
        return mla_dim, 1, mla_dim
    _require(tc, ("num_attention_heads",), "attention heads for tensor parallelism")
    head_dim = tc.get("head_dim")
    if not head_dim:
        _require(tc, ("hidden_size",), "head size = hidden_size / num_attention_heads when head_dim is absent")
        head_dim = int(tc["hidden_size"]) // int(tc["num_attention_heads"])
    return int(head_dim), int(tc.get("num_key_value_heads") or tc["num_attention_heads"]), 0


def _gdn_state(tc: dict[str, Any]) -> dict[str, Any]:
    _require(tc, _GDN_KEYS, "Gated DeltaNet state size")
    gdn: dict[str, Any] = {k: int(tc[k]) for k in _GDN_KEYS}
    gdn["ssm_dtype"] = str(tc.get("mamba_ssm_dtype") or "").replace("torch.", "")
    return gdn


def _mamba2_state(tc: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H Mamba2 geometry; its SSM state dtype is the config's mamba_ssm_cache_dtype, float32 when absent
    (vLLM's NemotronHForCausalLMConfig replaces the cache's 'auto' with it)."""
    _require(tc, _MAMBA2_KEYS, "Mamba2 state size")
    state: dict[str, Any] = {k: int(tc[k]) for k in _MAMBA2_KEYS}
    state["ssm_dtype"] = str(tc.get("mamba_ssm_cache_dtype") or "float32").replace("torch.", "")
    return state


def _kda_state(tc: dict[str, Any]) -> dict[str, int]:
    lin = tc["linear_attn_config"]
    if lin.get("num_heads") is None or lin.get("head_dim") is None:
        raise SizingError("linear_attn_config needs num_heads and head_dim (Kimi Delta Attention state)")
    return {"num_heads": int(lin["num_heads"]), "head_dim": int(lin["head_dim"]),
            "num_k_heads": int(lin.get("num_k_heads") or lin["num_heads"]),
            "head_k_dim": int(lin.get("head_k_dim") or lin["head_dim"]),
            "conv": int(lin.get("short_conv_kernel_size") or 4)}


def _replicated_bytes(tc: dict[str, Any], num_layers: int, mla: bool, mla_dim: int) -> int:
    """Weights every TP rank keeps whole: MLA low-rank projections and the MoE router."""
    hidden = int(tc.get("hidden_size") or 0)
    replicated = 0
    if mla and hidden:
        # q_a_proj (when q_lora_rank is set) and kv_a_proj_with_mqa are ReplicatedLinear in vLLM's
        # deepseek_v2.py. NVFP4/FP8 exports keep attention in bf16, so 2 B/param is the conservative choice.
        q_lora = int(tc.get("q_lora_rank") or 0)
        replicated = num_layers * hidden * (q_lora + mla_dim) * 2
    experts = int(tc.get("n_routed_experts") or tc.get("num_experts") or tc.get("num_local_experts") or 0)
    if experts and hidden:
        # The MoE router (GateLinear, a ReplicatedLinear) is whole on every TP rank.
        moe_layers = max(0, num_layers - int(tc.get("first_k_dense_replace") or 0))
        replicated += moe_layers * hidden * experts * 2
    return replicated


def _has_vision(config: dict[str, Any]) -> bool:
    """Multimodal checkpoints profile their encoder too (vision_config, or a text_config wrapper whose
    architecture is a *ForConditionalGeneration)."""
    return bool(config.get("vision_config")) or (
        isinstance(config.get("text_config"), dict)
        and any(str(a).endswith("ForConditionalGeneration") for a in config.get("architectures") or []))


def model_shape(config: dict[str, Any]) -> ModelShape:
    """Read the KV-relevant facts from config.json; SizingError names any missing field."""
    tc = text_config(config)
    _refuse_unmodelled(tc)
    _require(tc, ("num_hidden_layers",), "the number of layers")
    num_layers = int(tc["num_hidden_layers"])
    kinds = _kv_shared(tc, layer_kinds(tc, num_layers))
    mla = tc.get("kv_lora_rank") is not None
    head_dim, num_kv, mla_dim = _attention_geometry(tc, mla)
    heads = () if mla else _layer_heads(tc, kinds, head_dim, num_kv)
    top_k = int(tc.get("num_experts_per_tok") or tc.get("moe_topk") or tc.get("num_selected_experts") or 0)
    # DeepSeek-V3.2 / GLM-5 lightning indexer: fp8 keys + one fp32 scale per 128 elements.
    indexer = (int(tc["index_head_dim"]) + 4 * cdiv(int(tc["index_head_dim"]), 128)) \
        if mla and tc.get("index_topk") and tc.get("index_head_dim") else 0
    return ModelShape(
        num_layers=num_layers, kinds=kinds, mla=mla, num_heads=int(tc["num_attention_heads"]),
        num_kv_heads=num_kv, head_dim=head_dim, mla_dim=mla_dim,
        sliding_window=int(tc.get("sliding_window") or 0), chunk_size=int(tc.get("attention_chunk_size") or 0),
        max_len=_model_max_len(tc), dtype=model_dtype(tc), hidden_size=int(tc.get("hidden_size") or 0),
        vocab_size=int(tc.get("vocab_size") or 0), top_k=top_k, has_vision=_has_vision(config),
        replicated_bytes=_replicated_bytes(tc, num_layers, mla, mla_dim),
        gdn=_gdn_state(tc) if "gdn" in kinds else {}, kda=_kda_state(tc) if "kda" in kinds else {},
        mamba2=_mamba2_state(tc) if "mamba2" in kinds else {},
        model_type=str(tc.get("model_type") or ""), indexer_bytes=indexer, layer_heads=heads,
        tie_word_embeddings=bool(tc.get("tie_word_embeddings", False)),
        intermediate_size=0 if top_k else int(tc.get("intermediate_size") or 0))
