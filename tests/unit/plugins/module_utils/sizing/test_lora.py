"""LoRA (--enable-lora, --max-loras, --max-lora-rank): adapter slots in the budget, the flags in the plan; the
inventory's adapters (tiny ones, generated like the tiny models) checked against the base before anything changes,
served from their pinned directory, outside the restart fingerprint."""

from __future__ import annotations

from typing import Any

import pytest
from test_instances import cpu_knobs

import sizing_groundtruth as gt
import tiny_models
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.lora_adapters import adapter_metadata
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


# --- the inventory's adapters (vllm_node_lora_adapters), checked by node_plan before anything changes ---

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Tiny adapters' files as the vllm_plan action hands them to node_plan (config + header shapes)."""
    out = tmp_path_factory.mktemp("adapters")
    tiny_models.write_adapter(out, "good", "tiny-llama", rank=8)
    tiny_models.write_adapter(out, "good-mlp", "tiny-llama", rank=16, targets=("gate_proj", "down_proj"))
    tiny_models.write_adapter(out, "r64", "tiny-llama", rank=64)
    tiny_models.write_adapter(out, "deepseek", "tiny-llama", rank=8, targets=("o_proj",),
                              trained_on="tiny-deepseek-v3")
    return {name: adapter_metadata(out / tiny_models.ORG / name) for name in ("good", "good-mlp", "r64", "deepseek")}


