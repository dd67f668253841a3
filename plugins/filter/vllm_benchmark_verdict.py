"""Filter vllm_benchmark_verdict: the serving benchmark's figures against the catalog band and the previous run."""

from __future__ import annotations

from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.benchmark import band_for, compare
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input

DOCUMENTATION = r"""
name: vllm_benchmark_verdict
short_description: The serving benchmark's figures against the catalog band and the node's previous run
description:
  - Looks up the band for the plan's model x GPU x vLLM version (and GPU count, when the band names one) in
    O(bands) (C(vllm_node_benchmark_bands), roles/vllm_node/vars/main/benchmark_bands.yml).
  - A figure fails when it is worse than the band's edge (below C(min) for output tok/s and per-user tok/s, above
    C(max) for TTFT/TPOT/ITL) or worse than the previous run by more than the tolerance; any failed request fails.
  - Returns C(rows) (level, figure, measured, band, previous, verdict), C(failures) (one sentence each, with the
    numbers), C(passed), C(band) (the band's name, or null when the catalog has none) and C(tolerance).
positional: _input, bands, plan
options:
  _input:
    description: The benchmark's levels (C(single), C(planned)) as returned by the inference_check_benchmark module.
    type: dict
    required: true
  bands:
    description: "The band catalog: model -> GPU -> vLLM version -> C(single)/C(planned) -> figure -> C(min)/C(max)."
    type: dict
    required: true
  plan:
    description: The plan (C(model), C(gpu), C(vllm_version), C(gpu_count)).
    type: dict
    required: true
  previous:
    description: The previous run's levels ({} = none).
    type: dict
    default: {}
  tolerance:
    description: Allowed relative regression against the previous run (a band's C(previous_tolerance) wins).
    type: float
    default: 0.25
author: vllm-node
"""

EXAMPLES = r"""
verdict: >-
  {{ bench.levels | vllm_node.vllm_node.vllm_benchmark_verdict(vllm_node_benchmark_bands, vllm_node_plan,
     previous=bench.previous.levels | default({}), tolerance=0.25) }}
"""

RETURN = r"""
_value:
  description: C(rows), C(failures), C(passed), C(band), C(tolerance).
  type: dict
"""


@reports_bad_input
def vllm_benchmark_verdict(levels: dict[str, Any], bands: dict[str, Any], plan: dict[str, Any],
                           previous: dict[str, Any] | None = None, tolerance: float = 0.25) -> dict[str, Any]:
    """Band lookup for the plan, then compare (plugins/module_utils/benchmark.py)."""
    model, gpu, version = plan["model"], plan["gpu"], str(plan["vllm_version"])
    band = band_for(bands or {}, model, gpu, version, int(plan.get("gpu_count") or 0))
    name = f"{model} x {plan.get('gpu_count')} {gpu} x vLLM {version}" if band else ""
    return compare(levels, band, previous or {}, float(tolerance), name)


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"vllm_benchmark_verdict": vllm_benchmark_verdict}
