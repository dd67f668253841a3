"""Ansible's default screen output, less the argument-spec dump after a refused role input."""

from __future__ import annotations

DOCUMENTATION = r"""
name: default_no_spec_dump
type: stdout
short_description: Ansible's default output without the argument-spec dump of a refused role input
description:
  - Exactly Ansible's C(default) stdout callback, except for one thing. When a role's automatic argument-spec check
    refuses an input, the default callback prints the role's whole argument specification after the one line that
    matters (about 200 lines for the C(vllm_node) role). This callback drops that dump (C(argument_spec_data)) and
    the validation context, so a refused input reads as one message, like the plan's own refusals.
  - The project's C(ansible.cfg) selects it; set C(stdout_callback = vllm_node.vllm_node.default_no_spec_dump) to
    use it with the installed collection.
version_added: "1.0.0"
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout_callback in the configuration
"""

from typing import Any

from ansible.plugins.callback.default import CallbackModule as DefaultCallback

# What the argument-spec check returns besides its errors: the whole specification and where it came from.
SPEC_DUMP_KEYS = ("argument_spec_data", "validate_args_context")


def drop_spec_dump(result: dict[str, Any]) -> dict[str, Any]:
    """The result without the argument-spec dump (the errors themselves stay)."""
    for key in SPEC_DUMP_KEYS:
        result.pop(key, None)
    return result


class CallbackModule(DefaultCallback):
    """The default callback with the argument-spec check's dump left out."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "vllm_node.vllm_node.default_no_spec_dump"

    def _clean_results(self, result: Any, task_name: Any) -> None:
        """Ansible's own cleaning, then the spec dump of a refused role input goes."""
        super()._clean_results(result, task_name)
        if str(task_name).endswith("validate_argument_spec") and isinstance(result, dict):
            drop_spec_dump(result)
