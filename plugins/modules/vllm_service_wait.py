#!/usr/bin/python
"""Documentation of the action plugin plugins/action/vllm_service_wait.py (the code runs on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_service_wait
short_description: Wait for a starting vLLM unit with progress lines (read-only)
description:
  - Runs M(vllm_node.vllm_node.vllm_service_probe) on the node step after step, each step watching O(interval)
    seconds, and prints one progress line per step on the controller (status, seconds since the start, unit
    state, the newest loading line of the journal).
  - Stops when the unit is healthy, when it failed (auto-restart, a higher C(NRestarts), the unit failed), or when
    O(timeout) seconds have passed since the start; the number of steps is bounded by
    O(timeout) / O(interval) + 3 whatever the node answers.
  - Returns the last probe's result (every key M(vllm_node.vllm_node.vllm_service_probe) returns) plus RV(steps);
    it does not fail on a failed start, so the caller can roll back.
  - Changes nothing.
options:
  timeout:
    description: Seconds from O(since) after which the watch gives up (the status is then still V(loading)).
    type: int
    required: true
  interval:
    description: Seconds each step watches before a progress line is printed.
    type: int
    default: 15
  since:
    description:
      - Unix time (node clock) the start began, e.g. RV(vllm_node.vllm_node.vllm_service_probe#module:now) of a
        probe taken just before the restart, minus one.
      - Default the unit's C(InactiveExitTimestamp).
    type: int
  not_invocation:
    description: C(InvocationID) of the process a restart replaces; it never counts as healthy.
    type: str
attributes:
  action:
    support: full
    description: Runs on the controller and calls the probe module on the node.
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
  - vllm_node.vllm_node.read_only.service_watch
seealso:
  - module: vllm_node.vllm_node.vllm_service_probe
author: vllm-node
"""

EXAMPLES = r"""
- name: Note the running invocation and the node time before the restart
  vllm_node.vllm_node.vllm_service_probe:
    unit: vllm
    url: http://127.0.0.1:8000/health
    wait: 0
  register: before

- name: Restart
  ansible.builtin.systemd_service:
    name: vllm
    state: restarted
    no_block: true

- name: Wait until vLLM is healthy (one progress line every 15 s)
  vllm_node.vllm_node.vllm_service_wait:
    unit: vllm
    url: http://127.0.0.1:8000/health
    timeout: 1800
    interval: 15
    since: "{{ before.now - 1 }}"
    not_invocation: "{{ before.invocation_id }}"
  register: probe

- name: Stop when it did not come up
  ansible.builtin.fail:
    msg: "{{ probe.cause | join(' | ') }} {{ probe.fix }}"
  when: probe.status != 'healthy'
"""

RETURN = r"""
steps:
  description: Probe calls made.
  returned: always
  type: int
  sample: 12
status:
  description: V(healthy), V(failed), or V(loading) when the time ran out.
  returned: success
  type: str
  sample: healthy
elapsed:
  description: Seconds from the start to the last probe.
  returned: success
  type: int
cause:
  description: Root-cause lines of a failed start (see M(vllm_node.vllm_node.vllm_service_probe)).
  returned: success
  type: list
  elements: str
fix:
  description: The concrete fix of a KV-cache start-up failure, else empty.
  returned: success
  type: str
"""
