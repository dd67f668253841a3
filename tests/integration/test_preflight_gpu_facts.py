"""The preflight role on a node: GPUs matched from node facts (the simulated 8 x RTX PRO 6000 node and variants),
explicit keys checked against them, and the real numbers nvidia-smi reports used in the plan."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from harness import playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
PLAYBOOK = ROOT / "tests/integration/playbooks/preflight_node.yml"
# The generated test models, merged as a user's own models would be.
TEST_MODELS = yaml.safe_load((ROOT / "tests/fixtures/catalog/models.yml").read_text())["vllm_node_extra_models"]


def node_gpus(count: int = 8, **override: Any) -> list[dict[str, Any]]:
    """node_facts_gpus for the fixtures' default node (tests/fixtures/gpu_node/gpus.json)."""
    data = json.loads((ROOT / "tests/fixtures/gpu_node/gpus.json").read_text())["gpus"][:count]
    return [dict({"index": g["index"], "name": g["name"], "memory_total_mib": g["memory_total_mib"],
                  "compute_capability": g["compute_cap"], "pci_bus_id": g["pci_bus_id"],
                  "pci_device_id": g["pci_device_id"]}, **override) for g in data]


def preflight(tmp_path: Path, gpus: list[dict[str, Any]], **knobs: Any) -> tuple[int, str, dict[str, Any] | None]:
    plan_file = tmp_path / "plan.json"
    extra = {"node_facts_gpus": gpus, "node_facts_gpu_source": "nvidia-smi" if gpus else "none",
             "vllm_node_plan_file": str(plan_file), "vllm_node_model": "kimi-k2.5-nvfp4",
             "vllm_node_kv_cache_dtype": "bfloat16",
             # facts given, no nvidia-smi here: the GPU health gate has its own test (test_preflight_gpu_health.py)
             "vllm_node_gpu_health": False, **knobs}
    extra_file = tmp_path / "extra.json"
    extra_file.write_text(json.dumps(extra))
    rc, out, _ = playbook.run(PLAYBOOK, "-e", f"@{extra_file}", inventory="gpu-node-01,", timeout=300)
    plan = json.loads(plan_file.read_text()) if plan_file.exists() else None
    return rc, re.sub(r"\s+", " ", out), plan


def test_auto_detects_the_simulated_rtx_pro_node(tmp_path: Path) -> None:
    rc, out, plan = preflight(tmp_path, node_gpus())
    assert rc == 0, out
    assert (plan["gpu"], plan["gpu_count"], plan["device"]) == ("rtx-pro-6000-blackwell", 8, "cuda")
    assert plan["per_gpu"]["total_bytes"] == 97887 * 2**20
    assert plan["config_source"] == "catalog"


def test_the_real_memory_replaces_the_catalogs(tmp_path: Path) -> None:
    """A card reporting less memory (ECC, a different board) is planned with what it reports; the smallest wins."""
    gpus = node_gpus()
    gpus[3]["memory_total_mib"] = 95000
    rc, out, plan = preflight(tmp_path, gpus)
    assert rc == 0, out
    assert plan["per_gpu"]["total_bytes"] == 95000 * 2**20


def test_lspci_facts_without_memory_fall_back_to_the_catalog(tmp_path: Path) -> None:
    rc, out, plan = preflight(tmp_path, node_gpus(4, memory_total_mib=None, compute_capability=None, name=""),
                              vllm_node_model="llama-3.1-70b-instruct")
    assert rc == 0, out
    assert (plan["gpu"], plan["gpu_count"]) == ("rtx-pro-6000-blackwell", 4)
    assert plan["per_gpu"]["total_bytes"] == 97887 * 2**20


def test_an_explicit_key_that_contradicts_the_node_is_refused(tmp_path: Path) -> None:
    rc, out, plan = preflight(tmp_path, node_gpus(), vllm_node_gpu="h100-80gb")
    assert rc != 0
    assert "vllm_node_gpu=h100-80gb but the node reports 8 x NVIDIA RTX PRO 6000 Blackwell Server Edition" in out
    assert plan is None


