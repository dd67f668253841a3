"""Several models on one node (vllm_node_instances): every instance is the single-model plan on its own GPUs, the
GPU groups come from the topology, shared GPUs are checked for their memory and started in order, and a split that
does not fit is refused in one message naming each instance's need and the fix. Without instances the plan is
today's, unchanged."""
from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_node_plan import MODELS, knobs

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import instances
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.units import GiB
from repo_root import ROOT

# Two sockets of 4 RTX PRO 6000, a PCIe switch per pair: what the simulated node's `nvidia-smi topo -m` answers
# (tests/fixtures/gpu_node/gpus.json), as node_facts_gpu_topology.
NUMA = [0, 0, 0, 0, 1, 1, 1, 1]
TOPOLOGY = {"gpus": [{"index": i, "numa": NUMA[i], "cpu_affinity": None} for i in range(8)],
            "links": [["X" if i == j else "PIX" if i // 2 == j // 2 else "NODE" if NUMA[i] == NUMA[j] else "SYS"
                       for j in range(8)] for i in range(8)]}
CUDA_MODELS = sorted(MODELS)
STORY = [{"name": "kimi", "model": "kimi-k2.5-nvfp4", "gpus": 6},
         {"name": "llama", "model": "llama-3.1-70b-instruct", "gpus": 2}]
FITS = [{"name": "llama", "model": "llama-3.1-70b-instruct", "gpus": 2},
        {"name": "gptoss", "model": "gpt-oss-120b", "gpus": 4},
        {"name": "qwen-next", "model": "qwen3-next-80b-a3b-instruct", "gpus": 2}]


