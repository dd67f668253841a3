"""Speculative decoding (vLLM's --speculative-config): the drafter's KV layers, state blocks, weights, the flag."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from sizing_cases import KIMI, KIMI_TEXT, STORY_HARDWARE, TINY_LLAMA

RELEASES = gt.load_releases()
CASES = {c["id"]: c for c in gt.load_cases()}
QWEN36 = CASES["club3090-652"]["config"]            # 30 GDN + 10 full layers, mtp_num_hidden_layers 1
KIMI_MTP = dict(KIMI, text_config=dict(KIMI_TEXT, num_nextn_predict_layers=1))
MiB, GiB = 1 << 20, 1 << 30


def layout(config, spec=None, **kw):
    return vm.kv_layout(config, releases=RELEASES, speculative_config=spec, **kw)


def test_mtp_adds_the_checkpoints_mtp_layer_as_a_full_attention_layer():
    plain, mtp = layout(KIMI_MTP, tensor_parallel_size=8), layout(
        KIMI_MTP, {"method": "mtp", "num_speculative_tokens": 3}, tensor_parallel_size=8)
    assert len(mtp.specs) == len(plain.specs) + 1 and mtp.specs[-1] == plain.specs[0]
    assert mtp.bytes_per_token == plain.bytes_per_token * 62 // 61      # one more MLA layer of 61
    assert mtp.needed_bytes(131072) == plain.needed_bytes(131072) * 62 // 61


def test_mtp_on_a_hybrid_adds_state_blocks_per_speculative_token():
    base = dict(kv_cache_dtype="fp8")
    plain = layout(QWEN36, **base)
    mtp = layout(QWEN36, {"method": "qwen3_next_mtp", "num_speculative_tokens": 3}, **base)
    states = [s.state_blocks for s in mtp.specs if s.kind == "mamba"]
    assert set(states) == {2 + 3}                       # align mode (2) + one per speculative token
    assert sum(1 for s in mtp.specs if s.kind == "full") == 11
    length, available = 131072, int(6.01 * GiB)
    assert mtp.max_concurrency(available, length) < plain.max_concurrency(available, length)


def test_ngram_adds_nothing_and_mtp_needs_mtp_layers():
    assert layout(TINY_LLAMA, {"method": "ngram", "num_speculative_tokens": 4}) == layout(TINY_LLAMA)
    with pytest.raises(vm.SizingError, match="method mtp needs MTP layers"):
        layout(TINY_LLAMA, {"method": "mtp", "num_speculative_tokens": 1})
    with pytest.raises(vm.SizingError, match="not supported; known: mtp, eagle"):
        layout(TINY_LLAMA, {"method": "medusa2", "num_speculative_tokens": 1})
    with pytest.raises(vm.SizingError, match="num_speculative_tokens is required"):
        layout(TINY_LLAMA, {"method": "ngram"})


def test_eagle3_adds_the_draft_models_layers_with_its_own_geometry():
    with pytest.raises(vm.SizingError, match="needs model"):
        layout(TINY_LLAMA, {"method": "eagle3", "num_speculative_tokens": 3})
    draft = dict(TINY_LLAMA, num_hidden_layers=1, num_key_value_heads=4)
    eagle = layout(TINY_LLAMA, {"method": "eagle3", "num_speculative_tokens": 3, "model": "org/draft",
                                "draft_config": draft})
    assert [s.per_token for s in eagle.specs] == [256, 256, 512]     # 2 target layers + the draft's 4 KV heads
    default = layout(TINY_LLAMA, {"method": "eagle", "num_speculative_tokens": 3, "model": "org/draft"})
    assert len(default.specs) == 3 and default.specs[-1] == default.specs[0]


def test_the_plan_renders_the_flag_and_sizes_the_draft_weights():
    spec = {"method": "eagle3", "num_speculative_tokens": 3, "model": "org/Kimi-K2.5-eagle3",
            "draft_checkpoint_bytes": 8 * 10**9, "draft_config": KIMI_MTP}
    kwargs = dict(STORY_HARDWARE, releases=RELEASES, kv_cache_dtype="bfloat16")
    plain = vm.memory_plan(KIMI, **kwargs)
    with_spec = vm.memory_plan(KIMI, speculative_config=spec, **kwargs)
    flag = with_spec["vllm_args"][with_spec["vllm_args"].index("--speculative-config") + 1]
    assert json.loads(flag) == {"method": "eagle3", "num_speculative_tokens": 3, "model": "org/Kimi-K2.5-eagle3"}
    assert with_spec["per_gpu"]["weights_bytes"] == plain["per_gpu"]["weights_bytes"] + 10**9
    assert with_spec["speculative_config"]["draft_layers"] == 61
    assert "speculative_config" not in plain and "--speculative-config" not in plain["vllm_args"]
    with pytest.raises(vm.SizingError, match="--speculative-config in the extra arguments is set by the plan"):
        vm.service(plain, model_dir="/m", extra_args=["--speculative-config", flag])


FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _safe(config, spec=None, **kw):
    try:
        return vm.memory_plan(config, speculative_config=spec, releases=RELEASES, **kw)["safe_max_model_len"]
    except vm.SizingError:     # refused (too small for the weights): nothing is safe
        return 0


@FAST
@given(a=st.integers(1, 8), b=st.integers(1, 8), mib=st.integers(90_000, 110_000),
       kv=st.sampled_from(["bfloat16", "fp8"]), method=st.sampled_from(["mtp", "eagle3", "ngram"]))
def test_speculative_tokens_never_increase_the_safe_length(a, b, mib, kv, method):
    low, high = sorted((a, b))
    hw = dict(STORY_HARDWARE, gpu_memory_bytes=mib * MiB, kv_cache_dtype=kv)
    spec = {"method": method, "model": "org/draft", "draft_checkpoint_bytes": 2 * 10**9}
    none = _safe(KIMI_MTP, **hw)
    few = _safe(KIMI_MTP, dict(spec, num_speculative_tokens=low), **hw)
    many = _safe(KIMI_MTP, dict(spec, num_speculative_tokens=high), **hw)
    assert many <= few <= none


@FAST
@given(a=st.integers(1, 16), b=st.integers(1, 16), mib=st.integers(90_000, 110_000),
       spec=st.sampled_from([None, {"method": "mtp", "num_speculative_tokens": 2}]))
def test_more_gpus_never_lower_the_safe_length(a, b, mib, spec):
    low, high = sorted((a, b))
    hw = dict(STORY_HARDWARE, gpu_memory_bytes=mib * MiB)
    assert _safe(KIMI_MTP, spec, **dict(hw, gpu_count=low)) <= _safe(KIMI_MTP, spec, **dict(hw, gpu_count=high))


def test_the_catalogs_kimi_eagle3_draft_plans_and_renders_its_flag():
    """The story's known speed-up, carried by the catalog entry: sized as one MLA draft layer, flag in the unit."""
    from sizing_golden import load_catalog
    entry = load_catalog()[0]["kimi-k2.5-nvfp4"]
    spec = entry["speculative_config"]
    assert spec["method"] == "eagle3" and spec["model"] == "lightseekorg/kimi-k2.5-eagle3-mla"
    kwargs = dict(STORY_HARDWARE, releases=RELEASES, kv_cache_dtype="bfloat16", max_model_len=131072,
                  gpu_memory_utilization=0.95)
    plain = vm.memory_plan(entry["config"], **dict(kwargs, quant=entry["quant"]))
    drafted = vm.memory_plan(entry["config"], speculative_config=spec, **dict(kwargs, quant=entry["quant"]))
    assert drafted["fits"] and drafted["speculative_config"]["draft_layers"] == 1
    assert drafted["kv"]["bytes_per_token"] == plain["kv"]["bytes_per_token"] * 62 // 61   # 61 layers + the draft
    argv = vm.service(drafted, model_dir="/srv/vllm/models/nvidia/Kimi-K2.5-NVFP4")["argv"]
    flag = argv[argv.index("--speculative-config") + 1]
    assert json.loads(flag) == spec
    assert "--speculative-config" not in vm.service(plain, model_dir="/m")["argv"]


