"""Ansible filters for vLLM memory sizing: thin wrappers around plugins/module_utils/sizing/.

vllm_kv_cache_bytes, vllm_max_model_len, vllm_kv_cache_tokens, vllm_max_concurrency, vllm_memory_plan and
vllm_service_command (the service's command from a plan); each is documented in its sidecar file
plugins/filter/<name>.yml (`ansible-doc -t filter vllm_node.vllm_node.<name>`). Every sizing filter takes
``releases=vllm_node_vllm_releases``: the maths reads no files. Bad input raises AnsibleFilterError carrying the
maths' message (what is wrong and the valid choices).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.units import plain


def _wrap(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    def filter_func(config: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(plain(config), *[plain(a) for a in args], **{k: plain(v) for k, v in kwargs.items()})
        except sizing.SizingError as exc:
            raise AnsibleFilterError(str(exc)) from exc   # Ansible names the filter itself

    filter_func.__name__ = name
    filter_func.__doc__ = func.__doc__
    return filter_func


class FilterModule:
    """vllm_kv_cache_bytes, vllm_max_model_len, vllm_kv_cache_tokens, vllm_max_concurrency, vllm_memory_plan,
    vllm_service_command."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "vllm_kv_cache_bytes": _wrap("vllm_kv_cache_bytes", sizing.kv_cache_bytes),
            "vllm_max_model_len": _wrap("vllm_max_model_len", sizing.max_model_len),
            "vllm_kv_cache_tokens": _wrap("vllm_kv_cache_tokens", sizing.kv_cache_tokens),
            "vllm_max_concurrency": _wrap("vllm_max_concurrency", sizing.max_concurrency),
            "vllm_memory_plan": _wrap("vllm_memory_plan", sizing.memory_plan),
            "vllm_service_command": _wrap("vllm_service_command", sizing.service),
        }
