"""vLLM memory sizing (pure Python: no Ansible import, no file I/O), following vLLM 0.33 rules.

Everything a plan needs BEFORE the model is downloaded: from config.json, the checkpoint size, the GPUs and
the vLLM version. Version-dependent knowledge comes only from the releases data the caller passes
(``releases=vllm_node_vllm_releases``, roles/vllm_node/vars/main/vllm_releases.yml). The modules, in the
order a plan uses them:

    errors, units, versions        SizingError; GiB, cdiv, format_bytes; version_tuple and rule()
    model                          config.json -> ModelShape (layer kinds, heads, MLA, hybrid state)
    backends, kv_dtype             attention backend per GPU / version; what `auto` KV dtype means
    parallel                       valid TP / DCP, the `auto` TP policy
    kv_layout, kv                  the KV cache layout and the four KV questions
    kv_blocks                      the KV cache pinned to a number of blocks (--num-gpu-blocks-override)
    inputs, budget                 PlanInputs, the device, the knobs as the inventory gives them (coerced and
                                   checked once); weights / activation / CUDA graphs / utilization
    context, advice, plan          the resolved Sizing; prose and fixes; plan(); node_plan() (the knobs -> the
                                   plan with its service block, the vllm_plan action's one call)
    argv                           the ONLY place that renders vLLM flags and environment
    placement, instances           several models on one node: GPU groups from the topology; the split's plan
                                   (each instance node_plan'd on its own GPUs), its checks and one refusal

The filters (plugins/filter/sizing.py) are thin wrappers; their documentation (plugins/filter/<name>.yml)
describes every argument and the plan schema.
"""

from __future__ import annotations

from typing import Any

from .argv import ServiceInputs, service_command
from .backends import Backend, attention_backend, checkpoint_kv_cache_dtype, fp8_support_since, resolve_kv_cache_dtype
from .errors import SizingError
from .inputs import PlanInputs
from .kv import kv_cache_bytes, kv_cache_tokens, kv_layout, max_concurrency, max_model_len
from .kv_layout import KVLayout, LayerSpec, pp_stages
from .model import ModelShape, model_shape, text_config
from .plan import node_plan, plan
from .units import GiB, MiB, cdiv, format_bytes
from .versions import rule, version_tuple

__all__ = [
    "Backend", "GiB", "KVLayout", "LayerSpec", "MiB", "ModelShape", "PlanInputs", "SizingError",
    "attention_backend", "cdiv", "checkpoint_kv_cache_dtype", "format_bytes", "fp8_support_since",
    "kv_cache_bytes", "kv_cache_tokens", "kv_layout", "max_concurrency", "max_model_len", "memory_plan",
    "model_shape", "node_plan", "plan", "pp_stages", "resolve_kv_cache_dtype", "rule", "service", "text_config",
    "version_tuple",
]


def memory_plan(config: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """vllm_memory_plan: the plan for config.json and the filter's keyword arguments (releases required)."""
    return plan(PlanInputs.from_kwargs(config, **kwargs))


def service(plan_result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """vllm_service_command: the service's argv, environment, start timeout and fingerprint from a plan and
    ServiceInputs (model_dir, listen_address, port, serving, extra_args, extra_environment, start_timeout)."""
    return service_command(plan_result, ServiceInputs.from_kwargs(**kwargs))
