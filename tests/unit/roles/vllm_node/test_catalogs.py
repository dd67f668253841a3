"""The model and GPU catalogs (roles/vllm_node/vars/main/models.yml, gpus.yml) and the test models' catalog
(tests/fixtures/catalog/models.yml, merged through vllm_node_extra_models) are well-formed data that the sizing
filters and the preflight role can rely on; the test models' entries equal what the generator writes, and no
test model is in the product catalog."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.filter import catalog
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from repo_root import ROOT
from sizing_groundtruth import load_releases

PRODUCT: dict[str, Any] = yaml.safe_load(
    (ROOT / "roles/vllm_node/vars/main/models.yml").read_text())["vllm_node_catalog_models"]
FIXTURE: dict[str, Any] = yaml.safe_load(
    (ROOT / "tests/fixtures/catalog/models.yml").read_text())["vllm_node_extra_models"]
# What the roles see when the fixture is merged (the demo inventory, the tests): both catalogs, checked alike.
MODELS: dict[str, Any] = {**PRODUCT, **FIXTURE}
GPUS: dict[str, Any] = yaml.safe_load(
    (ROOT / "roles/vllm_node/vars/main/gpus.yml").read_text())["vllm_node_catalog_gpus"]
TINY = ("tiny-llama", "tiny-llama-private", "tiny-deepseek-v3", "tiny-deepseek-v3-fp8kv")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: multimodal checkpoints nest them under text_config."""
    return config.get("text_config") or config


def test_required_models_are_catalogued() -> None:
    for key in ("kimi-k2.5-nvfp4", "deepseek-v3.1", "qwen3-235b-a22b", "llama-3.1-70b-instruct",
                "llama-3.1-405b-instruct", "gpt-oss-120b", "glm-4.6-fp8", "qwen3-next-80b-a3b-instruct"):
        assert key in PRODUCT, key
    assert set(FIXTURE) == set(TINY)


def test_test_models_stay_out_of_the_product_catalog() -> None:
    """The product ships real models only; the generated ones live in the fixture and are merged by the tests."""
    assert not set(PRODUCT) & set(FIXTURE)
    assert not [key for key, entry in PRODUCT.items() if entry["repo"].startswith("vllm-node-test/")]
    product_defaults = (ROOT / "roles/preflight/defaults/main.yml").read_text()
    assert not [key for key in TINY if key in product_defaults], "the planner's fallback model is a test fixture"


@pytest.mark.parametrize("key", sorted(MODELS))
def test_model_entry_passes_the_roles_shape_check(key: str) -> None:
    """The check the vllm_node role runs on vllm_node_extra_models accepts every shipped and fixture entry."""
    assert catalog.model_entry_errors(key, MODELS[key]) == []


@pytest.mark.parametrize("key", sorted(GPUS))
def test_gpu_entry_passes_the_roles_shape_check(key: str) -> None:
    assert catalog.gpu_entry_errors(key, GPUS[key]) == []


@pytest.mark.parametrize("key", sorted(MODELS))
def test_model_entry_shape(key: str) -> None:
    entry = MODELS[key]
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["repo"]), entry["repo"]
    assert entry["revision"] == "main" or re.fullmatch(r"[0-9a-f]{40}", entry["revision"])
    assert isinstance(entry["checkpoint_bytes"], int) and entry["checkpoint_bytes"] > 0
    assert entry["checkpoint_source"]
    tc = text_config(entry["config"])
    for field in ("num_hidden_layers", "num_attention_heads", "max_position_embeddings"):
        assert isinstance(tc[field], int) and tc[field] > 0, field
    if "kv_lora_rank" not in tc:  # MLA models size their cache from the latent width instead
        assert tc["num_attention_heads"] % tc["num_key_value_heads"] == 0
        head_dim = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
        assert head_dim > 0
    layer_types = tc.get("layer_types")
    if layer_types is not None:
        assert len(layer_types) == tc["num_hidden_layers"]
    assert entry["quant"] is None or isinstance(entry["quant"], dict)
    serving = entry["serving"]
    assert isinstance(serving["trust_remote_code"], bool)
    assert "reasoning_parser" in serving and "tool_call_parser" in serving
    assert all(isinstance(arg, str) for arg in serving["extra_args"])
    if serving["tool_call_parser"]:  # vLLM ignores a tool parser without auto tool choice
        assert "--enable-auto-tool-choice" in serving["extra_args"]