def split(items: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    """node_plan for the story's node with these instances and the simulated topology."""
    return sizing.node_plan(knobs(instances=items, topology=TOPOLOGY, **overrides))


def single(model: str, count: int, port: int) -> tuple[dict[str, Any] | None, str]:
    """Today's single-model plan of `model` on `count` GPUs with every per-model knob at its default."""
    try:
        return sizing.node_plan(knobs(model=model, gpu_count=str(count), kv_cache_dtype="auto",
                                      gpu_memory_utilization="auto", max_model_len="auto", port=str(port))), ""
    except sizing.SizingError as exc:
        return None, str(exc)


def without_service(plan: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in plan.items() if k != "service"}


@pytest.mark.parametrize("model", CUDA_MODELS)
@pytest.mark.parametrize("count", [2, 4, 6])
def test_each_instance_is_the_single_plan_on_the_same_gpus(model: str, count: int) -> None:
    """Over the catalog: an instance's sizing is the single-model plan for its GPU count (or the same refusal); its
    service differs only by its port and CUDA_VISIBLE_DEVICES."""
    plan = split([{"name": "a", "model": model, "gpus": count},
                  {"name": "b", "model": "gpt-oss-120b", "gpus": 8 - count}])
    row = plan["instances"][0]
    expected, error = single(model, count, 8000)
    if expected is None:
        assert row["plan"] is None and row["error"] == instances.short_reason(error)
        return
    assert without_service(row["plan"]) == without_service(expected)
    service, alone = row["plan"]["service"], expected["service"]
    assert service["argv"] == alone["argv"]
    assert service["environment"] == dict(alone["environment"], CUDA_VISIBLE_DEVICES=row["cuda_visible_devices"])
    assert len(row["gpus"]) == count


def test_without_instances_the_plan_is_todays() -> None:
    """vllm_node_instances: [] and no topology give the single-model plan itself (the golden plans hold)."""
    today = sizing.node_plan(knobs())
    assert sizing.node_plan(knobs(instances=[], topology={})) == today
    assert "instances" not in today
    assert instances.instance_plans(today) == [("vllm", today)]


def test_the_storys_split_is_refused_with_each_instances_numbers_and_the_fix() -> None:
    """Kimi-K2.5 NVFP4 on 6 of 8 RTX PRO 6000 beside a 70B on 2: Kimi's weights do not fit 6 GPUs (TP 4 is the
    largest size 6 GPUs run), the 70B does; the smallest split needs 8 + 2 GPUs."""
    plan = split(STORY)
    assert plan["fits"] is False
    kimi, llama = plan["instances"]
    assert (kimi["gpus"], llama["gpus"]) == ([0, 1, 2, 3, 4, 5], [6, 7])
    llama_alone, _ = single("llama-3.1-70b-instruct", 2, 8001)
    assert llama_alone is not None and llama_alone["fits"]
    assert single("kimi-k2.5-nvfp4", 8, 8000)[0]["fits"]            # type: ignore[index]
    assert kimi["min_gpus"] == 8 and llama["min_gpus"] == 2
    weights = f"{llama_alone['per_gpu']['weights_bytes'] / GiB:.2f} GiB weights"
    _, kimi_error = single("kimi-k2.5-nvfp4", 6, 8000)
    for needle in ["The instances do not fit 8 x rtx-pro-6000-blackwell",
                   "kimi (kimi-k2.5-nvfp4) on GPUs 0,1,2,3,4,5: DOES NOT FIT: GPU too small for the weights",
                   instances.short_reason(kimi_error),
                   "it needs 8 GPU(s)", f"llama (llama-3.1-70b-instruct) on GPUs 6,7: fits: {weights}",
                   f"max-model-len {llama_alone['max_model_len']:,}",
                   "Fix: The smallest split needs 10 GPUs (kimi 8, llama 2) and the node has 8",
                   "serve llama on another node"]:
        assert needle in plan["message"]


def test_a_refusal_is_shortened_to_its_numbers() -> None:
    text = ("Cannot plan m on 6 x g (vLLM 0.33.0): GPU too small for the weights: 140.50 GiB of weights per GPU "
            "(591.0 GB checkpoint / (TP 4 x PP 1) = 137.60 GiB, + 1 % margin) plus 5.51 GiB activation peak exceed "
            "the 90.22 GiB vLLM may use (0.95 x 95.59 GiB). Use tensor_parallel_size >= 8 (needs 8 such GPUs)")
    assert instances.short_reason(text) == ("GPU too small for the weights: 140.50 GiB of weights per GPU plus 5.51 "
                                            "GiB activation peak exceed the 90.22 GiB vLLM may use (0.95 x 95.59 GiB)")
    assert instances.short_reason("vllm_node_kv_cache_dtype is 'int3'") == "vllm_node_kv_cache_dtype is 'int3'"


def test_a_split_that_fits_gets_disjoint_close_groups_ports_and_devices() -> None:
    plan = split(FITS)
    assert plan["fits"] is True and plan["message"] == ""
    rows = {r["name"]: r for r in plan["instances"]}
    assert rows["gptoss"]["gpus"] == [0, 1, 2, 3] and rows["gptoss"]["placement"] == "one NUMA node, NUMA node 0"
    assert rows["llama"]["gpus"] == [4, 5] and rows["qwen-next"]["gpus"] == [6, 7]
    assert [r["port"] for r in plan["instances"]] == [8000, 8001, 8002]
    for r in plan["instances"]:
        assert r["plan"]["service"]["environment"]["CUDA_VISIBLE_DEVICES"] == r["cuda_visible_devices"]
        assert r["plan"]["service"]["port"] == r["port"]
    assert plan["start_order"] == [["llama", "gptoss", "qwen-next"]]   # no GPU shared: all start at once
    assert "The split fits 8 x rtx-pro-6000-blackwell: llama (meta-llama/Llama-3.1-70B-Instruct)" in plan["summary"]


def shared(util_a: Any, util_b: Any, **b: Any) -> dict[str, Any]:
    return split([{"name": "a", "model": "gpt-oss-120b", "gpus": [6, 7], "gpu_memory_utilization": util_a},
                  {"name": "b", "model": "gpt-oss-120b", "gpus": [7, 6], "gpu_memory_utilization": util_b, **b},
                  {"name": "c", "model": "llama-3.1-70b-instruct", "gpus": 4}])


def test_instances_sharing_gpus_fit_within_the_safe_total_and_start_one_after_another() -> None:
    plan = shared(0.45, 0.45, max_model_len=8192)
    assert plan["fits"] is True
    a, b, c = plan["instances"]
    assert a["gpus"] == b["gpus"] == [6, 7] and c["gpus"] == [0, 1, 2, 3]
    assert b["start_after"] == ["a"] and a["shares_gpus_with"] == ["b"] and c["start_after"] == []
    assert plan["start_order"] == [["a", "c"], ["b"]]
    gpu6 = next(g for g in plan["gpus"] if g["index"] == 6)
    assert gpu6["memory_fraction"] == 0.9 and gpu6["used_bytes"] <= gpu6["total_bytes"]


@pytest.mark.parametrize(("util_a", "util_b", "needles"), [
    (0.5, 0.5, ["GPUs 6, 7 are shared by a, b: gpu-memory-utilization a 0.5, b 0.5 = 1 of the GPU (at most 0.95)",
                "set gpu_memory_utilization on every instance, summing to at most 0.95"]),
    (0.48, 0.48, ["= 0.96 of the GPU (at most 0.95)"]),   # the bytes would fit; the sum of fractions does not
    ("auto", 0.4, ["a left gpu_memory_utilization auto, which plans as if alone on the GPU"]),
])
def test_an_overcommitted_share_is_refused_naming_the_fractions(util_a: Any, util_b: Any, needles: list[str]) -> None:
    plan = shared(util_a, util_b)
    assert plan["fits"] is False
    for needle in needles:
        assert needle in plan["message"]


def test_node_wide_extras_apply_to_every_instance_and_its_own_come_after() -> None:
    plan = split(FITS[:1] + [dict(FITS[1], extra_args=["--enable-prefix-caching"],
                                  extra_environment={"OMP_NUM_THREADS": "4"})],
                 extra_args=["--disable-log-stats"], extra_environment={"OMP_NUM_THREADS": "1", "X": "y"})
    llama, gptoss = (r["plan"]["service"] for r in plan["instances"])
    assert "--disable-log-stats" in llama["argv"] and "--enable-prefix-caching" not in llama["argv"]
    assert gptoss["argv"][-2:] == ["--disable-log-stats", "--enable-prefix-caching"]
    assert llama["environment"]["OMP_NUM_THREADS"] == "1" and gptoss["environment"]["OMP_NUM_THREADS"] == "4"
    assert gptoss["environment"]["X"] == "y"


def test_more_gpus_asked_than_the_node_has() -> None:
    plan = split([{"name": "a", "model": "gpt-oss-120b", "gpus": 4}, {"name": "b", "model": "gpt-oss-120b", "gpus": 8}])
    assert plan["fits"] is False
    assert "the instances ask for 12 GPUs (a 4, b 8); the node has 8" in plan["message"]
    assert "a (gpt-oss-120b) on 4 GPU(s) (none left)" in plan["message"]   # b, the larger, was placed first


@pytest.mark.parametrize(("items", "overrides", "needle"), [
    ([{"name": "a", "model": "gpt-oss-120b"}, {"name": "b", "model": "gpt-oss-120b", "gpus": 2}], {},
     "vllm_node_instances[a].gpus is missing"),
    ([{"name": "a", "model": "gpt-oss-120b", "gpus": 2}, {"name": "a", "model": "gpt-oss-120b", "gpus": 2}], {},
     "vllm_node_instances[1].name is 'a': give each instance a unique name"),
    ([{"name": "Chat Bot", "model": "gpt-oss-120b", "gpus": 2}], {}, "name is 'Chat Bot'"),
    ([{"name": "a", "model": "gpt-oss-120b", "gpus": 2, "vllm_version": "0.33.0"}], {},
     "vllm_node_instances[a] has vllm_version, which an instance cannot set"),
    ([{"name": "a", "model": "gpt-oss-120b", "gpus": [7, 8]}], {}, "give distinct GPU indices 0..7"),
    ([{"name": "a", "gpus": 2}], {}, "vllm_node_instances[a].model is missing"),
    ([{"name": "a", "model": "gpt-oss-120b", "gpus": 2, "port": 9000},
      {"name": "b", "model": "gpt-oss-120b", "gpus": 2, "port": 9000}], {}, "two instances listen on the same port"),
    ([{"name": "a", "model": "gpt-oss-120b", "gpus": 2}], {"node_count": "2"}, "vllm_node_node_count must be 1"),
    ("chat", {}, "vllm_node_instances must be a list of instances"),
])
def test_bad_instances_are_one_message_naming_the_instance(items: Any, overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(sizing.SizingError) as caught:
        split(items, **overrides)
    assert needle in str(caught.value)


def test_one_instance_without_gpus_takes_them_all() -> None:
    plan = split([{"name": "solo", "model": "kimi-k2.5-nvfp4", "max_model_len": 131072}])
    assert plan["fits"] and plan["instances"][0]["gpus"] == list(range(8))
    assert without_service(plan["instances"][0]["plan"]) == without_service(sizing.node_plan(knobs(
        kv_cache_dtype="auto", gpu_memory_utilization="auto")))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["gpt-oss-120b", "llama-3.1-70b-instruct", "qwen3-next-80b-a3b-instruct"]),
                min_size=1, max_size=4),
       st.lists(st.sampled_from([1, 2, 4]), min_size=4, max_size=4))
