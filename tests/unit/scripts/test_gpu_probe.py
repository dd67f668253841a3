"""scripts/gpu_probe.py: the PyTorch measurement (against a scripted torch), the simulated host, and the report's
plan-vs-measured lines."""
from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

import gpu_probe as gp
from repo_root import ROOT

GiB, MiB = 2**30, 2**20


class FakeTorch:
    """torch.cuda as far as measure() uses it: a GPU of 80 GiB whose context takes 512 MiB and whose first matmul
    adds 96 MiB outside torch's allocator, with 20 MiB reserved by the allocator after it."""

    def __init__(self, available: bool = True) -> None:
        self.stage = 0
        self.__version__, self.version = "2.9.0", types.SimpleNamespace(cuda="13.0")
        self.bfloat16 = "bf16"
        self.cuda = types.SimpleNamespace(
            is_available=lambda: available, init=self.init, synchronize=lambda device: None,
            mem_get_info=self.mem_get_info, memory_reserved=self.memory_reserved,
            get_device_name=lambda device: "NVIDIA H100 80GB HBM3")

    def init(self) -> None:
        self.stage = 1

    def empty(self, *args: Any, **kwargs: Any) -> None:
        return None

    def randn(self, *args: Any, **kwargs: Any) -> Any:
        fake = self

        class Tensor:
            def __matmul__(self, other: Any) -> Any:
                fake.stage = 2
                return self

            def sum(self) -> Any:
                return types.SimpleNamespace(item=lambda: 0.0)

        return Tensor()

    def mem_get_info(self, device: int) -> tuple[int, int]:
        total = 80 * GiB
        used = {1: 100 * MiB + 512 * MiB + 2 * MiB, 2: 100 * MiB + 512 * MiB + 96 * MiB + 20 * MiB}[self.stage]
        return total - used, total

    def memory_reserved(self, device: int) -> int:
        return {1: 2 * MiB, 2: 20 * MiB}[self.stage]


def test_measure_separates_the_context_and_the_non_torch_growth() -> None:
    measured = gp.measure(FakeTorch(), used_before=100 * MiB)
    assert measured["torch_total_bytes"] == 80 * GiB
    assert measured["cuda_context_bytes"] == 512 * MiB
    assert measured["non_torch_bytes"] == 608 * MiB and measured["non_torch_growth_bytes"] == 96 * MiB
    assert measured["free_after_init_bytes"] == 80 * GiB - 614 * MiB
    assert measured["reason"] is None and measured["device_name"] == "NVIDIA H100 80GB HBM3"


def test_no_cuda_no_torch_and_a_simulated_host_give_null_fields_with_the_reason(monkeypatch) -> None:
    assert gp.measure(FakeTorch(available=False), None) == {
        **dict.fromkeys(gp.MEASURED_FIELDS), "reason": "torch.cuda.is_available() is False (no CUDA device or driver)"}
    answers = {"-h": (0, "NVIDIA System Management Interface\n"), "--query-gpu=memory.used": (0, "3\n")}
    monkeypatch.setattr(gp, "run", lambda argv: answers[argv[1]])

    def no_torch(name: str) -> Any:
        raise ImportError(f"No module named '{name}'")

    assert gp.measure_host(no_torch)["reason"] == "PyTorch is not importable: No module named 'torch'"
    helped = (ROOT / "tests/fixtures/gpu_node/nvidia-smi").read_text()
    assert gp.SIMULATED_MARK in helped, "the stand-in's help text no longer says what it is"
    answers["-h"] = (0, "NVIDIA System Management Interface -- fake for vllm-node tests\n")
    simulated = gp.measure_host(no_torch)
    assert simulated["reason"].startswith("simulated: nvidia-smi is the stand-in")
    assert all(simulated[name] is None for name in gp.MEASURED_FIELDS)


def test_used_bytes_from_nvidia_smi() -> None:
    assert gp.used_bytes_smi("3\n") == 3 * MiB
    assert gp.used_bytes_smi("[N/A]\n") is None and gp.used_bytes_smi("") is None


def test_the_report_compares_each_assumption() -> None:
    facts = {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "pci_device_id": "10de:2330", "memory_total_mib": 81559}],
             "gpu_source": "nvidia-smi", "python": "3.12.3", "ansible_core": "2.21.5", "driver_version": "580.95.05"}
    assumptions = {"model": "gpt-oss-120b", "gpu": "h100-80gb", "torch_memory_gib": 79.11, "cuda_context_gib": 0.75,
                   "non_torch_growth_gib": 0.25, "plan_error": None}
    plan = {"fits": True, "per_gpu": {"non_torch_bytes": 1}}
    measured = gp.measure(FakeTorch(), 100 * MiB)
    report = gp.report(facts, {"verdict": "PASS", "summary": ["GPU health PASS over 1 GPU(s)"]}, plan, assumptions,
                       measured, None, 12.34, "2026-12-06T10:00:00Z")
    assert report["simulated"] is False and report["gpu"]["catalog_key"] == "h100-80gb"
    assert report["compare"]["cuda_context_bytes"] == {"plan_bytes": int(0.75 * GiB), "measured_bytes": 512 * MiB,
                                                       "measured_minus_plan_bytes": 512 * MiB - int(0.75 * GiB)}
    assert report["compare"]["torch_total_bytes"]["measured_minus_plan_bytes"] == 80 * GiB - round(79.11 * GiB)
    assert report["plan"]["fits"] is True and report["duration_s"] == 12.3
    simulated = gp.report(facts, {}, None, assumptions, gp.null_measurement("simulated: x"), "x", 1, "t")
    assert simulated["simulated"] is True and simulated["plan"]["fits"] is None
    assert simulated["compare"]["cuda_context_bytes"]["measured_minus_plan_bytes"] is None


def test_main_writes_the_report_from_the_playbook_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(gp, "run", lambda argv: (0, "NVIDIA System Management Interface -- fake for vllm-node tests"))
    (tmp_path / "facts.json").write_text(json.dumps({"gpus": [], "gpu_source": "none"}))
    (tmp_path / "assumptions.json").write_text(json.dumps({"cuda_context_gib": 0.75}))
    assert gp.main(["measure", str(tmp_path)]) == 0
    assert gp.main(["report", str(tmp_path), "0"]) == 0
    report = json.loads((tmp_path / "gpu-probe-report.json").read_text())
    assert report["schema"] == gp.SCHEMA and report["simulated"] is True
    assert report["measured"]["reason"].startswith("simulated:")
    assert gp.main(["bogus"]) == 2


@pytest.mark.parametrize("text", ["", "NVIDIA System Management Interface"])
def test_a_real_nvidia_smi_is_not_simulated(text: str) -> None:
    assert gp.simulated(text) is None
