"""The node manifest (plugins/module_utils/node_manifest.py and its filters): sections, missing facts, secrets,
the host section outside the hash, generated_at carried on an unchanged node, config diffs, the comparison and its
command line (scripts/compare-manifests.sh)."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.filter import node_manifest as nmf
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import node_manifest as nm
from repo_root import ROOT

FILTERS = nmf.FilterModule().filters()
API_KEY = "sk-unit-test-key-8f2c1e9d"
HF_TOKEN = "hf_unitTestTokenQwErTy123"
GENERATED_KEY = "generated-on-the-node-0b7e4a61c3"
ORIGINAL = '{"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": {"kv_cache_scheme": "fp8"},\n' \
           ' "hidden_size": 64}'
PATCHED = '{\n  "architectures": [\n    "DeepseekV3ForCausalLM"\n  ],\n  "hidden_size": 64\n}\n'


def facts(**overrides: Any) -> dict[str, Any]:
    """What the roles publish on a converged cpu node (the names of the node_manifest role's vars/main.yml)."""
    files = {"config.json": "a" * 64, "model.safetensors": "b" * 64, "tokenizer.json": "c" * 64}
    base: dict[str, Any] = {
        "host": {"inventory_hostname": "node-a", "hostname": "node-a", "machine_id": "0123456789abcdef",
                 "kernel_release": "6.8.0-45-generic", "kernel_version": "#45-Ubuntu SMP",
                 "addresses": ["172.17.0.2", "10.0.0.5"]},
        "os": {"distribution": "Debian", "version": "12.7", "codename": "bookworm", "family": "Debian",
               "major_version": "12", "architecture": "x86_64"},
        "device": "cpu", "driver_version": None, "driver_flavour": None, "cuda_home": None,
        "vllm_version": "0.32.0", "vllm_variant": "cpu", "venv": "/opt/vllm/venvs/0.32.0-cpu",
        "lock_sha256": "d" * 64,
        "model_repo": "vllm-node-test/tiny-deepseek-v3", "model_revision": "main", "model_commit": "e" * 40,
        "model_dir": "/srv/vllm/models/vllm-node-test/tiny-deepseek-v3",
        "model_file_sha256": files,
        "model_manifest_sha256": hashlib.sha256(nm.canonical_json(files).encode()).hexdigest(),
        "config_rules_applied": ["drop-fp8-kv-scheme"],
        "config_changes": [{"rule": "drop-fp8-kv-scheme", "file": "config.json",
                            "path": "quantization_config.kv_cache_scheme", "old": "fp8"}],
        "config_files_sha256": {"config.json": "f" * 64, "hf_quant_config.json": "1" * 64},
        "config_texts": {"config.json.orig": ORIGINAL, "config.json": PATCHED},
        "service_name": "vllm", "fingerprint": "2" * 64,
        "fingerprint_inputs": {"venv": "/opt/vllm/venvs/0.32.0-cpu", "lock_sha256": "d" * 64,
                               "api_key_file_sha256": "3" * 64},
        "unit_sha256": "4" * 64, "env_sha256": "5" * 64,
        "plan": {"device": "cpu", "max_model_len": 4096, "repo": "vllm-node-test/tiny-deepseek-v3",
                 "service": {"argv": ["--max-model-len", "4096"], "environment": {"VLLM_CPU_KVCACHE_SPACE": "1"}}},
    }
    base.update(overrides)
    return base


def build(node_facts: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    return nm.build(facts() if node_facts is None else node_facts, **kwargs)


def test_a_converged_node_has_every_section_and_nothing_missing() -> None:
    manifest = build(secrets=[API_KEY, HF_TOKEN], now="2026-12-01T10:00:00+00:00")
    assert set(manifest) == {"schema", "host", "missing", "manifest_sha256", *nm.SECTIONS}
    assert manifest["missing"] == []
    assert manifest["vllm"] == {"version": "0.32.0", "variant": "cpu", "venv": "/opt/vllm/venvs/0.32.0-cpu",
                                "lock_sha256": "d" * 64}
    assert manifest["model"]["commit"] == "e" * 40
    assert manifest["model"]["files"]["model.safetensors"] == "b" * 64
    assert manifest["service"]["unit_sha256"] == "4" * 64
    assert manifest["plan"]["sha256"] == nm.sha256_json(facts()["plan"])
    assert manifest["plan"]["content"]["max_model_len"] == 4096
    assert manifest["os"]["codename"] == "bookworm"
    # cpu: no driver is installed, which is the truth and not a gap
    assert manifest["driver"] == {"device": "cpu", "required": False, "version": None, "flavour": None,
                                  "cuda_home": None}
    assert manifest["host"]["generated_at"] == "2026-12-01T10:00:00+00:00"
    assert manifest["host"]["addresses"] == ["10.0.0.5", "172.17.0.2"]
    assert manifest["manifest_sha256"] == nm.content_sha256(manifest)


def test_the_hash_covers_everything_but_the_host_section() -> None:
    manifest = build()
    without_host = {k: v for k, v in manifest.items() if k not in ("host", "manifest_sha256")}
    assert manifest["manifest_sha256"] == hashlib.sha256(
        json.dumps(without_host, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    changed = build(facts(vllm_version="0.31.0"))
    assert changed["manifest_sha256"] != manifest["manifest_sha256"]


def test_lora_adapters_are_listed_by_name_with_their_hashes_and_none_is_not_a_gap() -> None:
    downloaded = [{"name": name, "repository": f"o/{name}", "revision": "1" * 40, "base": "tiny-llama",
                   "commit": "1" * 40, "dir": f"/srv/vllm/models/lora/o/{name}/revisions/" + "1" * 40,
                   "complete": True, "files": {"adapter_model.safetensors": sha}, "files_sha256": sha * 2}
                  for name, sha in (("b", "2" * 32), ("a", "3" * 32))]
    manifest = build(facts(lora_adapters=downloaded))
    assert [a["name"] for a in manifest["model"]["adapters"]] == ["a", "b"]
    assert manifest["model"]["adapters"][0] == {
        "name": "a", "repository": "o/a", "revision": "1" * 40, "base": "tiny-llama",
        "dir": "/srv/vllm/models/lora/o/a/revisions/" + "1" * 40,
        "files": {"adapter_model.safetensors": "3" * 32}, "files_sha256": "3" * 64}
    assert manifest["missing"] == []
    # another adapter file is another manifest; no adapters is no key and nothing missing
    other = copy.deepcopy(downloaded)
    other[0]["files"]["adapter_model.safetensors"] = "9" * 32
    assert build(facts(lora_adapters=other))["manifest_sha256"] != manifest["manifest_sha256"]
    assert "adapters" not in build(facts(lora_adapters=[]))["model"]
    assert build(facts(lora_adapters=[]))["manifest_sha256"] == build()["manifest_sha256"]


def test_instances_are_listed_by_name_and_a_single_model_node_has_none() -> None:
    served = [{"name": name, "unit": f"vllm-{name}", "port": port, "model": model, "repo": f"o/{model}",
               "commit": "1" * 40, "gpus": "", "served_model_name": f"o/{model}", "url": "http://127.0.0.1",
               "plan": {"big": "left out"}}
              for name, port, model in (("mla", 8001, "tiny-deepseek-v3"), ("chat", 8000, "tiny-llama"))]
    manifest = build(facts(instances=served))
    assert [i["name"] for i in manifest["instances"]] == ["chat", "mla"]
    assert manifest["instances"][0] == {"name": "chat", "unit": "vllm-chat", "port": 8000, "model": "tiny-llama",
                                        "repo": "o/tiny-llama", "commit": "1" * 40, "gpus": "",
                                        "served_model_name": "o/tiny-llama"}
    assert manifest["missing"] == []
    moved = copy.deepcopy(served)
    moved[0]["port"] = 8002
    assert build(facts(instances=moved))["manifest_sha256"] != manifest["manifest_sha256"]
    assert "instances" not in build(facts(instances=[]))
    assert build(facts(instances=[]))["manifest_sha256"] == build()["manifest_sha256"]


def test_two_nodes_from_the_same_inventory_differ_only_in_host() -> None:
    other = facts(host={"inventory_hostname": "node-b", "hostname": "node-b", "machine_id": "fedcba9876543210",
                        "kernel_release": "6.8.0-47-generic", "kernel_version": "#47-Ubuntu SMP",
                        "addresses": ["172.17.0.3"]})
    a = build(now="2026-12-01T10:00:00+00:00")
    b = build(other, now="2026-12-01T11:30:00+00:00")
    assert a["host"] != b["host"]
    assert a["manifest_sha256"] == b["manifest_sha256"]
    assert nm.compare(a, b) == []


def test_the_gpu_health_brief_is_kept_per_host_outside_the_hash() -> None:
    """Two nodes whose GPUs differ in health (serials, a WARN) are still the same deployment."""
    brief = {"verdict": "WARN", "gpus": [{"index": 0, "serial": "1792525000000", "pci_bus_id": "0000:18:00.0",
                                          "verdict": "WARN", "findings": ["pcie_gen_degraded"], "accepted": []}],
             "node_findings": [], "summary": ["GPU health WARN over 1 GPU(s)"]}
    warned = build(facts(host=dict(facts()["host"], gpu_health=brief)), now="t")
    plain = build(now="t")
    assert warned["host"]["gpu_health"] == brief and plain["host"]["gpu_health"] is None
    assert warned["manifest_sha256"] == plain["manifest_sha256"] and nm.compare(warned, plain) == []
    assert build(facts(host=dict(facts()["host"], gpu_health="")), now="t")["host"]["gpu_health"] is None


def test_the_input_order_does_not_change_the_file() -> None:
    shuffled = {k: facts()[k] for k in reversed(list(facts()))}
    shuffled["model_file_sha256"] = dict(reversed(list(facts()["model_file_sha256"].items())))
    shuffled["plan"] = dict(reversed(list(facts()["plan"].items())))
    assert nm.render(build(shuffled, now="t")) == nm.render(build(now="t"))
    assert list(build()) == sorted(build())


@pytest.mark.parametrize("fact,field", [
    ("lock_sha256", "vllm.lock_sha256"),
    ("model_file_sha256", "model.files"),
    ("model_manifest_sha256", "model.files_sha256"),
    ("config_files_sha256", "config.files_sha256"),
    ("fingerprint", "service.fingerprint"),
    ("unit_sha256", "service.unit_sha256"),
    ("env_sha256", "service.env_sha256"),
    ("model_commit", "model.commit"),
    ("plan", "plan.content"),
])
@pytest.mark.parametrize("unpublished", [None, ""])
def test_an_unpublished_fact_is_null_and_named_missing(fact: str, field: str, unpublished: Any) -> None:
    manifest = build(facts(**{fact: unpublished}))
    section, name = field.split(".")
    assert manifest[section][name] is None
    assert manifest["missing"] == [field]


def test_an_empty_rule_list_is_known_not_missing() -> None:
    manifest = build(facts(config_rules_applied=[], config_changes=[], config_texts={}))
    assert manifest["config"]["rules_applied"] == [] and manifest["config"]["changes"] == []
    assert manifest["config"]["diffs"] == {}
    assert manifest["missing"] == []


def test_a_gpu_node_without_driver_facts_says_so() -> None:
    manifest = build(facts(device="cuda"))
    assert manifest["driver"]["required"] is True
    assert manifest["missing"] == ["driver.flavour", "driver.version"]
    gpu = build(facts(device="cuda", driver_version="580.95.05", driver_flavour="open", cuda_home=""))
    assert gpu["driver"] == {"device": "cuda", "required": True, "version": "580.95.05", "flavour": "open",
                             "cuda_home": None}
    assert gpu["missing"] == []


def test_nothing_published_yields_a_manifest_of_nulls() -> None:
    manifest = build({"host": {"inventory_hostname": "node-a"}})
    assert manifest["vllm"] == {"version": None, "variant": None, "venv": None, "lock_sha256": None}
    assert "vllm.version" in manifest["missing"] and "plan.content" in manifest["missing"]
    assert manifest["plan"]["sha256"] is None
    assert manifest["host"]["machine_id"] is None


def test_config_diff_shows_the_rule_change_not_the_formatting() -> None:
    diff = build()["config"]["diffs"]["config.json"]
    assert diff[:2] == ["--- config.json.orig", "+++ config.json"]
    removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert any('"kv_cache_scheme": "fp8"' in line for line in removed)
    # the original's one-line layout and the patched file's indentation are not differences
    assert not any("architectures" in line or "DeepseekV3ForCausalLM" in line for line in removed + added)


def test_config_diff_of_text_that_is_not_json() -> None:
    assert nm.config_diff("a.txt", "x\ny\n", "x\nz\n") == ["--- a.txt.orig", "+++ a.txt", "@@ -1,2 +1,2 @@", " x",
                                                            "-y", "+z"]


def test_a_changed_file_that_could_not_be_read_is_missing() -> None:
    manifest = build(facts(config_texts={"config.json": PATCHED}))
    assert manifest["config"]["diffs"] == {"config.json": None}
    assert manifest["missing"] == ["config.diffs.config.json"]


def secret_facts() -> dict[str, Any]:
    """Facts where secrets leaked in everywhere they could: an extra environment, a fingerprint input, a config,
    a host field."""
    leaky = facts()
    leaky["plan"] = copy.deepcopy(leaky["plan"])
    leaky["plan"]["service"]["environment"].update(HF_TOKEN=HF_TOKEN, MY_PASSWORD="hunter2-is-long",
                                                   VLLM_API_KEY=GENERATED_KEY)
    leaky["plan"]["service"]["argv"] += ["--api-key", API_KEY]
    leaky["fingerprint_inputs"] = dict(leaky["fingerprint_inputs"], note=f"key={API_KEY}")
    leaky["config_texts"] = {"config.json.orig": ORIGINAL.replace("64}", f'64, "token": "{HF_TOKEN}"}}'),
                             "config.json": PATCHED}
    leaky["host"] = dict(leaky["host"], hostname=f"node-{GENERATED_KEY}")
    return leaky


def test_no_secret_value_appears() -> None:
    manifest = build(secret_facts(), secrets=[API_KEY, HF_TOKEN, GENERATED_KEY, ""])
    text = nm.render(manifest)
    for secret in (API_KEY, HF_TOKEN, GENERATED_KEY, "hunter2-is-long"):
        assert secret not in text
    environment = manifest["plan"]["content"]["service"]["environment"]
    assert environment["HF_TOKEN"] == environment["VLLM_API_KEY"] == environment["MY_PASSWORD"] == nm.REDACTED
    assert environment["VLLM_CPU_KVCACHE_SPACE"] == "1"
    # a hash under a secret-looking name is not the secret: kept
    assert manifest["service"]["fingerprint_inputs"]["api_key_file_sha256"] == "3" * 64
    assert manifest["manifest_sha256"] == nm.content_sha256(manifest)


def test_name_based_redaction_leaves_counts_and_paths_alone() -> None:
    value = {"max_num_batched_tokens": 2048, "tokens": "4096", "api_key_file": "/etc/vllm/api-key",
             "VLLM_API_KEY": "abc", "hf-token": "x-y"}
    assert nm.redact(value, []) == {"max_num_batched_tokens": 2048, "tokens": "4096",
                                    "api_key_file": "/etc/vllm/api-key", "VLLM_API_KEY": nm.REDACTED,
                                    "hf-token": nm.REDACTED}


def test_generated_at_is_carried_while_the_content_is_the_same() -> None:
    first = build(now="2026-12-01T10:00:00+00:00")
    again = build(previous=first, now="2026-12-01T10:20:00+00:00")
    assert again["host"]["generated_at"] == "2026-12-01T10:00:00+00:00"
    assert nm.render(again) == nm.render(first)
    # from the file's JSON text, as the role passes it
    assert FILTERS["node_manifest_build"](facts(), [], nm.render(first), "later") == first
    upgraded = build(facts(vllm_version="0.33.0"), previous=first, now="2026-12-01T10:20:00+00:00")
    assert upgraded["host"]["generated_at"] == "2026-12-01T10:20:00+00:00"


@pytest.mark.parametrize("previous", [None, "", "not json", "[1, 2]", {"manifest_sha256": "0" * 64}])
def test_no_usable_previous_manifest_takes_now(previous: Any) -> None:
    assert FILTERS["node_manifest_build"](facts(), [], previous, "now")["host"]["generated_at"] == "now"


def test_newly_missing_names_what_this_run_did_not_publish() -> None:
    full = build()
    partial = build(facts(lock_sha256=None, unit_sha256=None))
    assert FILTERS["node_manifest_newly_missing"](partial, nm.render(full)) == ["service.unit_sha256",
                                                                               "vllm.lock_sha256"]
    assert FILTERS["node_manifest_newly_missing"](full, nm.render(partial)) == []
    assert FILTERS["node_manifest_newly_missing"](partial, None) == []
    assert FILTERS["node_manifest_newly_missing"](partial, "garbage") == []


@pytest.mark.parametrize("bad", ["a string", ["a", "list"], None])
def test_the_filter_refuses_facts_that_are_not_a_dict(bad: Any) -> None:
    with pytest.raises(Exception, match="node_manifest_build: node_manifest: the facts must be a dict, got"):
        FILTERS["node_manifest_build"](bad)


def test_compare_lists_each_differing_field_with_its_path() -> None:
    a = build()
    changed_files = dict(facts()["model_file_sha256"], **{"model.safetensors": "9" * 64, "extra.bin": "8" * 64})
    b = build(facts(vllm_version="0.31.0", model_file_sha256=changed_files, config_rules_applied=[]))
    lines = nm.compare(a, b)
    assert f'model.files["model.safetensors"]: A="{"b" * 64}" B="{"9" * 64}"' in lines
    assert 'model.files["extra.bin"]: only in B ("' + "8" * 64 + '")' in lines
    assert 'vllm.version: A="0.31.0" B="0.31.0"' not in lines
    assert 'vllm.version: A="0.32.0" B="0.31.0"' in lines
    assert 'config.rules_applied[0]: only in A ("drop-fp8-kv-scheme")' in lines
    assert not any(line.startswith(("host", "manifest_sha256:")) for line in lines)
    assert nm.compare(a, b, ignore=["model.files", "vllm", "config.rules_applied"]) == []
    assert FILTERS["node_manifest_compare"](a, b) == lines


def test_compare_reports_a_hand_edited_manifest() -> None:
    a = build()
    edited = copy.deepcopy(a)
    edited["vllm"]["version"] = "0.99.0"
    edited["manifest_sha256"] = a["manifest_sha256"]
    lines = nm.compare(a, edited)
    assert 'vllm.version: A="0.32.0" B="0.99.0"' in lines
    assert "manifest_sha256 of B does not match its content (edited by hand?)" in lines


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """scripts/compare-manifests.sh, the operators' entry point, with this interpreter."""
    return subprocess.run(["bash", str(ROOT / "scripts/compare-manifests.sh"), *args], capture_output=True,
                          text=True, check=False, env=dict(os.environ, PYTHON=sys.executable), timeout=60)


def test_command_line_exit_codes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(nm.render(build(now="t1")))
    other_host = facts(host={"inventory_hostname": "node-b", "addresses": ["10.9.9.9"]})
    b.write_text(nm.render(build(other_host, now="t2")))
    c.write_text(nm.render(build(facts(plan=dict(facts()["plan"], max_model_len=2048)))))
    same = run_cli(str(a), str(b))
    assert same.returncode == 0, same.stderr
    assert "same node" in same.stdout
    differ = run_cli(str(a), str(c))
    assert differ.returncode == 1, differ.stderr
    assert "plan.content.max_model_len: A=4096 B=2048" in differ.stdout
    assert "plan.sha256" in differ.stdout
    assert run_cli(str(a), str(c), "--ignore", "plan").returncode == 0
    unreadable = run_cli(str(a), str(tmp_path / "none.json"))
    assert unreadable.returncode == 2 and "cannot read" in unreadable.stderr


def test_the_filters_are_documented() -> None:
    for name in FILTERS:
        doc = yaml.safe_load((ROOT / "plugins/filter" / f"{name}.yml").read_text())
        assert doc["DOCUMENTATION"]["name"] == name
        assert doc["DOCUMENTATION"]["options"]["_input"]["required"] is True
        assert f"vllm_node.vllm_node.{name}" in doc["EXAMPLES"]
