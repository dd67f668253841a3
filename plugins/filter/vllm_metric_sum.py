"""Filter vllm_metric_sum: the sum of a metric's samples in a Prometheus /metrics scrape (all its label sets)."""

from __future__ import annotations

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.vllm_metrics import sample_sum

DOCUMENTATION = r"""
name: vllm_metric_sum
short_description: The sum of a metric's samples in a /metrics scrape, over all its label sets
description:
  - vLLM exposes its request gauges per model and engine, e.g. C(vllm:num_requests_running{engine="0",...});
    the rollout waits until their sum on the node is 0 before it stops vLLM.
  - Returns null when the scrape has no sample of the metric (a vLLM that does not expose it, or not vLLM).
positional: _input, name
options:
  _input:
    description: The text of a C(/metrics) answer (Prometheus exposition format).
    type: str
    required: true
  name:
    description: The metric's name, without labels.
    type: str
    required: true
author: vllm-node
"""

EXAMPLES = r"""
in_flight: >-
  {{ scrape.content | vllm_node.vllm_node.vllm_metric_sum('vllm:num_requests_running') }}
"""

RETURN = r"""
_value:
  description: The sum of the samples (a float), or null when there is none.
  type: float
"""


@reports_bad_input
def vllm_metric_sum(text: str, name: str) -> float | None:
    """plugins/module_utils/vllm_metrics.py's sample_sum."""
    return sample_sum(str(text or ""), str(name))


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"vllm_metric_sum": vllm_metric_sum}
