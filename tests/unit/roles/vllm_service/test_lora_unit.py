"""The unit and the adapters file the vllm_service role renders for a plan with LoRA adapters (its own templates and
vars, Ansible's templating): the unit starts vLLM with the file's adapters ($NODE_LORA_MODULES, word-split by
systemd), and an adapter change alters the file only, never the unit or the planned command whose hashes make the
restart fingerprint."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from test_compile_cache_dir import ROLE, trusted

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from repo_root import ROOT

COMMIT = "0123456789abcdef0123456789abcdef01234567"
DEMO = ROOT / "inventories/demo/group_vars/vllm_nodes"


def plan_with(names: list[str], enable_lora: bool = True) -> dict[str, Any]:
    """The demo node's plan (tiny-llama on vLLM's CPU build) with these adapters (files not read)."""
    adapters = [{"name": n, "repository": f"acme/{n}", "revision": COMMIT, "base": "tiny-llama"} for n in names]
    gpus = yaml.safe_load((ROOT / "roles/vllm_node/vars/main/gpus.yml").read_text())["vllm_node_catalog_gpus"]
    models = yaml.safe_load((DEMO / "test_models.yml").read_text())["vllm_node_extra_models"]
    return sizing.node_plan({
        "model": "tiny-llama", "models": models, "releases": gt.load_releases(), "gpu": "cpu", "gpus": gpus,
        "vllm_variant": "cpu", "vllm_version": "0.32.0", "cpu_kv_cache_space_gib": 1, "max_model_len": "auto",
        "enable_lora": enable_lora, "max_loras": 2, "lora_adapters": adapters})


def render(template: str, plan: dict[str, Any]) -> str:
    """One of the role's templates for this plan (role defaults and vars, the node's usual published values)."""
    variables = {**trusted(yaml.safe_load((ROLE / "defaults/main.yml").read_text())),
                 **trusted(yaml.safe_load((ROLE / "vars/main.yml").read_text())),
                 "vllm_node_plan": plan, "vllm_service_plan": plan, "ansible_managed": "managed",
                 "vllm_service_served_model_name": plan["served_model_name"],
                 "vllm_service_url": "http://127.0.0.1:8000", "ansible_check_mode": False}
    templar = Templar(loader=DataLoader(), variables=variables)
    return str(templar.template(trust_as_template((ROLE / "templates" / template).read_text())))


UNIT, LORA_FILE = "etc/systemd/system/vllm.service.j2", "etc/vllm/vllm-lora.env.j2"


def test_the_unit_starts_with_the_files_adapters_and_does_not_change_with_them() -> None:
    two, one = plan_with(["alpha", "beta"]), plan_with(["alpha"])
    unit = render(UNIT, two)
    assert "EnvironmentFile=-/etc/vllm/vllm-lora.env\n" in unit
    exec_start = unit.split("ExecStart=", 1)[1].split("\n\n", 1)[0]
    # the last word, unquoted: systemd splits $VAR at whitespace into arguments (none when the list is empty)
    # (templated here as a string, the line continuations keep Jinja's escapes: compared past them)
    assert re.search(r'"--enforce-eager"[\s\\n]+\$NODE_LORA_MODULES$', exec_start), exec_start
    assert '"--enable-lora"' in exec_start and "--lora-modules" not in exec_start
    assert 'Environment="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"' in unit
    assert render(UNIT, one) == unit, "an adapter change must not change the unit (its hash restarts vLLM)"
    assert one["service"]["fingerprint"] == two["service"]["fingerprint"]
    root = "/srv/vllm/models/lora/acme"
    both = f"alpha={root}/alpha/revisions/{COMMIT} beta={root}/beta/revisions/{COMMIT}"
    assert f"\nNODE_LORA_MODULES=--lora-modules {both}\n" in render(LORA_FILE, two)
    assert f"\nNODE_LORA_MODULES=--lora-modules alpha={root}/alpha/revisions/{COMMIT}\n" in render(LORA_FILE, one)
    assert f"# beta: acme/beta@{COMMIT} on tiny-llama" in render(LORA_FILE, two)


def test_no_adapters_start_with_an_empty_list_and_no_lora_has_no_file() -> None:
    assert "\nNODE_LORA_MODULES=\n" in render(LORA_FILE, plan_with([]))
    unit = render(UNIT, plan_with([], enable_lora=False))
    assert "NODE_LORA_MODULES" not in unit and "vllm-lora.env" not in unit and "RUNTIME_LORA" not in unit


@pytest.mark.parametrize("names", [["alpha"], []])
def test_the_fingerprinted_command_is_the_same_with_any_adapters(names: list[str]) -> None:
    assert plan_with(names)["service"]["fingerprint"] == plan_with(["other"])["service"]["fingerprint"]