def test_kimi_entry_is_the_story_checkpoint() -> None:
    kimi = MODELS["kimi-k2.5-nvfp4"]
    assert kimi["repo"] == "nvidia/Kimi-K2.5-NVFP4"
    tc = kimi["config"]["text_config"]
    assert (tc["num_hidden_layers"], tc["kv_lora_rank"], tc["qk_rope_head_dim"]) == (61, 512, 64)
    assert tc["max_position_embeddings"] == 262144
    assert kimi["quant"]["kv_cache_quant_algo"] == "FP8"
    assert kimi["config"]["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    # 591 GB announced, 550 GiB on disk: the catalog must stay inside that band.
    assert 585e9 <= kimi["checkpoint_bytes"] <= 600e9
    serving = kimi["serving"]
    assert serving["trust_remote_code"] is True
    assert serving["reasoning_parser"] == serving["tool_call_parser"] == "kimi_k2"
    assert serving["extra_args"] == ["--enable-auto-tool-choice", "--mm-encoder-tp-mode", "data"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run the real tiny model generator once."""
    out = tmp_path_factory.mktemp("hub")
    subprocess.run([sys.executable, str(ROOT / "tests/fixtures/tiny_models.py"), "--out", str(out)],
                   check=True, capture_output=True)
    return out / "vllm-node-test"


@pytest.mark.parametrize("key", TINY)
def test_tiny_model_entries_equal_the_generator(generated: Path, key: str) -> None:
    entry = MODELS[key]
    assert entry["repo"] == f"vllm-node-test/{key}"
    repo = generated / key
    shipped = json.loads((repo / "config.json").read_text())
    for field, value in entry["config"].items():
        assert shipped.get(field, "<absent>") == value, f"{key}: config.{field}"
    index = json.loads((repo / "model.safetensors.index.json").read_text())
    assert entry["checkpoint_bytes"] == index["metadata"]["total_size"]
    quant_file = repo / "hf_quant_config.json"
    if entry["quant"] is None:
        assert not quant_file.exists()
    else:
        declared = json.loads(quant_file.read_text())["quantization"]
        for field, value in entry["quant"].items():
            assert declared[field] == value, f"{key}: quant.{field}"


def test_required_gpus_are_catalogued() -> None:
    assert {"rtx-pro-6000-blackwell", "b200", "h200", "h100-80gb", "a100-80gb", "l40s", "rtx-5090", "cpu"} <= set(GPUS)


@pytest.mark.parametrize("key", sorted(GPUS))
def test_gpu_entry_shape(key: str) -> None:
    gpu = GPUS[key]
    assert gpu["kind"] in ("cuda", "cpu")
    assert isinstance(gpu["nvswitch"], bool)
    if gpu["kind"] == "cpu":
        assert isinstance(gpu["kv_cache_space_gib"], int) and gpu["kv_cache_space_gib"] >= 1
        assert gpu["interconnect"] == "none" and not gpu["pci_ids"]
        return
    assert isinstance(gpu["memory_mib"], int) and 16_000 < gpu["memory_mib"] < 300_000
    assert re.fullmatch(r"\d+\.\d", gpu["compute_capability"])
    assert gpu["pci_ids"] and all(re.fullmatch(r"10de:[0-9a-f]{4}", p) for p in gpu["pci_ids"])
    assert gpu["name"] in gpu["names"]
    assert gpu["interconnect"] in ("pcie", "nvlink")
    assert not gpu["nvswitch"] or gpu["interconnect"] == "nvlink"


def test_pci_ids_and_names_identify_one_entry() -> None:
    """The preflight role matches detected GPUs by PCI id, then name: both must be unambiguous."""
    for attr in ("pci_ids", "names"):
        seen: dict[str, str] = {}
        for key, gpu in GPUS.items():
            for value in gpu[attr]:
                assert value not in seen, f"{value} in {seen.get(value)} and {key}"
                seen[value] = key


def test_simulated_gpu_node_matches_the_catalog() -> None:
    """The fixtures' default node (8 x RTX PRO 6000 Server Edition) is what the catalog entry describes."""
    data = json.loads((ROOT / "tests/fixtures/gpu_node/gpus.json").read_text())
    entry = GPUS["rtx-pro-6000-blackwell"]
    for gpu in data["gpus"]:
        assert gpu["pci_device_id"] in entry["pci_ids"]
        assert gpu["name"] in entry["names"]
        assert gpu["memory_total_mib"] == entry["memory_mib"]
        assert gpu["compute_cap"] == entry["compute_capability"]


# ---- every catalog entry can be planned, and its KV geometry matches the research notes

RELEASES = load_releases()
# Per-rank bf16 KV bytes per token at TP 8, computed independently in shared/docs/model-configs.yaml.
TP8_BF16_BYTES_PER_TOKEN = {
    "kimi-k2.5-nvfp4": 70272, "deepseek-v3.1": 70272, "qwen3-235b-a22b": 48128, "llama-3.1-70b-instruct": 40960,
    "llama-3.1-405b-instruct-fp8": 64512, "glm-4.6-fp8": 47104, "qwen3-next-80b-a3b-instruct": 12288,
}


def catalog_plan(key: str, gpu_key: str, count: int, **knobs: Any) -> dict[str, Any]:
    entry, gpu = MODELS[key], GPUS[gpu_key]
    return sizing.memory_plan(
        entry["config"], releases=RELEASES, checkpoint_bytes=entry["checkpoint_bytes"], gpu=gpu, gpu_count=count,
        device=gpu["kind"], vllm_variant="cpu" if gpu["kind"] == "cpu" else "cuda", quant=entry["quant"],
        model_key=key, repo=entry["repo"], gpu_key=gpu_key, **knobs)


@pytest.mark.parametrize("key", sorted(MODELS))
def test_every_model_plans_on_its_hardware(key: str) -> None:
    """Tiny models on the cpu device, the others on 8 x B200 (1.4 TB: every catalog checkpoint fits)."""
    gpu_key, count = ("cpu", 1) if key.startswith("tiny-") else ("b200", 8)
    plan = catalog_plan(key, gpu_key, count)
    assert plan["fits"] is True
    assert plan["model"] == key and plan["repo"] == MODELS[key]["repo"]
    model_max = text_config(MODELS[key]["config"])["max_position_embeddings"]
    assert plan["model_max_model_len"] == model_max
    assert 0 < plan["safe_max_model_len"] <= model_max


@pytest.mark.parametrize(("key", "expected"), sorted(TP8_BF16_BYTES_PER_TOKEN.items()))
def test_kv_bytes_per_token_match_the_research_notes(key: str, expected: int) -> None:
    plan = catalog_plan(key, "rtx-pro-6000-blackwell", 8, tensor_parallel_size=8, kv_cache_dtype="bfloat16")
    assert plan["kv"]["bytes_per_token"] == expected
