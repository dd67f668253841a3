"""LoRA (--enable-lora, --max-loras, --max-lora-rank): adapter slots in the budget, the flags in the plan."""

from __future__ import annotations

import pytest

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from sizing_cases import TINY_LLAMA

RELEASES = gt.load_releases()
# vllm-10517-20k: Llama-3.1-8B (32 layers, hidden 4096, 32 heads, 8 KV heads x 128)
LLAMA8B = next(c for c in gt.load_cases() if c["id"] == "vllm-10517-20k")["config"]
H100 = dict(gpu={"memory_mib": 81559, "compute_capability": "9.0"}, gpu_count=1, checkpoint_bytes=16 * 10**9,
            releases=RELEASES)


def test_adapter_slots_enter_the_weights_per_gpu():
    plain = vm.memory_plan(LLAMA8B, **H100)
    lora = vm.memory_plan(LLAMA8B, enable_lora=True, max_loras=4, max_lora_rank=64, **H100)
    # per layer and slot at rank 64, bf16: qkv 3x64x4096 + (4096 + 2x1024)x64, o 64x4096 + 4096x64,
    # gate_up 2x64x4096 + 2x14336x64, down 64x14336 + 4096x64 -> x 32 layers x 4 slots x 2 B
    r, h = 64, 4096
    inter = int(LLAMA8B.get("intermediate_size") or 4 * h)
    per_layer = 3 * r * h + (h + 2 * 1024) * r + r * h + h * r + 2 * r * h + 2 * inter * r + r * inter + h * r
    assert lora["per_gpu"]["weights_bytes"] - plain["per_gpu"]["weights_bytes"] == 4 * 32 * per_layer * 2
    assert lora["vllm_args"][-5:] == ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"]
    assert lora["lora"] == {"max_loras": 4, "max_lora_rank": 64} and "lora" not in plain
    assert lora["safe_max_model_len"] <= plain["safe_max_model_len"]


def test_tensor_parallel_shards_the_adapters():
    one = vm.memory_plan(LLAMA8B, enable_lora=True, **dict(H100, gpu_count=1))
    two = vm.memory_plan(LLAMA8B, enable_lora=True, **dict(H100, gpu_count=2))
    plain_one, plain_two = vm.memory_plan(LLAMA8B, **dict(H100, gpu_count=1)), vm.memory_plan(
        LLAMA8B, **dict(H100, gpu_count=2))
    extra = [p["per_gpu"]["weights_bytes"] - q["per_gpu"]["weights_bytes"]
             for p, q in ((one, plain_one), (two, plain_two))]
    assert 0 < extra[1] < extra[0]


def test_bad_lora_settings_are_refused_and_flags_are_owned():
    with pytest.raises(vm.SizingError, match="max_lora_rank 12 is not one vLLM accepts"):
        vm.memory_plan(LLAMA8B, enable_lora=True, max_lora_rank=12, **H100)
    with pytest.raises(vm.SizingError, match="max_loras must be >= 1"):
        vm.memory_plan(LLAMA8B, enable_lora=True, max_loras=0, **H100)
    plan = vm.memory_plan(TINY_LLAMA, gpu={"kind": "cpu", "kv_cache_space_gib": 1}, enable_lora=True,
                          releases=RELEASES)
    assert "--enable-lora" in plan["vllm_args"]
    with pytest.raises(vm.SizingError, match="--max-loras in the extra arguments is set by the plan"):
        vm.service(plan, model_dir="/m", extra_args=["--max-loras", "8"])
