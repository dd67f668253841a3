"""playbooks/rollout.yml on a node serving several models (vllm_node_instances, issue 27): the rollout's own steps
(roles/rollout/tasks: check, decide, drain, enable) through ansible-playbook, on a node and a gateway that are both this
machine (connection local), behind the machine's own HAProxy. The node's check-mode pass is given as what
playbooks/tasks/node_instance_serve.yml notes per instance (restart_needed, from each include's vllm_service); each
instance is a stand-in answering /health and vLLM's request gauges on /metrics (harness.backends.GaugeVllm).

What must hold: only the instances that would restart are the node's change (rollout_restart_instances), each with its
own benchmark from before (vllm_node_instance_benchmark_state_file), not the node's single-model one nor another
instance's; the drain waits for the requests of those instances only (one that keeps running keeps its requests);
a restarting instance without its own baseline is refused by name before anything is drained; a single-model node is
decided as before (vllm_service_restart_needed, benchmark-last.json, vllm_service_url)."""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import haproxy, playbook
from harness.backends import GaugeVllm

PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "rollout_instances.yml"
NODE, GATEWAY = "rollout-node", "rollout-gateway"
INSTANCES = [{"name": "chat", "model": "tiny-llama"}, {"name": "mla", "model": "tiny-deepseek-v3"}]
DRAIN_TIMEOUT = 8
# each record as inference_check keeps it: distinct figures, so the test sees whose was read
RECORDS = {"node": {"time": "2026-12-06T10:00:00+00:00", "levels": {"single": {"output_tps": 11.0}}},
           "chat": {"time": "2026-12-06T11:00:00+00:00", "levels": {"single": {"output_tps": 22.0}}},
           "mla": {"time": "2026-12-06T12:00:00+00:00", "levels": {"single": {"output_tps": 33.0}}}}


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The real plans of a two-instance node (chat, mla) and of a single-model one."""
    two = json.dumps({"vllm_node_instances": INSTANCES})
    return {"instances": playbook.demo_plan(tmp_path_factory.mktemp("instances") / "plan.json", "-e", two),
            "single": playbook.demo_plan(tmp_path_factory.mktemp("single") / "plan.json")}


@pytest.fixture()
def stand_ins() -> Iterator[dict[str, GaugeVllm]]:
    """chat with 3 requests running (it keeps serving), mla idle."""
    servers = {"chat": GaugeVllm("chat", running=3).start(), "mla": GaugeVllm("mla").start()}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture()
def gateway(tmp_path: Path, stand_ins: dict[str, GaugeVllm]) -> Iterator[Path]:
    """HAProxy with the node as a server of backend vllm (checked on mla's /health); its runtime socket."""
    with haproxy.one_server(tmp_path, NODE, stand_ins["mla"].port) as runtime:
        yield runtime


def run_rollout_steps(tmp_path: Path, gateway: Path, node: dict[str, Any], records: dict[str, dict[str, Any]],
                      **settings: Any) -> tuple[int, str, dict[str, Any]]:
    """The rollout's steps on the node (`node`: its plan and check-mode facts) with `records` kept on it and the
    rollout `settings` on top; (rc, output, what the play wrote)."""
    state = tmp_path / "state"
    state.mkdir()
    for name, record in records.items():
        target = state / ("benchmark-last.json" if name == "node" else f"benchmark-last-{name}.json")
        target.write_text(json.dumps(record))
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"children": {"vllm_nodes": {"hosts": {NODE: {**local, **node}}},
                                      "gateways": {"hosts": {GATEWAY: local}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    result = tmp_path / "result.json"
    extra = {"rollout_gateway_socket": str(gateway), "rollout_report_dir": str(tmp_path / "reports"),
             "rollout_drain_timeout": DRAIN_TIMEOUT, "rollout_drain_interval": 1, "rollout_page_cache": False,
             "rollout_gateway_timeout": 30, "result_file": str(result),
             "inference_check_benchmark_state_file": str(state / "benchmark-last.json"),
             "vllm_node_instance_benchmark_state_file": str(state / "benchmark-last-%s.json"), **settings}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    rc, out, _ = playbook.run(PLAYBOOK, "-e", f"@{tmp_path / 'extra.json'}", inventory=str(tmp_path / "hosts.yml"),
                              env=playbook.environment(ANSIBLE_LOCALHOST_WARNING="false"), timeout=300)
    return rc, out, json.loads(result.read_text()) if result.exists() else {}


def checked_instances(stand_ins: dict[str, GaugeVllm], restarting: set[str]) -> list[dict[str, Any]]:
    """The node's instances as its check-mode pass noted them."""
    return [{"name": name, "unit": f"vllm-{name}", "url": server.url, "restart_needed": name in restarting}
            for name, server in stand_ins.items()]


def server_state(gateway: Path) -> dict[str, Any]:
    """The node's server in HAProxy's backend vllm now."""
    return dict(haproxy.servers(haproxy.runtime_command(gateway, "show stat"), "vllm")[NODE])


def test_only_the_changed_instance_is_the_change_with_its_own_baseline_and_its_own_drain(
        tmp_path: Path, gateway: Path, stand_ins: dict[str, GaugeVllm], plans: dict[str, dict[str, Any]]) -> None:
    # the check-mode pass left vllm_service_url and vllm_service_restart_needed at its last include's: chat's
    node = {"vllm_node_plan": plans["instances"], "served": checked_instances(stand_ins, {"mla"}),
            "restart_needed": False,
            "vllm_service_url": stand_ins["chat"].url}
    rc, out, result = run_rollout_steps(tmp_path, gateway, node, RECORDS)
    assert rc == 0, out[-4000:]
    assert result["restart_needed"] is True and result["restart_instances"] == ["mla"], result
    assert result["baselines"] == {"mla": RECORDS["mla"]}, "mla is gated against its own figures only"
    assert result["baseline"] == {}, "the node's single-model record is not a baseline of an instance"
    assert "mla of 2026-12-06T12:00:00+00:00" in re.sub(r"\s+", " ", out) and "left running: chat" in out
    # the wait read mla's gauges (0) and ended at once; chat, left running with its 3 requests, was not waited on
    assert result["drain_left"] == 0
    assert stand_ins["mla"].scrapes >= 1 and stand_ins["chat"].scrapes == 0
    waited = result["times"]["drained"] - result["times"]["drain"]
    assert waited < DRAIN_TIMEOUT, f"the drain waited {waited:.1f} s"
    assert result["drained_stat"]["vllm"][NODE]["admin_drain"], result["drained_stat"]
    assert not server_state(gateway)["admin_drain"], "the node was not put back"


def test_a_restarting_instance_without_its_own_baseline_is_refused_before_any_drain(
        tmp_path: Path, gateway: Path, stand_ins: dict[str, GaugeVllm], plans: dict[str, dict[str, Any]]) -> None:
    node = {"vllm_node_plan": plans["instances"], "served": checked_instances(stand_ins, {"mla"}),
            "restart_needed": False,
            "vllm_service_url": stand_ins["chat"].url}
    # the node's single-model record and chat's are there; mla's is not
    rc, out, _ = run_rollout_steps(tmp_path, gateway, node, {"node": RECORDS["node"], "chat": RECORDS["chat"]})
    folded = re.sub(r"\s+", " ", out)
    assert rc != 0
    assert (f"On {NODE} the instance(s) mla would restart but have no benchmark from before the change "
            f"({tmp_path / 'state' / 'benchmark-last-mla.json'})") in folded, out[-3000:]
    assert "Nothing was drained or changed." in folded
    assert "Drain the node at the gateways" not in out
    assert not server_state(gateway)["admin_drain"]


def test_a_single_model_node_is_decided_as_before(tmp_path: Path, gateway: Path, stand_ins: dict[str, GaugeVllm],
                                                  plans: dict[str, dict[str, Any]]) -> None:
    node = {"vllm_node_plan": plans["single"], "served": [], "restart_needed": True,
            "vllm_service_url": stand_ins["mla"].url}
    rc, out, result = run_rollout_steps(tmp_path, gateway, node, RECORDS)
    assert rc == 0, out[-4000:]
    assert result["restart_needed"] is True and result["restart_instances"] == []
    assert result["baseline"] == RECORDS["node"] and result["baselines"] == {}
    assert result["drain_left"] == 0 and stand_ins["mla"].scrapes >= 1
    assert result["drained_stat"]["vllm"][NODE]["admin_drain"]
    assert "restarted and gated against its benchmark of 2026-12-06T10:00:00+00:00" in re.sub(r"\s+", " ", out)


def test_a_node_none_of_whose_instances_changes_is_left_alone(
        tmp_path: Path, gateway: Path, stand_ins: dict[str, GaugeVllm], plans: dict[str, dict[str, Any]]) -> None:
    # vllm_service_restart_needed of the last include says nothing of the node with instances
    node = {"vllm_node_plan": plans["instances"], "served": checked_instances(stand_ins, set()), "restart_needed": True,
            "vllm_service_url": stand_ins["chat"].url}
    rc, out, result = run_rollout_steps(tmp_path, gateway, node, {})
    assert rc == 0, out[-4000:]
    assert result["restart_needed"] is False and result["restart_instances"] == [] and result["baselines"] == {}
    assert "left alone (no drain, no restart)" in out
    assert stand_ins["chat"].scrapes == 0 and stand_ins["mla"].scrapes == 0
    assert not server_state(gateway)["admin_drain"]


def test_the_drained_baseline_is_refused_on_a_node_with_instances_before_any_drain(
        tmp_path: Path, gateway: Path, stand_ins: dict[str, GaugeVllm], plans: dict[str, dict[str, Any]]) -> None:
    """rollout_baseline_source drained benchmarks a node's single service: a node serving instances is refused by
    name in the first play, with the option named, although every instance has its kept baseline."""
    node = {"vllm_node_plan": plans["instances"], "served": checked_instances(stand_ins, {"mla"}),
            "restart_needed": False, "vllm_service_url": stand_ins["chat"].url}
    rc, out, _ = run_rollout_steps(tmp_path, gateway, node, RECORDS, rollout_baseline_source="drained")
    folded = re.sub(r"\s+", " ", out)
    assert rc != 0
    assert (f"{NODE} serves instances (vllm_node_instances: chat, mla): rollout_baseline_source: drained benchmarks "
            "a node's single service only. Set rollout_baseline_source: stored") in folded, out[-3000:]
    assert "Nothing was drained or changed." in folded
    assert "Drain the node at the gateways" not in out
    assert not server_state(gateway)["admin_drain"]