def test_a_split_fits_exactly_when_every_instance_fits_its_own_gpus(models: list[str], counts: list[int]) -> None:
    items = [{"name": f"i{n}", "model": m, "gpus": counts[n]} for n, m in enumerate(models)]
    plan = split(items)
    asked = sum(counts[: len(models)])
    rows = plan["instances"]
    alone = [single(m, counts[n], 8000 + n)[0] for n, m in enumerate(models)]
    own = all(p is not None and p["fits"] and instances.uses_all(p, counts[n]) for n, p in enumerate(alone))
    assert plan["fits"] == (asked <= 8 and own)
    used = [g for r in rows for g in r["gpus"]]
    assert len(used) == len(set(used))   # disjoint
    if not plan["fits"]:
        assert all(f"{r['name']} ({r['model']})" in plan["message"] for r in rows)


DEMO_MODELS = yaml.safe_load((ROOT / "inventories/demo/group_vars/vllm_nodes/test_models.yml").read_text(
    encoding="utf-8"))["vllm_node_extra_models"]


def cpu_knobs(**overrides: Any) -> dict[str, Any]:
    """The demo node: vLLM's CPU build, 1 GiB of KV space, the tiny test models in the catalog."""
    return knobs(**dict(dict(models=dict(MODELS, **DEMO_MODELS), gpu="cpu", vllm_variant="cpu", gpu_count="auto",
                             cpu_kv_cache_space_gib=1, vllm_version="0.32.0", kv_cache_dtype="auto",
                             gpu_memory_utilization="auto", max_model_len="auto"), **overrides))


