"""sizing/warmstart.py through node_plan: the loader in the plan (prediction, timeouts, refusal of a loader the
lock lacks) and the compile-cache key (a cache of another vLLM, torch, driver, GPU or plan gets another directory)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
import yaml
from test_node_plan import VARS, knobs

import vllm_locks
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import warmstart
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.units import MiB
from repo_root import ROOT

LOADERS = yaml.safe_load((VARS / "loaders.yml").read_text())["vllm_node_loaders"]
LOCKS = yaml.safe_load((VARS / "vllm_locks.yml").read_text())["vllm_node_vllm_locks"]


def story(**overrides: Any) -> dict[str, Any]:
    """The story's plan (Kimi-K2.5 on 8 x RTX PRO 6000, 262,144 tokens, KV auto) with the loader catalog."""
    return sizing.node_plan(knobs(**{"kv_cache_dtype": "auto", "max_model_len": "262144",
                                     "gpu_memory_utilization": "auto", "loaders": LOADERS, "locks": LOCKS,
                                     "driver": "580.95.05", **overrides}))


def tiny_cpu(version: str, **overrides: Any) -> dict[str, Any]:
    """The demo node's plan: the tiny Llama on the cpu build of `version`."""
    models = yaml.safe_load((ROOT / "tests/fixtures/catalog/models.yml").read_text())
    return story(**{"model": "tiny-llama", "models": {**knobs()["models"], **models["vllm_node_extra_models"]},
                    "gpu": "auto", "gpu_count": "auto", "vllm_variant": "cpu", "vllm_version": version,
                    "cpu_kv_cache_space_gib": "1", "max_model_len": "4096", "kv_cache_dtype": "auto",
                    "gpu_memory_utilization": "auto", "driver": "", **overrides})


def row(plan: dict[str, Any], load_format: str, disk: str) -> dict[str, Any]:
    return next(r for r in plan["loader"]["table"] if (r["load_format"], r["disk"]) == (load_format, disk))


def test_without_the_catalog_the_plan_is_unchanged() -> None:
    plain = sizing.node_plan(knobs())
    assert "loader" not in plain and "compile_cache" not in plain
    assert sizing.node_plan(knobs(loaders=LOADERS, locks=LOCKS))["startup"] == plain["startup"]


def test_the_story_default_keeps_the_story_rate_and_timeouts() -> None:
    plan = story()
    loader = plan["loader"]
    assert (loader["load_format"], loader["disk"]) == ("auto", "unknown")
    assert loader["predicted_load_seconds"] == plan["startup"]["predicted_load_seconds"]
    assert plan["startup"]["load_mib_per_second"] == 138.0
    assert "--load-format" not in plan["service"]["argv"]
    assert loader["available"] == ["auto", "fastsafetensors", "instanttensor", "safetensors"]


@pytest.mark.parametrize(("load_format", "disk"), [("fastsafetensors", "nvme"), ("instanttensor", "network"),
                                                   ("safetensors", "nvme")])
def test_a_loader_on_a_known_disk_sets_the_prediction_and_every_timeout(load_format: str, disk: str) -> None:
    plan = story(load_format=load_format, load_disk=disk)
    gbps = warmstart.rate(LOADERS, load_format, disk)["gbps"]  # type: ignore[index]
    weights = plan["per_gpu"]["weights_bytes"]
    rate = gbps * 1e9 / MiB / 8
    assert plan["startup"]["predicted_load_seconds"] == math.ceil(weights / (rate * MiB))
    engine = plan["startup"]["engine_ready_timeout_seconds"]
    assert plan["service"]["environment"]["VLLM_ENGINE_READY_TIMEOUT_S"] == str(engine)
    assert plan["service"]["start_timeout"] == plan["startup"]["unit_start_timeout_seconds"]
    assert plan["loader"]["unit_start_timeout_seconds"] == plan["service"]["start_timeout"]
    assert plan["service"]["argv"][-2:] == ["--load-format", load_format]
    # the table's row for the chosen pair is the plan itself
    assert row(plan, load_format, disk)["predicted_load_seconds"] == plan["startup"]["predicted_load_seconds"]
    assert row(plan, load_format, disk)["engine_ready_timeout_seconds"] == engine


def test_faster_loaders_predict_shorter_loads_and_never_below_vllms_default_timeout() -> None:
    plan = story()
    slow, fast = row(plan, "safetensors", "nvme"), row(plan, "instanttensor", "network")
    assert fast["predicted_load_seconds"] < slow["predicted_load_seconds"] < row(plan, "auto", "unknown")[
        "predicted_load_seconds"]
    assert all(r["engine_ready_timeout_seconds"] >= 600 for r in plan["loader"]["table"])
    # no figure for the pair: the story's rate, so the timeouts stay safe
    assert row(plan, "instanttensor", "nvme")["predicted_load_seconds"] == row(plan, "auto", "unknown")[
        "predicted_load_seconds"]


