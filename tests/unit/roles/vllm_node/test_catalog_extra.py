"""The shape check of user catalog entries (vllm_node_extra_models / vllm_node_extra_gpus, plugins/filter/catalog.py):
each problem is named with the entry, the field and the fix; valid entries and amendments pass."""
from __future__ import annotations

from typing import Any

import pytest
import yaml
from test_catalogs import GPUS, PRODUCT, ROOT

from ansible_collections.vllm_node.vllm_node.plugins.filter import catalog

GOOD_MODEL: dict[str, Any] = {
    "repo": "acme/Small-8B", "checkpoint_bytes": 16_000_000_000,
    "config": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
               "max_position_embeddings": 32768},
}
GOOD_GPU: dict[str, Any] = {"kind": "cuda", "name": "NVIDIA Future", "memory_mib": 48000,
                            "compute_capability": "12.0", "pci_ids": ["10de:abcd"], "names": ["NVIDIA Future"]}


def merged(extra: dict[str, Any], product: dict[str, Any]) -> dict[str, Any]:
    """What the role's recursive combine gives for these keys (enough for the shallow amendments used here)."""
    return {key: {**product.get(key, {}), **value} if isinstance(value, dict) else value
            for key, value in extra.items()}


def test_a_complete_new_model_and_gpu_pass() -> None:
    assert catalog.catalog_errors({"small": GOOD_MODEL}, {"small": GOOD_MODEL}, "models") == []
    assert catalog.catalog_errors({"future": GOOD_GPU}, {"future": GOOD_GPU}, "gpus") == []


def test_an_amendment_of_a_product_entry_is_checked_merged() -> None:
    """{kimi-k2.5-nvfp4: {revision: <sha>}} alone is valid: the product entry supplies the rest."""
    extra = {"kimi-k2.5-nvfp4": {"revision": "0" * 40}}
    assert catalog.catalog_errors(extra, merged(extra, PRODUCT), "models") == []
    assert catalog.catalog_errors({"rtx-5090": {"memory_mib": 32000}},
                                  merged({"rtx-5090": {"memory_mib": 32000}}, GPUS), "gpus") == []


@pytest.mark.parametrize(("drop", "needles"), [
    ("repo", ["vllm_node_extra_models['small'].repo is missing", "repo: nvidia/Kimi-K2.5-NVFP4"]),
    ("checkpoint_bytes", ["vllm_node_extra_models['small'].checkpoint_bytes is missing", "metadata.total_size"]),
    ("config", ["vllm_node_extra_models['small'].config is missing", "num_hidden_layers"]),
])
def test_a_missing_model_field_is_named_with_the_fix(drop: str, needles: list[str]) -> None:
    entry = {k: v for k, v in GOOD_MODEL.items() if k != drop}
    errors = catalog.catalog_errors({"small": entry}, {"small": entry}, "models")
    assert len(errors) == 1, errors
    for needle in needles:
        assert needle in errors[0]


def test_incomplete_config_and_bad_types_are_each_named() -> None:
    entry = {**GOOD_MODEL, "config": {"num_hidden_layers": 2}, "quant": "fp8", "checkpoint_bytes": "16GB",
             "serving": {"trust_remote_code": "yes", "extra_args": "--enforce-eager"}}
    errors = " ".join(catalog.model_entry_errors("small", entry))
    for needle in ("checkpoint_bytes is '16GB'", "config lacks positive integers for num_attention_heads, "
                   "max_position_embeddings", "quant must be null", "trust_remote_code must be true or false",
                   "extra_args must be a list of strings"):
        assert needle in errors


def test_gpu_problems_are_named_with_the_fix() -> None:
    errors = " ".join(catalog.gpu_entry_errors("future", {**GOOD_GPU, "compute_capability": 12.0,
                                                         "memory_mib": None, "pci_ids": ["2bb5"]}))
    assert "compute_capability is 12.0: set it as a quoted string" in errors
    assert "memory_mib is None" in errors
    assert "pci_ids must be 'vendor:device'" in errors
    assert catalog.gpu_entry_errors("x", {"kind": "tpu"}) == [
        "vllm_node_extra_gpus['x'].kind must be cuda or cpu; got 'tpu'."]
    assert "kv_cache_space_gib" in catalog.gpu_entry_errors("big-cpu", {"kind": "cpu"})[0]


def test_not_a_mapping_is_refused() -> None:
    assert "must be a mapping of catalog key -> entry" in catalog.catalog_errors(["small"], {}, "models")[0]
    errors = catalog.catalog_errors({"small": "acme/x"}, {"small": "acme/x"}, "models")
    assert "must be a mapping of fields" in errors[0]


def test_the_fixture_catalog_is_a_valid_extra_catalog() -> None:
    """tests/fixtures/catalog/models.yml is used exactly as a user's vllm_node_extra_models would be."""
    extra = yaml.safe_load((ROOT / "tests/fixtures/catalog/models.yml").read_text())["vllm_node_extra_models"]
    assert catalog.catalog_errors(extra, extra, "models") == []


@pytest.mark.parametrize("spec", [{"num_speculative_tokens": 3}, {"method": "eagle3", "num_speculative_tokens": 0},
                                  "eagle3", {"method": "mtp", "num_speculative_tokens": "3"}])
def test_a_malformed_speculative_config_is_named_with_its_shape(spec: Any) -> None:
    entry = dict(GOOD_MODEL, speculative_config=spec)
    errors = catalog.catalog_errors({"small": entry}, {"small": entry}, "models")
    assert len(errors) == 1 and "speculative_config must be a mapping shaped like vLLM's --speculative-config" in \
        errors[0], errors


def test_the_products_speculative_configs_pass_and_one_can_be_added() -> None:
    entry = dict(GOOD_MODEL, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                 "prompt_lookup_max": 4})
    assert catalog.catalog_errors({"small": entry}, {"small": entry}, "models") == []
    assert catalog.catalog_errors(PRODUCT, PRODUCT, "models") == []
