"""KV cache maths (vLLM 0.33 rules): bytes per token, blocks, groups, null block, token counts."""

from __future__ import annotations

import copy

import pytest

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from sizing_cases import KIMI, TINY_DSV3, TINY_DSV3_FP8KV, TINY_LLAMA

GiB = 1 << 30
RELEASES = gt.load_releases()
CASES = {c["id"]: c for c in gt.load_cases()}


def kw(**extra):
    return dict(releases=RELEASES, **extra)


# --- exact CPU cases (held against vLLM's "CPU KV cache size: N tokens") ----------------------------------
def test_tiny_llama_cpu_one_gib_is_2097152_tokens():
    layout = vm.kv_layout(TINY_LLAMA, device="cpu", releases=RELEASES)
    assert layout.bytes_per_token == 512          # 2 layers x 2 KV heads x 32 x 2 (K,V) x 2 B
    assert layout.block_size == 128               # CPU_ATTN's preferred block
    assert vm.kv_cache_tokens(TINY_LLAMA, GiB, 4096, device="cpu", **kw()) == 2_097_152


def test_tiny_deepseek_v3_cpu_one_gib_is_466032_tokens():
    layout = vm.kv_layout(TINY_DSV3, device="cpu", releases=RELEASES)
    assert layout.bytes_per_token == 2304         # (512 + 64) x 2 layers x 2 B
    assert layout.block_size == 16                # the reference CPU MLA kernel
    assert vm.kv_cache_tokens(TINY_DSV3, GiB, 4096, device="cpu", **kw()) == 466_032


def test_cpu_plans_match_the_logged_token_counts():
    for config, tokens in ((TINY_LLAMA, 2_097_152), (TINY_DSV3, 466_032)):
        plan = vm.memory_plan(config, gpu={"kind": "cpu", "kv_cache_space_gib": 1}, gpu_count=1,
                                   checkpoint_bytes=1000, releases=RELEASES)
        assert plan["fits"] and plan["device"] == "cpu"
        assert plan["kv"]["tokens"] == tokens
        assert plan["max_model_len"] == 4096
        assert plan["environment"] == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENGINE_READY_TIMEOUT_S": "600"}
        assert "--gpu-memory-utilization" not in plan["vllm_args"]


def test_cpu_mla_cannot_run_the_checkpoints_fp8_kv():
    plan = vm.memory_plan(TINY_DSV3_FP8KV, gpu={"kind": "cpu", "kv_cache_space_gib": 1}, gpu_count=1,
                               releases=RELEASES)
    assert plan["checkpoint_kv_cache_dtype"] == "fp8_e4m3"
    assert plan["checkpoint_kv_cache_dtype_supported"] is False
    assert plan["kv_cache_dtype"] == "bfloat16" and plan["kv"]["tokens"] == 466_032
    # CPU MLA refuses an explicit bfloat16 (seen with vllm-cpu 0.32), and 'auto' means fp8 until the
    # model_config role drops the checkpoint's KV declaration (it does so because supported is False).
    assert plan["vllm_args"][-2:] == ["--kv-cache-dtype", "auto"]


# --- bytes per token: GQA, replication, MLA, DCP, fp8 -----------------------------------------------------
def test_gqa_kv_heads_replicate_when_tp_exceeds_them():
    qwen = CASES["vllm-21348"]["config"]           # 94 layers, 4 KV heads x 128
    per_tp = {tp: vm.kv_layout(qwen, tensor_parallel_size=tp, releases=RELEASES).bytes_per_token
              for tp in (1, 2, 4, 8)}
    assert per_tp == {1: 192512, 2: 96256, 4: 48128, 8: 48128}   # TP8: one (replicated) head per rank


def test_mla_latent_cache_is_replicated_on_every_tp_rank_and_split_by_dcp():
    one = vm.kv_cache_bytes(KIMI, 262144, tensor_parallel_size=1, kv_cache_dtype="bfloat16", **kw())
    eight = vm.kv_cache_bytes(KIMI, 262144, tensor_parallel_size=8, kv_cache_dtype="bfloat16", **kw())
    dcp8 = vm.kv_cache_bytes(KIMI, 262144, tensor_parallel_size=8, decode_context_parallel_size=8,
                                  kv_cache_dtype="bfloat16", **kw())
    assert one == eight == 262144 * 70272
    assert dcp8 == eight // 8


