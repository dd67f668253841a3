"""The observability role's local mode on the e2e node (testinfra, run by `molecule verify` before test_site.py,
which changes the node): Debian's Prometheus on the node scrapes vLLM, node_exporter and the canned dcgm-exporter
(tests/fixtures/dcgm_exporter) over loopback; its HTTP API answers vLLM's gauges; every metric name in the committed
dashboards and the rendered alert rules is in the live scrapes (the metric-name contract), and the same check fails
on a renamed metric; the canned Xid fires GpuXidError end to end; nothing listens beyond loopback.
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.parse

import yaml

import metric_names as mn
from harness.project import PROJECT

HOST = "site_e2e-bookworm"
PROMETHEUS = "http://127.0.0.1:9090"
CONFIG_DIR = "/etc/prometheus/vllm-node"
DASHBOARDS = sorted((PROJECT / "roles" / "observability" / "files" / "dashboards").glob("*.json"))
# The first scrape comes within one 5 s interval of Prometheus' start; allow for a loaded machine.
SCRAPE_WAIT_SECONDS = 90

testinfra_hosts = [f"ansible://{HOST}"]


def get(host, url: str) -> str:
    """GET a URL on the node (the services listen on its loopback)."""
    return host.check_output(f"curl -sf --max-time 10 {shlex.quote(url)}")


def api(host, path: str, **params: str) -> dict:
    """Prometheus' HTTP API: the data of a successful answer."""
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    answer = json.loads(get(host, f"{PROMETHEUS}/api/v1/{path}{query}"))
    assert answer["status"] == "success", answer
    return answer["data"]


def wait_for_targets(host) -> list[dict]:
    """The active targets once every one has been scraped up (bounded by SCRAPE_WAIT_SECONDS)."""
    deadline = time.monotonic() + SCRAPE_WAIT_SECONDS
    while True:
        targets = api(host, "targets")["activeTargets"]
        if targets and all(t["health"] == "up" for t in targets):
            return targets
        assert time.monotonic() < deadline, f"targets not all up after {SCRAPE_WAIT_SECONDS} s: {targets}"
        time.sleep(2)


def expressions(host) -> dict[str, list[str]]:
    """Every PromQL expression of the committed dashboards and of the rules rendered on the node, by where."""
    found: dict[str, list[str]] = {}
    for path in DASHBOARDS:
        for where, exprs in mn.dashboard_expressions(json.loads(path.read_text())).items():
            found[f"{path.name}: {where}"] = exprs
    rules = yaml.safe_load(host.check_output(f"cat {CONFIG_DIR}/rules/vllm-node.rules.yml"))
    for where, exprs in mn.rule_expressions(rules).items():
        found[f"rules: {where}"] = exprs
    return found


def scrapes(host) -> dict[str, set[str]]:
    """The names each exporter serves now, by the metric prefix checked against it."""
    return {
        "vllm:": mn.exposition_names(get(host, "http://127.0.0.1:8000/metrics")),
        "http_": mn.exposition_names(get(host, "http://127.0.0.1:8000/metrics")),
        "node_": mn.exposition_names(get(host, "http://127.0.0.1:9100/metrics")),
        "DCGM_": mn.exposition_names(get(host, "http://127.0.0.1:9400/metrics")),
    }


def test_prometheus_scrapes_every_target_over_loopback(host):
    targets = wait_for_targets(host)
    by_job = {t["labels"]["job"]: t["scrapeUrl"] for t in targets}
    assert by_job == {
        "prometheus": "http://127.0.0.1:9090/metrics",
        "vllm": "http://127.0.0.1:8000/metrics",
        "node": "http://127.0.0.1:9100/metrics",
        "dcgm": "http://127.0.0.1:9400/metrics",
    }
    assert all(t["labels"].get("node", HOST) == HOST for t in targets)


