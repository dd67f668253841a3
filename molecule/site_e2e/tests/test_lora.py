"""LoRA adapters on the e2e node (issue 30), after test_gateway.py and before test_site.py changes the model.

The node serves tiny-llama with adapter sea-a from the start (host_vars/site_e2e-bookworm.yml: downloaded by
model_download, checked by the re-plan from its files, listed in the unit's --lora-modules). On day 2, site.yml with
sea-b added: `--check --diff` shows the change and loads nothing; the real run loads it at runtime (same MainPID,
no handler) and it answers through the gateway; a client's unload through the gateway gets 403; an adapter of
tiny-deepseek-v3 is refused by the re-plan naming both models, before the service changes; site.yml with sea-b
removed again unloads it (its name 404 through the gateway) while the base and sea-a keep serving. Each run's time
goes to artifacts/site_e2e-measurements.json (lora_*_seconds).
"""

from __future__ import annotations

import json
from typing import Any

from harness import node, playbook
from harness.api import Gateway, chat
from harness.figures import Figures
from harness.project import ARTIFACTS, PROJECT
from harness.unit import show

HOST = "site_e2e-bookworm"
SITE = PROJECT / "playbooks/site.yml"
LORA_FILE = "/etc/vllm/vllm-lora.env"
NO_BENCHMARK = {"inference_check_benchmark": False}
# The process a restart would replace (harness.unit.show reads them).
PROCESS = ("MainPID", "ActiveEnterTimestamp")
record = Figures(ARTIFACTS / "site_e2e-measurements.json").record

testinfra_hosts = [f"ansible://{HOST}"]


def adapter(name: str, repo: str, base: str = "tiny-llama") -> dict[str, str]:
    """An inventory entry pinned to the commit host_vars gives the repository (the hub's)."""
    return {"name": name, "repository": f"vllm-node-test/{repo}", "revision": f"{{{{ e2e_lora_commits['{repo}'] }}}}",
            "base": base}


SEA_A = adapter("sea-a", "tiny-llama-lora-a")
SEA_B = adapter("sea-b", "tiny-llama-lora-b")


def site(host: Any, name: str, *args: str, adapters: list[dict[str, str]] | None = None) -> tuple[playbook.Run,
                                                                                                  dict[str, str]]:
    """site.yml on the node with these adapters (None: the inventory's); the run and the unit's state before it."""
    before = show(host, "vllm", PROCESS)
    extra: dict[str, Any] = dict(NO_BENCHMARK, **({} if adapters is None else {"vllm_node_lora_adapters": adapters}))
    run = playbook.in_scenario("site_e2e", name, SITE, *args, extra_vars=extra)
    record(f"{name.replace('-', '_')}_seconds", round(run.seconds, 1))
    return run, before


def ask(gateway: Gateway, key: str, model: str) -> tuple[int, bytes]:
    """One short chat completion of `model` (the base or an adapter's name) through the gateway."""
    return gateway.request("POST", "/v1/chat/completions", key, chat(model, 4, "Name a sea."), timeout=120)


def test_the_adapter_of_the_inventory_is_downloaded_checked_served_and_in_the_manifest(host, gateway, key):
    plan = node.planned(HOST)
    (served,) = plan["lora"]["adapters"]
    assert (served["name"], served["checked"]) == ("sea-a", True), "the re-plan read the downloaded files"
    assert served["path"].startswith("/srv/vllm/models/lora/vllm-node-test/tiny-llama-lora-a/revisions/")
    assert f"sea-a={served['path']}" in host.file(LORA_FILE).content_string
    assert "--enable-lora" in host.file("/etc/systemd/system/vllm.service").content_string
    manifest = json.loads(host.check_output("cat /etc/vllm-node/manifest.json"))
    (listed,) = manifest["model"]["adapters"]
    assert (listed["name"], listed["dir"]) == ("sea-a", served["path"])
    assert set(listed["files"]) == {"adapter_config.json", "adapter_model.safetensors", "README.md"}
    for path, digest in listed["files"].items():
        assert host.check_output(f"sha256sum {listed['dir']}/{path}").split()[0] == digest, path
    assert node.inference_check(HOST)["adapters"]["sea-a"]["status"] == 200
    status, body = ask(gateway, key, "sea-a")
    assert status == 200, body[:300]


def test_check_mode_shows_an_added_adapter_and_loads_nothing(host, gateway, key):
    run, before = site(host, "lora-check", "--check", "--diff", adapters=[SEA_A, SEA_B])
    assert run.rc == 0, run.output[-4000:]
    assert "sea-b=/srv/vllm/models/lora/" in run.output, "the diff of the adapters file names the new adapter"
    assert "changed" in playbook.statuses(run.output, "Load and unload the adapters at runtime")
    assert show(host, "vllm", PROCESS) == before
    assert "sea-b" not in host.file(LORA_FILE).content_string
    assert ask(gateway, key, "sea-b")[0] == 404


def test_an_added_adapter_is_loaded_without_a_restart_and_answers_through_the_gateway(host, gateway, key):
    run, before = site(host, "lora-add", adapters=[SEA_A, SEA_B])
    assert run.rc == 0, run.output[-4000:]
    assert show(host, "vllm", PROCESS) == before, "adding an adapter restarted vLLM"
    assert playbook.service_restarts(run.output) == 0
    assert "sea-b=" in host.file(LORA_FILE).content_string
    status, body = ask(gateway, key, "sea-b")
    assert status == 200, body[:300]
    assert node.inference_check(HOST)["adapters"]["sea-b"]["status"] == 200


def test_a_client_cannot_unload_an_adapter_through_the_gateway(gateway, key):
    status, _ = gateway.request("POST", "/v1/unload_lora_adapter", key, {"lora_name": "sea-b"})
    assert status == 403
    assert ask(gateway, key, "sea-b")[0] == 200


def test_an_adapter_of_another_base_is_refused_before_the_service_changes(host):
    bad = adapter("deep", "tiny-deepseek-v3-lora")
    lora_file = host.file(LORA_FILE).content_string
    run, before = site(host, "lora-refused", adapters=[SEA_A, SEA_B, bad])
    assert run.rc != 0
    text = " ".join(run.output.split())  # the YAML result format folds the message
    for needle in ("adapter deep was not trained for tiny-llama", "vllm-node-test/tiny-deepseek-v3",
                   "Use an adapter trained on tiny-llama"):
        assert needle in text, needle
    assert "TASK [vllm_service" not in run.output
    assert show(host, "vllm", PROCESS) == before and host.file(LORA_FILE).content_string == lora_file


def test_a_removed_adapter_is_unloaded_without_a_restart_and_the_rest_keeps_serving(host, gateway, key):
    run, before = site(host, "lora-remove")
    assert run.rc == 0, run.output[-4000:]
    assert show(host, "vllm", PROCESS) == before, "removing an adapter restarted vLLM"
    assert "sea-b" not in host.file(LORA_FILE).content_string
    status, body = ask(gateway, key, "sea-b")
    assert status == 404, body[:300]
    for model in (node.planned(HOST)["served_model_name"], "sea-a"):
        status, body = ask(gateway, key, model)
        assert status == 200, (model, body[:300])
    assert set(node.inference_check(HOST)["adapters"]) == {"sea-a"}