def test_fp8_halves_the_kv_cache():
    bf16 = vm.kv_cache_bytes(KIMI, 131072, tensor_parallel_size=8, kv_cache_dtype="bfloat16", **kw())
    fp8 = vm.kv_cache_bytes(KIMI, 131072, tensor_parallel_size=8, kv_cache_dtype="fp8", **kw())
    assert fp8 * 2 == bf16 and round(fp8 / GiB, 2) == 4.29


# --- `auto` and the checkpoint's ModelOpt KV setting -----------------------------------------------------
@pytest.mark.parametrize("config,quant,expected", [
    (TINY_DSV3, {"kv_cache_quant_algo": "FP8"}, "fp8_e4m3"),                         # catalog `quant`
    (TINY_DSV3, {"producer": {"name": "modelopt"}, "quantization": {"kv_cache_quant_algo": "FP8"}}, "fp8_e4m3"),
    (TINY_DSV3_FP8KV, None, "fp8_e4m3"),                                             # config.json flat form
    (dict(TINY_DSV3, quantization_config={"quant_method": "modelopt", "kv_cache_scheme": {
        "dynamic": True, "num_bits": 8, "type": "float"}}), None, "bfloat16"),        # dynamic: not recognised
    (dict(TINY_DSV3, quantization_config={"quant_method": "compressed-tensors", "kv_cache_scheme": {
        "dynamic": False, "num_bits": 8, "type": "float"}}), None, "bfloat16"),       # only ModelOpt counts
    (TINY_LLAMA, {"quantization": {"kv_cache_quant_algo": "NVFP4"}}, "nvfp4"),
    (TINY_LLAMA, {"kv_cache_quant_algo": None}, "bfloat16"),
])
def test_auto_resolves_to_the_checkpoint_kv_setting(config, quant, expected):
    assert vm.resolve_kv_cache_dtype(config, "auto", quant, "0.33.0", RELEASES) == expected


def test_auto_is_the_model_dtype_before_0_14():
    assert vm.resolve_kv_cache_dtype(TINY_DSV3_FP8KV, "auto", None, "0.13.0", RELEASES) == "bfloat16"
    assert vm.resolve_kv_cache_dtype(TINY_DSV3_FP8KV, "bfloat16", None, "0.33.0", RELEASES) == "bfloat16"


# --- backends and block sizes ---------------------------------------------------------------------------
@pytest.mark.parametrize("cc,dtype,version,backend,block,supported", [
    ("12.0", "bfloat16", "0.33.0", "TRITON_MLA", 16, True),
    ("12.0", "fp8_e4m3", "0.33.0", "TRITON_MLA", 16, True),
    ("12.0", "fp8_e4m3", "0.17.0", "TRITON_MLA", 16, False),
    ("9.0", "bfloat16", "0.33.0", "FLASH_ATTN_MLA", 16, True),
    ("9.0", "fp8_e4m3", "0.33.0", "FLASHMLA", 64, True),
    ("10.0", "bfloat16", "0.33.0", "FLASHINFER_MLA", 32, True),
    ("8.0", "fp8_e4m3", "0.33.0", "TRITON_MLA", 16, False),        # TRITON_MLA fp8 needs SM89+
])
def test_mla_backend_choice(cc, dtype, version, backend, block, supported):
    got = vm.attention_backend(True, dtype, cc, "cuda", version, RELEASES)
    assert (got.name, got.block_size, got.supported) == (backend, block, supported)


def test_backend_block_size_reaches_the_kv_layout():
    layout = vm.kv_layout(KIMI, tensor_parallel_size=8, kv_cache_dtype="fp8", compute_capability="9.0",
                          releases=RELEASES)
    assert layout.block_size == 64 and layout.backend.name == "FLASHMLA"
    assert vm.kv_layout(TINY_LLAMA, block_size=32, releases=RELEASES).block_size == 32


def test_fp8_support_since():
    assert vm.fp8_support_since(True, "12.0", RELEASES) == "0.18.0"
    assert vm.fp8_support_since(True, "9.0", RELEASES) == "0.0.0"


