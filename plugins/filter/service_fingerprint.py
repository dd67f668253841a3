"""Filter service_fingerprint: one sha256 over everything the running vLLM process depends on."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.service_fingerprint import (
    FingerprintError,
)
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.service_fingerprint import (
    service_fingerprint as _service_fingerprint,
)

DOCUMENTATION = r"""
name: service_fingerprint
short_description: The fingerprint of everything a running vLLM process depends on, and its inputs
description:
  - Takes the components the process uses (the plan's service fingerprint, the venv and its lock hash, the model
    revision and file manifest, the patched configs, the unit, environment file, CA bundle) and returns one sha256
    over them (canonical JSON, sorted keys), so the order they are given in does not matter.
  - A secret (the API key) is given in O(secrets) and only its sha256 is kept in the inputs.
  - A component or secret given as V(null) is not known in this run (its role did not run, e.g. a C(--tags) run)
    and keeps its value from O(previous), the last record, so a partial run does not restart the service.
positional: _input
options:
  _input:
    description: Component name -> value (string, number, list or dict of JSON data; V(null) = keep the previous).
    type: dict
    required: true
  secrets:
    description: Secret name -> value; only the sha256 hex of the value enters the inputs and the fingerprint.
    type: dict
    default: {}
  previous:
    description: The C(inputs) of the last record on the node (V({}) when there is none).
    type: dict
    default: {}
author: vllm-node
"""

EXAMPLES = r"""
record: >-
  {{ {'service': plan.service.fingerprint, 'venv': vllm_env_active_venv, 'unit_sha256': unit_stat.stat.checksum}
     | vllm_node.vllm_node.service_fingerprint(secrets={'api_key': key}, previous=last_record.inputs | default({})) }}
"""

RETURN = r"""
_value:
  description: The fingerprint and what it was taken over.
  type: dict
  contains:
    fingerprint:
      description: sha256 hex of the inputs as canonical JSON.
      type: str
    inputs:
      description: Component -> value, secrets as their sha256 hex, sorted by name.
      type: dict
"""


def service_fingerprint(components: Any, secrets: Any = None, previous: Any = None) -> dict[str, Any]:
    """The filter: module_utils' service_fingerprint; bad input becomes an AnsibleFilterError."""
    try:
        return _service_fingerprint(components, secrets, previous)
    except FingerprintError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"service_fingerprint": service_fingerprint}