def test_the_cpu_device_runs_instances_one_after_another_without_gpu_groups() -> None:
    """Two tiny models on the demo's CPU node: no GPU group and no CUDA_VISIBLE_DEVICES; they share the host's
    memory, so the second starts after the first; each is the single CPU plan of its model."""
    plan = sizing.node_plan(cpu_knobs(instances=[{"name": "llama", "model": "tiny-llama"},
                                                 {"name": "mla", "model": "tiny-deepseek-v3", "gpus": 1}]))
    assert plan["fits"] is True and plan["device"] == "cpu" and plan["gpus"] == []
    llama, mla = plan["instances"]
    assert llama["gpus"] == [] and llama["cuda_visible_devices"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in llama["plan"]["service"]["environment"]
    assert plan["start_order"] == [["llama"], ["mla"]] and mla["start_after"] == ["llama"]
    for row, port in ((llama, 8000), (mla, 8001)):
        alone = sizing.node_plan(cpu_knobs(model=row["model"], port=str(port)))
        assert row["plan"] == alone
    with pytest.raises(sizing.SizingError, match=r"gpus is 2 on the cpu device, which has no GPUs: leave gpus out"):
        sizing.node_plan(cpu_knobs(instances=[{"name": "llama", "model": "tiny-llama", "gpus": 2}]))
