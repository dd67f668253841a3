"""Filter rollout_baselines: each instance's benchmark from before a rollout, from the node's per-instance records."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input

DOCUMENTATION = r"""
name: rollout_baselines
short_description: Each instance's benchmark from before a rollout (its gate's baseline), from the node's records
description:
  - playbooks/rollout.yml reads, for each instance whose service the change restarts, the last passing benchmark its
    inference check kept on the node (C(vllm_node_instance_benchmark_state_file), one file per instance) with
    ansible.builtin.slurp in a loop (a missing record is not an error there, C(failed_when) is false).
  - This turns that loop's results into instance name -> record; an instance whose record is missing or holds no
    figures (empty C(levels)) is left out, so the names not in the answer are the ones without a baseline.
positional: _input
options:
  _input:
    description: The C(results) of the slurp loop, each with C(item) (the instance's name) and, when the file was
      read, C(content) (base64) and C(source) (its path).
    type: list
    elements: dict
    required: true
author: vllm-node
"""

EXAMPLES = r"""
rollout_baselines: "{{ slurped.results | vllm_node.vllm_node.rollout_baselines }}"
"""

RETURN = r"""
_value:
  description: Instance name -> its record (C(time), C(levels), C(settings), C(invocation_id), C(key)).
  type: dict
"""


def parse_record(content: str, source: str) -> dict[str, Any]:
    """One record's JSON from its base64 text. Raises ValueError naming `source` when it is not a JSON object."""
    try:
        record = json.loads(base64.b64decode(content, validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"the benchmark record {source} is not JSON ({err}): delete it and run playbooks/site.yml "
                         "to measure a new one") from None
    if not isinstance(record, dict):
        raise ValueError(f"the benchmark record {source} is not a JSON object")
    return record


@reports_bad_input
def rollout_baselines(results: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Instance name -> its record, for each result that read a record with figures (non-empty `levels`)."""
    baselines: dict[str, dict[str, Any]] = {}
    for result in results:
        name = str(result["item"])
        content = result.get("content")
        if not content:
            continue
        record = parse_record(str(content), str(result.get("source") or name))
        if record.get("levels"):
            baselines[name] = record
    return baselines


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"rollout_baselines": rollout_baselines}
