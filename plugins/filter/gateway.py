"""Ansible filters over plugins/module_utils/gateway_routing.py: the gateway's pools and model routing, and the
/v1/models list it answers with several models. Documented per filter in plugins/filter/<name>.yml
(ansible-doc -t filter vllm_node.vllm_node.<name>).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gateway_routing as routing
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input


@reports_bad_input
def gateway_routing(backends: list[dict[str, Any]], max_body_bytes: int) -> dict[str, Any]:
    """gateway_routing.routing: the pools, the models, the map and the error bodies."""
    return routing.routing(list(backends or []), int(max_body_bytes))


@reports_bad_input
def gateway_models_list(models: list[str], previous: str = "", now: int = 0) -> str:
    """gateway_routing.models_list: vLLM's /v1/models answer, each model's `created` kept from `previous`."""
    return routing.models_list([str(m) for m in models or []], str(previous or ""), int(now))


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        """The filters of this file."""
        return {"gateway_routing": gateway_routing, "gateway_models_list": gateway_models_list}
