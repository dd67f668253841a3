"""node_plan (the vllm_plan action's one call): the knobs as the inventory gives them -> vllm_node_plan.

The knobs are coerced and checked once, here; a refusal names the knob, says why and what to set instead. The
plan it returns is the one the two filters (vllm_memory_plan, vllm_service_command) build from typed arguments.
The vLLM release default is named once (vllm_node_vllm_version), and the Python default follows it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import inputs
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.versions import DEFAULT_VERSION
from repo_root import ROOT

VARS = ROOT / "roles" / "vllm_node" / "vars" / "main"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


MODELS = _load(VARS / "models.yml")["vllm_node_catalog_models"]
GPUS = _load(VARS / "gpus.yml")["vllm_node_catalog_gpus"]
RELEASES = gt.load_releases()


def knobs(**overrides: Any) -> dict[str, Any]:
    """The preflight's call for the story (8 x RTX PRO 6000, Kimi K2.5), knobs as -e gives them: strings."""
    args: dict[str, Any] = {
        "model": "kimi-k2.5-nvfp4", "models": MODELS, "model_config": {}, "quant_config": {},
        "checkpoint_bytes": "0", "served_model_name": "", "speculative_config": {}, "releases": RELEASES,
        "gpu": "rtx-pro-6000-blackwell", "gpus": GPUS, "detected_gpus": [], "gpu_source": "",
        "cpu_kv_cache_space_gib": None, "gpu_count": "8", "host": "node1", "vllm_version": DEFAULT_VERSION,
        "vllm_variant": "cuda",
        "tensor_parallel_size": "auto", "pipeline_parallel_size": "1", "node_count": "1", "pp_layer_partition": "",
        "load_mib_per_second": "auto", "decode_context_parallel_size": "auto", "kv_cache_dtype": "bfloat16",
        "gpu_memory_utilization": "0.95", "max_model_len": "131072", "enforce_eager": "false",
        "enable_lora": "false", "max_loras": "", "max_lora_rank": None, "cpu_amx": "no",
        "model_root": "/srv/vllm/models", "model_dir": "", "listen_address": "127.0.0.1", "port": "8000",
        "extra_args": [], "extra_environment": {}, "start_timeout": None, "shutdown_timeout": "30",
    }
    args.update(overrides)
    return args


def test_one_call_equals_the_two_filters_with_typed_arguments() -> None:
    """Strings from -e give the same plan (service block included) as the typed filter arguments."""
    entry = MODELS["kimi-k2.5-nvfp4"]
    typed = sizing.memory_plan(
        entry["config"], releases=RELEASES, checkpoint_bytes=entry["checkpoint_bytes"],
        gpu=GPUS["rtx-pro-6000-blackwell"], gpu_count=8, device="cuda", vllm_version=DEFAULT_VERSION,
        vllm_variant="cuda", quant=entry.get("quant"), tensor_parallel_size="auto", pipeline_parallel_size=1,
        node_count=1, pp_layer_partition=None, load_mib_per_second="auto", decode_context_parallel_size="auto",
        kv_cache_dtype="bfloat16", gpu_memory_utilization=0.95, max_model_len=131072, enforce_eager=False,
        speculative_config=None, enable_lora=False, max_loras=None, max_lora_rank=None, cpu_amx=False,
        model_key="kimi-k2.5-nvfp4", repo=entry["repo"],
        served_model_name=entry.get("served_model_name") or entry["repo"], gpu_key="rtx-pro-6000-blackwell")
    typed.update(config_source="catalog", revision=entry.get("revision") or "main",
                 checkpoint_bytes=entry["checkpoint_bytes"])
    typed["service"] = sizing.service(
        typed, model_dir=f"/srv/vllm/models/{entry['repo']}", listen_address="127.0.0.1", port=8000,
        serving=entry.get("serving") or {}, extra_args=[], extra_environment={}, start_timeout=None,
        shutdown_timeout=30)
    assert sizing.node_plan(knobs()) == typed
    # group_vars give ints and floats: the same plan
    assert sizing.node_plan(knobs(gpu_count=8, max_model_len=131072, gpu_memory_utilization=0.95, port=8000,
                                  shutdown_timeout=30, enforce_eager=False)) == typed


