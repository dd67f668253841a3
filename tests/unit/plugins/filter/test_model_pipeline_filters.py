"""Unit tests of the filter plugins of model_config and of model_download_planner_inputs (pure Python, no Ansible).

The rest of model_download is tested in tests/unit/plugins/module_utils/test_model_download_*.py.
"""

from __future__ import annotations

import importlib.util

import pytest
from ansible.errors import AnsibleFilterError

from repo_root import ROOT

md = importlib.import_module("ansible_collections.vllm_node.vllm_node.plugins.filter.model_download")
mc = importlib.import_module("ansible_collections.vllm_node.vllm_node.plugins.filter.model_config")

def found(root: str, sizes: dict[str, int]) -> list[dict]:
    """What ansible.builtin.find (recurse, hidden, file_type=file) returns for files below root: absolute paths."""
    return [{"path": f"{root}/{rel}", "size": size, "mode": "0640", "isreg": True} for rel, size in sizes.items()]


PLAN_017 = {
    "attention": "mla",
    "checkpoint_kv_cache_dtype": "fp8_e4m3",
    "checkpoint_kv_cache_dtype_supported": False,
    "vllm_version": "0.17.0",
    "compute_capability": "12.0",
}


def _rules():
    import yaml

    return yaml.safe_load((ROOT / "roles/model_config/vars/main.yml").read_text())["__model_config_rules"]


def test_version_tuple_orders_releases() -> None:
    assert mc.version_tuple("0.17.1rc2") == (0, 17, 1)
    assert mc.version_tuple("0.17.0") < mc.version_tuple("0.18.0") < mc.version_tuple("0.33.0")
    assert mc.version_tuple("0.18") == mc.version_tuple("0.18.0")
    assert mc.version_tuple("0.15.2rc1.dev93+g11") == (0, 15, 2)


def test_sm120_rule_matches_old_vllm_plan() -> None:
    assert [r["id"] for r in mc.matching_rules(_rules(), PLAN_017)] == ["sm120-mla-fp8-kv-before-0.18"]


@pytest.mark.parametrize(
    "override",
    [
        {"checkpoint_kv_cache_dtype_supported": True, "vllm_version": "0.33.0"},
        {"attention": "full"},
        {"checkpoint_kv_cache_dtype": None},
        {"checkpoint_kv_cache_dtype": "bfloat16"},
        # no verdict in the plan: fall back to SM120 + version; a fixed vLLM or another GPU -> no rule
        {"checkpoint_kv_cache_dtype_supported": None, "vllm_version": "0.18.0"},
        {"checkpoint_kv_cache_dtype_supported": None, "compute_capability": "10.0"},
    ],
)
def test_sm120_rule_does_not_match(override: dict) -> None:
    assert mc.matching_rules(_rules(), {**PLAN_017, **override}) == []


def test_sm120_rule_fallback_without_plan_verdict() -> None:
    facts = {**PLAN_017, "checkpoint_kv_cache_dtype_supported": None}
    assert len(mc.matching_rules(_rules(), facts)) == 1
    facts.pop("compute_capability")
    assert mc.matching_rules(_rules(), facts) == []


