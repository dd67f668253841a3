"""Every module and every filter the collection exports documents itself: `ansible-doc` prints it from the
collection (the filters are listed from the FilterModule classes of plugins/filter/*.py, not by hand)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repo_root import ROOT

ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"
MODULES = sorted(path.stem for path in (ROOT / "plugins" / "modules").glob("*.py") if path.stem != "__init__")
COLLECTION = "vllm_node.vllm_node"


def exported_filters() -> dict[str, str]:
    """Every filter name the collection exports -> the plugin file that exports it (its FilterModule.filters())."""
    names: dict[str, str] = {}
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"ansible_collections.vllm_node.vllm_node.plugins.filter.{path.stem}")
        for name in module.FilterModule().filters():
            assert name not in names, f"{name} exported by both {names[name]} and {path.name}"
            names[name] = path.name
    return names


FILTERS = exported_filters()


def ansible_doc(*args: str) -> subprocess.CompletedProcess:
    """ansible-doc run from the repository root (its ansible.cfg puts ./collections on the collections path)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(ANSIBLE_DOC), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_modules_are_the_expected_ones():
    assert MODULES == ["bundle_fetch", "disk_space", "files_probe", "gateway_servers", "gpu_health",
                       "inference_check_benchmark", "inference_check_measure", "lora_adapters_read",
                       "lora_adapters_sync", "model_download", "model_download_link", "model_download_node",
                       "model_download_unserved",
                       "page_cache_warm", "vllm_plan", "vllm_service_probe", "vllm_service_wait"]


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


def test_every_exported_filter_is_documented():
    """`ansible-doc -t filter --list` marks a filter without documentation UNDOCUMENTED; a doc file whose filter no
    longer exists is listed too. Both fail here, by name."""
    proc = ansible_doc("-t", "filter", "--list", "--json", COLLECTION)
    assert proc.returncode == 0, proc.stderr
    listed = {name.removeprefix(f"{COLLECTION}."): text for name, text in json.loads(proc.stdout).items()}
    assert len(FILTERS) >= 30, sorted(FILTERS)  # the discovery found the plugins (32 today)
    undocumented = sorted(f"{name} ({FILTERS[name]})" for name in FILTERS if listed.get(name) in (None, "UNDOCUMENTED"))
    assert not undocumented, f"without documentation (add plugins/filter/<name>.yml or make it private): {undocumented}"
    stale = sorted(set(listed) - set(FILTERS))
    assert not stale, f"documented filters that no FilterModule exports: {stale}"


def test_every_filter_documentation_is_complete():
    """All exported filters in one ansible-doc call: a description, every option described (the piped value as
    _input), an example that calls the filter by its full name, and the returned value."""
    proc = ansible_doc("-t", "filter", "--json", *(f"{COLLECTION}.{name}" for name in sorted(FILTERS)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr
    docs = json.loads(proc.stdout)
    for name in FILTERS:
        entry = docs[f"{COLLECTION}.{name}"]
        doc = entry["doc"]
        assert doc["name"] == name and doc["short_description"] and doc["description"], name
        assert "_input" in doc["options"], name
        assert all(option.get("description") for option in doc["options"].values()), name
        assert f"{COLLECTION}.{name}" in entry["examples"], name
        assert entry["return"]["_value"]["description"], name
