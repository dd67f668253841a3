#!/usr/bin/python
"""Ansible module: the LoRA adapters model_download put on the node, read for the plan and the manifest."""

from __future__ import annotations

DOCUMENTATION = r"""
module: lora_adapters_read
short_description: Read the downloaded LoRA adapters' config and tensor shapes (for the plan) and hashes (manifest)
description:
  - Runs on the node after the model_download role fetched and verified each adapter (its C(adapters) entry point).
    For each adapter reads C(adapter_config.json) and the header of C(adapter_model.safetensors) (the tensor shapes;
    no weights are read) from its revision's directory.
  - Returns C(entries), the inventory entries with C(config) and C(shapes) added, which the re-plan checks against
    the base before the service changes, and C(adapters), each adapter's directory, files' sha256 and their hash.
  - Changes nothing. An adapter whose directory is not there (check mode before its first download) keeps its
    entry without files, and the plan then says it could not check it.
options:
  adapters:
    description: The inventory's adapters (vllm_node_lora_adapters), in the order of the download results.
    type: list
    elements: dict
    required: true
  downloads:
    description: The facts the model_download action returned for each adapter (step all), same order.
    type: list
    elements: dict
    required: true
  seals:
    description: The facts of its seal step ({} where none ran), same order.
    type: list
    elements: dict
    required: true
attributes:
  check_mode:
    support: full
    description: Reads only, as in a real run.
  diff_mode:
    support: none
author: vllm-node
"""

EXAMPLES = r"""
- name: Read the downloaded adapters
  vllm_node.vllm_node.lora_adapters_read:
    adapters: "{{ model_download_lora_adapters }}"
    downloads: "{{ __model_download_lora.results | map(attribute='facts') | list }}"
    seals: "{{ __model_download_lora_sealed.results | map(attribute='facts', default={}) | list }}"
  register: read
"""

RETURN = r"""
entries:
  description: The inventory entries with config (adapter_config.json) and shapes (tensor -> shape) when read.
  type: list
  elements: dict
  returned: success
adapters:
  description: Each adapter's name, repository, revision, base, commit, dir, files (path -> sha256), files_sha256.
  type: list
  elements: dict
  returned: success
"""

import struct
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.lora_adapters import (
    adapter_metadata,
    downloaded_adapters,
    plan_entry,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "adapters": {"type": "list", "elements": "dict", "required": True},
            "downloads": {"type": "list", "elements": "dict", "required": True},
            "seals": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True)
    params = module.params
    try:
        adapters = downloaded_adapters(params["adapters"], params["downloads"], params["seals"])
    except ValueError as exc:
        module.fail_json(msg=f"lora_adapters_read: {exc}")
    entries = []
    for entry, adapter in zip(params["adapters"], adapters, strict=True):
        directory = Path(adapter["dir"]) if adapter["dir"] else None
        metadata = None
        if directory is not None and (directory / "adapter_config.json").is_file():
            try:
                metadata = adapter_metadata(directory)
            except (OSError, ValueError, struct.error) as exc:
                module.fail_json(msg=f"adapter {adapter['name']}: cannot read its files in {directory} ({exc}): it "
                                     "must hold adapter_config.json and adapter_model.safetensors (a PEFT LoRA "
                                     "adapter); fix the repository or its revision")
        entries.append(plan_entry(entry, metadata))
    module.exit_json(changed=False, entries=entries, adapters=adapters)


if __name__ == "__main__":
    main()