def test_patch_removes_declared_keys_and_reports_them() -> None:
    rules = mc.matching_rules(_rules(), PLAN_017)
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    res = mc.patch_document(quant, "hf_quant_config.json", rules)
    assert res["content"] == {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}
    assert res["changes"] == [
        {"rule": "sm120-mla-fp8-kv-before-0.18", "file": "hf_quant_config.json",
         "path": "quantization.kv_cache_quant_algo", "old": "FP8"}
    ]
    assert quant["quantization"]["kv_cache_quant_algo"] == "FP8", "input must not be modified"
    cfg = {"architectures": ["DeepseekV3ForCausalLM"],
           "quantization_config": {"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}
    out = mc.patch_all({"config.json": cfg, "hf_quant_config.json": quant}, rules)
    assert "kv_cache_scheme" not in out["config.json"]["content"]["quantization_config"]
    assert list(out["config.json"]["content"]) == ["architectures", "quantization_config"], "key order kept"


def test_patch_absent_path_is_not_a_change() -> None:
    rules = mc.matching_rules(_rules(), PLAN_017)
    assert mc.patch_document({"architectures": []}, "config.json", rules)["changes"] == []
    assert mc.patch_document({"quantization_config": None}, "config.json", rules)["changes"] == []


def test_file_sources_tell_fresh_downloads_from_our_patches() -> None:
    stats = {
        "config.json": {"exists": True, "checksum": "patched"},
        "config.json.orig": {"exists": True, "checksum": "orig"},
        "hf_quant_config.json": {"exists": True, "checksum": "new-download"},
        "hf_quant_config.json.orig": {"exists": True, "checksum": "old-orig"},
        "generation_config.json": {"exists": False},
        "generation_config.json.orig": {"exists": False},
    }
    state = {"files": {"config.json": {"patched_sha1": "patched"}, "hf_quant_config.json": {"patched_sha1": "x"}}}
    got = {f["name"]: f for f in mc.file_sources(["config.json", "hf_quant_config.json", "generation_config.json"],
                                                  stats, state)}
    assert set(got) == {"config.json", "hf_quant_config.json"}
    assert got["config.json"]["source"] == "config.json.orig" and not got["config.json"]["stale_orig"]
    assert got["hf_quant_config.json"]["source"] == "hf_quant_config.json" and got["hf_quant_config.json"]["stale_orig"]


def test_state_record_keeps_written_files_only() -> None:
    patches = {"config.json": {"changes": [{"rule": "r1"}, {"rule": "r1"}]}, "hf_quant_config.json": {"changes": []}}
    written = [{"item": {"name": "config.json"}, "checksum": "abc"},
               {"item": {"name": "hf_quant_config.json"}, "skipped": True}]
    assert mc.state_record(written, patches) == {"files": {"config.json": {"patched_sha1": "abc", "rules": ["r1"]}}}


SHARDS = [
    {"path": "model-00001-of-00002.safetensors", "size": 1000},
    {"path": "model-00002-of-00002.safetensors", "size": 500},
    {"path": "config.json", "size": 670},
]


def test_planner_inputs_take_the_index_total_size_first() -> None:
    got = md.planner_inputs({"architectures": ["X"]}, {"metadata": {"total_size": 1400}}, {"quantization": {}}, SHARDS)
    assert got == {
        "config": {"architectures": ["X"]},
        "quant_config": {"quantization": {}},
        "checkpoint_bytes": 1400,
        "checkpoint_bytes_source": "index",
    }


@pytest.mark.parametrize("index", [None, {}, {"weight_map": {}}, {"metadata": {}}, {"metadata": {"total_size": 0}}])
def test_planner_inputs_fall_back_to_the_sum_of_the_shards(index) -> None:
    got = md.planner_inputs({"a": 1}, index, None, SHARDS)
    assert (got["checkpoint_bytes"], got["checkpoint_bytes_source"]) == (1500, "shards")
    assert got["quant_config"] == {}


def test_planner_inputs_shards_from_a_local_listing_with_absolute_paths() -> None:
    listing = found("/ctl/model", {"config.json": 670, "model.safetensors": 4096, "notes.safetensors.txt": 9})
    assert md.planner_inputs({}, None, None, listing)["checkpoint_bytes"] == 4096


def test_planner_inputs_without_index_or_shards_is_zero() -> None:
    got = md.planner_inputs(None, None, None, [{"path": "config.json", "size": 670}])
    assert got == {"config": {}, "quant_config": {}, "checkpoint_bytes": 0, "checkpoint_bytes_source": "none"}
    assert md.planner_inputs({})["checkpoint_bytes"] == 0


@pytest.mark.parametrize("total", [-1, "1400", 1.5, True])
def test_planner_inputs_refuse_a_bad_total_size(total) -> None:
    with pytest.raises(AnsibleFilterError, match="metadata.total_size must be a non-negative integer"):
        md.planner_inputs({}, {"metadata": {"total_size": total}}, None, SHARDS)


@pytest.mark.parametrize(("config", "index", "quant", "name"), [
    ([1], None, None, "config.json"),
    ({}, "text", None, "model.safetensors.index.json"),
    ({}, None, [], "hf_quant_config.json"),
])
def test_planner_inputs_refuse_documents_that_are_not_objects(config, index, quant, name) -> None:
    with pytest.raises(AnsibleFilterError, match=f"{name} must hold a JSON object"):
        md.planner_inputs(config, index, quant, [])
