"""The plan as a picture: the chart's data and the HTML page the preflight role writes beside the plan JSON.

The plans are computed by the real sizing code (the story's refused request and one that fits); the page is rendered
from the role's real template with the vendored Chart.js.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
import yaml

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.filter.check_report_html import (
    check_report_html as check_report_filter,
)
from ansible_collections.vllm_node.vllm_node.plugins.filter.plan_report import plan_report_html as filter_html
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.plan_report import (
    check_report_html,
    instances_chart,
    latency_chart,
    memory_chart,
    plan_report_html,
    script_json,
)
from check_reports import check_report
from repo_root import ROOT
from sizing_cases import KIMI, STORY_HARDWARE

TEMPLATE = (ROOT / "roles/preflight/templates/plan-report.html.j2").read_text()
CHART_JS_FILE = ROOT / "roles/preflight/files/chartjs/chart.umd.min.js"
CHART_JS = CHART_JS_FILE.read_text()
STORY = dict(STORY_HARDWARE, releases=gt.load_releases())


def story_refused() -> dict[str, Any]:
    """262,144 tokens of bf16 KV for Kimi-K2.5-NVFP4 on 8 x RTX PRO 6000 at 0.95: does not fit."""
    return vm.memory_plan(KIMI, **dict(STORY, kv_cache_dtype="bfloat16", max_model_len=262144,
                                       gpu_memory_utilization=0.95))


def story_fits() -> dict[str, Any]:
    return vm.memory_plan(KIMI, **dict(STORY, kv_cache_dtype="bfloat16", max_model_len=131072,
                                       gpu_memory_utilization=0.95))


def embedded(html: str, element_id: str) -> Any:
    """The JSON of the page's <script type="application/json" id=...> element."""
    match = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', html, re.S)
    assert match, f"#{element_id} is missing from the page"
    return json.loads(match.group(1))


def segment(chart: dict[str, Any], stack: str, key: str) -> list[int | None]:
    return next(s["bytes"] for s in chart[stack] if s["key"] == key)


@pytest.mark.parametrize("make_plan", [story_refused, story_fits])
def test_the_page_embeds_the_plan_json_unchanged(make_plan) -> None:
    plan = make_plan()
    # What the preflight role writes to the plan file, read back: the page must carry exactly that.
    plan_file_data = json.loads(json.dumps(plan, sort_keys=True, indent=4))
    html = plan_report_html(plan, TEMPLATE, CHART_JS)
    assert embedded(html, "plan-json") == plan_file_data
    assert embedded(html, "chart-data") == memory_chart(plan)
    assert embedded(html, "check-json") is None


def test_the_story_refusal_stacks_the_kv_cache_over_the_budget_line() -> None:
    plan = story_refused()
    chart = memory_chart(plan)
    per_gpu, kv = plan["per_gpu"], plan["kv"]
    assert chart["gpus"] == [f"GPU {i}" for i in range(8)] and chart["fits"] is False
    assert chart["budget_bytes"] == per_gpu["requested_bytes"]
    inside = ("weights", "activation_peak", "cudagraph", "kv_cache")
    below_line = sum(segment(chart, "planned", key)[0] for key in inside)
    # The budget holds weights, activations, CUDA graphs and the KV pool exactly; the request's KV needs more.
    assert below_line == pytest.approx(chart["budget_bytes"], abs=1 << 20)
    over = segment(chart, "planned", "kv_over_budget")
    assert over == [kv["needed_bytes"] - kv["available_bytes"]] * 8
    assert over[0] > 5 * (1 << 30)  # 17.16 GiB needed, 10.81 GiB available
    assert segment(chart, "planned", "kv_cache")[0] + over[0] == kv["needed_bytes"]
    assert segment(chart, "planned", "weights") == [per_gpu["weights_bytes"]] * 8


def test_a_plan_that_fits_has_no_kv_over_the_budget_and_fills_the_gpu() -> None:
    plan = story_fits()
    chart = memory_chart(plan)
    assert chart["fits"] is True
    assert segment(chart, "planned", "kv_over_budget") == [0] * 8
    stacked = sum(s["bytes"][0] for s in chart["planned"])
    assert stacked == pytest.approx(plan["per_gpu"]["total_bytes"], abs=1 << 20)
    assert chart["reported"] == []


