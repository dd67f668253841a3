"""Property tests (hypothesis) for the sizing maths and the plan."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from sizing_cases import KIMI, TINY_DSV3, TINY_LLAMA

GiB = 1 << 30
MiB = 1 << 20
RELEASES = gt.load_releases()
CASES = {c["id"]: c for c in gt.load_cases()}
# A spread of layouts: GQA, MLA, sliding window, chunked local, hybrid GDN, hybrid KDA+MLA.
CONFIGS = {
    "tiny-llama": (TINY_LLAMA, {}),
    "tiny-dsv3": (TINY_DSV3, {}),
    "kimi": (KIMI, {"tensor_parallel_size": 8, "kv_cache_dtype": "bfloat16"}),
    "gpt-oss": (CASES["vllm-27508"]["config"], {}),
    "llama4-scout": (CASES["vllm-19407"]["config"], {"tensor_parallel_size": 8}),
    "qwen3.6-gdn": (CASES["club3090-652"]["config"], {"kv_cache_dtype": "fp8"}),
    "kimi-linear": (CASES["vllm-28228"]["config"], {"tensor_parallel_size": 2}),
}
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
names = st.sampled_from(sorted(CONFIGS))


@FAST
@given(name=names, a=st.integers(0, 64 * GiB), b=st.integers(0, 64 * GiB))
def test_more_kv_memory_never_lowers_the_estimated_length(name, a, b):
    config, kw = CONFIGS[name]
    low, high = sorted((a, b))
    upper = 262144
    assert vm.max_model_len(config, low, max_model_len=upper, releases=RELEASES, **kw) <= \
        vm.max_model_len(config, high, max_model_len=upper, releases=RELEASES, **kw)


@FAST
@given(name=names, a=st.integers(1, 1 << 21), b=st.integers(1, 1 << 21))
def test_kv_need_is_monotonic_in_max_model_len(name, a, b):
    config, kw = CONFIGS[name]
    low, high = sorted((a, b))
    assert vm.kv_cache_bytes(config, low, releases=RELEASES, **kw) <= \
        vm.kv_cache_bytes(config, high, releases=RELEASES, **kw)


@FAST
@given(name=names, available=st.integers(0, 64 * GiB))
def test_the_estimated_length_fits_and_one_more_token_would_not(name, available):
    config, kw = CONFIGS[name]
    layout = vm.kv_layout(config, releases=RELEASES, **kw)
    upper = 1 << 20
    length = layout.estimate_max_model_len(available, upper)
    null_block = max(layout.bytes_per_block(s) for s in layout.active_stages())
    if length:
        assert layout.needed_bytes(length) <= available - null_block
    if 0 < length < upper:
        assert layout.needed_bytes(length + 1) > available - null_block


@FAST
@given(mib_a=st.integers(100_000, 200_000), mib_b=st.integers(100_000, 200_000),
       util=st.sampled_from([0.85, 0.9, 0.92, 0.95, "auto"]), kv=st.sampled_from(["bfloat16", "fp8", "auto"]))
def test_more_gpu_memory_never_lowers_the_safe_length(mib_a, mib_b, util, kv):
    low, high = sorted((mib_a, mib_b))

    def safe(mib):
        return vm.memory_plan(KIMI, gpu_memory_bytes=mib * MiB, compute_capability="12.0", gpu_count=8,
                                   checkpoint_bytes=591 * 10**9, quant={"kv_cache_quant_algo": "FP8"},
                                   gpu_memory_utilization=util, kv_cache_dtype=kv,
                                   releases=RELEASES)["safe_max_model_len"]

    assert safe(low) <= safe(high)


@FAST
@given(mib=st.integers(100_000, 200_000), kv=st.sampled_from(["bfloat16", "fp8", "auto"]),
       util=st.sampled_from(["auto", 0.9, 0.95]), version=st.sampled_from(["0.17.0", "0.20.0", "0.33.0"]))
def test_recommended_length_never_needs_more_than_the_available_kv(mib, kv, util, version):
    if version == "0.17.0" and kv == "fp8":
        return   # refused: TRITON_MLA has no fp8 KV before 0.18 (tested in test_sizing_plan)
    p = vm.memory_plan(KIMI, gpu_memory_bytes=mib * MiB, compute_capability="12.0", gpu_count=8,
                            checkpoint_bytes=591 * 10**9, quant={"kv_cache_quant_algo": "FP8"}, kv_cache_dtype=kv,
                            gpu_memory_utilization=util, vllm_version=version, releases=RELEASES)
    if p["max_model_len"] > 0:
        assert p["kv"]["needed_bytes"] + p["kv"]["bytes_per_block"] <= p["kv"]["available_bytes"]
        assert p["max_model_len"] <= p["safe_max_model_len"] <= p["model_max_model_len"]


@FAST
@given(name=names, available=st.integers(1 * GiB, 64 * GiB), length=st.integers(1, 262144))
def test_results_are_deterministic(name, available, length):
    config, kw = CONFIGS[name]
    first = (vm.kv_cache_bytes(config, length, releases=RELEASES, **kw),
             vm.kv_cache_tokens(config, available, length, releases=RELEASES, **kw),
             vm.max_model_len(config, available, max_model_len=262144, releases=RELEASES, **kw))
    second = (vm.kv_cache_bytes(config, length, releases=RELEASES, **kw),
              vm.kv_cache_tokens(config, available, length, releases=RELEASES, **kw),
              vm.max_model_len(config, available, max_model_len=262144, releases=RELEASES, **kw))
    assert first == second


@FAST
@given(kv=st.sampled_from(["bfloat16", "auto"]), length=st.sampled_from(["auto", 131072, 262144]))
def test_plans_are_deterministic(kv, length):
    kwargs = dict(gpu={"memory_mib": 97887, "compute_capability": "12.0"}, gpu_count=8,
                  checkpoint_bytes=591 * 10**9, quant={"kv_cache_quant_algo": "FP8"}, kv_cache_dtype=kv,
                  max_model_len=length, releases=RELEASES)
    assert vm.memory_plan(KIMI, **kwargs) == vm.memory_plan(KIMI, **kwargs)


def _safe_or_zero(config, **kwargs):
    """The plan's safe_max_model_len; 0 where the weights alone do not fit (the plan refuses)."""
    try:
        return vm.memory_plan(config, releases=RELEASES, **kwargs)["safe_max_model_len"]
    except vm.SizingError as err:
        if "GPU too small for the weights" in str(err):
            return 0
        raise