def detected(count: int, key: str = "rtx-pro-6000-blackwell", memory_mib: int = 97250) -> list[dict[str, Any]]:
    """The node's GPUs as the gpu_catalog_match filter gives them (node_facts_gpus matched to the catalog)."""
    return [{"key": key, "name": GPUS[key]["name"], "pci_device_id": "2bb5", "memory_total_mib": memory_mib - i,
             "compute_capability": "12.0"} for i in range(count)]


def test_auto_gpu_count_takes_the_detected_gpus_and_an_explicit_one_is_checked_against_them() -> None:
    p = sizing.node_plan(knobs(gpu="auto", gpu_count="auto", detected_gpus=detected(8)))
    assert (p["gpu"], p["gpu_count"]) == ("rtx-pro-6000-blackwell", 8)
    assert p["per_gpu"]["total_bytes"] == (97250 - 7) * 2**20, "the smallest card's memory, as nvidia-smi says"
    with pytest.raises(sizing.SizingError, match=r"vllm_node_gpu_count=8 but the node has 4 x rtx-pro-6000"):
        sizing.node_plan(knobs(detected_gpus=detected(4)))
    with pytest.raises(sizing.SizingError, match=r"vllm_node_gpu_count is auto but no rtx-pro-6000-blackwell GPU "
                                                 r"was detected on node1.*-e vllm_node_gpu_count=8"):
        sizing.node_plan(knobs(gpu_count="auto"))


@pytest.mark.parametrize(("overrides", "needles"), [
    ({"gpu": "rtx-6000"}, ["Unknown GPU 'rtx-6000' (vllm_node_gpu)", "Set vllm_node_gpu to one of:", "b200"]),
    ({"gpu": "auto"}, ["vllm_node_gpu is auto but no GPU was detected on node1 (node_facts_gpu_source: not gathered)"]),
    ({"gpu": "auto", "detected_gpus": [{"key": None, "name": "Matrox G200", "pci_device_id": "0522"}]},
     ["The node's GPUs are not in the GPU catalog: Matrox G200 (0522)", "vllm_node_extra_gpus"]),
    ({"gpu": "auto", "detected_gpus": detected(1) + detected(1, "h100-80gb", 81559)},
     ["The node has different GPU types (rtx-pro-6000-blackwell, h100-80gb)", "set vllm_node_gpu"]),
    ({"gpu": "h100-80gb", "detected_gpus": detected(8)},
     ["vllm_node_gpu=h100-80gb but the node reports 8 x NVIDIA RTX PRO 6000", "set vllm_node_gpu to auto"]),
    ({"vllm_variant": "cpu"}, ["vllm_node_gpu=rtx-pro-6000-blackwell is a cuda device but vllm_node_vllm_variant=cpu",
                               "the cpu build runs only on the cpu device"]),
])
def test_the_gpu_is_checked_against_the_catalog_the_build_and_the_node(overrides: dict[str, Any],
                                                                       needles: list[str]) -> None:
    with pytest.raises(sizing.SizingError) as caught:
        sizing.node_plan(knobs(**overrides))
    for needle in needles:
        assert needle in str(caught.value), str(caught.value)


def test_a_pure_knob_is_refused_before_the_gpu_is_looked_for() -> None:
    """plan.yml without vllm_node_gpu on a controller: the bad knob is named, not the missing GPU facts."""
    with pytest.raises(sizing.SizingError, match="vllm_node_kv_cache_dtype is 'int3'"):
        sizing.node_plan(knobs(gpu="auto", gpu_count="auto", kv_cache_dtype="int3"))


