"""Documentation fragments shared by the collection's modules (one text, not four copies)."""

from __future__ import annotations


class ModuleDocFragment:
    """C(vllm_node.vllm_node.read_only): the attributes of a module that only reads the node;
    C(vllm_node.vllm_node.read_only.service_watch): the options of the modules that watch the vLLM unit."""

    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

    SERVICE_WATCH = r"""
options:
  unit:
    description: systemd unit name (without C(.service)).
    type: str
    required: true
  url:
    description: Health URL; it must answer HTTP 200 for the unit to count as healthy.
    type: str
    required: true
"""
