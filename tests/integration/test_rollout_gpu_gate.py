"""playbooks/rollout.yml leaves out a node whose GPUs fail their health gate (issue 28): the real ansible-playbook
against a node and a gateway that are both this machine (connection local). The node is the simulated GPU node of
tests/harness/gpu_node.py with a fatal Xid in its kernel log; the gateway is the machine's own HAProxy with the node
as a server of backend `vllm` and a runtime socket in tmp_path.

What must hold: the first play does not stop the rollout for it, the second drains it at the gateway (HAProxy shows
it DRAIN) and changes nothing on it (no deploy task runs), its report says `left_out` with the GPU and the cause, and
the last play fails naming it, its GPU and the fix."""
from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness import gpu_node, haproxy, playbook
from harness.backends import NamedBackend

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
NODE, GATEWAY = "rollout-node", "rollout-gateway"


@pytest.fixture()
def gateway(tmp_path: Path) -> Iterator[Path]:
    """HAProxy with the node as a server of backend vllm (a /health stand-in behind it); its runtime socket."""
    vllm = NamedBackend(NODE)
    vllm.start()
    try:
        with haproxy.one_server(tmp_path, NODE, vllm.port) as runtime:
            yield runtime
    finally:
        vllm.stop()


def test_a_node_whose_gpu_fails_is_drained_left_out_and_named(tmp_path: Path, gateway: Path) -> None:
    node = gpu_node.simulated(tmp_path, "h100", "h100-healthy.xml", "kern-xid79.log")
    local = {"ansible_connection": "local", "ansible_python_interpreter": node["ansible_python_interpreter"]}
    inventory = {"all": {"children": {
        "vllm_nodes": {"hosts": {NODE: {**local, **node}}},
        "gateways": {"hosts": {GATEWAY: {**local, "ansible_python_interpreter": sys.executable}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    reports = tmp_path / "reports"
    (tmp_path / "vars.yml").write_text(yaml.safe_dump({"rollout_report_dir": str(reports),
                                                       "rollout_gateway_socket": str(gateway)}))
    # the simulated tools read their data file from the environment the modules inherit (connection local)
    env = playbook.environment(VLLM_NODE_FAKE_GPUS=node["fake_gpus"], ANSIBLE_LOCALHOST_WARNING="false")
    env["PATH"] = f"{node['fake_bin']}:{env['PATH']}"
    rc, out, _ = playbook.run("playbooks/rollout.yml", "-e", f"@{tmp_path / 'vars.yml'}",
                              inventory=str(tmp_path / "hosts.yml"), env=env, timeout=600)
    folded = re.sub(r"\s+", " ", out)
    assert rc != 0, "a node left out must fail the run's last play"
    message = re.search(r"rollout-node was LEFT OUT of the rollout: (.*?) Report: ", folded)
    assert message, out[-4000:]
    text = message.group(1)
    assert "drained at rollout-gateway" in text and "nothing was changed on it" in text
    assert "GPU health check FAILED" in text and "Xid 79" in text and "GPU 1 (serial 1654723000001" in text, text
    assert "run playbooks/rollout.yml again" in text

    assert "Name the nodes left out of the rollout" in out, "the last play did not run"
    drains = [r for r in playbook.task_results(out, "Drain the node at the gateways") if r[0] != "skipping"]
    assert drains == [("changed", NODE)], drains
    ran = re.findall(r"^TASK \[((?:vllm_env|model_download|model_config|vllm_service|inference_check) : [^\]]*)\] \**\n"
                     r"(?:ok|changed): ", out, flags=re.M)
    assert ran == [], f"tasks that change the node ran on it: {ran}"
    stat = haproxy.servers(haproxy.runtime_command(gateway, "show stat"), "vllm")[NODE]
    assert stat["admin_drain"], stat

    report = json.loads((reports / f"{NODE}.json").read_text())
    assert report["outcome"] == "left_out" and "Xid 79" in report["cause"], report
    assert report["gateways"] == [GATEWAY]