# --- the null block and the binary search ---------------------------------------------------------------
def test_null_block_is_held_back_by_the_estimate():
    length = 131072
    need = vm.kv_cache_bytes(KIMI, length, tensor_parallel_size=8, kv_cache_dtype="bfloat16", **kw())
    block = 16 * 70272
    at_need = vm.max_model_len(KIMI, need, tensor_parallel_size=8, kv_cache_dtype="bfloat16", **kw())
    with_null = vm.max_model_len(KIMI, need + block, tensor_parallel_size=8, kv_cache_dtype="bfloat16",
                                      **kw())
    assert at_need == length - 16 and with_null == length
    assert vm.max_model_len(KIMI, block, tensor_parallel_size=8, kv_cache_dtype="bfloat16", **kw()) == 0


def test_estimate_is_capped_at_the_model_maximum_or_the_given_length():
    assert vm.max_model_len(TINY_LLAMA, 10 * GiB, **kw()) == 4096
    assert vm.max_model_len(TINY_LLAMA, 10 * GiB, max_model_len=2048, **kw()) == 2048


def test_qwen38_prediction_differs_from_the_null_block_rule_by_exactly_one_block():
    case = CASES["qwen38-rtx3090-39"]
    layout = vm.kv_layout(case["config"], releases=RELEASES)
    available = int(case["expect"]["available_kv_gib"] * GiB)
    ours = layout.estimate_max_model_len(available, 65536)
    without_null = layout.estimate_max_model_len(available + layout.bytes_per_block(0), 65536)
    assert layout.block_size == 784
    assert without_null == case["v0_33_prediction"]["estimated_max_model_len"][1] == 20384
    assert ours == without_null - 784


# --- sliding window, chunked local, hybrid, pipeline stages ----------------------------------------------
def test_sliding_window_holds_in_flight_tokens():
    oss = CASES["vllm-27508"]["config"]
    small = vm.kv_cache_bytes(oss, 131072, max_num_batched_tokens=1024, **kw())
    large = vm.kv_cache_bytes(oss, 131072, max_num_batched_tokens=8192, **kw())
    page_group = 18 * 16 * 2048                     # 18 layers per group x block 16 x 2,048 B/token/layer
    assert small == page_group * (8192 + 137)       # cdiv(127 + 2 x 1024, 16) + 1 = 137
    assert large == page_group * (8192 + 1033)
    # short contexts: the window is capped by max_model_len
    assert vm.kv_cache_bytes(oss, 64, **kw()) == page_group * (4 + 5)
    # the window keeps W - 1 earlier tokens: 127 + 17 in flight = 144 = 9 blocks exactly (+1 for alignment)
    one_batch = vm.kv_cache_bytes(oss, 4096, max_num_batched_tokens=17, vllm_version="0.20.0", **kw())
    assert one_batch == page_group * (256 + 10)


def test_chunked_local_attention_is_charged_as_full_by_default():
    scout = CASES["vllm-19407"]["config"]
    full = vm.kv_cache_bytes(scout, 10485760, tensor_parallel_size=8, **kw())
    assert full == 10485760 * 48 * 512
    hybrid_on = copy.deepcopy(RELEASES)
    hybrid_on["chunked_local_disables_hybrid_manager"] = [{"since": "0.0.0", "value": False}]
    capped = vm.kv_cache_bytes(scout, 10485760, tensor_parallel_size=8, releases=hybrid_on)
    assert capped < full / 3                         # 36 chunked layers capped at 8192 + in-flight tokens


def test_hybrid_gdn_page_unification_and_align_mode():
    case = CASES["club3090-652"]
    layout = vm.kv_layout(case["config"], kv_cache_dtype="fp8", releases=RELEASES)
    assert layout.block_size == 2096 and len(layout.groups) == 4
    assert layout.blocks_per_request(131072) == 63 + 3 * 2          # attention + 3 GDN groups x 2 (align)
    none_mode = vm.kv_layout(case["config"], kv_cache_dtype="fp8", mamba_cache_mode="none", releases=RELEASES)
    assert none_mode.blocks_per_request(131072) == 63 + 3


