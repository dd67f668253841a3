"""Filter observability_instances over plugins/module_utils/instance_monitoring.py: the scrape target, labels and
alert thresholds of each vLLM instance of a node (vllm_node_instances), for the observability role."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import instance_monitoring as monitoring
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input

DOCUMENTATION = r"""
name: observability_instances
short_description: The Prometheus target and alert thresholds of each vLLM instance of a node
description:
  - For a plan with C(instances) (several models on one node, C(vllm_node_instances)), one record per instance that
    has a plan, in the plan's order; a single-model plan gives an empty list.
  - Each instance is scraped on the host of O(vllm_target) (the node's scrape address) and its own port
    (C(plan.service.port)).
  - The waiting-queue threshold is O(waiting_override) when set, else the instance's own C(kv.max_concurrency) rounded
    up, at least 1.
  - Two instances with one name or one target, a target without a port or an instance plan without
    C(service.port) fail with a message naming them.
positional: _input, vllm_target, waiting_override
options:
  _input:
    description: The node's plan (vllm_node_plan or the plan JSON).
    type: dict
    required: true
  vllm_target:
    description: The node's single-model scrape target, host:port (observability_vllm_target).
    type: str
    required: true
  waiting_override:
    description: observability_alert_waiting_requests; null = each instance's plan decides.
    type: int
    required: false
author: vllm-node
"""

EXAMPLES = r"""
instances: "{{ vllm_node_plan | vllm_node.vllm_node.observability_instances('10.0.0.11:8000') }}"
# [{"name": "chat", "model": "org/llama", "target": "10.0.0.11:8000", "waiting": 2, "max_concurrency": 1.5,
#   "kv_tokens": 4096}, {"name": "mla", ..., "target": "10.0.0.11:8001", ...}]
"""

RETURN = r"""
_value:
  description: >-
    [{name, model (the served_model_name, vLLM's model_name label), target (host:port), waiting (the threshold),
    max_concurrency, kv_tokens}].
  type: list
  elements: dict
"""


@reports_bad_input
def observability_instances(plan: dict[str, Any] | None, vllm_target: str,
                            waiting_override: int | None = None) -> list[dict[str, Any]]:
    """instance_monitoring.instances: each planned instance's target, labels and thresholds."""
    return monitoring.instances(plan or {}, str(vllm_target), waiting_override)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        """The filters of this file."""
        return {"observability_instances": observability_instances}
