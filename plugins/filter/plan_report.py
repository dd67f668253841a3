"""Filter plan_report_html: the plan as a static HTML page with a per-GPU stacked memory chart."""

from __future__ import annotations

from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.plan_report import plan_report_html as _render

DOCUMENTATION = r"""
name: plan_report_html
short_description: The memory plan as a static HTML page with a per-GPU stacked memory chart
description:
  - Renders O(template) (Jinja2 text, the preflight role's C(templates/plan-report.html.j2)) with the plan, the
    chart's data and O(chart_js) inlined, so the page works offline.
  - Each GPU gets a stacked bar of weights, activation peak, CUDA graphs, KV cache, the KV cache the request needs
    beyond the budget (only for a plan that does not fit), CUDA context and headroom; the budget
    (gpu-memory-utilization x GPU memory) and the GPU's memory are lines across the chart.
  - With O(check) (the inference check's report) vLLM's reported weights and KV cache per rank stand beside the plan.
  - The page embeds the plan JSON unchanged (element C(#plan-json)) and the chart's data (C(#chart-data)).
positional: _input, template, chart_js
options:
  _input:
    description: The plan (vllm_node_plan), as the preflight role writes it to the plan JSON.
    type: dict
    required: true
  template:
    description: The page's Jinja2 template text.
    type: str
    required: true
  chart_js:
    description: The charting library's code (Chart.js UMD build), inlined into the page.
    type: str
    required: true
  check:
    description: The inference check's report (artifacts/inference-check-<host>.json); empty = the plan only.
    type: dict
    default: {}
  managed:
    description: The "managed by Ansible" line put in a comment at the top of the page.
    type: str
    default: ""
author: vllm-node
"""

EXAMPLES = r"""
html: >-
  {{ vllm_node_plan | vllm_node.vllm_node.plan_report_html(lookup('ansible.builtin.file', 'plan-report.html.j2'),
     lookup('ansible.builtin.file', 'chartjs/chart.umd.min.js')) }}
"""

RETURN = r"""
_value:
  description: The HTML page.
  type: str
"""


@reports_bad_input
def plan_report_html(plan: dict[str, Any], template: str, chart_js: str, check: dict[str, Any] | None = None,
                     managed: str = "") -> str:
    """The plan's HTML report (see plugins/module_utils/plan_report.py)."""
    return _render(plan, template, chart_js, check or None, managed)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"plan_report_html": plan_report_html}
