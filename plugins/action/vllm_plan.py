"""Action plugin: vllm_node_plan, the plan with its service block, in one call (documented in
plugins/modules/vllm_plan.py).

Runs on the controller only (no connection to the node, nothing changes, the same in check mode). The knobs arrive as
the inventory gives them; plugins/module_utils/sizing (node_plan) coerces and checks them once. A refusal is one
message (what, why, the fix) as the task's msg: no filter-error chain around it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.lora_adapters import adapter_metadata
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.units import plain


class ActionModule(ActionBase):
    """Compute vllm_node_plan from the knobs, the catalogs and the GPU the preflight matched."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return {plan} (changed false), or failed with the refusal as msg."""
        result = super().run(tmp, task_vars)
        try:
            plan = sizing.node_plan(with_adapter_files(plain(self._task.args)))
        except sizing.SizingError as exc:
            return dict(result, failed=True, changed=False, msg=str(exc))
        return dict(result, changed=False, plan=plan)


def with_adapter_files(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments with each LoRA adapter that names a path (a directory on the controller) given its
    adapter_config.json and tensor shapes (the weights' header only), which the plan checks against the base."""
    entries = args.get("lora_adapters")
    if not isinstance(entries, list) or not any(isinstance(e, Mapping) and e.get("path") for e in entries):
        return args
    read = []
    for entry in entries:
        if isinstance(entry, Mapping) and entry.get("path"):
            directory = Path(str(entry["path"])).expanduser()
            try:
                metadata = adapter_metadata(directory)
            except (OSError, ValueError, struct.error) as exc:
                raise sizing.SizingError(
                    f"adapter {entry.get('name')}: cannot read its files in {directory} ({exc}): path must be a "
                    "directory on the controller with adapter_config.json and adapter_model.safetensors") from exc
            entry = {**{k: v for k, v in entry.items() if k != "path"}, **metadata}
        read.append(entry)
    return {**args, "lora_adapters": read}