def test_reported_figures_stand_beside_the_plan_per_rank() -> None:
    plan = story_fits()
    check = {"host": "node1", "time": "2026-12-01T10:00:00Z", "url": "http://127.0.0.1:8000",
             "plan": {"model": "kimi-k2.5-nvfp4", "max_model_len": 131072},
             "startup": {"model_loading_bytes": [76 * (1 << 30)] * 8,
                         "available_kv_cache_bytes": [11 * (1 << 30)] * 7}}
    chart = memory_chart(plan, check)
    assert segment(chart, "reported", "weights") == [76 * (1 << 30)] * 8
    assert segment(chart, "reported", "kv_cache") == [11 * (1 << 30)] * 7 + [None]  # rank 7 logged nothing
    html = filter_html(plan, TEMPLATE, CHART_JS, check=check, managed="Ansible managed")
    assert embedded(html, "check-json") == {key: check[key] for key in ("host", "time", "url", "plan")}
    assert embedded(html, "chart-data") == chart
    assert "<!-- Ansible managed -->" in html
    assert "node1" in html


def test_a_check_without_startup_figures_adds_no_reported_stack() -> None:
    assert memory_chart(story_fits(), {"host": "n", "startup": {"model_loading_bytes": []}})["reported"] == []


def test_strings_from_the_plan_cannot_close_the_script_element() -> None:
    plan = dict(story_fits(), notes=["</script><script>alert(1)</script>"], model="a<b>&c")
    html = plan_report_html(plan, TEMPLATE, CHART_JS)
    assert "alert(1)</script>" not in html
    assert "<b>" not in html  # the title is escaped too
    assert embedded(html, "plan-json")["notes"] == plan["notes"]
    assert json.loads(script_json({"x": "</script>&"})) == {"x": "</script>&"}


def test_the_library_is_inlined_so_the_page_works_offline() -> None:
    html = plan_report_html(story_fits(), TEMPLATE, CHART_JS)
    assert CHART_JS.strip()[:200] in html
    assert not re.search(r'<script[^>]+src=|<link[^>]+href=["\']https?:', html), "no external resource"


def test_the_vendored_chart_js_is_the_recorded_release() -> None:
    """The file is the one roles/preflight/files/chartjs/README.md names: chart.js 4.5.1 from npm, MIT."""
    assert hashlib.sha256(CHART_JS_FILE.read_bytes()).hexdigest() == (
        "48444a82d4edcb5bec0f1965faacdde18d9c17db3063d042abada2f705c9f54a")
    assert "Chart.js v4.5.1" in CHART_JS[:200]
    assert "MIT" in (CHART_JS_FILE.parent / "LICENSE.md").read_text()
    assert "4.5.1" in (CHART_JS_FILE.parent / "README.md").read_text()


@pytest.mark.parametrize("bad, message", [
    ({}, "plan must be the plan JSON"),
    ({"per_gpu": {}, "gpu_count": 0}, "gpu_count must be an integer >= 1"),
    ({"per_gpu": {"weights_bytes": "lots"}, "gpu_count": 1}, "per_gpu.weights_bytes must be a byte count"),
])
def test_bad_plans_are_refused_with_what_is_wrong(bad, message) -> None:
    with pytest.raises(ValueError, match=message):
        memory_chart(bad)


def test_the_filter_names_itself_on_bad_input() -> None:
    with pytest.raises(Exception, match="plan_report_html: plan must be"):
        filter_html([], TEMPLATE, CHART_JS)


def test_a_cluster_plan_lists_each_stage_and_a_single_node_has_no_stage_table() -> None:
    two = vm.memory_plan(KIMI, **dict(STORY, kv_cache_dtype="bfloat16", max_model_len=262144, node_count=2))
    html = plan_report_html(two, TEMPLATE, CHART_JS)
    rows = re.findall(r'<tr data-stage="(\d+)" data-weights-bytes="(\d+)" data-kv-bytes="(\d+)">', html)
    assert [(int(r), int(w), int(k)) for r, w, k in rows] == [
        (s["rank"], s["weights_bytes"], s["kv_cache_bytes"]) for s in two["cluster"]["stages"]]
    assert "<td>0-30</td>" in html and "<td>31-60</td>" in html
    assert 'id="stage-table"' not in plan_report_html(story_fits(), TEMPLATE, CHART_JS)


# The inference check's page: the benchmark's latency percentiles, rendered the same way as the plan's page.
CHECK_TEMPLATE = (ROOT / "roles/inference_check/templates/inference-check.html.j2").read_text()


