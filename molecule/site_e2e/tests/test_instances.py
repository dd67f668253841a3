"""Several models on one node (vllm_node_instances, issue 27), run last (conftest.py orders it): site.yml switches the
converged node from its one model to two instances, `chat` (tiny-llama with the adapter sea-a) and `mla`
(tiny-deepseek-v3), each under its own unit on its own port behind the node's one gateway, which routes by the
request's model. Then: a re-run changes nothing; a flag change to chat restarts vllm-chat exactly once while
vllm-mla keeps its process and a client loop on mla sees no failed request; a rollout of another change to chat
whose gate fails puts chat's previous unit back while mla keeps its process; removing mla stops and removes its unit
while chat keeps serving; and the node goes back to one model (vllm.service, the instances' units removed)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from harness import node, playbook, unit
from harness.api import Gateway
from harness.clients import Client, ClientLoop
from harness.figures import Figures
from harness.project import ARTIFACTS, PROJECT

HOST = "site_e2e-bookworm"
SITE = PROJECT / "playbooks/site.yml"
ROLLOUT = PROJECT / "playbooks/rollout.yml"
NO_BENCHMARK = {"inference_check_benchmark": False}
SEA_A = {"name": "sea-a", "repository": "vllm-node-test/tiny-llama-lora-a",
         "revision": "{{ e2e_lora_commits['tiny-llama-lora-a'] }}", "base": "chat"}
# With instances the node-wide per-model knobs (host_vars' LoRA ones) are not read: chat sets its own.
CHAT = {"name": "chat", "model": "tiny-llama", "enable_lora": True, "max_loras": 2, "max_lora_rank": 8}
MLA = {"name": "mla", "model": "tiny-deepseek-v3"}
CHAT_MODEL, MLA_MODEL = "vllm-node-test/tiny-llama", "vllm-node-test/tiny-deepseek-v3"
PROCESS = ("MainPID", "InvocationID", "ActiveState")
record = Figures(ARTIFACTS / "site_e2e-measurements.json").record

testinfra_hosts = [f"ansible://{HOST}"]


def site_with(name: str, instances: list[dict[str, Any]] | None) -> playbook.Run:
    """site.yml with these instances (None: the inventory's one model), the run's seconds recorded."""
    extra: dict[str, Any] = dict(NO_BENCHMARK)
    if instances is not None:
        extra.update(vllm_node_instances=instances, vllm_node_lora_adapters=[SEA_A])
    run = playbook.in_scenario("site_e2e", name, SITE, extra_vars=extra)
    record(f"instances_{name.replace('-', '_')}_seconds", round(run.seconds, 1))
    return run


def files_of(name: str) -> list[str]:
    """The unit's files vllm_service writes (unit, environment, fingerprint record)."""
    return [f"/etc/systemd/system/{name}.service", f"/etc/vllm/{name}.env", f"/etc/vllm/{name}.fingerprint"]


def unit_words(host: Any, name: str) -> str:
    """The unit file's words, its quoting and line continuations undone ('--port 8001' whatever the layout)."""
    text = host.file(f"/etc/systemd/system/{name}.service").content_string
    return " ".join(text.replace("\\\n", " ").replace('"', "").split())


def models(gateway: Gateway, key: str) -> set[str]:
    """The ids /v1/models lists through the gateway."""
    status, body = gateway.request("GET", "/v1/models", key)
    assert status == 200, body[:300]
    return {m["id"] for m in json.loads(body)["data"]}


@pytest.fixture(scope="module")
def switched(host) -> Iterator[playbook.Run]:
    """The node switched from its one model to the two instances."""
    run = site_with("instances", [CHAT, MLA])
    assert run.rc == 0, run.output[-4000:]
    yield run


def test_two_instances_serve_behind_one_gateway_and_vllm_service_is_gone(host, switched, gateway, key):
    for name in ("vllm-chat", "vllm-mla"):
        assert unit.show(host, name, ("ActiveState",))["ActiveState"] == "active", name
    assert not any(host.file(path).exists for path in files_of("vllm")), "vllm.service and its files are removed"
    plan = node.planned(HOST)
    assert [(i["name"], i["port"]) for i in plan["instances"]] == [("chat", 8000), ("mla", 8001)]
    assert "--port 8001" in unit_words(host, "vllm-mla")
    assert "sea-a=" in host.file("/etc/vllm/vllm-chat-lora.env").content_string
    for model in (CHAT_MODEL, "sea-a", MLA_MODEL):
        for stream in (False, True):
            assert gateway.chat_once(key, model, stream) == "", (model, stream)
    assert models(gateway, key) == {CHAT_MODEL, "sea-a", MLA_MODEL}
    status, body = gateway.request("POST", "/v1/chat/completions", key,
                                   {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404, body[:300]
    manifest = json.loads(host.check_output("cat /etc/vllm-node/manifest.json"))
    assert [(i["name"], i["unit"], i["port"], i["model"]) for i in manifest["instances"]] == [
        ("chat", "vllm-chat", 8000, "tiny-llama"), ("mla", "vllm-mla", 8001, "tiny-deepseek-v3")]
    for name in ("chat", "mla"):
        report = json.loads((ARTIFACTS / "instances" / name / f"inference-check-{HOST}.json").read_text())
        assert report["failures"] == [], (name, report["failures"])


def test_a_rerun_changes_nothing(host, switched):
    before = {name: unit.show(host, name, PROCESS) for name in ("vllm-chat", "vllm-mla")}
    run = site_with("instances-rerun", [CHAT, MLA])
    assert run.rc == 0, run.output[-4000:]
    assert playbook.recap(run.output, HOST)["changed"] == 0, playbook.changed_tasks(run.output)
    assert {name: unit.show(host, name, PROCESS) for name in before} == before


def test_a_flag_change_restarts_only_its_instance_while_the_other_serves(host, switched, gateway, key):
    chat_before, mla_before = unit.witness(host, "vllm-chat"), unit.witness(host, "vllm-mla")
    loop = ClientLoop(lambda _kind, stream: gateway.chat_once(key, MLA_MODEL, stream), 20000, 900,
                      [Client("mla", think=0.5)])   # one client: the 2-core CI machine runs the converge beside it
    loop.start()
    run = site_with("instances-flag-change", [dict(CHAT, max_model_len=2048), MLA])
    counts = loop.stop()
    assert run.rc == 0, run.output[-4000:]
    record("instances_flag_change_mla_requests", {"sent": counts["sent"], "failed": counts["failed"]})
    assert playbook.service_restarts(run.output) == 1
    assert unit.restarts(host, chat_before, "vllm-chat") == 1
    assert unit.restarts(host, mla_before, "vllm-mla") == 0
    assert unit.show(host, "vllm-mla", ("MainPID",))["MainPID"] == mla_before["MainPID"]
    assert "--max-model-len 2048" in unit_words(host, "vllm-chat")
    assert counts["sent"] > 0 and counts["failed"] == 0, counts["failures"]
    assert gateway.chat_once(key, CHAT_MODEL, True) == ""


def test_a_rollout_whose_gate_fails_puts_back_the_instance_it_changed(host, switched, gateway, key):
    """rollout.yml changes chat's context and its gate fails (the check is told to require a reasoning answer, which
    the tiny models never give): chat is rolled back to its previous unit, from the backups of its own run (chat is
    served before mla, so the last run's backups are mla's, and mla changed nothing); mla keeps its process. The
    rollout drains chat's server at the node's own gateway and puts it back."""
    chat_unit = unit_words(host, "vllm-chat")
    chat_before, mla_before = unit.witness(host, "vllm-chat"), unit.witness(host, "vllm-mla")
    extra: dict[str, Any] = dict(NO_BENCHMARK, vllm_node_instances=[dict(CHAT, max_model_len=1024), MLA],
                                 vllm_node_lora_adapters=[SEA_A], inference_check_require_reasoning=True,
                                 rollout_require_baseline=False,
                                 # the node's own gateway, where the server of chat's pools is named chat
                                 rollout_gateway_hosts=[HOST], rollout_gateway_server="chat")
    run = playbook.in_scenario("site_e2e", "instances-rollout-rollback", ROLLOUT, extra_vars=extra)
    record("instances_rollout_rollback_seconds", round(run.seconds, 1))
    assert run.rc != 0, run.output[-4000:]
    assert f"Rollout stopped at {HOST}" in run.output, run.output[-4000:]
    report = json.loads((ARTIFACTS / "rollout" / f"{HOST}.json").read_text())
    assert (report["outcome"], report["restart_instances"], report["rolled_back"]) == ("failed", ["chat"], True)
    assert unit_words(host, "vllm-chat") == chat_unit, "chat's previous unit (--max-model-len 2048) is back"
    assert unit.restarts(host, chat_before, "vllm-chat") == 2, "the change, then the rollback"
    assert unit.show(host, "vllm-mla", ("MainPID",))["MainPID"] == mla_before["MainPID"]
    assert unit.restarts(host, mla_before, "vllm-mla") == 0
    for model in (CHAT_MODEL, MLA_MODEL):
        assert gateway.chat_once(key, model, False) == "", model


def test_a_removed_instance_is_stopped_and_removed_and_the_other_keeps_serving(host, switched, gateway, key):
    chat_before = unit.show(host, "vllm-chat", PROCESS)
    run = site_with("instances-remove-mla", [dict(CHAT, max_model_len=2048)])
    assert run.rc == 0, run.output[-4000:]
    assert unit.show(host, "vllm-mla", ("LoadState",))["LoadState"] == "not-found"
    assert not any(host.file(path).exists for path in files_of("vllm-mla"))
    assert unit.show(host, "vllm-chat", PROCESS) == chat_before
    assert gateway.chat_once(key, CHAT_MODEL, False) == ""
    status, body = gateway.request("POST", "/v1/chat/completions", key,
                                   {"model": MLA_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404, body[:300]


def test_back_to_one_model_removes_the_instances_units(host, switched, gateway, key):
    run = site_with("instances-back-to-one", None)
    assert run.rc == 0, run.output[-4000:]
    assert unit.show(host, "vllm", ("ActiveState",))["ActiveState"] == "active"
    assert unit.show(host, "vllm-chat", ("LoadState",))["LoadState"] == "not-found"
    assert not any(host.file(path).exists for path in files_of("vllm-chat"))
    assert "instances" not in json.loads(host.check_output("cat /etc/vllm-node/manifest.json"))
    assert gateway.chat_once(key, node.planned(HOST)["served_model_name"], True) == ""