@pytest.mark.parametrize("method, tokens", [("mtp", 2), ("ngram", 4)])
def test_speculative_tokens_add_conv_state_rows_to_linear_attention(method, tokens):
    """vLLM sizes a GDN/KDA layer's conv state (kernel - 1 + num_speculative_tokens) x conv dim / TP (the drafted
    tokens are verified in one step; mamba_utils.py, 0.32), whatever the drafter: the state page grows, and with it
    the attention block the hybrid's page unification picks. Qwen3-Next at TP 4: conv dim 8192 / 4, kernel 4."""
    from sizing_golden import load_catalog

    config = dict(load_catalog()[0]["qwen3-next-80b-a3b-instruct"]["config"], num_nextn_predict_layers=1)
    base = dict(tensor_parallel_size=4, kv_cache_dtype="bfloat16")
    plain = layout(config, **base)
    drafted = layout(config, {"method": method, "num_speculative_tokens": tokens}, **base)
    ssm = 32 // 4 * 128 * 128 * 2
    conv = 8192 // 4 * 2
    per_token = 1 * 2 * 256 * 2                      # 2 KV heads replicated to one per rank, head_dim 256
    for lay, rows in ((plain, 3), (drafted, 3 + tokens)):
        state = ssm + conv * rows
        block = 16 * -(-state // (16 * per_token))   # the smallest attention block whose page holds the state
        assert lay.block_size == block, (rows, lay.block_size)
        assert {s.page for s in lay.specs if s.kind == "mamba"} == {block * per_token}
    assert (plain.block_size, drafted.block_size) == (272, 288)
