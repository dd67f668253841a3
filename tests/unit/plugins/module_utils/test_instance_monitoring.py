"""Prometheus per vLLM instance (plugins/module_utils/instance_monitoring.py and its filter observability_instances):
each planned instance scraped on the node's scrape address and its own port, labelled with its name and served
model, its waiting threshold from its own plan; a single-model plan gives nothing (the role keeps one target)."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.filter.observability import FilterModule, observability_instances
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import instance_monitoring as im


def entry(name: str, port: int, concurrency: float | None, tokens: int | None = 4096,
          served: str = "") -> dict[str, Any]:
    """One row of a split's plan (sizing/instances.py's shape, the parts read here)."""
    kv = {} if concurrency is None else {"max_concurrency": concurrency, "tokens": tokens}
    return {"name": name, "model": f"{name}-key", "served_model_name": served or f"org/{name}",
            "plan": {"served_model_name": served or f"org/{name}", "kv": kv,
                     "service": {"port": port, "listen_address": "0.0.0.0"}}}


SPLIT = {"device": "cuda", "instances": [entry("chat", 8000, 1.5), entry("mla", 8001, 12.2, 65536)]}


@pytest.mark.parametrize(("target", "host"), [
    ("10.0.0.11:8000", "10.0.0.11"), ("node1.example:8000", "node1.example"), ("[::1]:8000", "[::1]"),
    ("::1:8000", "[::1]"), ("[fd00::5]:9000", "[fd00::5]"),
])
def test_scrape_host(target: str, host: str) -> None:
    assert im.scrape_host(target) == host


@pytest.mark.parametrize("target", ["10.0.0.11", "10.0.0.11:", ":8000", "host:http", ""])
def test_a_target_without_host_and_port_is_refused(target: str) -> None:
    with pytest.raises(ValueError, match="must be host:port"):
        im.scrape_host(target)


@pytest.mark.parametrize(("concurrency", "override", "threshold"), [
    (3.2, None, 4), (2.0, None, 2), (0.4, None, 1), (None, None, 1), ("53.59", None, 54), (3.2, 0, 0), (3.2, "7", 7),
])
def test_waiting_threshold(concurrency: Any, override: Any, threshold: int) -> None:
    assert im.waiting_threshold(concurrency, override) == threshold


def test_a_negative_waiting_override_is_refused() -> None:
    with pytest.raises(ValueError, match="observability_alert_waiting_requests must be >= 0"):
        im.waiting_threshold(3.2, -1)


def test_a_single_model_plan_has_no_instances() -> None:
    assert im.instances({"device": "cuda", "kv": {"max_concurrency": 3.2}}, "10.0.0.11:8000") == []
    assert im.instances(None, "not a target") == []


def test_each_instance_on_its_own_port_of_the_nodes_address_with_its_own_threshold() -> None:
    assert im.instances(SPLIT, "10.0.0.11:8000") == [
        {"name": "chat", "model": "org/chat", "target": "10.0.0.11:8000", "waiting": 2, "max_concurrency": 1.5,
         "kv_tokens": 4096},
        {"name": "mla", "model": "org/mla", "target": "10.0.0.11:8001", "waiting": 13, "max_concurrency": 12.2,
         "kv_tokens": 65536},
    ]
    ipv6 = im.instances(SPLIT, "[fd00::5]:8000")
    assert [r["target"] for r in ipv6] == ["[fd00::5]:8000", "[fd00::5]:8001"]


def test_the_override_sets_every_instances_threshold() -> None:
    assert [r["waiting"] for r in im.instances(SPLIT, "127.0.0.1:8000", 5)] == [5, 5]


def test_a_refused_instance_gets_no_target_and_a_plan_without_kv_the_least_threshold() -> None:
    refused = dict(entry("kimi", 8002, 1.0), plan=None)
    plan = {"instances": [refused, entry("cpu", 8000, None, served="vllm-node-test/tiny-llama")]}
    assert im.instances(plan, "127.0.0.1:8000") == [
        {"name": "cpu", "model": "vllm-node-test/tiny-llama", "target": "127.0.0.1:8000", "waiting": 1,
         "max_concurrency": None, "kv_tokens": None}]


@pytest.mark.parametrize(("plan", "needle"), [
    ({"instances": [entry("a", 8000, 1.0), entry("b", 8000, 1.0)]}, "share the target 127.0.0.1:8000"),
    ({"instances": [entry("a", 8000, 1.0), entry("a", 8001, 1.0)]}, "share the name a"),
    ({"instances": [dict(entry("a", 8000, 1.0), plan={"kv": {}})]}, "instance 'a': its plan has no service.port"),
    ({"instances": [entry("a", 0, 1.0)]}, "no service.port in 1..65535 \\(got 0\\)"),
    ({"instances": [entry("Bad name", 8000, 1.0)]}, "lower-case letters"),
    ({"instances": {"a": 1}}, "must be a list of mappings"),
])
def test_bad_plans_are_refused_naming_what(plan: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        im.instances(plan, "127.0.0.1:8000")


def test_the_filter_is_exported_and_names_itself_in_errors() -> None:
    assert FilterModule().filters() == {"observability_instances": observability_instances}
    assert observability_instances(SPLIT, "10.0.0.11:8000", None) == im.instances(SPLIT, "10.0.0.11:8000")
    with pytest.raises(Exception, match="^observability_instances: the vLLM scrape target must be host:port"):
        observability_instances(SPLIT, "10.0.0.11")
