"""module_utils/lora_adapters.py on tiny adapters generated like the tiny models (tests/fixtures/tiny_models.py):
one for tiny-llama passes; one shaped for tiny-deepseek-v3, one of too high a rank, one with a module the base
lacks and one of another PEFT kind are refused with both models and the fix named; the slots grow with the count."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tiny_models
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import lora_adapters as la

BASE = "vllm-node-test/tiny-llama"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny adapters: a good one, one of another base, one of rank 64, one adapting a module tiny-llama lacks."""
    out = tmp_path_factory.mktemp("adapters")
    tiny_models.write_adapter(out, "tiny-llama-lora", "tiny-llama", rank=8)
    tiny_models.write_adapter(out, "tiny-llama-lora-mlp", "tiny-llama", rank=16, targets=("gate_proj", "down_proj"))
    tiny_models.write_adapter(out, "deepseek-lora", "tiny-llama", rank=8, targets=("o_proj",),
                              trained_on="tiny-deepseek-v3")
    tiny_models.write_adapter(out, "tiny-llama-lora-r64", "tiny-llama", rank=64)
    tiny_models.write_adapter(out, "mla-lora", "tiny-llama", rank=8, targets=("kv_b_proj",),
                              trained_on="tiny-deepseek-v3")
    return out / tiny_models.ORG


@pytest.fixture(scope="module")
def base_shapes() -> dict[str, tuple[int, ...]]:
    return tiny_models.llama_shapes(tiny_models.LLAMA_CONFIG)


def test_an_adapter_of_the_base_passes(hub: Path, base_shapes) -> None:
    for name in ("tiny-llama-lora", "tiny-llama-lora-mlp"):
        adapter = la.read_adapter(name, hub / name)
        assert adapter.peft_type == "LORA" and adapter.base_model == BASE
        assert la.adapter_problems(adapter, BASE, base_shapes, max_lora_rank=16) == []


def test_the_header_is_read_not_the_weights(hub: Path) -> None:
    path = hub / "tiny-llama-lora" / "adapter_model.safetensors"
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    shapes = la.safetensors_shapes(path.read_bytes()[:8 + length])
    assert shapes == la.read_safetensors_shapes(path)
    assert shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"] == (8, 64)
    assert shapes["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"] == (128, 8)
    with pytest.raises(ValueError, match="only"):
        la.safetensors_shapes(path.read_bytes()[:8 + length - 1])


def test_an_adapter_of_another_base_is_refused_naming_both(hub: Path, base_shapes) -> None:
    adapter = la.read_adapter("deepseek-lora", hub / "deepseek-lora")
    problems = la.adapter_problems(adapter, BASE, base_shapes, max_lora_rank=16)
    assert len(problems) == 1, problems
    assert f"not trained for {BASE}" in problems[0]
    assert "vllm-node-test/tiny-deepseek-v3" in problems[0]
    # tiny-deepseek-v3's o_proj maps 4 heads x 128 = 512 to hidden 128; tiny-llama's 128 to 64
    assert "maps 512 inputs to 128 outputs where the base's o_proj maps 128 to 64" in problems[0]
    assert problems[0].count("maps 512 inputs") == 1, "each reason once, not once per layer"


def test_a_module_the_base_lacks_is_named(hub: Path, base_shapes) -> None:
    adapter = la.read_adapter("mla-lora", hub / "mla-lora")
    [problem] = la.adapter_problems(adapter, BASE, base_shapes, max_lora_rank=16)
    assert "adapts model.layers.0.self_attn.kv_b_proj, a module the base does not have" in problem


def test_a_rank_above_the_slots_is_refused_with_the_setting_that_fits(hub: Path, base_shapes) -> None:
    adapter = la.read_adapter("tiny-llama-lora-r64", hub / "tiny-llama-lora-r64")
    [problem] = la.adapter_problems(adapter, BASE, base_shapes, max_lora_rank=16)
    assert "rank 64, above the plan's max_lora_rank 16" in problem
    assert "set vllm_node_max_lora_rank to 64" in problem
    assert la.adapter_problems(adapter, BASE, base_shapes, max_lora_rank=64) == []


def test_another_peft_kind_and_an_empty_file_are_refused(hub: Path, base_shapes) -> None:
    config = json.loads((hub / "tiny-llama-lora" / "adapter_config.json").read_text())
    ia3 = la.adapter_from("ia3", dict(config, peft_type="IA3"), {})
    problems = la.adapter_problems(ia3, BASE, base_shapes, max_lora_rank=16)
    assert any("IA3 adapter, not LoRA" in p for p in problems)
    assert any("no lora_A/lora_B tensors" in p for p in problems)