# A Nemotron-H-shaped config: Mamba2 128 heads x 64, 8 groups, state 128, conv 4; GQA 32 / 8 KV heads x 128.
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
              "num_hidden_layers": 28, "hybrid_override_pattern": "M-M-M*-" * 4, "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
              "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4, "vocab_size": 131072,
              "max_position_embeddings": 131072}


def test_nemotron_h_mamba2_hybrid_state_and_page_unification():
    """hybrid_override_pattern: M layers hold a Mamba2 state, * layers KV, - / E layers nothing. The state (conv
    (kernel - 1) x (heads x head_dim + 2 x groups x state) in bf16 + SSM heads x head_dim x state in float32, the
    default vLLM gives Nemotron-H) sets the attention block: the smallest multiple of 16 whose page holds it."""
    shape = vm.model_shape(NEMOTRON_H)
    assert shape.kinds == ("mamba2", "shared", "mamba2", "shared", "mamba2", "full", "shared") * 4
    assert shape.hybrid_state and shape.attention == "hybrid"
    state = (128 * 64 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 4
    per_token = 8 * 2 * 128 * 2
    layout = vm.kv_layout(NEMOTRON_H, kv_cache_dtype="bfloat16", releases=RELEASES)
    assert layout.block_size == 16 * -(-state // (16 * per_token)) == 1040
    assert {s.page for s in layout.specs if s.kind in ("mamba", "full")} == {1040 * per_token}
    assert sorted(len(g) for g in layout.groups) == [4, 4, 4, 4]      # 12 Mamba2 -> 3 groups + 4 attention
    assert layout.blocks_per_request(131072) == 127 + 3 * 2           # align mode: 2 state blocks per group
    fp16_ssm = vm.kv_layout(dict(NEMOTRON_H, mamba_ssm_cache_dtype="float16"), kv_cache_dtype="bfloat16",
                            releases=RELEASES)
    assert fp16_ssm.block_size == 16 * -(-(state - 128 * 64 * 128 * 2) // (16 * per_token))
    with pytest.raises(ValueError, match="describes 27 layers"):
        vm.model_shape(dict(NEMOTRON_H, hybrid_override_pattern=("M-M-M*-" * 4)[:27]))
    with pytest.raises(ValueError, match="unknown layer type"):
        vm.model_shape(dict(NEMOTRON_H, hybrid_override_pattern="M-M-M*X" * 4))


def test_kimi_linear_under_0_33_rules():
    layout = vm.kv_layout(CASES["vllm-28228"]["config"], tensor_parallel_size=2, releases=RELEASES)
    assert layout.block_size == 1024                  # hybrid MLA blocks are multiples of 128 in 0.33
    assert sorted(len(g) for g in layout.groups) == [6, 7, 7, 7]   # 20 KDA -> 7,7,6 + 7 MLA
    assert layout.blocks_per_request(120000) == 118 + 3 * 2


def test_pipeline_stages_follow_vllm_partitioning():
    assert [len(s) for s in vm.pp_stages(92, 8)] == [11, 11, 11, 12, 12, 12, 12, 11]
    assert [len(s) for s in vm.pp_stages(48, 2, "16,32")] == [16, 32]
    glm = CASES["vllm-32105"]["config"]
    worst = vm.kv_cache_bytes(glm, 202752, pipeline_parallel_size=8, **kw())
    stage0 = vm.kv_cache_bytes(glm, 202752, pipeline_parallel_size=8, pp_rank=0, **kw())
    assert worst == 12 * 202752 * 4096 and stage0 == 11 * 202752 * 4096
    with pytest.raises(ValueError, match="sums to"):
        vm.pp_stages(48, 2, [16, 16])
    with pytest.raises(ValueError, match="entries"):
        vm.pp_stages(48, 2, [48])


# --- token formula per version, rope scaling ------------------------------------------------------------
def test_token_formula_changes_at_0_21():
    oss = CASES["hf-mem-60"]["config"]
    avail = int(5.38 * GiB)
    old = vm.kv_cache_tokens(oss, avail, 131072, kv_cache_dtype="bfloat16", vllm_version="0.20.0",
                                  max_num_batched_tokens=8192, **kw())
    new = vm.kv_cache_tokens(oss, avail, 131072, kv_cache_dtype="bfloat16", vllm_version="0.33.0",
                                  max_num_batched_tokens=8192, **kw())
    assert old == 9793 // 2 * 16 and new == int(9793 / (8192 + 1033) * 131072)


def test_rope_factor_scales_the_model_maximum_unless_prescaled():
    linear = dict(TINY_LLAMA, rope_scaling={"rope_type": "linear", "factor": 4.0})
    yarn = dict(TINY_LLAMA, rope_scaling={"type": "yarn", "factor": 4.0})
    assert vm.model_shape(linear).max_len == 16384 and vm.model_shape(yarn).max_len == 4096


# --- errors name the problem and the valid choices -------------------------------------------------------
def test_tp_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 .*valid choices: 1, 2, 4"):
        vm.kv_cache_bytes(TINY_LLAMA, 4096, tensor_parallel_size=3, **kw())


def test_missing_config_fields_are_named():
    broken = {k: v for k, v in TINY_LLAMA.items() if k != "num_hidden_layers"}
    with pytest.raises(ValueError, match="num_hidden_layers"):
        vm.kv_cache_bytes(broken, 4096, **kw())
    no_len = {k: v for k, v in TINY_LLAMA.items() if k != "max_position_embeddings"}
    with pytest.raises(ValueError, match="max_position_embeddings"):
        vm.max_model_len(no_len, GiB, **kw())
    no_mla_rope = {k: v for k, v in TINY_DSV3.items() if k != "qk_rope_head_dim"}
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        vm.kv_cache_bytes(no_mla_rope, 4096, **kw())


@pytest.mark.parametrize("extra,match", [
    ({"layers_block_type": ["mamba", "attention"]}, "layers_block_type"),
    ({"attn_layer_period": 8}, "Jamba"),
    ({"attn_type_list": [0, 0, 1]}, "lightning"),
])
def test_unmodelled_hybrids_are_refused_not_charged_as_full(extra, match):
    with pytest.raises(ValueError, match=match):
        vm.kv_cache_bytes(dict(TINY_LLAMA, **extra), 4096, **kw())


def test_invalid_dcp_and_dtype_are_refused():
    with pytest.raises(ValueError, match=r"needs tensor_parallel_size \(2\) > the model's 2 KV heads"):
        vm.kv_cache_bytes(TINY_LLAMA, 4096, tensor_parallel_size=2, decode_context_parallel_size=2, **kw())
    with pytest.raises(ValueError, match="must divide tensor_parallel_size"):
        vm.kv_cache_bytes(KIMI, 4096, tensor_parallel_size=8, decode_context_parallel_size=3, **kw())
    with pytest.raises(ValueError, match="choose one of"):
        vm.kv_cache_bytes(TINY_LLAMA, 4096, kv_cache_dtype="int3", **kw())



# --- per-layer head geometry and interleave patterns (vLLM's gemma2/3/4.py, gpt_oss.py; transformers' configs) ---
GEMMA4_LIKE = {"model_type": "gemma4_text", "num_hidden_layers": 12, "num_attention_heads": 16,
               "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
               "attention_k_eq_v": True, "sliding_window": 1024, "max_position_embeddings": 262144,
               "torch_dtype": "bfloat16"}


def test_gemma4_full_layers_use_the_global_head_geometry():
    layout = vm.kv_layout(GEMMA4_LIKE, device="cpu", releases=RELEASES)
    shape = vm.model_shape(GEMMA4_LIKE)
    # no layer_types: transformers' 5:1 pattern (every 6th layer full)
    assert shape.kinds == ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",)
    per_token = [s.per_token for s in layout.specs]
    assert per_token[5] == 2 * 2 * 512 * 2       # 2 global KV heads x (K, V) x 512 x bf16
    assert per_token[0] == 8 * 2 * 256 * 2       # 8 KV heads x (K, V) x 256 x bf16
    assert layout.bytes_per_token == 2 * 4096 + 10 * 8192


def test_gemma4_without_k_eq_v_keeps_the_kv_heads_but_not_the_head_size():
    config = dict(GEMMA4_LIKE, attention_k_eq_v=False)
    assert vm.model_shape(config).heads_of(5) == (512, 8)
    assert vm.model_shape(config).heads_of(0) == (256, 8)


def test_kv_shared_layers_hold_no_cache():
    shared = dict(GEMMA4_LIKE, num_kv_shared_layers=6)
    full = vm.kv_layout(GEMMA4_LIKE, device="cpu", releases=RELEASES)
    half = vm.kv_layout(shared, device="cpu", releases=RELEASES)
    assert vm.model_shape(shared).kinds[6:] == ("shared",) * 6
    assert not any(i >= 6 for group in half.groups for i in group)
    assert half.bytes_per_token == 4096 + 5 * 8192 < full.bytes_per_token


def test_gemma2_and_gpt_oss_alternate_without_layer_types():
    gemma2 = {"model_type": "gemma2", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 256, "sliding_window": 4096, "max_position_embeddings": 8192}
    assert vm.model_shape(gemma2).kinds == ("sliding", "full", "sliding", "full")
    gemma3 = dict(gemma2, model_type="gemma3_text", num_hidden_layers=6, sliding_window_pattern=3)
    assert vm.model_shape(gemma3).kinds == ("sliding", "sliding", "full") * 2
    gpt_oss = {k: v for k, v in CASES["vllm-27508"]["config"].items() if k != "layer_types"}
    assert vm.model_shape(gpt_oss).kinds == vm.model_shape(CASES["vllm-27508"]["config"]).kinds


def test_tensor_parallel_must_fit_every_layers_kv_heads():
    # 8 KV heads on sliding layers, 2 on global ones: TP 4 replicates the global heads (vLLM: 4 % 2 == 0).
    four = vm.kv_layout(GEMMA4_LIKE, tensor_parallel_size=4, device="cpu", releases=RELEASES)
    assert four.specs[5].per_token == 1 * 2 * 512 * 2 and four.specs[0].per_token == 2 * 2 * 256 * 2
    with pytest.raises(vm.SizingError, match="tensor_parallel_size 3"):
        vm.kv_layout(dict(GEMMA4_LIKE, num_attention_heads=24), tensor_parallel_size=3, releases=RELEASES)


def test_cpu_mla_with_amx_uses_128_token_blocks_from_vllm_cpu_0_32():
    """The real vllm-cpu 0.32.0 run on an AMX host logged 'CPU KV cache size: 465,920 tokens' (tests/fixtures/
    README.md): the AMX MLA backend keeps the 128-token CPU block, the reference kernel (no AMX) forces 16."""
    amx = dict(device="cpu", cpu_amx=True, releases=RELEASES)
    assert vm.kv_layout(TINY_DSV3, vllm_version="0.32.0", **amx).block_size == 128
    assert vm.kv_cache_tokens(TINY_DSV3, GiB, 4096, vllm_version="0.32.0", **amx) == 465_920
    assert vm.kv_cache_tokens(TINY_DSV3, GiB, 4096, vllm_version="0.32.0", device="cpu", releases=RELEASES) \
        == 466_032
    assert vm.kv_layout(TINY_DSV3, vllm_version="0.31.0", **amx).block_size == 16     # rule from 0.32 only
    assert vm.kv_layout(TINY_LLAMA, vllm_version="0.32.0", **amx).block_size == 128   # CPU_ATTN: unchanged
    plan = vm.memory_plan(TINY_DSV3, gpu={"kind": "cpu", "kv_cache_space_gib": 1}, gpu_count=1, cpu_amx=True,
                          vllm_version="0.32.0", releases=RELEASES)
    assert plan["kv"]["tokens"] == 465_920 and plan["kv"]["block_size"] == 128


def test_max_concurrency_follows_the_versions_formula():
    """V0 / early V1 printed blocks x block size / max_model_len; the hybrid allocator (0.9+) divides the pool by
    the blocks one request holds over every group: for gpt-oss (two groups share the pool) the old figure is
    ~1.5x higher."""
    gpt_oss, available, length = CASES["vllm-27508"]["config"], 8 * GiB, 32768
    old = vm.max_concurrency(gpt_oss, available, length, vllm_version="0.8.5", **kw())
    new = vm.max_concurrency(gpt_oss, available, length, vllm_version="0.32.0", **kw())
    layout = vm.kv_layout(gpt_oss, releases=RELEASES)
    assert old == round(layout.num_blocks(available) * 16 / length, 2)
    assert new == round(layout.num_blocks(available) / layout.blocks_per_request(length), 2)
    assert old > 1.4 * new