def _uncapped(config):
    """The config with a huge max_position_embeddings: the model's own maximum must not hide a difference."""
    if "text_config" in config:
        return dict(config, text_config=dict(config["text_config"], max_position_embeddings=1 << 22))
    return dict(config, max_position_embeddings=1 << 22)


# Models for the speculative / TP properties: MLA with an MTP module, hybrid GDN with MTP, plain GQA.
KIMI_MTP = _uncapped(dict(KIMI, text_config=dict(KIMI["text_config"], num_nextn_predict_layers=1)))
SPEC_MODELS = {
    "kimi-mtp": (KIMI_MTP, dict(gpu={"memory_mib": 97887, "compute_capability": "12.0"}, gpu_count=8,
                                checkpoint_bytes=591 * 10**9, quant={"kv_cache_quant_algo": "FP8"})),
    "qwen3.6-gdn-mtp": (_uncapped(CASES["club3090-652"]["config"]),
                        dict(gpu={"memory_mib": 49152, "compute_capability": "8.9"}, gpu_count=1,
                             checkpoint_bytes=22 * 10**9)),
}


@FAST
@given(name=st.sampled_from(sorted(SPEC_MODELS)), a=st.integers(0, 7), b=st.integers(0, 7),
       method=st.sampled_from(["mtp", "eagle3", "ngram"]), kv=st.sampled_from(["auto", "fp8"]))
def test_more_speculative_tokens_never_raise_the_safe_length(name, a, b, method, kv):
    """Speculative tokens (0 = off) only add KV layers, state blocks and lookahead: the safe length never grows."""
    config, hardware = SPEC_MODELS[name]
    fewer, more = sorted((a, b))

    def spec(tokens):
        if tokens == 0:
            return None
        out = {"method": method, "num_speculative_tokens": tokens}
        return dict(out, model="org/draft") if method == "eagle3" else out

    kwargs = dict(hardware, kv_cache_dtype=kv, gpu_memory_utilization=0.9)
    assert _safe_or_zero(config, speculative_config=spec(more), **kwargs) <= \
        _safe_or_zero(config, speculative_config=spec(fewer), **kwargs)


TP_MODELS = {
    "kimi": (KIMI, dict(gpu={"memory_mib": 97887, "compute_capability": "12.0"}, checkpoint_bytes=591 * 10**9,
                        quant={"kv_cache_quant_algo": "FP8"})),
    "qwen3-235b": (CASES["vllm-21348"]["config"], dict(gpu={"memory_mib": 81559, "compute_capability": "9.0"},
                                                       checkpoint_bytes=236 * 10**9)),
    "llama4-scout": (CASES["vllm-19407"]["config"], dict(gpu={"memory_mib": 81559, "compute_capability": "9.0"},
                                                         checkpoint_bytes=218 * 10**9)),
    "gpt-oss": (CASES["vllm-27508"]["config"], dict(gpu={"memory_mib": 81559, "compute_capability": "9.0"},
                                                    checkpoint_bytes=65 * 10**9)),
}


@FAST
@given(name=st.sampled_from(sorted(TP_MODELS)), a=st.sampled_from([1, 2, 4, 8]), b=st.sampled_from([1, 2, 4, 8]),
       kv=st.sampled_from(["auto", "fp8"]), util=st.sampled_from(["auto", 0.9]),
       version=st.sampled_from(["0.20.0", "0.33.0"]))
def test_more_gpus_never_lower_the_safe_length(name, a, b, kv, util, version):
    """Tensor parallel over more GPUs (gpu_count = TP) shards weights and KV heads: the safe length never drops."""
    config, hardware = TP_MODELS[name]
    config = _uncapped(config)
    low, high = sorted((a, b))

    def safe(tp):
        try:
            return _safe_or_zero(config, gpu_count=tp, tensor_parallel_size=tp, kv_cache_dtype=kv,
                                 gpu_memory_utilization=util, vllm_version=version, **hardware)
        except vm.SizingError as err:
            if "divid" in str(err):   # TP must divide the attention heads: not a plan to compare
                return None
            raise

    small, large = safe(low), safe(high)
    if small is not None and large is not None:
        assert small <= large, f"TP {low}: {small} > TP {high}: {large}"
