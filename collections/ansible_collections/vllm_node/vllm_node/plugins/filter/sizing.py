"""Ansible filters for vLLM memory sizing: thin wrappers around plugins/module_utils/vllm_memory.py.

Usage (see vllm_memory's docstring for every keyword argument and the plan schema)::

    {{ model.config | vllm_kv_cache_bytes(131072, tensor_parallel_size=8, kv_cache_dtype='bfloat16') }}
    {{ model.config | vllm_max_model_len(available_bytes, tensor_parallel_size=8) }}
    {{ model.config | vllm_kv_cache_tokens(available_bytes, 131072, tensor_parallel_size=8) }}
    {{ model.config | vllm_memory_plan(releases=vllm_node_vllm_releases, gpu=vllm_node_gpus[key],
                                       gpu_count=8, checkpoint_bytes=model.checkpoint_bytes, quant=model.quant,
                                       max_model_len=vllm_node_max_model_len, ...) }}

Bad input raises AnsibleFilterError carrying the maths' message (what is wrong and the valid choices).
"""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import vllm_memory

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain Python use (tests) without Ansible installed
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]


def _plain(value: Any) -> Any:
    """Ansible hands over its own str/dict/list subclasses (and lazy templates): make them plain."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def _wrap(func: Callable[..., Any]) -> Callable[..., Any]:
    def filter_func(config: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(_plain(config), *[_plain(a) for a in args], **{k: _plain(v) for k, v in kwargs.items()})
        except vllm_memory.SizingError as exc:
            raise AnsibleFilterError(str(exc)) from exc   # Ansible names the filter itself

    filter_func.__name__ = func.__name__
    filter_func.__doc__ = func.__doc__
    return filter_func


class FilterModule:
    """vllm_kv_cache_bytes, vllm_max_model_len, vllm_kv_cache_tokens, vllm_memory_plan."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "vllm_kv_cache_bytes": _wrap(vllm_memory.vllm_kv_cache_bytes),
            "vllm_max_model_len": _wrap(vllm_memory.vllm_max_model_len),
            "vllm_kv_cache_tokens": _wrap(vllm_memory.vllm_kv_cache_tokens),
            "vllm_memory_plan": _wrap(vllm_memory.vllm_memory_plan),
        }
