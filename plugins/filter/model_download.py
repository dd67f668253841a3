"""Filter of the model_download role used outside it: the sizing plan's inputs from a model's documents.

playbooks/plan.yml applies the same rule on the controller as the role on the node
(plugins/module_utils/model_download/files.py, planner_inputs); documented in model_download_planner_inputs.yml.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf


def planner_inputs(
    config: Mapping[str, Any] | None,
    index: Mapping[str, Any] | None = None,
    quant: Mapping[str, Any] | None = None,
    files: Iterable[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """mdf.planner_inputs, its refusals as filter errors."""
    try:
        return mdf.planner_inputs(config, index, quant, files)
    except mdf.ModelDownloadError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"model_download_planner_inputs": planner_inputs}