@pytest.mark.parametrize(("overrides", "needles"), [
    ({"kv_cache_dtype": "int3"}, ["vllm_node_kv_cache_dtype is 'int3'", "set it to auto", "fp8_e4m3"]),
    ({"gpu_memory_utilization": "1.5"}, ["vllm_node_gpu_memory_utilization must be auto or a fraction in (0, 1]",
                                         "'1.5'", "Set it to auto"]),
    ({"gpu_memory_utilization": True}, ["vllm_node_gpu_memory_utilization must be auto"]),
    ({"max_model_len": "128k"}, ["vllm_node_max_model_len must be auto or a positive integer", "'128k'",
                                 "-e vllm_node_max_model_len="]),
    ({"tensor_parallel_size": "0"}, ["vllm_node_tensor_parallel_size must be auto or a positive integer"]),
    ({"tensor_parallel_size": "-2"}, ["vllm_node_tensor_parallel_size must be auto or a positive integer"]),
    ({"tensor_parallel_size": 2.5}, ["vllm_node_tensor_parallel_size must be auto or a positive integer"]),
    ({"decode_context_parallel_size": "two"}, ["vllm_node_decode_context_parallel_size must be auto"]),
    ({"node_count": "auto"}, ["vllm_node_node_count must be a positive integer"]),
    ({"max_loras": "0"}, ["vllm_node_max_loras must be a positive integer"]),
    ({"load_mib_per_second": "-5"}, ["vllm_node_load_mib_per_second must be auto or MiB/s"]),
    ({"enable_lora": "maybe"}, ["vllm_node_enable_lora must be true or false"]),
    ({"port": "http"}, ["vllm_node_port must be a positive integer", "-e vllm_node_port=8000"]),
    ({"checkpoint_bytes": "-1"}, ["vllm_node_checkpoint_bytes must be a whole number >= 0"]),
    ({"vllm_version": "latest"}, ["vllm_node_vllm_version is 'latest', not a vLLM release", f'"{DEFAULT_VERSION}"']),
    ({"vllm_version": "0.5.0"}, ["vllm_node_vllm_version 0.5.0 is older than every release", "Set it to one of"]),
    ({"vllm_variant": "rocm"}, ["vllm_node_vllm_variant is 'rocm'", "Set it to cuda or cpu"]),
    ({"speculative_config": "eagle3"}, ["vllm_node_speculative_config must be {} (off), catalog", "got 'eagle3'"]),
    ({"model": "qwen3-235b-a22b", "speculative_config": "catalog"},
     ["the catalog entry of qwen3-235b-a22b has no speculative_config"]),
    ({"model": "kimi-k3"}, ["Unknown model 'kimi-k3' (vllm_node_model)", "kimi-k2.5-nvfp4", "vllm_node_extra_models"]),
    ({"model": "mine", "model_config": {"num_hidden_layers": 2}},
     ["Cannot plan model 'mine'", "pass vllm_node_checkpoint_bytes"]),
    ({"extra_args": "--enable-prefix-caching"}, ["vllm_node_extra_args must be a list"]),
])
def test_a_bad_knob_is_one_message_naming_it_and_the_fix(overrides: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(sizing.SizingError) as caught:
        sizing.node_plan(knobs(**overrides))
    for needle in needles:
        assert needle in str(caught.value), str(caught.value)


def test_a_plan_the_maths_cannot_make_names_the_request_and_the_knob() -> None:
    with pytest.raises(sizing.SizingError) as caught:
        sizing.node_plan(knobs(tensor_parallel_size="3"))
    message = str(caught.value)
    assert message.startswith(f"Cannot plan kimi-k2.5-nvfp4 on 8 x rtx-pro-6000-blackwell (vLLM {DEFAULT_VERSION}): "
                              "tensor_parallel_size 3 does not divide the model's 64 attention heads")
    assert "valid choices: 1, 2, 4, 8. Set vllm_node_tensor_parallel_size to one of the valid sizes, or auto." \
        in message
    with pytest.raises(sizing.SizingError, match=r"Cannot plan .*--max-model-len in the extra arguments .* use "
                                                 r"vllm_node_max_model_len"):
        sizing.node_plan(knobs(extra_args=["--max-model-len", "4096"]))


def test_a_plan_that_does_not_fit_is_returned_not_raised() -> None:
    """The preflight writes it (with the estimate), then refuses it."""
    p = sizing.node_plan(knobs(max_model_len="262144"))
    assert p["fits"] is False and p["service"]["argv"]


def test_an_unknown_argument_is_refused() -> None:
    with pytest.raises(sizing.SizingError, match="unknown keyword argument.*max_model_lenght"):
        sizing.node_plan(knobs(max_model_lenght="4096"))


@pytest.mark.parametrize(("value", "expected"), [
    (8, 8), ("8", 8), (" 8 ", 8), (8.0, 8), ("+8", 8), ("auto", "auto"), ("AUTO", "auto")])
def test_knob_count_takes_what_the_inventory_writes(value: Any, expected: Any) -> None:
    assert inputs.knob_count("tensor_parallel_size", value) == expected


@pytest.mark.parametrize("value", [True, False, None, "", "8.5", 8.5, "-1", -1, 0, "0x10", [8]])
def test_knob_count_refuses_the_rest(value: Any) -> None:
    with pytest.raises(sizing.SizingError, match="vllm_node_tensor_parallel_size must be auto or a positive"):
        inputs.knob_count("tensor_parallel_size", value)


@pytest.mark.parametrize(("value", "expected"), [
    (True, True), ("yes", True), ("True", True), (1, True), ("on", True),
    (False, False), ("no", False), ("false", False), (0, False), ("", False), (None, False)])
def test_knob_bool(value: Any, expected: bool) -> None:
    assert inputs.knob_bool("enable_lora", value) is expected


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("1", 1.0), (".5", 0.5), (0.92, 0.92), (1, 1.0)])
def test_knob_fraction(value: Any, expected: Any) -> None:
    assert inputs.knob_fraction(value) == expected


