"""Every module (and the service_url filter) documents itself: `ansible-doc` prints it from the collection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"
MODULES = sorted(path.stem for path in (ROOT / "plugins" / "modules").glob("*.py") if path.stem != "__init__")


def ansible_doc(*args: str) -> subprocess.CompletedProcess:
    """ansible-doc run from the repository root (its ansible.cfg puts ./collections on the collections path)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(ANSIBLE_DOC), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_modules_are_the_expected_ones():
    assert MODULES == ["bundle_fetch", "disk_space", "files_probe", "gateway_servers", "inference_check_benchmark",
                       "inference_check_measure", "model_download", "model_download_link", "model_download_node",
                       "vllm_service_probe", "vllm_service_wait"]


@pytest.mark.parametrize("name", MODULES)
def test_module_documentation(name):
    proc = ansible_doc("--json", f"vllm_node.vllm_node.{name}")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    entry = json.loads(proc.stdout)[f"vllm_node.vllm_node.{name}"]
    doc = entry["doc"]
    assert doc["short_description"] and doc["description"]
    assert doc["options"] and all(option.get("description") for option in doc["options"].values())
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert f"vllm_node.vllm_node.{name}:" in entry["examples"]
    assert entry["return"]
    # the text form prints too (what an operator runs)
    assert ansible_doc(f"vllm_node.vllm_node.{name}").returncode == 0


def test_modules_support_check_mode():
    for name in MODULES:
        source = (ROOT / "plugins" / "modules" / f"{name}.py").read_text()
        if "AnsibleModule(" in source:  # vllm_service_wait, model_download: the action plugins' documentation only
            assert "supports_check_mode=True" in source, name
    assert (ROOT / "plugins" / "action" / "vllm_service_wait.py").exists()
    assert (ROOT / "plugins" / "action" / "model_download.py").exists()


def test_service_url_filter_documentation():
    proc = ansible_doc("--json", "-t", "filter", "vllm_node.vllm_node.service_url")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["vllm_node.vllm_node.service_url"]["doc"]
    assert set(doc["options"]) == {"_input", "port"}


def test_service_fingerprint_filter_documentation():
    proc = ansible_doc("--json", "-t", "filter", "vllm_node.vllm_node.service_fingerprint")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)["vllm_node.vllm_node.service_fingerprint"]["doc"]
    assert set(doc["options"]) == {"_input", "secrets", "previous"}
    assert all(option.get("description") for option in doc["options"].values())


def test_vllm_platform_check_filter_documentation():
    proc = ansible_doc("--json", "-t", "filter", "vllm_node.vllm_node.vllm_platform_check")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["vllm_node.vllm_node.vllm_platform_check"]["doc"]
    assert set(doc["options"]) == {"_input", "version", "variant", "python", "os_name", "driver_branch", "driver_cuda"}
