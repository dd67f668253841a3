"""Every role's public interface: meta/argument_specs.yml lists exactly the variables of defaults/main.yml
(the house rule "argument specs in lock-step with the defaults"), each with a type and a description."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

from repo_root import ROOT

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta").is_dir())


def spec_options(role: str) -> dict[str, Any]:
    """Options of every entry point of the role, merged."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]
    options: dict[str, Any] = {}
    for entry in specs.values():
        options.update(entry.get("options") or {})
    return options


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_match_the_defaults(role: str) -> None:
    defaults_file = ROOT / "roles" / role / "defaults/main.yml"
    defaults = set(yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.exists() else set()
    options = spec_options(role)
    assert sorted(defaults - set(options)) == [], "defaults without an argument spec"
    assert sorted(set(options) - defaults) == [], "argument specs without a default"
    for name, option in options.items():
        assert option.get("type") and option.get("description"), name


def test_vllm_node_secrets_are_no_log() -> None:
    options = spec_options("vllm_node")
    assert options["vllm_node_api_key"]["no_log"] is True
    assert options["vllm_node_hf_token"]["no_log"] is True
