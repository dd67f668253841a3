"""vLLM memory sizing maths (pure Python, no Ansible import), following vLLM 0.33 rules.

Public functions (also exposed as Ansible filters by ``filter_plugins/vllm_sizing.py``)
-------------------------------------------------------------------------------------
``config`` is the parsed ``config.json`` as shipped (multimodal checkpoints keep the text
model under ``text_config``; it is unwrapped here).  Common keyword arguments of all four:

    tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1,
    kv_cache_dtype='auto', block_size=None,
    # extras (all optional):
    quant=None,                 # hf_quant_config.json content, or the catalog's `quant` dict
                                # ({kv_cache_quant_algo: FP8}); merged like vLLM does
    compute_capability=None,    # "12.0": picks the attention backend + kernel block size
    vllm_version='0.33.0', releases=None,   # releases = group_vars/all/vllm_releases.yml
                                # `vllm_node_vllm_releases` dict; None = built-in 0.33 rules
    max_num_batched_tokens=None,  # in-flight tokens for sliding-window layers (default 2048)
    mamba_cache_mode=None,      # 'none' | 'align' | 'all'; None = vLLM default (align when the
                                # model supports prefix caching for mamba, else none)
    pp_layer_partition=None,    # list of per-stage layer counts (VLLM_PP_LAYER_PARTITION)
    device='cuda'               # 'cpu': CPU backend rules (block size 128 for CPU attention)

- ``vllm_kv_cache_bytes(config, max_model_len, **kw) -> int``
  Bytes of KV cache ONE request of ``max_model_len`` tokens needs on the most loaded rank
  (vLLM's "X GiB KV cache is needed", i.e. block-rounded per KV-cache group).
- ``vllm_max_model_len(config, available_kv_bytes, **kw) -> int``
  vLLM's "estimated maximum model length": largest L in [1, model max (or ``max_model_len=``
  kwarg)] whose one request fits in ``available_kv_bytes - one block`` (the null block).
  0 when not even one token fits.
- ``vllm_kv_cache_tokens(config, available_kv_bytes, max_model_len, **kw) -> int``
  vLLM 0.33's "KV cache size: N tokens" = int(num_blocks / blocks_per_request * max_model_len),
  num_blocks = available_kv_bytes // bytes_per_block.
- ``vllm_memory_plan(config, **kw) -> dict``  (signature below)

vllm_memory_plan signature
--------------------------
::

    vllm_memory_plan(
        config: dict,                        # config.json (text_config nesting as shipped)
        *,
        releases: dict,                      # vllm_node_vllm_releases (group_vars/all/vllm_releases.yml)
        checkpoint_bytes: int,               # model.safetensors.index.json metadata.total_size / catalog
        gpu: dict | None = None,             # a vllm_node_gpus catalog entry (memory_mib,
                                             #   compute_capability, or kind: cpu + kv_cache_space_gib);
                                             #   explicit kwargs below win over it
        gpu_memory_bytes: int | None = None, # per GPU, nvidia-smi MiB * 2**20
        compute_capability: str | None = None,   # "12.0"
        gpu_count: int | str = 1,
        device: str = 'cuda',                # 'cuda' | 'cpu'
        cpu_kv_cache_space_gib: float | None = None,   # VLLM_CPU_KVCACHE_SPACE (device cpu)
        vllm_version: str = '0.33.0',
        vllm_variant: str = 'cuda',
        quant: dict | None = None,           # hf_quant_config.json / catalog `quant`
        tensor_parallel_size='auto',         # 'auto' | int  (strings from Ansible are accepted)
        pipeline_parallel_size=1,            # int ('auto' -> 1)
        decode_context_parallel_size='auto', # 'auto' | int   (auto -> 1 unless needed, see below)
        kv_cache_dtype='auto',               # 'auto' | bfloat16 | float16 | fp8 | fp8_e4m3 | fp8_e5m2
        gpu_memory_utilization='auto',       # 'auto' (release default, raised when needed) | float
        max_model_len='auto',                # 'auto' | int
        block_size=None,                     # None = backend default
        max_num_batched_tokens=None, mamba_cache_mode=None, pp_layer_partition=None,
        enforce_eager: bool = False,         # True -> no CUDA-graph reservation
        model_key: str = '', repo: str = '', served_model_name: str = '', gpu_key: str = '',
    ) -> dict

Raises ``ValueError`` (message names the problem and the valid choices) for: a TP that does
not divide the attention heads or exceeds gpu_count, missing config fields, a GPU too small
for the weights, unknown KV dtype, bad utilization.  A requested value that merely does not
fit is NOT an error: ``fits`` is False and ``checks``/``reasons``/``advice`` say why.

Return schema (JSON-serialisable; the house-rules plan contract, plus a few extra keys)
--------------------------------------------------------------------------------------
::

    fits: bool                         # every requested (non-auto) knob fits
    model, repo, served_model_name, gpu, gpu_count, device, vllm_version, vllm_variant
    attention: "mla" | "full" | "hybrid" | "sliding" | "chunked"   # dominant KV layer kind
    checkpoint_kv_cache_dtype: "fp8_e4m3" | "nvfp4" | null
    checkpoint_kv_cache_dtype_supported: bool
    tensor_parallel_size, pipeline_parallel_size, decode_context_parallel_size: int
    kv_cache_dtype: str               # resolved: "bfloat16" | "float16" | "fp8_e4m3" | ...
    gpu_memory_utilization: float
    max_model_len: int                # chosen (requested value, or the safe one when auto)
    model_max_model_len: int
    safe_max_model_len: int           # largest length whose one request fits (<= model max)
    vllm_args: [str]                  # ["--tensor-parallel-size","8","--max-model-len","131072",
                                      #  "--gpu-memory-utilization","0.95","--kv-cache-dtype","bfloat16", ...]
    environment: {str: str}           # {"VLLM_CPU_KVCACHE_SPACE": "1"} on cpu, PP partition, ...
    per_gpu: {total_bytes, requested_bytes, weights_bytes, activation_peak_bytes,
              cudagraph_bytes, non_torch_bytes, kv_cache_bytes, headroom_bytes}
    kv: {bytes_per_token, block_size, needed_bytes, available_bytes, tokens, max_concurrency,
         num_blocks, bytes_per_block, backend}
    checks: [{knob, requested, chosen, fits, message}]
    reasons: [str]
    advice: [str]
    notes: [str]                      # how the estimates were made (calibration, replication)
"""

from __future__ import annotations

__all__ = [
    "vllm_kv_cache_bytes",
    "vllm_max_model_len",
    "vllm_kv_cache_tokens",
    "vllm_memory_plan",
]