def test_unknown_gpus_are_named_with_the_catalog_keys(tmp_path: Path) -> None:
    rc, out, _ = preflight(tmp_path, node_gpus(2, pci_device_id="10de:ffff", name="NVIDIA Future GPU"))
    assert rc != 0
    assert "not in the GPU catalog: NVIDIA Future GPU (10de:ffff)" in out and "rtx-pro-6000-blackwell" in out


def test_more_gpus_than_the_node_has_is_refused(tmp_path: Path) -> None:
    rc, out, _ = preflight(tmp_path, node_gpus(4), vllm_node_gpu_count=8, vllm_node_model="llama-3.1-70b-instruct")
    assert rc != 0
    assert "vllm_node_gpu_count=8 but the node has 4 x rtx-pro-6000-blackwell" in out


def test_cpu_build_on_a_gpu_node_plans_the_cpu_device(tmp_path: Path) -> None:
    """The demo: simulated GPUs are present, but the CPU build serves, so the plan is for the cpu device."""
    rc, out, plan = preflight(tmp_path, node_gpus(), vllm_node_vllm_variant="cpu", vllm_node_model="tiny-llama",
                              vllm_node_extra_models=TEST_MODELS,
                              vllm_node_kv_cache_dtype="auto", vllm_node_max_model_len=4096)
    assert rc == 0, out
    assert (plan["gpu"], plan["device"], plan["gpu_count"]) == ("cpu", "cpu", 1)


def test_the_story_is_refused_before_anything_changes(tmp_path: Path) -> None:
    rc, out, plan = preflight(
        tmp_path, node_gpus(), vllm_node_max_model_len=262144, vllm_node_gpu_memory_utilization=0.95
    )
    assert rc != 0
    assert plan is not None and plan["fits"] is False
    assert "do not fit" in out and "Safe max-model-len: " in out
    assert re.search(r"gpu-node-01\s*:\s*ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=1", out)


def os_facts(distribution: str, major: str) -> dict[str, Any]:
    """node_facts_os as the node_facts role reports it."""
    return {"distribution": distribution, "major_version": major, "version": major, "codename": "", "family": "Debian"}


def test_a_python_without_a_cuda_lock_is_refused_before_the_driver(tmp_path: Path) -> None:
    """Ubuntu 22.04's Python 3.10: vLLM 0.33.0 publishes nothing for it (Requires-Python >=3.11), so no lock."""
    rc, out, plan = preflight(tmp_path, node_gpus(), node_facts_os=os_facts("Ubuntu", "22"))
    assert rc != 0
    assert ("the vLLM 0.33.0 CUDA build has no lock for Python 3.10 (Ubuntu 22.04): vLLM 0.33.0 requires Python "
            "<3.15,>=3.11, locks exist for Python 3.11, 3.12, 3.13") in out
    assert "set vllm_env_python_interpreter" in out and plan is None


def test_every_other_supported_os_has_its_cuda_lock(tmp_path: Path) -> None:
    for distribution, major, lock in [("Debian", "12", "py3.11"), ("Debian", "13", "py3.13"),
                                      ("Ubuntu", "24", "py3.12")]:
        rc, out, plan = preflight(tmp_path, node_gpus(), node_facts_os=os_facts(distribution, major))
        assert rc == 0, out
        assert f"lock vllm-0.33.0-cuda-{lock}.txt; driver branch 580 runs CUDA up to 13.0" in out


def test_a_driver_branch_too_old_for_the_locks_cuda_is_refused(tmp_path: Path) -> None:
    """Branch 570 runs CUDA 12.x; the 0.33.0 lock pins the CUDA 13 runtime. Without node facts (the controller's
    plan) every lock of the release counts; with them, the node's own lock is named."""
    rc, out, plan = preflight(tmp_path, node_gpus(), nvidia_driver_branch=570, node_facts_os=os_facts("Debian", "13"))
    assert rc != 0 and plan is None
    assert ("driver branch 570 supports CUDA up to 12.8; the vLLM 0.33.0 CUDA lock for Python 3.13 needs CUDA 13 "
            "(nvidia-cuda-runtime 13.0.96, torch 2.14.0): set nvidia_driver_branch to 580 or newer.") in out
    rc, out, _ = preflight(tmp_path, node_gpus(), nvidia_driver_branch="575")
    assert rc != 0
    assert "driver branch 575 supports CUDA up to 12.9; the vLLM 0.33.0 CUDA lock needs CUDA 13" in out
