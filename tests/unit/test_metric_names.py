"""The metric-name contract: names extracted from PromQL (dashboards, alert rules), the scrape's names, and the
check that reports a panel or alert whose metric the pinned vLLM (or dcgm-exporter) does not expose.

Against recorded fixtures here (vLLM 0.32.0's metric families, the canned dcgm-exporter exposition); the same check
runs against the live scrape in molecule/site_e2e/tests/test_observability.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import metric_names as mn

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "roles" / "observability" / "files" / "dashboards").glob("*.json"))
VLLM_FAMILIES = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32.0-metric-families.txt"
DCGM_EXPOSITION = ROOT / "tests" / "fixtures" / "dcgm_exporter" / "metrics"
NODE_EXPORTER_NAMES = ROOT / "tests" / "fixtures" / "metrics" / "node-exporter-1.5.0-names.txt"


@pytest.mark.parametrize(("expr", "names"), [
    ("vllm:num_requests_running", {"vllm:num_requests_running"}),
    ('histogram_quantile(0.99, sum by (le, node) (rate(vllm:ttft_bucket{job="vllm", le=~"0.5"}[5m])))',
     {"vllm:ttft_bucket"}),
    ("sum(rate(http_requests_total{status=~'5..'}[5m])) by (handler) / ignoring(status) group_left(node) up",
     {"http_requests_total", "up"}),
    ("sum without (gpu) (DCGM_FI_DEV_GPU_TEMP) > bool 85", {"DCGM_FI_DEV_GPU_TEMP"}),
    ('{__name__="vllm:kv_cache_usage_perc", job="vllm"} > 0.9', {"vllm:kv_cache_usage_perc"}),
    ("rate(a_total[5m] offset 1h) and b @ start() or c unless d", {"a_total", "b", "c", "d"}),
    ("max_over_time(deriv(queue[5m:1m])[1h:])", {"queue"}),
    ("x > 1e3 and y < 0x1f or z == Inf or w != NaN", {"x", "y", "z", "w"}),
    ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}),
    ('topk(5, sum by (model_name) (rate(m_total{model_name=~"$model_name"}[$__rate_interval])))', {"m_total"}),
    ("sum(rate(m_total[${__rate_interval}])) * $scale + [[legacy]]", {"m_total"}),
    ('count_values("version", build_info) # build_info is not a metric here: "comment" {x}', {"build_info"}),
    ("1 - avg by (node) (rate(node_cpu_seconds_total{mode='idle'}[5m]))", {"node_cpu_seconds_total"}),
    ("time() - process_start_time_seconds", {"process_start_time_seconds"}),
    ("vector(1) + scalar(sum(on) )", set()),
    ('a{label="} [5m] ( b"} + c{x=`}`}', {"a", "c"}),
    ("quantile(0.9, latency) by (job)", {"latency"}),
], ids=lambda value: value if isinstance(value, str) else None)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert mn.promql_metric_names(expr) == names


@pytest.mark.parametrize("expr", ["sum(rate(x[5m])", "x)", 'x{job="vllm"', 'x{job="vllm}', "x[5m"])
def test_malformed_promql_is_refused_with_the_expression(expr: str) -> None:
    with pytest.raises(ValueError, match="PromQL expression"):
        mn.promql_metric_names(expr)


def test_exposition_names_reads_samples_and_declared_families() -> None:
    text = (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n'
        "# TYPE vllm:request_success counter\n"
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 3.0\nvllm:e2e_request_latency_seconds_count 3.0\n'
        "process_open_fds 12\n\n# a comment\n"
    )
    assert mn.exposition_names(text) == {
        "vllm:kv_cache_usage_perc", "vllm:request_success", "vllm:e2e_request_latency_seconds",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_count", "process_open_fds",
    }


@pytest.mark.parametrize(("query", "selector"), [
    ('label_values(vllm:num_requests_running{job="vllm"}, node)', 'vllm:num_requests_running{job="vllm"}'),
    ("label_values(node)", ""),
    ("query_result(topk(3, x))", "topk(3, x)"),
    ("metrics(vllm:.*)", ""),
    ("up", "up"),
])
def test_grafana_variable_selector(query: str, selector: str) -> None:
    assert mn.grafana_variable_selector(query) == selector


def test_dashboard_expressions_walks_rows_and_variables() -> None:
    dashboard = {
        "panels": [
            {"title": "A", "targets": [{"expr": "a"}, {"expr": ""}, {"refId": "B"}]},
            {"type": "row", "title": "row", "panels": [{"title": "B", "targets": [{"expr": "b"}]}]},
            {"id": 7, "targets": [{"expr": "c"}]},
        ],
        "templating": {"list": [
            {"name": "node", "type": "query", "query": {"query": "label_values(up{job='x'}, node)"}},
            {"name": "ds", "type": "datasource", "query": "prometheus"},
        ]},
    }
    assert mn.dashboard_expressions(dashboard) == {
        "A": ["a"], "B": ["b"], "panel 7": ["c"], "templating:node": ["up{job='x'}"]}


def test_rule_expressions() -> None:
    rules = {"groups": [{"rules": [{"alert": "A", "expr": "a > 1"}, {"record": "r:b", "expr": "sum(b)"}]}]}
    assert mn.rule_expressions(rules) == {"A": ["a > 1"], "r:b": ["sum(b)"]}


def test_missing_metric_names_checks_only_the_prefixes_and_accepts_histogram_samples() -> None:
    exprs = {"p": ["rate(vllm:x_bucket[5m]) + vllm:gone + node_load1"], "q": ["vllm:y_count"]}
    exposed = {"vllm:x", "vllm:y_count"}
    assert mn.missing_metric_names(exprs, exposed, ["vllm:"]) == {"p": ["vllm:gone"]}
    assert mn.missing_metric_names(exprs, exposed) == {"p": ["node_load1", "vllm:gone"]}


# ---- the contract on the committed dashboards, against the recorded scrapes ------------------------------------

def recorded(path: Path) -> set[str]:
    """Recorded metric names, one a line ('#' comments)."""
    return {line for line in path.read_text().splitlines() if line and not line.startswith("#")}


def recorded_vllm_names() -> set[str]:
    """vLLM 0.32.0's metric families, as recorded."""
    return recorded(VLLM_FAMILIES)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_there_are_dashboards_and_each_uses_the_templated_datasource() -> None:
    assert [p.name for p in DASHBOARDS] == ["vllm-node-gpu.json", "vllm-node-serving.json"]
    for path in DASHBOARDS:
        dashboard = load(path)
        exprs = mn.dashboard_expressions(dashboard)
        assert len(exprs) >= 8, path.name
        for panel in dashboard["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert all(target["datasource"]["uid"] == "${datasource}" for target in panel["targets"])


def test_the_serving_dashboard_covers_what_operators_ask() -> None:
    used = {name for exprs in mn.dashboard_expressions(load(DASHBOARDS[1])).values()
            for expr in exprs for name in mn.promql_metric_names(expr)}
    for name in ["vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:generation_tokens_total"]:
        assert name in used


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboards_use_only_names_the_pinned_vllm_and_dcgm_exporter_expose(path: Path) -> None:
    exprs = mn.dashboard_expressions(load(path))
    dcgm = mn.exposition_names(DCGM_EXPOSITION.read_text())
    assert mn.missing_metric_names(exprs, recorded_vllm_names(), ["vllm:", "http_"]) == {}
    assert mn.missing_metric_names(exprs, dcgm, ["DCGM_"]) == {}
    assert mn.missing_metric_names(exprs, recorded(NODE_EXPORTER_NAMES), ["node_"]) == {}


@pytest.mark.parametrize(("old", "new", "panel"), [
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "KV cache usage"),
    ("vllm:request_time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
     "Time per output token (p50, p90, p99)"),
    ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", "Xid errors"),
    ("node_memory_MemAvailable_bytes", "node_memory_MemAvailable", "Node memory available"),
], ids=["kv-cache-pre-0.32", "tpot-pre-0.32", "dcgm-xid", "node-exporter-pre-0.16"])
def test_the_contract_fails_on_a_renamed_metric(old: str, new: str, panel: str) -> None:
    """The dashboards with one metric renamed back to a name vLLM 0.32 (or dcgm-exporter) does not expose: the
    check names the panel and the missing metric."""
    dcgm = mn.exposition_names(DCGM_EXPOSITION.read_text())
    exposed = recorded_vllm_names() | dcgm | recorded(NODE_EXPORTER_NAMES)
    for path in DASHBOARDS:
        text = path.read_text()
        if old not in text:
            continue
        renamed = json.loads(text.replace(old, new))
        checked = ["vllm:", "http_", "DCGM_", "node_"]
        assert mn.missing_metric_names(mn.dashboard_expressions(json.loads(text)), exposed, checked) == {}
        assert mn.missing_metric_names(mn.dashboard_expressions(renamed), exposed, checked) == {panel: [new]}
        return
    pytest.fail(f"{old} is in no dashboard")


def test_the_canned_dcgm_exposition_serves_what_the_alerts_read() -> None:
    dcgm = mn.exposition_names(DCGM_EXPOSITION.read_text())
    for name in ["DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                 "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]:
        assert name in dcgm


def test_deepcopy_is_not_needed_the_functions_do_not_mutate() -> None:
    dashboard = load(DASHBOARDS[1])
    before = copy.deepcopy(dashboard)
    mn.dashboard_expressions(dashboard)
    assert dashboard == before