@pytest.mark.parametrize("value", ["0", 0, "1.01", "-0.5", "92%", None, True])
def test_knob_fraction_refuses(value: Any) -> None:
    with pytest.raises(sizing.SizingError, match=r"must be auto or a fraction in \(0, 1\]"):
        inputs.knob_fraction(value)


# --- the vLLM release default, named once ----------------------------------------------------------------------

def _role_default() -> str:
    return str(_load(ROOT / "roles" / "vllm_node" / "defaults" / "main.yml")["vllm_node_vllm_version"])


def test_the_python_default_release_is_the_roles_default() -> None:
    assert _role_default() == DEFAULT_VERSION
    assert inputs.PlanInputs(config={}, releases=RELEASES).vllm_version == DEFAULT_VERSION
    assert DEFAULT_VERSION in RELEASES["known_versions"]


@pytest.mark.parametrize("name", ["vllm_memory_plan", "vllm_max_model_len", "vllm_kv_cache_tokens",
                                  "vllm_max_concurrency", "vllm_kv_cache_bytes"])
def test_the_filter_documentation_states_the_same_default(name: str) -> None:
    """ansible-doc reads YAML: the documented default is a literal, held equal to the named one here."""
    doc = _load(ROOT / "plugins" / "filter" / f"{name}.yml")["DOCUMENTATION"]
    assert str(doc["options"]["vllm_version"]["default"]) == _role_default()


def test_no_other_yaml_restates_the_default_release() -> None:
    """Roles and playbooks read vllm_node_vllm_version; the one fallback left is vllm_env's, for the role used
    alone (without vllm_node its defaults are not loaded), and it must state the same release."""
    fallback = re.compile(r"vllm_node_vllm_version\s*\|\s*default\('([0-9][^']*)'\)")
    found = {}
    for path in sorted([*(ROOT / "roles").rglob("*.yml"), *(ROOT / "playbooks").rglob("*.yml")]):
        for value in fallback.findall(path.read_text(encoding="utf-8")):
            found[str(path.relative_to(ROOT))] = value
    assert found.pop("roles/vllm_env/defaults/main.yml", _role_default()) == _role_default()
    assert found == {}, found