def test_prometheus_answers_vllms_gauges(host):
    wait_for_targets(host)
    for metric in ["vllm:num_requests_running", "vllm:kv_cache_usage_perc"]:
        result = api(host, "query", query=metric)["result"]
        assert result, f"{metric}: no series in Prometheus"
        for series in result:
            labels, value = series["metric"], float(series["value"][1])
            assert (labels["job"], labels["node"], labels["cluster"]) == ("vllm", HOST, "vllm-node"), labels
            assert labels["model_name"]
            assert value >= 0
            if metric == "vllm:kv_cache_usage_perc":
                assert value <= 1, "kv_cache_usage_perc is a fraction"
        print(f"MEASURED prometheus {metric}: {[s['value'][1] for s in result]}")


def test_every_dashboard_and_alert_metric_is_in_the_live_scrapes(host):
    """The metric-name contract against the pinned vLLM, node_exporter and the canned dcgm-exporter, live."""
    exprs = expressions(host)
    live = scrapes(host)
    used = {name for values in exprs.values() for expr in values for name in mn.promql_metric_names(expr)}
    for prefix, names in live.items():
        checked = {n for n in used if n.startswith(prefix)}
        assert checked, f"no panel or alert uses a {prefix} metric: the check would be empty"
        assert mn.missing_metric_names(exprs, names, [prefix]) == {}, f"{prefix} names the scrape lacks"
        print(f"MEASURED contract {prefix}: {len(checked)} names checked against {len(names)} scraped")
    # Every name is known to Prometheus too (it scraped them), whatever its prefix.
    in_prometheus = set(api(host, "label/__name__/values"))
    assert mn.missing_metric_names(exprs, in_prometheus, ["vllm:", "http_", "node_", "DCGM_"]) == {}


def test_the_live_contract_fails_on_a_renamed_metric(host):
    """The serving dashboard with vLLM's pre-0.32 KV-cache name, checked against the same live scrape."""
    serving = next(p for p in DASHBOARDS if p.name == "vllm-node-serving.json").read_text()
    assert "vllm:kv_cache_usage_perc" in serving
    renamed = json.loads(serving.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))
    live = scrapes(host)["vllm:"]
    assert "vllm:gpu_cache_usage_perc" not in live
    assert mn.missing_metric_names(mn.dashboard_expressions(renamed), live, ["vllm:"]) == {
        "KV cache usage": ["vllm:gpu_cache_usage_perc"]}


def test_the_canned_xid_fires_the_gpu_alert(host):
    """GPU 0 of the canned dcgm-exporter reports Xid 79: GpuXidError (no `for:`) fires once a rule evaluation saw it."""
    wait_for_targets(host)
    deadline = time.monotonic() + SCRAPE_WAIT_SECONDS
    while True:
        firing = [a for a in api(host, "alerts")["alerts"] if a["state"] == "firing"]
        xid = [a for a in firing if a["labels"]["alertname"] == "GpuXidError"]
        if xid:
            break
        assert time.monotonic() < deadline, f"GpuXidError not firing after {SCRAPE_WAIT_SECONDS} s: {firing}"
        time.sleep(2)
    assert [(a["labels"]["gpu"], a["labels"]["node"], a["labels"]["severity"]) for a in xid] == [
        ("0", HOST, "critical")]
    assert xid[0]["annotations"]["summary"] == f"GPU 0 on {HOST} reported Xid 79"


def test_the_dashboards_are_on_the_node_as_committed(host):
    for path in DASHBOARDS:
        assert host.check_output(f"cat {CONFIG_DIR}/dashboards/{path.name}") == path.read_text().rstrip("\n")


def test_prometheus_and_node_exporter_listen_on_loopback_only(host):
    listening = host.check_output("ss -Hltn")
    for port in (9090, 9100):
        addresses = {line.split()[3] for line in listening.splitlines() if line.split()[3].endswith(f":{port}")}
        assert addresses == {f"127.0.0.1:{port}"}, f"port {port}: {addresses}"
