"""A broad grid of sizing plans (every catalog model x GPUs x knob combinations, the story, refusals).

tests/unit/data/sizing_plans_golden.json holds what the single-file sizing module (vllm_memory.py, before the
split into plugins/module_utils/sizing/) produced for this grid; the sizing package must reproduce it byte for
byte (tests/unit/plugins/module_utils/sizing/test_golden_plans.py). Regenerate only when a number is meant to
change, and say why in the commit:

    .venv/bin/python tests/unit/sizing_golden.py --write
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import yaml

from repo_root import ROOT, UNIT_DATA

GOLDEN = UNIT_DATA / "sizing_plans_golden.json"
CATALOG = ROOT / "roles" / "vllm_node" / "vars" / "main"

# (GPU catalog key, GPU count) for the full-size models; the tiny test models also run on the cpu device.
HARDWARE = [("rtx-pro-6000-blackwell", 8), ("rtx-pro-6000-blackwell", 2), ("b200", 8), ("h200", 8),
            ("h100-80gb", 8), ("a100-80gb", 4), ("l40s", 4), ("rtx-5090", 1)]
KNOBS: list[dict[str, Any]] = [
    {},
    {"kv_cache_dtype": "bfloat16"},
    {"kv_cache_dtype": "fp8", "max_model_len": 131072},
    {"kv_cache_dtype": "bfloat16", "max_model_len": 262144, "gpu_memory_utilization": 0.95},
    {"vllm_version": "0.17.0"},
    {"vllm_version": "0.19.0", "kv_cache_dtype": "bfloat16", "max_model_len": 65536},
    {"vllm_version": "0.13.0"},
    {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
    {"decode_context_parallel_size": 2, "tensor_parallel_size": 8},
    {"enforce_eager": True, "max_num_batched_tokens": 4096, "max_num_seqs": 64, "block_size": 32},
    {"gpu_memory_utilization": 0.8, "max_model_len": 131072},
    {"gpu_memory_utilization": 0.99},
    {"max_model_len": 300000, "served_model_name": "served"},
    {"tensor_parallel_size": 3},
    {"kv_cache_dtype": "nvfp4"},
    {"pipeline_parallel_size": 2, "pp_layer_partition": "1,1"},
]
CPU_KNOBS: list[dict[str, Any]] = [
    {}, {"vllm_version": "0.32.0"}, {"kv_cache_dtype": "fp8"}, {"max_model_len": 2048},
    {"cpu_kv_cache_space_gib": 2}, {"max_model_len": 8192}, {"kv_cache_dtype": "bfloat16"},
]


def load_catalog() -> tuple[dict[str, Any], dict[str, Any]]:
    models = yaml.safe_load((CATALOG / "models.yml").read_text(encoding="utf-8"))["vllm_node_catalog_models"]
    # The tiny test models are a user's vllm_node_extra_models (tests/fixtures/catalog/models.yml).
    extra = yaml.safe_load((ROOT / "tests/fixtures/catalog/models.yml").read_text(encoding="utf-8"))
    models = {**models, **extra["vllm_node_extra_models"]}
    gpus = yaml.safe_load((CATALOG / "gpus.yml").read_text(encoding="utf-8"))["vllm_node_catalog_gpus"]
    return models, gpus


def cases() -> list[tuple[str, dict[str, Any]]]:
    """(case id, keyword arguments except releases and config) for every plan of the grid."""
    models, gpus = load_catalog()
    out: list[tuple[str, dict[str, Any]]] = []
    for key in sorted(models):
        entry = models[key]
        base = {"model": key, "checkpoint_bytes": entry["checkpoint_bytes"], "quant": entry["quant"],
                "model_key": key, "repo": entry["repo"]}
        hardware = [("cpu", 1), ("rtx-pro-6000-blackwell", 1)] if key.startswith("tiny-") else HARDWARE
        for gpu_key, count in hardware:
            gpu = gpus[gpu_key]
            device = gpu["kind"]
            knobs_list = CPU_KNOBS if device == "cpu" else KNOBS
            for index, knobs in enumerate(knobs_list):
                kwargs = dict(base, gpu=gpu, gpu_count=count, device=device, gpu_key=gpu_key,
                              vllm_variant="cpu" if device == "cpu" else "cuda", **knobs)
                out.append((f"{key}|{gpu_key}x{count}|{index}", kwargs))
    # The deployment story as the README tells it (bf16 at 262,144 refused; 131,072 fits).
    story = {"model": "kimi-k2.5-nvfp4", "gpu": gpus["rtx-pro-6000-blackwell"], "gpu_count": 8,
             "checkpoint_bytes": 591_000_000_000, "quant": {"kv_cache_quant_algo": "FP8"},
             "model_key": "kimi-k2.5-nvfp4", "repo": "nvidia/Kimi-K2.5-NVFP4", "gpu_key": "rtx-pro-6000-blackwell"}
    for index, knobs in enumerate([
            {"kv_cache_dtype": "bfloat16", "max_model_len": 262144, "gpu_memory_utilization": 0.95},
            {"kv_cache_dtype": "bfloat16", "max_model_len": 131072, "gpu_memory_utilization": 0.95},
            {"kv_cache_dtype": "bfloat16", "gpu_memory_utilization": 0.95}, {},
            {"gpu_memory_bytes": 97887 << 20, "compute_capability": "12.0", "gpu": None},
            {"gpu_count": "auto"}, {"checkpoint_bytes": None}, {"gpu_memory_utilization": 1.5},
            {"vllm_version": "latest"}, {"vllm_version": "0.40.0"}, {"tensor_parallel_size": "8",
                                                                     "gpu_count": "8", "max_model_len": "131072"}]):
        out.append((f"story|{index}", dict(story, **knobs)))
    return out


def run(plan: Callable[..., dict[str, Any]], error: type[Exception], releases: dict[str, Any]) -> dict[str, str]:
    """Case id -> canonical JSON of the plan, or of {"error": message} for a refused one."""
    models, _ = load_catalog()
    out: dict[str, str] = {}
    for case_id, kwargs in cases():
        kwargs = dict(kwargs)
        config = models[kwargs.pop("model")]["config"]
        try:
            result: Any = plan(config, releases=releases, **kwargs)
        except error as exc:
            result = {"error": str(exc)}
        out[case_id] = json.dumps(result, sort_keys=True, separators=(",", ":"))
    return out


def load_golden() -> dict[str, str]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


if __name__ == "__main__" and "--write" in sys.argv:
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import SizingError, memory_plan
    from sizing_groundtruth import load_releases

    GOLDEN.write_text(json.dumps(run(memory_plan, SizingError, load_releases()), indent=0, sort_keys=True) + "\n",
                      encoding="utf-8")