def test_an_explicit_rate_wins_over_the_catalog() -> None:
    plan = story(load_format="instanttensor", load_disk="network", load_mib_per_second="50")
    assert plan["startup"]["load_mib_per_second"] == 50.0
    assert plan["loader"]["basis"] == "vllm_node_load_mib_per_second"


def test_a_loader_the_lock_lacks_is_refused_with_the_fix() -> None:
    with pytest.raises(sizing.SizingError, match=r"runai_streamer needs the package runai-model-streamer.*"
                       r"Python 3.11, 3.12, 3.13.*vllm_node_load_format: auto.*make locks"):
        story(load_format="runai_streamer", load_disk="network")
    assert row(story(), "runai_streamer", "network")["in_lock"] is False


@pytest.mark.parametrize(("overrides", "message"), [
    ({"load_format": "magic"}, "vllm_node_load_format 'magic' is not a loader"),
    ({"load_disk": "floppy"}, "vllm_node_load_disk 'floppy' is not a disk"),
    ({"load_format": "fastsafetensors", "extra_args": ["--load-format", "auto"]}, "set the loader in one place"),
])
def test_bad_loader_knobs_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(sizing.SizingError, match=message):
        story(**overrides)


def test_the_cpu_lock_has_no_optional_loader() -> None:
    with pytest.raises(sizing.SizingError, match="fastsafetensors needs the package fastsafetensors"):
        tiny_cpu("0.32.0", load_format="fastsafetensors")


def test_a_cache_of_another_vllm_version_gets_another_directory() -> None:
    old, new = tiny_cpu("0.31.0"), tiny_cpu("0.32.0")
    assert old["compile_cache"]["dir"].startswith("vllm-0.31.0-cpu-")
    assert new["compile_cache"]["dir"].startswith("vllm-0.32.0-cpu-")
    assert old["compile_cache"]["key"] != new["compile_cache"]["key"]
    # the same inputs give the same key: a restart reuses its cache
    assert tiny_cpu("0.32.0")["compile_cache"] == new["compile_cache"]


@pytest.mark.parametrize("change", [
    {"driver": "590.10.01"}, {"gpu": "b200"}, {"max_model_len": "131072"}, {"load_format": "fastsafetensors"},
])
def test_the_key_follows_the_driver_the_gpu_and_the_plan(change: dict[str, Any]) -> None:
    assert story(**change)["compile_cache"]["key"] != story()["compile_cache"]["key"]


def test_the_key_follows_the_locks_pins() -> None:
    changed = yaml.safe_load(yaml.safe_dump(LOCKS))
    changed["0.33.0-cuda"]["pythons"]["3.12"]["pins"]["triton"] = "9.9.9"
    assert story(locks=changed)["compile_cache"]["key"] != story()["compile_cache"]["key"]
    inputs = story()["compile_cache"]["inputs"]
    assert inputs["locks"]["3.12"] == {"torch": "2.14.0", "triton": "3.8.0", "flashinfer-python": "0.7.2.post1"}
    assert inputs["driver"] == "580.95.05" and inputs["gpu"] == "rtx-pro-6000-blackwell"
    assert inputs["compute_capability"] == "12.0"


def test_the_key_is_the_documented_hash() -> None:
    cache = story()["compile_cache"]
    text = json.dumps(cache["inputs"], sort_keys=True, separators=(",", ":"))
    assert cache["key"] == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert cache["dir"] == f"vllm-0.33.0-cuda-{cache['key']}"


def test_every_loader_package_is_a_pin_the_lock_catalog_records() -> None:
    packages = {entry["package"] for entry in LOADERS["formats"].values() if entry["package"]}
    assert packages <= set(vllm_locks.PLANNED_PINS)
    assert set(warmstart.KEY_PINS) <= set(vllm_locks.PLANNED_PINS)


def test_every_rate_names_its_source_and_a_known_loader_and_disk() -> None:
    for rate in LOADERS["rates"]:
        assert rate["load_format"] in LOADERS["formats"] and rate["disk"] in LOADERS["disks"]
        assert rate["gbps"] > 0 and rate["gpus"] >= 1 and rate["source"]
    pairs = [(r["load_format"], r["disk"]) for r in LOADERS["rates"]]
    assert len(pairs) == len(set(pairs))
