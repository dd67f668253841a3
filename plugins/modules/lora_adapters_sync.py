#!/usr/bin/python
"""Ansible module: the LoRA adapters a running vLLM serves, loaded and unloaded at runtime to match a list."""

from __future__ import annotations

DOCUMENTATION = r"""
module: lora_adapters_sync
short_description: Load and unload vLLM's LoRA adapters at runtime, without a restart
description:
  - Reads the adapters vLLM serves (GET /v1/models, the entries with a parent), unloads those not listed or whose
    directory changed (POST /v1/unload_lora_adapter), loads the missing ones (POST /v1/load_lora_adapter), and
    reads the list again to confirm.
  - Runs on the node against vLLM over loopback; vLLM must run with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (the plan
    sets it with vllm_node_enable_lora). The gateway refuses these paths to clients.
  - Changes nothing when the served adapters already match. In check mode only reads, and reports what would be
    loaded and unloaded, with a diff.
options:
  url:
    description: vLLM's base URL, e.g. http://127.0.0.1:8000.
    type: str
    required: true
  api_key:
    description: vLLM's API key (a bearer token); empty when it runs without one.
    type: str
    default: ""
  adapters:
    description:
      - The adapters to serve, each {name, path} (the name clients ask for as the model, the adapter's directory on
        the node); other keys are ignored, so the plan's entries (plan.lora.adapters) can be passed as they are.
      - Any other served adapter is unloaded.
    type: list
    elements: dict
    required: true
  timeout:
    description: Seconds one request may take (a load reads the adapter's weights).
    type: int
    default: 120
attributes:
  check_mode:
    support: full
    description: Reads what vLLM serves and reports what would be loaded and unloaded (with a diff); sends no load or
      unload.
  diff_mode:
    support: full
    description: The served adapters before and after.
author: vllm-node
"""

EXAMPLES = r"""
- name: Serve these adapters
  vllm_node.vllm_node.lora_adapters_sync:
    url: http://127.0.0.1:8000
    api_key: "{{ vllm_service_effective_api_key }}"
    adapters:
      - name: support-bot
        path: /srv/vllm/models/lora/acme/support-bot/revisions/0123456789abcdef0123456789abcdef01234567
"""

RETURN = r"""
loaded:
  description: Adapters loaded (or, in check mode, that would be).
  type: list
  elements: str
  returned: success
  sample: [support-bot]
unloaded:
  description: Adapters unloaded (or that would be); an adapter whose directory changed is in both lists.
  type: list
  elements: str
  returned: success
  sample: []
adapters:
  description: The adapters served afterwards.
  type: list
  elements: str
  returned: success
  sample: [support-bot]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.lora_sync import SyncError, http_request, sync


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "adapters": {"type": "list", "elements": "dict", "required": True},
            "timeout": {"type": "int", "default": 120},
        },
        supports_check_mode=True)
    params = module.params
    request = http_request(params["url"], params["api_key"], float(params["timeout"]))
    try:
        result = sync(request, params["adapters"], check_mode=module.check_mode)
    except SyncError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
