"""The node manifest after site.yml (testinfra, run by `molecule verify` before test_site.py, which changes the node):
on the node root-only, every section there, the controller copy identical, the plan's hash that of the plan file,
the files' hashes those on disk, no secret, and only the facts other issue-10 pieces add may still be missing."""

from __future__ import annotations

import json

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import node_manifest as nm
from harness import node, playbook
from harness.project import ARTIFACTS

HOST = "site_e2e-bookworm"
MANIFEST = "/etc/vllm-node/manifest.json"

testinfra_hosts = [f"ansible://{HOST}"]


def node_manifest(host) -> tuple[str, dict]:
    text = host.check_output(f"cat {MANIFEST}") + "\n"
    return text, json.loads(text)


def test_manifest_is_root_only_on_the_node(host):
    manifest = host.file(MANIFEST)
    assert manifest.is_file
    assert (manifest.user, manifest.group, manifest.mode) == ("root", "root", 0o600)


def test_manifest_has_every_section_and_its_hash(host):
    _, manifest = node_manifest(host)
    assert set(manifest) == {"schema", "host", "missing", "manifest_sha256", *nm.SECTIONS}
    assert manifest["manifest_sha256"] == nm.content_sha256(manifest)
    assert manifest["host"]["inventory_hostname"] == HOST and manifest["host"]["generated_at"]
    assert manifest["host"]["machine_id"] == host.check_output("cat /etc/machine-id").strip()
    assert manifest["os"]["codename"] == "bookworm"
    assert manifest["driver"]["device"] == "cpu" and manifest["driver"]["required"] is False
    assert (manifest["vllm"]["version"], manifest["vllm"]["variant"]) == ("0.32.0", "cpu")
    assert host.file(manifest["vllm"]["venv"]).is_directory
    assert host.file("/opt/vllm/current").linked_to == manifest["vllm"]["venv"]
    assert manifest["service"]["name"] == "vllm"
    print(f"MANIFEST {HOST} {manifest['manifest_sha256']} missing={manifest['missing']}")
    # every role that feeds the manifest ran in site.yml: a field missing here is a fact that stopped reaching it
    assert manifest["missing"] == []
    assert manifest["vllm"]["lock_sha256"] and manifest["service"]["fingerprint"]
    assert manifest["model"]["files_sha256"] and manifest["model"]["files"]


def test_controller_copy_is_the_node_manifest(host):
    text, _ = node_manifest(host)
    assert (ARTIFACTS / HOST / "manifest.json").read_text() == text


def test_plan_is_the_written_plan(host):
    _, manifest = node_manifest(host)
    plan = json.loads((ARTIFACTS / f"plan-{HOST}.json").read_text())
    assert manifest["plan"]["content"] == plan
    assert manifest["plan"]["sha256"] == nm.sha256_json(plan)
    assert manifest["model"]["repo"] == plan["repo"]


def test_model_files_are_the_ones_on_disk(host):
    _, manifest = node_manifest(host)
    model = manifest["model"]
    assert host.file(model["dir"]).is_directory and len(model["commit"]) == 40
    if model["files"] is None:  # model_download_file_sha256 not published yet (the revisions piece)
        return
    patched = {change["file"] for change in manifest["config"]["changes"]}
    for path, digest in model["files"].items():
        if path not in patched:  # patched configs: the manifest keeps the hash of the file as downloaded
            assert host.check_output(f"sha256sum {model['dir']}/{path}").split()[0] == digest, path


def test_check_mode_on_the_converged_node_changes_no_manifest(host, converged_reruns):
    """The check-mode run (conftest.py) left both manifest copies "ok" and the node's manifest as it was."""
    text, _ = node_manifest(host)
    out = converged_reruns["check"]["out"]
    assert converged_reruns["check"]["rc"] == 0, out[-4000:]
    for task in ("node_manifest : Write the manifest on the node", "node_manifest : Write the controller copy"):
        assert playbook.statuses(out, task) == ["ok"], (task, out[-4000:])
    assert "not written" not in out
    assert node_manifest(host)[0] == text


def test_no_secret_in_the_manifest(host):
    text, _ = node_manifest(host)
    api_key = node.api_key(host)
    assert len(api_key) >= 16 and api_key not in text
