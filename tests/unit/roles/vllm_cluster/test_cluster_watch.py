"""The group-healing watch (roles/vllm_cluster/templates/.../cluster-watch.py.j2), rendered and run against scripted
`systemctl show` and `ss` answers: it restarts its unit only when none of the peer-side endpoints its current
process was seen connected to is left, even when the peer's new process has already reconnected."""

from __future__ import annotations

import json
import types
from pathlib import Path

import jinja2
import pytest

from repo_root import ROOT

TEMPLATE = (ROOT / "roles/vllm_cluster/templates/usr/local/libexec/vllm-node/"
            "cluster-watch.py.j2")
HEAD, WORKER = "172.31.112.10", "172.31.112.11"


class Node:
    """A scripted member: the unit's invocation and the established connections `ss` reports."""

    def __init__(self) -> None:
        self.invocation, self.active = "inv-1", "active"
        self.connections: list[tuple[str, str]] = []  # (local, remote)
        self.restarts = 0
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], **_kwargs: object) -> types.SimpleNamespace:
        if argv[:2] == ["systemctl", "show"]:
            return types.SimpleNamespace(stdout=f"InvocationID={self.invocation}\nActiveState={self.active}\n")
        if argv[:2] in (["systemctl", "restart"], ["systemctl", "kill"]):
            self.calls.append(argv)
            self.restarts += argv[1] == "restart"
            return types.SimpleNamespace(stdout="")
        assert argv[0] == "ss"
        return types.SimpleNamespace(stdout="".join(f"0 0 {local} {remote}\n" for local, remote in self.connections))


@pytest.fixture()
def watch(tmp_path: Path) -> tuple[dict, Node]:
    """The head's watch (peer: the worker), its subprocess calls answered by a scripted node."""
    env = jinja2.Environment()
    env.filters["to_json"] = json.dumps
    env.filters["comment"] = lambda text: "# " + text
    source = env.from_string(TEMPLATE.read_text()).render(
        ansible_managed="managed", vllm_cluster_service_name="vllm", vllm_cluster_runtime={"address": HEAD},
        __vllm_cluster_peer_addresses=[WORKER], __vllm_cluster_watch_state=str(tmp_path / "state.json"),
        __vllm_cluster_api_port=8000, vllm_cluster_master_port=29501)
    namespace: dict = {"__name__": "cluster_watch"}
    exec(compile(source, str(TEMPLATE), "exec"), namespace)  # noqa: S102  # the rendered script under test
    node = Node()
    namespace["subprocess"] = types.SimpleNamespace(run=node.run)
    return namespace, node


def test_endpoints_leave_out_the_api_and_the_store_port(watch: tuple[dict, Node]) -> None:
    namespace, node = watch
    node.connections = [(f"{HEAD}:29501", f"{WORKER}:41234"),   # the worker's store client: kept
                        (f"{HEAD}:8000", f"{WORKER}:40100"),    # the worker polling the API: left out
                        (f"{HEAD}:40200", f"{WORKER}:8000"),
                        (f"{HEAD}:40300", f"{WORKER}:29501"),   # to a store port on the peer: left out
                        (f"{HEAD}:33333", f"{WORKER}:45555")]   # a Gloo pair: kept
    assert namespace["peer_endpoints"](WORKER) == {f"{WORKER}:41234", f"{WORKER}:45555"}


def test_restarts_when_the_old_endpoints_are_gone_even_if_new_ones_came(watch: tuple[dict, Node]) -> None:
    namespace, node = watch
    node.connections = [(f"{HEAD}:33333", f"{WORKER}:45555"), (f"{HEAD}:29501", f"{WORKER}:41234")]
    namespace["main"]()
    # one of them closes, a new one opens: the same peer process, nothing to do
    node.connections = [(f"{HEAD}:29501", f"{WORKER}:41234"), (f"{HEAD}:29501", f"{WORKER}:41999")]
    namespace["main"]()
    assert node.restarts == 0
    # the worker was killed and its new process already reconnected: none of the seen endpoints is left
    node.connections = [(f"{HEAD}:29501", f"{WORKER}:50001")]
    namespace["main"]()
    assert node.restarts == 1


def test_no_restart_before_a_connection_was_seen_or_while_the_unit_is_down(watch: tuple[dict, Node]) -> None:
    namespace, node = watch
    namespace["main"]()  # starting: nothing seen yet
    node.connections = [(f"{HEAD}:33333", f"{WORKER}:45555")]
    namespace["main"]()
    node.active, node.connections = "failed", []
    namespace["main"]()  # the unit itself is down: systemd restarts it, the watch forgets
    node.active, node.invocation = "active", "inv-2"
    namespace["main"]()
    assert node.restarts == 0


def test_a_gone_peer_kills_the_unit_before_restarting_it(watch: tuple[dict, Node]) -> None:
    """No graceful drain for a replica that lost a stage: SIGKILL first, so the peer's new process cannot join the
    dying one's rendezvous, then the restart."""
    namespace, node = watch
    node.connections = [(f"{HEAD}:33333", f"{WORKER}:45555")]
    namespace["main"]()
    node.connections = []
    namespace["main"]()
    assert node.calls == [["systemctl", "kill", "--signal=SIGKILL", "vllm.service"],
                          ["systemctl", "restart", "--no-block", "vllm.service"]]
