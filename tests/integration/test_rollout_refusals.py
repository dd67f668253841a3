"""playbooks/rollout.yml refuses bad input before anything is drained: the real ansible-playbook against a throwaway
inventory whose node and gateway are this machine (connection local). Each refusal must come from the first play
(check mode), and the second play, the one that drains, must never start.

The gateway's runtime API is stood in for by a UNIX socket in tmp_path answering `show stat` with HAProxy 2.6's
CSV header and one server: enough for the module that reads it (vllm_node.vllm_node.gateway_servers).
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness import playbook
from harness.haproxy import AnsweringSocket

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODE, GATEWAY = "rollout-node", "rollout-gateway"
SHOW_STAT = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,weight\n"
             "vllm,some-other-node,0,0,0,1,256,9,UP,1\nvllm,BACKEND,0,0,0,1,256,9,UP,1\n\n")


@pytest.fixture()
def stat_socket(tmp_path: Path) -> Iterator[str]:
    """A UNIX socket that answers every connection with SHOW_STAT, like HAProxy's runtime API."""
    with AnsweringSocket(SHOW_STAT.encode, tmp_path / "gateway.sock", read_request=True) as answering:
        yield str(answering.address)


def refused_rollout(tmp_path: Path, **extra: object) -> tuple[int, str]:
    """rollout.yml against a node and a gateway that are both this machine; (rc, output)."""
    inventory = {"all": {"children": {
        "vllm_nodes": {"hosts": {NODE: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}},
        "gateways": {"hosts": {GATEWAY: {"ansible_connection": "local",
                                         "ansible_python_interpreter": sys.executable}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "vars.yml").write_text(yaml.safe_dump({"rollout_report_dir": str(tmp_path / "reports"), **extra}))
    rc, out, _ = playbook.run("playbooks/rollout.yml", "-e", f"@{tmp_path / 'vars.yml'}",
                              inventory=str(tmp_path / "hosts.yml"), timeout=600)
    return rc, out


def assert_nothing_drained(out: str) -> None:
    assert "Change the nodes batch by batch" not in out, "the play that drains started"
    assert "Drain the node at the gateways" not in out


def test_an_unknown_gateway_host_is_refused(tmp_path: Path) -> None:
    rc, out = refused_rollout(tmp_path, rollout_gateway_hosts=["no-such-gateway"])
    assert rc != 0
    assert "gateway host(s) no-such-gateway not in the inventory" in out, out[-3000:]
    assert_nothing_drained(out)


def test_no_gateway_at_all_is_refused(tmp_path: Path) -> None:
    rc, out = refused_rollout(tmp_path, rollout_gateway_hosts=[])
    assert rc != 0
    assert "no gateway host" in out, out[-3000:]
    assert_nothing_drained(out)


def test_a_missing_runtime_socket_is_refused(tmp_path: Path) -> None:
    rc, out = refused_rollout(tmp_path, rollout_gateway_socket=str(tmp_path / "missing.sock"))
    assert rc != 0
    assert f"HAProxy's runtime API socket {tmp_path / 'missing.sock'} is not there" in out, out[-3000:]
    assert_nothing_drained(out)


def test_a_node_the_gateway_does_not_know_is_refused(tmp_path: Path, stat_socket: str) -> None:
    rc, out = refused_rollout(tmp_path, rollout_gateway_socket=stat_socket)
    assert rc != 0
    assert f"{NODE} is not a server of any backend" in out and "vllm: some-other-node" in out, out[-3000:]
    assert_nothing_drained(out)


def test_a_node_the_named_backend_does_not_hold_is_refused(tmp_path: Path, stat_socket: str) -> None:
    rc, out = refused_rollout(tmp_path, rollout_gateway_socket=stat_socket, rollout_gateway_backend="vllm")
    assert rc != 0
    assert f"{NODE} is not a server of backend 'vllm'" in out and "it has some-other-node" in out, out[-3000:]
    assert_nothing_drained(out)
