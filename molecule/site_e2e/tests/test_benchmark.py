"""The inference check's serving benchmark on the converged node (testinfra, run by `molecule verify`).

The check JSON of the converge (and of the re-run and check-mode run in conftest.py, which reuse the figures
measured since the service started) carries vLLM's `vllm bench serve` figures at concurrency 1 and the planned
concurrency, with 0 failed requests, its latency page beside it, and the verdict against the catalog band for the
tiny model on the CPU. One real run of the check against an impossible band (2 prompts, concurrency 1) fails with
the numbers and does not replace the node's last passing result. Runs before test_site.py (file order), on the
tiny-llama node.
"""

from __future__ import annotations

import json

from harness import node, playbook
from harness.figures import Figures
from harness.project import ARTIFACTS, PROJECT

HOST = "site_e2e-bookworm"
record = Figures(ARTIFACTS / "site_e2e-measurements.json").record
STATE = "/var/lib/vllm-node/benchmark-last.json"
FIGURES = ("output_tps", "per_user_tps", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
           "itl_ms_p50", "itl_ms_p99")

testinfra_hosts = [f"ansible://{HOST}"]


def test_the_check_json_carries_the_benchmark_and_its_band_verdict(host):
    checked = node.inference_check(HOST)
    bench = checked["benchmark"]
    assert "levels" in bench, f"no benchmark figures in the check JSON: {bench}"
    levels = bench["levels"]
    assert levels["single"]["concurrency"] == 1
    assert levels["planned"]["concurrency"] > 1, "the plan's KV max concurrency is far above the cap"
    for name, figs in levels.items():
        assert figs["failed"] == 0, (name, figs)
        assert figs["successful"] == bench["settings"]["num_prompts"], (name, figs)
        assert all(isinstance(figs[key], (int, float)) and figs[key] > 0 for key in FIGURES), (name, figs)
        assert figs["ttft_ms_p50"] <= figs["ttft_ms_p99"] and figs["itl_ms_p50"] <= figs["itl_ms_p99"]
    verdict = bench["verdict"]
    plan = checked["plan"]
    assert verdict["band"] == f"{plan['model']} x 1 cpu x vLLM {plan['vllm_version']}", "the tiny model's CPU band"
    assert verdict["passed"] and verdict["failures"] == [] and checked["failures"] == []
    banded = [row for row in verdict["rows"] if row["band"]]
    assert banded and {row["verdict"] for row in banded} == {"ok"}, verdict["rows"]
    assert {row["verdict"] for row in verdict["rows"]} <= {"ok", "no band"}, verdict["rows"]
    assert any(line.startswith("benchmark c=1:") for line in checked["summary"])
    # the page beside the JSON draws the same figures (tests/integration/test_plan_report_browser.py renders one)
    page = (ARTIFACTS / f"inference-check-{HOST}.html").read_text()
    assert 'id="latency-chart"' in page and json.dumps(levels["single"]["ttft_ms_p99"]) in page
    # the last passing result stays on the node for the next run's comparison
    kept = json.loads(host.file(STATE).content_string)
    assert kept["levels"] == levels and kept["invocation_id"] == checked["unit"]["invocation_id"]
    # KV tokens, blocks and max concurrency from vLLM's /metrics (vllm:cache_config_info), bytes from the journal
    pva = checked["plan_vs_actual"]
    assert pva["kv_cache_tokens"]["source"] == "metrics" and pva["kv_cache_bytes"]["source"] == "journal"
    assert pva["kv_cache_blocks"]["actual"] == checked["metrics_kv"]["num_gpu_blocks"] > 0
    # the replica's prefix cache as the check found it (vllm:prefix_cache_*_total): its own prompts were looked up
    cache = checked["prefix_cache"]
    assert cache["queries"] > 0 and 0 <= cache["hits"] <= cache["queries"], cache
    assert any(line.startswith("prefix cache: ") for line in checked["summary"]), checked["summary"]
    record("benchmark", {"wall_seconds": bench["wall_seconds"], "reused_from": bench.get("reused_from"),
                         "levels": levels})


def test_a_regression_beyond_the_band_fails_the_check_with_the_numbers(host):
    checked = node.inference_check(HOST)
    plan = checked["plan"]
    kept_before = host.file(STATE).content_string
    pages = {path: path.read_text() for path in (ARTIFACTS / f"inference-check-{HOST}.json",
                                                  ARTIFACTS / f"inference-check-{HOST}.html")}
    impossible = {plan["model"]: {"cpu": {plan["vllm_version"]: {"single": {"output_tps": {"min": 1e6}}}}}}
    rc, out, seconds = playbook.in_scenario("site_e2e", "benchmark-regression", PROJECT / "playbooks/verify.yml",
                                            "-e", json.dumps({"inference_check_benchmark_bands": impossible}),
                                            "-e", "inference_check_benchmark_rerun=true",
                                            "-e", "inference_check_benchmark_num_prompts=2",
                                            "-e", "inference_check_benchmark_concurrency=1", timeout=900)
    record("benchmark_regression_verify_seconds", round(seconds, 1))
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())
    assert "Inference check failed" in text and "c=1 output_tps: measured" in text, out[-3000:]
    assert "expected >= 1e+06" in text and "band 1e+06..-" in text, out[-3000:]
    failed = node.inference_check(HOST)
    for path, content in pages.items():  # the converged node's report again, for the tests after this one
        path.write_text(content)
    assert failed["benchmark"]["verdict"]["passed"] is False
    assert failed["benchmark"]["settings"]["num_prompts"] == 2 and "planned" not in failed["benchmark"]["levels"]
    assert failed["benchmark"]["levels"]["single"]["failed"] == 0
    record("benchmark_regression_wall_seconds", failed["benchmark"]["wall_seconds"])
    # a regression does not become the baseline the next run compares with
    assert host.file(STATE).content_string == kept_before
