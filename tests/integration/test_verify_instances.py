"""playbooks/verify.yml on a node serving several models (vllm_node_instances, issue 27): every instance of the plan
is checked as site.yml checks it (playbooks/tasks/instance_checks.yml), at its own plan's address and port, under its
own unit vllm-<name>, with its report under artifacts/instances/<name>/; one failing does not hide the others'
reports, and the run fails naming each. The real ansible-playbook against a node that is this machine (connection
local) with the demo inventory's two-instance plan (playbooks/plan.yml); each instance is a stand-in answering vLLM's
model list with its served name and 401 without the key (harness.backends.FakeVllm), and nothing else, so each
instance's check runs up to its completion and fails there."""
from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness import playbook
from harness.backends import FakeVllm, free_port
from harness.project import ARTIFACTS

NODE = "verify-node"
KEY = "sk-verify-instances-test"
NAMES = ("verify-chat", "verify-mla")
MODELS = ("tiny-llama", "tiny-deepseek-v3")


@pytest.fixture()
def reports() -> Iterator[Path]:
    """artifacts/instances/, without this test's instances before and after it."""
    root = ARTIFACTS / "instances"
    for name in NAMES:
        shutil.rmtree(root / name, ignore_errors=True)
    yield root
    for name in NAMES:
        shutil.rmtree(root / name, ignore_errors=True)


def test_verify_checks_every_instance_with_its_own_url_unit_and_report(tmp_path: Path, reports: Path) -> None:
    ports = [free_port()]
    while len(ports) < 2:
        ports += [port for port in [free_port()] if port not in ports]
    instances = [{"name": name, "model": model, "port": port}
                 for name, model, port in zip(NAMES, MODELS, ports, strict=True)]
    plan_file = tmp_path / "plan.json"
    plan = playbook.demo_plan(plan_file, "-e", json.dumps({"vllm_node_instances": instances}))
    served = {row["name"]: row["plan"]["served_model_name"] for row in plan["instances"]}
    stand_ins = {}
    for name, port in zip(NAMES, ports, strict=True):
        stand_ins[name] = FakeVllm(base=served[name], api_key=KEY)
        stand_ins[name].port = port
        stand_ins[name].start()
    try:
        inventory = {"vllm_nodes": {"hosts": {NODE: {"ansible_connection": "local",
                                                     "ansible_python_interpreter": sys.executable}}}}
        (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
        extra = {"vllm_node_plan_file": str(plan_file), "vllm_node_api_key": KEY, "inference_check_health_retries": 2,
                 "inference_check_health_delay": 1,
                 "vllm_node_instance_benchmark_state_file": str(tmp_path / "benchmark-last-%s.json")}
        (tmp_path / "extra.json").write_text(json.dumps(extra))
        rc, out, seconds = playbook.run("playbooks/verify.yml", "-e", f"@{tmp_path / 'extra.json'}",
                                        inventory=str(tmp_path / "hosts.yml"),
                                        env=playbook.environment(ANSIBLE_LOCALHOST_WARNING="false"), timeout=300)
    finally:
        for stand_in in stand_ins.values():
            stand_in.stop()
    folded = re.sub(r"\s+", " ", out)
    assert rc != 0, "the stand-ins serve no completion: each check must fail"
    assert f"The inference check failed on {NODE} for verify-chat, verify-mla:" in folded, out[-3000:]
    for name, port in zip(NAMES, ports, strict=True):
        report = json.loads((reports / name / f"inference-check-{NODE}.json").read_text())
        assert report["url"] == f"http://127.0.0.1:{port}", (name, report["url"])
        assert report["served_model_name"] == served[name]
        assert report["unauthenticated_status"] == 401, "the check did not send the node's key to its own instance"
        # the stand-in listed the instance's own served name: /v1/models passed, the completion failed
        assert not any("/v1/models" in failure for failure in report["failures"]), report["failures"]
        assert any("chat completion" in failure for failure in report["failures"]), report["failures"]
        assert f"systemctl show vllm-{name}" in out or report["unit"]["main_pid"] == 0
        gets = [path for method, path, _ in stand_ins[name].calls if method == "GET"]
        assert "/v1/models" in gets, gets
    print(f"\nverify.yml with two instances: {seconds:.1f} s")
