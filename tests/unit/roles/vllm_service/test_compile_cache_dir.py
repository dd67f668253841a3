"""The unit's cache environment, rendered from the role's own vars with Ansible's templating: the plan's keyed
directory, so a cache another vLLM version built is never the one the new process opens."""

from __future__ import annotations

from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.vllm_node.vllm_node.plugins.filter.compile_cache import compile_cache_prune
from repo_root import ROOT

ROLE = ROOT / "roles" / "vllm_service"
CACHE_VARS = ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
              "FLASHINFER_WORKSPACE_BASE")


def trusted(value: Any) -> Any:
    """The role's YAML as Ansible loads it: every string a template."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return value


def unit_environment(plan: dict[str, Any]) -> dict[str, str]:
    """__vllm_service_unit_environment for a plan (role defaults and vars, nothing from an inventory)."""
    variables = {**trusted(yaml.safe_load((ROLE / "defaults/main.yml").read_text())),
                 **trusted(yaml.safe_load((ROLE / "vars/main.yml").read_text())), "vllm_node_plan": plan}
    templar = Templar(loader=DataLoader(), variables=variables)
    return dict(templar.template(trust_as_template("{{ __vllm_service_unit_environment }}")))


def test_every_cache_lives_in_the_plans_keyed_directory() -> None:
    env = unit_environment({"compile_cache": {"dir": "vllm-0.32.0-cpu-0123456789abcdef"}})
    for name in CACHE_VARS:
        assert env[name].startswith("/var/lib/vllm/cache/vllm-0.32.0-cpu-0123456789abcdef"), name
    # HOME and the model cache stay where they were
    assert env["HOME"] == "/var/lib/vllm" and env["HF_HOME"] == "/var/lib/vllm/hf"


def test_a_stale_cache_of_another_vllm_version_is_not_opened_and_is_pruned_beyond_the_bound() -> None:
    old = unit_environment({"compile_cache": {"dir": "vllm-0.31.0-cpu-1111111111111111"}})
    new = unit_environment({"compile_cache": {"dir": "vllm-0.32.0-cpu-2222222222222222"}})
    for name in CACHE_VARS:
        assert "vllm-0.31.0" not in new[name] and new[name] != old[name], name
    found = [{"path": "/var/lib/vllm/cache/vllm-0.29.0-cpu-0000000000000000", "mtime": 1},
             {"path": "/var/lib/vllm/cache/vllm-0.30.0-cpu-3333333333333333", "mtime": 2},
             {"path": "/var/lib/vllm/cache/vllm-0.31.0-cpu-1111111111111111", "mtime": 3},
             {"path": "/var/lib/vllm/cache/vllm-0.32.0-cpu-2222222222222222", "mtime": 4}]
    keep = yaml.safe_load((ROLE / "defaults/main.yml").read_text())["vllm_service_compile_cache_keep"]
    assert compile_cache_prune(found, "vllm-0.32.0-cpu-2222222222222222", keep) == [
        "/var/lib/vllm/cache/vllm-0.29.0-cpu-0000000000000000"]


def test_a_plan_without_a_key_keeps_the_one_cache_directory() -> None:
    env = unit_environment({})
    assert env["VLLM_CACHE_ROOT"] == "/var/lib/vllm/cache/vllm"
    assert env["XDG_CACHE_HOME"] == "/var/lib/vllm/cache"