def entry(name: str, files: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """One vllm_node_lora_adapters entry for tiny-llama, with its files when given."""
    return {"name": name, "repository": f"vllm-node-test/{name}", "revision": COMMIT, "base": "tiny-llama",
            **(files or {}), **overrides}


def lora_plan(adapter_entries: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    return vm.node_plan(cpu_knobs(model="tiny-llama", lora_adapters=adapter_entries,
                                  **dict(dict(enable_lora="true", max_loras="1", max_lora_rank="16"), **overrides)))


def test_adapters_of_the_base_are_served_from_their_pinned_directory_outside_the_fingerprint(adapters) -> None:
    plan = lora_plan([entry("good", adapters["good"]), entry("good-mlp", adapters["good-mlp"])], max_loras="2")
    root = "/srv/vllm/models/lora/vllm-node-test"
    assert [(a["name"], a["path"], a["checked"]) for a in plan["lora"]["adapters"]] == [
        ("good", f"{root}/good/revisions/{COMMIT}", True), ("good-mlp", f"{root}/good-mlp/revisions/{COMMIT}", True)]
    service = plan["service"]
    assert service["lora_modules"] == ["--lora-modules", f"good={root}/good/revisions/{COMMIT}",
                                       f"good-mlp={root}/good-mlp/revisions/{COMMIT}"]
    assert "--lora-modules" not in service["argv"]
    assert service["argv"][service["argv"].index("--enable-lora"):][:5] == [
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16"]
    assert service["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # a day-2 change of the adapters leaves the restart fingerprint as it was
    fewer = lora_plan([entry("good", adapters["good"])], max_loras="2")
    assert fewer["service"]["fingerprint"] == service["fingerprint"]
    assert fewer["service"]["lora_modules"] != service["lora_modules"]
    assert lora_plan([], max_loras="2")["service"]["fingerprint"] == service["fingerprint"]


def test_more_adapters_than_slots_raise_max_loras_and_the_plan_sizes_them(adapters) -> None:
    three = [entry(n, adapters["good"]) for n in ("a", "b", "c")]
    gpu = {"gpu": "rtx-pro-6000-blackwell", "vllm_variant": "cuda", "gpu_count": "1", "max_loras": "1"}
    plan, one = lora_plan(three, **gpu), lora_plan(three[:1], **gpu)
    assert plan["lora"]["max_loras"] == 3 and "--max-loras" in plan["vllm_args"]
    assert plan["vllm_args"][plan["vllm_args"].index("--max-loras") + 1] == "3"
    assert any("max_loras raised from 1 to 3" in note for note in plan["notes"])
    assert plan["per_gpu"]["weights_bytes"] > one["per_gpu"]["weights_bytes"]


@pytest.mark.parametrize(("make", "overrides", "needles"), [
    (lambda a: [entry("deepseek", a["deepseek"])], {},
     ["adapter deepseek was not trained for tiny-llama", "vllm-node-test/tiny-deepseek-v3",
      "maps 512 inputs to 128 outputs where the base's o_proj maps 128 to 64",
      "Use an adapter trained on tiny-llama"]),
    (lambda a: [entry("r64", a["r64"])], {},
     ["adapter r64 has rank 64, above the plan's max_lora_rank 16", "set vllm_node_max_lora_rank to 64"]),
    (lambda a: [entry("good", a["good"], base="kimi-k2.5-nvfp4")], {},
     ["adapter good belongs to base kimi-k2.5-nvfp4, but this node serves tiny-llama",
      "list it on a node serving kimi-k2.5-nvfp4"]),
    (lambda a: [entry("good", a["good"])], {"enable_lora": "false"},
     ["vllm_node_enable_lora is false", "set vllm_node_enable_lora to true"]),
    (lambda a: [entry("good", a["good"], revision="main")], {},
     ["adapter good: revision 'main' is not pinned", "40-hex commit"]),
    (lambda a: [entry("good", a["good"]), entry("good", a["good-mlp"])], {},
     ["adapter name good is listed twice"]),
    (lambda a: [entry("a=b", a["good"])], {}, ["'a=b' is not an adapter name"]),
    (lambda a: [entry("good", a["good"], repository="good")], {}, ["write it as owner/name"]),
    (lambda a: [entry("vllm-node-test/tiny-llama")], {}, ["is not an adapter name"]),
    (lambda a: [{"name": "x", "repository": "o/x", "revision": COMMIT}], {},
     ["vllm_node_lora_adapters[0] has no base"]),
])
def test_a_bad_adapter_is_refused_before_anything_naming_it_the_base_and_the_fix(
        adapters, make, overrides: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(vm.SizingError) as refused:
        lora_plan(make(adapters), **overrides)
    message = str(refused.value)
    assert message.startswith("Cannot serve the LoRA adapters of vllm_node_lora_adapters on tiny-llama: ")
    for needle in needles:
        assert needle in message, message


def test_an_adapter_without_files_is_served_unchecked_and_says_so() -> None:
    plan = lora_plan([entry("unread")])
    assert plan["lora"]["adapters"][0]["checked"] is False
    assert any("adapter unread: its files were not read" in note for note in plan["notes"])


def test_the_base_is_known_by_its_repository_and_served_name_too(adapters) -> None:
    by_repo = lora_plan([entry("good", adapters["good"], base="vllm-node-test/tiny-llama")])
    assert [a["base"] for a in by_repo["lora"]["adapters"]] == ["vllm-node-test/tiny-llama"]
    with pytest.raises(vm.SizingError, match="has the name the base tiny-llama is served under"):
        lora_plan([entry("served", adapters["good"])], served_model_name="served")


def test_each_instance_serves_the_adapters_of_its_name_or_model(adapters) -> None:
    """Two models on the demo node, LoRA on in each: an adapter names its instance or its model; the DeepSeek-shaped
    adapter that tiny-llama refuses fits tiny-deepseek-v3 (MLA: o_proj from heads x v_head_dim)."""
    plan = vm.node_plan(cpu_knobs(
        instances=[{"name": "llama", "model": "tiny-llama", "enable_lora": True},
                   {"name": "mla", "model": "tiny-deepseek-v3", "gpus": 1, "enable_lora": True}],
        lora_adapters=[entry("good", adapters["good"], base="llama"),
                       entry("deepseek", adapters["deepseek"], base="tiny-deepseek-v3")]))
    llama, mla = plan["instances"]
    assert plan["fits"] is True, plan.get("message")
    assert [a["name"] for a in llama["plan"]["lora"]["adapters"]] == ["good"]
    assert [a["name"] for a in mla["plan"]["lora"]["adapters"]] == ["deepseek"]
    with pytest.raises(vm.SizingError, match="adapter good belongs to base qwen, which no instance serves"):
        vm.node_plan(cpu_knobs(enable_lora="true", instances=[{"name": "llama", "model": "tiny-llama"}],
                               lora_adapters=[entry("good", adapters["good"], base="qwen")]))