def test_the_latency_chart_carries_every_level_and_percentile_of_the_report() -> None:
    check = check_report()
    chart = latency_chart(check)
    keys = [figure["key"] for figure in chart["figures"]]
    assert keys == ["ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "itl_ms_p50", "itl_ms_p99"]
    for entry in chart["levels"]:
        figs = check["benchmark"]["levels"][entry["level"]]
        assert entry["concurrency"] == figs["concurrency"]
        assert entry["ms"] == [figs[key] for key in keys]


def test_the_check_page_embeds_the_report_and_the_library() -> None:
    check = check_report()
    page = check_report_filter(check, CHECK_TEMPLATE, CHART_JS, managed="Ansible managed: test")
    embedded = re.search(r'<script type="application/json" id="check-json">(.*?)</script>', page, re.S)
    assert embedded and json.loads(embedded.group(1)) == check
    assert CHART_JS[:200] in page and "<!-- Ansible managed: test -->" in page
    assert 'id="latency-chart"' in page and "PASSED" in page


def test_a_report_without_a_benchmark_has_no_latency_page() -> None:
    with pytest.raises(ValueError, match="benchmark"):
        check_report_html({"host": "n", "benchmark": {"skipped": "check mode"}}, CHECK_TEMPLATE, CHART_JS)
    with pytest.raises(Exception, match="check_report_html: benchmark.levels.single.ttft_ms_p50 must be a number"):
        check_report_filter({"benchmark": {"levels": {"single": {"ttft_ms_p50": "fast"}}}}, CHECK_TEMPLATE, CHART_JS)


def split_plan(items: list[dict[str, Any]]) -> dict[str, Any]:
    """vllm_node_plan of several instances on the story's 8 x RTX PRO 6000 (catalogs from the vllm_node role)."""
    catalogs = ROOT / "roles/vllm_node/vars/main"
    return vm.node_plan({
        "model": "", "releases": gt.load_releases(), "gpu": "rtx-pro-6000-blackwell", "gpu_count": 8,
        "models": yaml.safe_load((catalogs / "models.yml").read_text())["vllm_node_catalog_models"],
        "gpus": yaml.safe_load((catalogs / "gpus.yml").read_text())["vllm_node_catalog_gpus"], "instances": items})


def test_a_split_draws_every_gpus_stack_per_instance() -> None:
    """Each GPU carries what every instance on it takes, one above the other (the memory torch never sees counted
    once on a shared GPU), then what stays free: every bar is the GPU's memory. An instance the plan refused draws
    nothing, and the page names every instance."""
    plan = split_plan([{"name": "a", "model": "gpt-oss-120b", "gpus": [6, 7], "gpu_memory_utilization": 0.45},
                       {"name": "b", "model": "gpt-oss-120b", "gpus": [6, 7], "gpu_memory_utilization": 0.45},
                       {"name": "c", "model": "llama-3.1-70b-instruct", "gpus": 4},
                       {"name": "k", "model": "kimi-k2.5-nvfp4", "gpus": 2}])
    chart = instances_chart(plan)
    assert chart["gpus"] == [f"GPU {i}" for i in range(8)]
    by_instance: dict[str, list[int]] = {}
    for seg in chart["planned"]:
        assert seg["label"].startswith(seg["instance"] + ": ") or seg["key"] == "headroom"
        by_instance.setdefault(seg["instance"], [0] * 8)
        by_instance[seg["instance"]] = [x + y for x, y in zip(by_instance[seg["instance"]], seg["bytes"], strict=True)]
    assert sorted(by_instance) == ["", "a", "b", "c"]           # k (Kimi on 2 GPUs) is refused: nothing drawn
    a_plan = plan["instances"][0]["plan"]["per_gpu"]
    takes = a_plan["requested_bytes"] + a_plan["non_torch_bytes"]
    assert by_instance["a"] == [0] * 6 + [takes] * 2
    assert by_instance["b"] == [0] * 6 + [takes - plan["unseen_bytes"]] * 2
    assert [i for i, v in enumerate(by_instance["c"]) if v] == plan["instances"][2]["gpus"]
    placed = {g for r in plan["instances"] if r["plan"] for g in r["gpus"]}
    for gpu in range(8):   # every bar of a placed GPU is the GPU: what the instances take plus what stays free
        stacked = sum(seg["bytes"][gpu] for seg in chart["planned"])
        assert stacked == chart["total_bytes"] if gpu in placed else by_instance[""][gpu] == chart["total_bytes"]
    alone = memory_chart(plan["instances"][2]["plan"])["budget_bytes"]
    single = memory_chart(plan["instances"][0]["plan"])
    assert chart["budget_bytes"] == max(2 * single["budget_bytes"], alone)   # a shared GPU holds two budgets
    html = plan_report_html(plan, TEMPLATE, CHART_JS)
    assert embedded(html, "chart-data") == json.loads(script_json(chart))
    assert all(f'data-instance="{n}"' in html for n in "abck") and "DOES NOT FIT" in html
