"""Filter rollout_drained_baseline: the gate's baseline from the benchmark of a drained node before its change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input

DOCUMENTATION = r"""
name: rollout_drained_baseline
short_description: The gate's baseline from the benchmark of a drained node before its change
description:
  - With C(rollout_baseline_source=drained), playbooks/rollout.yml benchmarks each node after its drain and before
    anything changes (the inference check's benchmark task, C(tasks_from=benchmark)), so the gate compares the changed
    node with itself under the same load, not with the figures kept on the node at its last site.yml run.
  - This turns that task's registered result into the record the gate reads (C(levels)), in the shape of the kept
    record, with C(source=drained). A failed, skipped or reused run, or one without figures, gives empty C(levels)
    and says why in C(failure); the rollout then refuses the node (C(rollout_require_baseline)) or gates it against
    the catalog band only.
positional: _input
options:
  _input:
    description: The registered result of the benchmark task (module inference_check_benchmark).
    type: dict
    required: true
  time:
    description: When the benchmark ran (ISO 8601, UTC).
    type: str
    required: true
author: vllm-node
"""

EXAMPLES = r"""
rollout_baseline: "{{ bench | vllm_node.vllm_node.rollout_drained_baseline(now(utc=true).isoformat()) }}"
"""

RETURN = r"""
_value:
  description: C(source) (drained), C(time), C(levels) (level -> figures; {} when there is no usable run), C(settings),
    C(wall_seconds) and C(failure) ("" when the figures are usable).
  type: dict
"""


def failure_of(result: Mapping[str, Any]) -> str:
    """Why the run gives no baseline of this moment ("" when its figures are usable)."""
    if result.get("failed"):
        return f"the benchmark failed: {str(result.get('msg') or 'no message').strip()}"
    if result.get("skipped"):
        return f"the benchmark was skipped ({result.get('skip_reason') or 'a condition was false'})"
    if result.get("skipped_reason"):
        return f"the benchmark did not run ({result['skipped_reason']})"
    if result.get("reused"):
        return f"the benchmark reused the figures of {result['reused']} instead of measuring now"
    if not result.get("levels"):
        return "the benchmark measured no figures"
    return ""


@reports_bad_input
def rollout_drained_baseline(result: Mapping[str, Any], time: str) -> dict[str, Any]:
    """The record the gate compares with: this moment's figures, or none and why."""
    if not isinstance(result, Mapping):
        raise ValueError(f"expected the benchmark task's registered result (a dict), got {type(result).__name__}")
    failure = failure_of(result)
    return {"source": "drained", "time": str(time),
            "levels": {} if failure else dict(result["levels"]),
            "settings": {} if failure else dict(result.get("settings") or {}),
            "wall_seconds": result.get("wall_seconds"), "failure": failure}


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"rollout_drained_baseline": rollout_drained_baseline}
