"""Filter check_report_html: the inference check's report as a static HTML page with the benchmark's latency chart."""

from __future__ import annotations

from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.plan_report import check_report_html as _render

DOCUMENTATION = r"""
name: check_report_html
author: vllm-node
version_added: "1.0.0"
short_description: The inference check's report as a static HTML page with the benchmark's latency chart
description:
  - Renders O(template) (the inference_check role's C(templates/inference-check.html.j2)) with the check report,
    the chart's data and O(chart_js) inlined (the same rendering as P(vllm_node.vllm_node.plan_report_html#filter)),
    so the page works offline.
  - One bar group per latency figure (TTFT, TPOT, ITL at p50 and p99, in ms), one bar per benchmark level
    (concurrency 1 and the planned concurrency).
  - The page embeds the report unchanged (element C(#check-json)) and the chart's data (C(#chart-data)).
  - Fails when the report has no C(benchmark.levels) (benchmark off or skipped).
positional: _input, template, chart_js
options:
  _input:
    description: The inference check's report (artifacts/inference-check-<host>.json).
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
  managed:
    description: The "managed by Ansible" line put in a comment at the top of the page.
    type: str
    default: ""
"""

EXAMPLES = r"""
html: >-
  {{ inference_check_report | vllm_node.vllm_node.check_report_html(
       lookup('ansible.builtin.file', 'inference-check.html.j2'), lookup('ansible.builtin.file', 'chart.umd.min.js')) }}
"""

RETURN = r"""
_value:
  description: The HTML page.
  type: str
"""


@reports_bad_input
def check_report_html(check: dict[str, Any], template: str, chart_js: str, managed: str = "") -> str:
    """The inference check's HTML report with the benchmark's latency chart (plugins/module_utils/plan_report.py)."""
    return _render(check, template, chart_js, managed)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"check_report_html": check_report_html}
