"""Action plugin: vllm_node_plan, the plan with its service block, in one call (documented in
plugins/modules/vllm_plan.py).

Runs on the controller only (no connection to the node, nothing changes, the same in check mode). The knobs arrive as
the inventory gives them; plugins/module_utils/sizing (node_plan) coerces and checks them once. A refusal is one
message (what, why, the fix) as the task's msg: no filter-error chain around it.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing


def plain(value: Any) -> Any:
    """Ansible's own str/dict/list subclasses (and lazy containers) as plain Python values."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


class ActionModule(ActionBase):
    """Compute vllm_node_plan from the knobs, the catalogs and the GPU the preflight matched."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return {plan} (changed false), or failed with the refusal as msg."""
        result = super().run(tmp, task_vars)
        try:
            plan = sizing.node_plan(plain(self._task.args))
        except sizing.SizingError as exc:
            return dict(result, failed=True, changed=False, msg=str(exc))
        return dict(result, changed=False, plan=plan)
