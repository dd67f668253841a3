"""The vllm_cluster filter: rank and flags from the group's order, the cluster interface from `ip route get`."""

from __future__ import annotations

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.filter.vllm_cluster import (
    ClusterError,
    parse_route,
    vllm_cluster,
)

ADDRS_HEAD = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
12: eth0@if13    inet 172.31.111.10/24 brd 172.31.111.255 scope global eth0\\       valid_lft forever
14: eth1@if15    inet 172.31.112.10/24 brd 172.31.112.255 scope global eth1\\       valid_lft forever
"""
ROUTE_HEAD = "local 172.31.112.10 dev lo table local src 172.31.112.10 uid 0 \\    cache <local> "
ROUTE_WORKER = "172.31.112.10 dev eth1 src 172.31.112.11 uid 0 \\    cache "
ROUTE_VIA_GATEWAY = "172.31.112.10 via 172.31.111.1 dev eth0 src 172.31.111.11 uid 0 \\    cache "
MEMBERS = ["node-a", "node-b"]


def test_the_head_is_rank_0_and_serves_the_api() -> None:
    head = vllm_cluster(MEMBERS, "node-a", "172.31.112.10", 29501, ROUTE_HEAD, ADDRS_HEAD)
    assert (head["rank"], head["role"], head["node_count"]) == (0, "head", 2)
    assert head["interface"] == "eth1"       # the interface holding the master address, not lo, not eth0
    assert head["environment"] == {"VLLM_HOST_IP": "172.31.112.10", "GLOO_SOCKET_IFNAME": "eth1",
                                   "NCCL_SOCKET_IFNAME": "eth1"}
    assert head["args"] == ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "0",
                            "--master-addr", "172.31.112.10", "--master-port", "29501"]


def test_a_worker_runs_headless_on_the_interface_that_reaches_the_head() -> None:
    worker = vllm_cluster(MEMBERS, "node-b", "172.31.112.10", "29511", ROUTE_WORKER, "")
    assert (worker["rank"], worker["role"], worker["head"]) == (1, "worker", "node-a")
    assert worker["environment"]["VLLM_HOST_IP"] == "172.31.112.11"
    assert worker["environment"]["GLOO_SOCKET_IFNAME"] == "eth1"
    assert worker["args"][-3:] == ["--master-port", "29511", "--headless"]
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "1"


def test_parse_route_reads_dev_src_via_and_local() -> None:
    assert parse_route(ROUTE_VIA_GATEWAY) == {"via": "172.31.111.1", "dev": "eth0", "src": "172.31.111.11"}
    assert parse_route(ROUTE_HEAD)["local"] == "yes"


@pytest.mark.parametrize(("host", "route", "addresses", "message"), [
    ("node-b", ROUTE_VIA_GATEWAY, "", "node-b reaches the head's cluster address 172.31.112.10 only through"),
    ("node-b", "RTNETLINK answers: Network is unreachable", "", "node-b has no route"),
    ("node-b", ROUTE_HEAD, ADDRS_HEAD, "node-b holds the head's cluster address"),
    ("node-a", ROUTE_HEAD, ADDRS_HEAD.replace("172.31.112.10", "172.31.112.9"), "node-a is the head"),
])
def test_a_wrong_interface_is_refused_naming_the_node_and_the_fix(host: str, route: str, addresses: str,
                                                                  message: str) -> None:
    with pytest.raises(ClusterError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        vllm_cluster(MEMBERS, host, "172.31.112.10", 29501, route, addresses)
    assert "vllm_cluster_master_address" in str(error.value) or "connect node-b" in str(error.value)


@pytest.mark.parametrize(("members", "host", "port", "address", "message"), [
    (MEMBERS, "node-c", 29501, "172.31.112.10", "node-c is not a member"),
    (["node-a", "node-a"], "node-a", 29501, "172.31.112.10", "lists a member twice"),
    (MEMBERS, "node-b", 70000, "172.31.112.10", "must be in 1..65535"),
    (MEMBERS, "node-b", "x", "172.31.112.10", "must be a port number"),
    (MEMBERS, "node-b", 29501, "", "vllm_cluster_master_address is empty"),
])
def test_bad_inputs_are_refused(members: list[str], host: str, port: object, address: str, message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        vllm_cluster(members, host, address, port, ROUTE_WORKER, "")
