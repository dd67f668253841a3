"""A rebuild reproduces the node (issue 10): the node that lived through the day-2 sequence and a node converged
fresh from the same inventory have the same manifest outside the host section, field by field.

Hosts: VLLM_NODE_MANIFEST_HOSTS="<node with history>,<fresh node>[,...]" when set, else the platforms of this
scenario's molecule.yml in group vllm_nodes, in order (the first is compared with each other one). Fields that may
differ on purpose are named in VLLM_NODE_MANIFEST_IGNORE (comma-separated paths, e.g. service.env_sha256 when each
node generates its own API key: the env file carries it, so its hash differs; set vllm_node_api_key instead).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import node_manifest as nm
from harness.project import ARTIFACTS

SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parents[1]))
MANIFEST = "/etc/vllm-node/manifest.json"


def manifest_hosts() -> list[str]:
    """The hosts whose manifests are compared, the one with history first."""
    named = os.environ.get("VLLM_NODE_MANIFEST_HOSTS", "")
    if named.strip():
        return [h.strip() for h in named.split(",") if h.strip()]
    scenario = SCENARIO / "molecule.yml"
    platforms = (yaml.safe_load(scenario.read_text()) or {}).get("platforms") or [] if scenario.is_file() else []
    return [p["name"] for p in platforms if "vllm_nodes" in (p.get("groups") or ["vllm_nodes"])]


HOSTS = manifest_hosts()
IGNORE = [p.strip() for p in os.environ.get("VLLM_NODE_MANIFEST_IGNORE", "").split(",") if p.strip()]
testinfra_hosts = [f"ansible://{h}" for h in HOSTS]


def controller_manifest(name: str) -> dict:
    path = ARTIFACTS / name / "manifest.json"
    assert path.is_file(), f"{path} missing: site.yml (node_manifest) did not run to the end on {name}"
    return json.loads(path.read_text())


def test_each_node_holds_its_controller_copy(host):
    name = host.backend.get_hostname()
    text = host.check_output(f"cat {MANIFEST}") + "\n"
    assert (ARTIFACTS / name / "manifest.json").read_text() == text
    manifest = json.loads(text)
    assert manifest["manifest_sha256"] == nm.content_sha256(manifest)
    assert manifest["host"]["inventory_hostname"] == name


@pytest.mark.parametrize("fresh", HOSTS[1:] or ["(none)"])
def test_a_fresh_node_reproduces_the_manifest(fresh):
    assert len(HOSTS) >= 2, (
        f"needs two nodes from the same inventory (the day-2 one and a fresh one), got {HOSTS}: add the second "
        "platform to molecule.yml (group vllm_nodes) or name both in VLLM_NODE_MANIFEST_HOSTS")
    original, rebuilt = controller_manifest(HOSTS[0]), controller_manifest(fresh)
    assert original["host"]["inventory_hostname"] != rebuilt["host"]["inventory_hostname"]
    differences = nm.compare(original, rebuilt, IGNORE)
    print(f"MANIFEST {HOSTS[0]} {original['manifest_sha256']} vs {fresh} {rebuilt['manifest_sha256']}: "
          f"{len(differences)} difference(s) (ignored: {IGNORE or 'none'})")
    assert differences == [], "\n".join(differences)
    assert original["missing"] == rebuilt["missing"]