def test_a_rank_that_disagrees_with_the_matrices_is_refused(hub: Path, base_shapes) -> None:
    adapter = la.read_adapter("tiny-llama-lora", hub / "tiny-llama-lora")
    lying = la.adapter_from("lying", {"peft_type": "LORA", "r": 4}, adapter.shapes)
    [problem] = la.adapter_problems(lying, BASE, base_shapes, max_lora_rank=16)
    assert "rank 8/8, its config says r=4" in problem


def test_more_adapters_than_slots_raise_max_loras() -> None:
    adapters = [la.adapter_from(f"a{i}", {"peft_type": "LORA", "r": 8}, {}) for i in range(3)]
    assert la.slots_for(adapters, 4) == (4, "")
    slots, note = la.slots_for(adapters, 1)
    assert slots == 3 and "max_loras raised from 1 to 3" in note


@given(st.integers(min_value=1, max_value=512))
def test_next_rank_is_the_smallest_choice_that_holds_it(rank: int) -> None:
    chosen = la.next_rank(rank)
    assert chosen >= rank and chosen in la.MAX_LORA_RANKS
    assert all(choice < rank for choice in la.MAX_LORA_RANKS if choice < chosen)


def test_next_rank_above_every_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="above every"):
        la.next_rank(513)


def test_the_bases_linear_layers_come_from_config_json_alone(base_shapes) -> None:
    """tiny-llama's q/k/v/o and gate/up/down as its checkpoint has them, from config.json alone."""
    derived = la.base_linear_shapes(tiny_models.LLAMA_CONFIG)
    assert derived == {name: shape for name, shape in base_shapes.items()
                       if name.startswith("model.layers.") and len(shape) == 2}


def test_mla_and_moe_bases_give_the_projections_vllm_wraps_only() -> None:
    """tiny DeepSeek-V3 (MLA, MoE): o_proj with its heads x v_head_dim input; no q/k/v, no MLP of experts."""
    config = tiny_models.DEEPSEEK_CONFIG
    derived = la.base_linear_shapes(config)
    heads, v_dim = config["num_attention_heads"], config["v_head_dim"]
    assert derived == {f"model.layers.{i}.self_attn.o_proj.weight": (config["hidden_size"], heads * v_dim)
                       for i in range(config["num_hidden_layers"])}
    real = tiny_models.deepseek_shapes(config)
    assert all(real[name] == shape for name, shape in derived.items())
    assert la.base_linear_shapes({}) == {}


def test_adapter_metadata_is_json_data_of_the_files(hub: Path) -> None:
    metadata = la.adapter_metadata(hub / "tiny-llama-lora")
    assert metadata["config"]["r"] == 8 and json.loads(json.dumps(metadata)) == metadata
    assert metadata["shapes"]["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"] == [64, 8]
    with pytest.raises(FileNotFoundError):
        la.adapter_metadata(hub / "missing")


def test_downloaded_adapters_pair_each_entry_with_its_download_and_seal() -> None:
    entries = [{"name": "a", "repository": "o/a", "revision": "1" * 40, "base": "tiny-llama", "path": "/x"},
               {"name": "b", "repository": "o/b", "revision": "2" * 40, "base": "tiny-llama"}]
    marker = {"model_download_commit": "2" * 40, "model_download_dir": "/m/lora/o/b/revisions/" + "2" * 40,
              "model_download_complete": True, "model_download_file_sha256": {"z": "1", "a": "2"},
              "model_download_manifest_sha256": "h"}
    first = {"model_download_commit": "1" * 40, "model_download_dir": "/d"}
    sealed = {"model_download_complete": True, "model_download_file_sha256": {"f": "3"},
              "model_download_manifest_sha256": "s"}
    a, b = la.downloaded_adapters(entries, [first, marker], [sealed, {}])
    assert (a["dir"], a["files"], a["files_sha256"], a["complete"]) == ("/d", {"f": "3"}, "s", True)
    assert list(b["files"]) == ["a", "z"] and b["files_sha256"] == "h" and b["commit"] == "2" * 40
    assert la.downloaded_adapters(entries[:1], [{}], [{}])[0] | {"name": ""} == {
        "name": "", "repository": "o/a", "revision": "1" * 40, "base": "tiny-llama", "commit": None, "dir": None,
        "complete": False, "files": {}, "files_sha256": None}
    with pytest.raises(ValueError, match="2 adapters but 1 downloads and 2 seals"):
        la.downloaded_adapters(entries, [first], [{}, {}])


def test_plan_entry_keeps_the_inventory_keys_and_adds_the_read_files() -> None:
    entry = {"name": "a", "repository": "o/a", "revision": "1" * 40, "base": "m", "path": "/p", "extra": 1}
    assert la.plan_entry(entry, None) == {k: v for k, v in entry.items() if k != "extra"}
    read = {"config": {"r": 8}, "shapes": {"t": [8, 64]}}
    assert la.plan_entry(entry, read) == {"name": "a", "repository": "o/a", "revision": "1" * 40, "base": "m",
                                          "path": "/p", **read}
