"""The node_manifest role on the controller itself (connection local, paths in a temporary directory, no container):
written on the "node" and the controller copy alike, a rerun and --check change nothing, a changed fact rewrites it
with a new generated_at, a run that publishes less keeps the file, and no secret reaches either copy."""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import node_manifest as nm
from harness import playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
API_KEY = "sk-integration-key-51c0de"
GENERATED_KEY = "node-generated-key-9a8b7c6d5e"

# The facts the other roles publish on a converged cpu node, as set_fact would leave them.
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: true
  # what the host section reads (names, machine-id, kernel, addresses); the full set is slow on a loaded machine
  gather_subset: ["!all", "min", "network"]
  vars:
    __files: {config.json: "{{ 'a' * 64 }}", model.safetensors: "{{ 'b' * 64 }}"}
  pre_tasks:
    - name: Publish what the other roles would
      ansible.builtin.set_fact:
        node_facts_os: {distribution: Debian, version: "12.7", major_version: "12", codename: bookworm, family: Debian}
        # the note carries both keys where no secret-looking name protects them: only their values redact them
        vllm_node_plan: {device: cpu, repo: org/tiny, revision: main, max_model_len: "{{ max_model_len | int }}",
                         note: "clients send {{ generated_key }} or {{ vllm_node_api_key }}"}
        vllm_env_active_version: "0.32.0"
        vllm_env_active_variant: cpu
        vllm_env_active_venv: /opt/vllm/venvs/0.32.0-cpu
        model_download_commit: "{{ '2' * 40 }}"
        model_download_dir: "{{ config_dir }}"
        model_download_file_sha256: "{{ __files }}"
        model_download_manifest_sha256: "{{ '3' * 64 }}"
        model_config_rules_applied: [drop-kv-scheme]
        model_config_changes:
          - {rule: drop-kv-scheme, file: config.json, path: quantization_config.kv_cache_scheme, old: fp8}
        model_config_files_sha256: {"config.json": "{{ 'c' * 64 }}"}
        vllm_service_name: vllm
        vllm_service_effective_api_key: "{{ generated_key }}"
        vllm_service_fingerprint: "{{ 'd' * 64 }}"
        vllm_service_fingerprint_inputs: {venv: /opt/vllm/venvs/0.32.0-cpu}
        vllm_service_unit_sha256: "{{ 'e' * 64 }}"
        vllm_service_env_sha256: "{{ 'f' * 64 }}"

    - name: Publish the lock hash too (left out to act as a run that did not reach vllm_env)
      ansible.builtin.set_fact:
        vllm_env_lock_sha256: "{{ '1' * 64 }}"
      when: publish_lock | bool
  roles:
    - role: node_manifest
"""


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    """The play, a model directory with a patched config and its original, the output paths."""
    config_dir = tmp_path / "model"
    config_dir.mkdir()
    (config_dir / "config.json.orig").write_text(
        '{"hidden_size": 64, "quantization_config": {"kv_cache_scheme": "fp8", "quant_method": "fp8"}}')
    (config_dir / "config.json").write_text('{\n  "hidden_size": 64,\n  "quantization_config": {\n'
                                            '    "quant_method": "fp8"\n  }\n}\n')
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    return {"dir": tmp_path, "config_dir": config_dir,
            "manifest": tmp_path / "etc" / "manifest.json", "artifacts": tmp_path / "artifacts"}


def manifest_play(node: dict[str, Path], *args: str, **extra: Any) -> tuple[int, str, dict[str, int]]:
    """ansible-playbook on the play; (rc, output, the localhost recap counters)."""
    variables = {"config_dir": str(node["config_dir"]), "generated_key": GENERATED_KEY,
                 "node_manifest_path": str(node["manifest"]), "node_manifest_artifacts_dir": str(node["artifacts"]),
                 "node_manifest_owner": str(os.getuid()), "node_manifest_group": str(os.getgid()),
                 "vllm_node_api_key": API_KEY, "max_model_len": 4096, "publish_lock": True, **extra}
    rc, out, _ = playbook.run(node["dir"] / "play.yml", "-e", json.dumps(variables), *args, inventory="localhost,",
                              timeout=300)
    counters = playbook.recap(out, "localhost") if "PLAY RECAP" in out else {}
    return rc, out, counters


def read(node: dict[str, Path]) -> tuple[str, str]:
    return node["manifest"].read_text(), (node["artifacts"] / "localhost" / "manifest.json").read_text()


def test_written_once_then_unchanged_in_runs_and_check_mode(node: dict[str, Path]) -> None:
    rc, out, recap = manifest_play(node)
    assert rc == 0, out
    assert recap["changed"] >= 2, out  # the node file and the controller copy
    on_node, on_controller = read(node)
    assert on_node == on_controller
    assert stat.S_IMODE(node["manifest"].stat().st_mode) == 0o600
    manifest = json.loads(on_node)
    assert manifest["missing"] == []
    assert manifest["vllm"]["lock_sha256"] == "1" * 64
    assert manifest["model"]["files"]["model.safetensors"] == "b" * 64
    assert manifest["host"]["inventory_hostname"] == "localhost"
    assert manifest["host"]["machine_id"] and manifest["host"]["kernel_release"]
    diff = manifest["config"]["diffs"]["config.json"]
    assert any(line.startswith("-") and "kv_cache_scheme" in line for line in diff), diff
    assert manifest["manifest_sha256"] == nm.content_sha256(manifest)
    assert manifest["plan"]["content"]["note"] == f"clients send {nm.REDACTED} or {nm.REDACTED}"
    for secret in (API_KEY, GENERATED_KEY):
        assert secret not in on_node and secret not in out

    rc, out, recap = manifest_play(node)
    assert rc == 0 and recap["changed"] == 0, out
    rc, out, recap = manifest_play(node, "--check", "--diff")
    assert rc == 0 and recap["changed"] == 0, out
    assert read(node) == (on_node, on_controller)


def test_a_changed_fact_rewrites_with_a_new_time(node: dict[str, Path]) -> None:
    assert manifest_play(node)[0] == 0
    before = json.loads(read(node)[0])
    rc, out, recap = manifest_play(node, "--check", max_model_len=2048)
    assert rc == 0 and recap["changed"] >= 1, out   # check mode shows it would change ...
    assert json.loads(read(node)[0]) == before       # ... and changes nothing
    rc, out, recap = manifest_play(node, max_model_len=2048)
    assert rc == 0 and recap["changed"] >= 2, out
    after = json.loads(read(node)[0])
    assert after["plan"]["content"]["max_model_len"] == 2048
    assert after["manifest_sha256"] != before["manifest_sha256"]
    assert after["host"]["generated_at"] > before["host"]["generated_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", after["host"]["generated_at"])
    assert nm.compare(before, after) == [
        "plan.content.max_model_len: A=4096 B=2048",
        f"plan.sha256: A=\"{before['plan']['sha256']}\" B=\"{after['plan']['sha256']}\""]


def test_a_run_that_publishes_less_keeps_the_file(node: dict[str, Path]) -> None:
    assert manifest_play(node)[0] == 0
    kept = read(node)
    rc, out, recap = manifest_play(node, publish_lock=False)
    assert rc == 0 and recap["changed"] == 0, out
    assert "not written: this run did not publish vllm.lock_sha256" in out
    assert read(node) == kept
    rc, out, recap = manifest_play(node, publish_lock=False, node_manifest_overwrite_with_missing=True)
    assert rc == 0 and recap["changed"] >= 2, out
    manifest = json.loads(read(node)[0])
    assert manifest["vllm"]["lock_sha256"] is None and manifest["missing"] == ["vllm.lock_sha256"]
