#!/usr/bin/python
"""Documentation of the action plugin plugins/action/vllm_plan.py (the code runs on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_plan
short_description: vLLM's memory plan and the service's command from the knobs, in one call
description:
  - The one place C(vllm_node_plan) is computed (the preflight role calls it and publishes RV(plan) under that
    name). It is the plan of the memory sizing maths (schema in
    C(ansible-doc -t filter vllm_node.vllm_node.vllm_memory_plan)) plus C(config_source), C(revision),
    C(checkpoint_bytes) and C(service), the service's whole command (schema in
    C(ansible-doc -t filter vllm_node.vllm_node.vllm_service_command)).
  - The knobs are taken as the inventory gives them (V(auto), integers, floats, numeric strings, empty or null) and
    are coerced and checked once, in Python; a bad value fails the task with one message that names the knob, says
    why and what to set instead. So does a plan the maths cannot make (the message starts with
    C(Cannot plan <model> on <count> x <gpu> (vLLM <version>):)).
  - A plan that does not fit is returned with C(fits=false), not refused; the caller writes it, then refuses it.
  - Runs on the controller, changes nothing, needs no connection to the node.
options:
  model:
    description: Key of O(models) (vllm_node_model); with O(model_config), any name.
    type: str
    required: true
  models:
    description: The model catalog (vllm_node_models).
    type: dict
    required: true
  model_config:
    description: The parsed config.json read from the node; empty = the catalog entry's config.
    type: dict
  quant_config:
    description: >-
      The parsed hf_quant_config.json beside O(model_config); empty = none (catalog mode uses the entry's quant).
    type: dict
  checkpoint_bytes:
    description: Checkpoint size in bytes; 0 = the catalog entry's.
    type: raw
    default: 0
  served_model_name:
    description: Served model name; empty = the entry's served_model_name, else its repo.
    type: str
  speculative_config:
    description: >-
      An empty mapping = off, V(catalog) = the entry's speculative_config, or a mapping like vLLM's
      --speculative-config.
    type: raw
  releases:
    description: vLLM release knowledge (vllm_node_vllm_releases).
    type: dict
    required: true
  gpu:
    description: >-
      vllm_node_gpu, a key of O(gpus), or V(auto) (the type of the node's GPUs in O(detected_gpus); V(cpu) for the cpu
      build). Checked against the catalog, the build and the GPUs the node reports.
    type: str
    default: auto
  gpus:
    description: The GPU catalog (vllm_node_gpus).
    type: dict
    required: true
  detected_gpus:
    description: >-
      The node's GPUs matched to O(gpus) (the gpu_catalog_match filter over node_facts_gpus); their memory and
      compute capability replace the catalog's, the smallest card decides. Empty = plan for the catalog's numbers.
    type: list
    elements: dict
  gpu_source:
    description: Where the node's GPU facts came from (node_facts_gpu_source), for the messages.
    type: str
  cpu_kv_cache_space_gib:
    description: CPU device only, VLLM_CPU_KVCACHE_SPACE in GiB; null = the GPU catalog's kv_cache_space_gib.
    type: raw
  gpu_count:
    description: V(auto) (every detected GPU of that type; 1 on the cpu device) or a positive integer.
    type: raw
    default: auto
  host:
    description: The node's inventory name, for the messages.
    type: str
  vllm_version:
    description: The vLLM release the plan is for (vllm_node_vllm_version).
    type: str
    required: true
  vllm_variant:
    description: The vLLM build, V(cuda) or V(cpu).
    type: str
    default: cuda
  tensor_parallel_size:
    description: V(auto) or a positive integer.
    type: raw
    default: auto
  pipeline_parallel_size:
    description: V(auto) (1) or a positive integer.
    type: raw
    default: 1
  node_count:
    description: Nodes one replica spans.
    type: raw
    default: 1
  pp_layer_partition:
    description: Layers per pipeline stage, comma-separated; empty = vLLM's split.
    type: raw
  load_mib_per_second:
    description: V(auto) (138) or MiB/s of weights one GPU loads.
    type: raw
    default: auto
  decode_context_parallel_size:
    description: V(auto) or a positive integer dividing the tensor parallel size.
    type: raw
    default: auto
  kv_cache_dtype:
    description: V(auto) or one of vLLM's --kv-cache-dtype names (bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4).
    type: str
    default: auto
  gpu_memory_utilization:
    description: V(auto) or a fraction in (0, 1].
    type: raw
    default: auto
  max_model_len:
    description: V(auto) or a positive integer.
    type: raw
    default: auto
  kv_cache_blocks:
    description: >-
      The KV cache pinned to this many blocks (vLLM's C(--num-gpu-blocks-override)), a positive integer the memory
      budget holds; null = the cache the budget holds.
    type: raw
  enforce_eager:
    description: The service runs with --enforce-eager (no CUDA-graph memory).
    type: raw
    default: false
  enable_lora:
    description: Size LoRA adapter slots and render --enable-lora.
    type: raw
    default: false
  max_loras:
    description: --max-loras; null = vLLM's default.
    type: raw
  max_lora_rank:
    description: --max-lora-rank; null = vLLM's default.
    type: raw
  lora_adapters:
    description:
      - LoRA adapters to serve (vllm_node_lora_adapters), each {name, repository, revision (a 40-hex commit), base,
        path (optional)}. base is the model's catalog key, repository or served name.
      - An adapter with a path (a directory on the controller with adapter_config.json and
        adapter_model.safetensors) is checked against the base before anything changes (LoRA, rank within
        O(max_lora_rank), modules the base has with its shapes); one without is checked by vLLM when it loads.
      - More adapters than O(max_loras) raise the slots to their count, and the plan sizes the raised value.
      - They are served from <model_root>/lora/<repository>/revisions/<revision>, listed in plan.lora.adapters and in
        plan.service.lora_modules, which is outside plan.service.fingerprint (an adapter change restarts nothing).
    type: list
    elements: raw
    default: []
  cpu_amx:
    description: CPU device only, the CPU has AMX tiles.
    type: raw
    default: false
  model_root:
    description: Models live on the node at <root>/<repo>; the service's --model when O(model_dir) is empty.
    type: str
  model_dir:
    description: The service's --model directory; empty = <model_root>/<repo>.
    type: str
  listen_address:
    description: Address the service listens on.
    type: str
    default: 127.0.0.1
  port:
    description: TCP port of the service.
    type: raw
    default: 8000
  extra_args:
    description: Extra vLLM arguments; one the plan or a knob sets is refused, naming the knob.
    type: list
    elements: str
  extra_environment:
    description: Extra environment of the service; a variable the plan sets is refused.
    type: dict
  start_timeout:
    description: Seconds from start to healthy; null = the plan's startup.unit_start_timeout_seconds.
    type: raw
  shutdown_timeout:
    description: vLLM's --shutdown-timeout in seconds (0 leaves the flag out).
    type: raw
    default: 0
  instances:
    description:
      - Several models on one node (vllm_node_instances); empty = one, from the options above. Each is a mapping
        with name, model, gpus (a count or a list of indices) and the per-model options above (served_model_name,
        max_model_len, kv_cache_blocks, kv_cache_dtype, gpu_memory_utilization, speculative_config,
        tensor_parallel_size, port, ...).
      - Each instance is planned as a single-model node on its own GPUs; RV(plan) is then the split (see RETURN).
    type: list
    elements: dict
  topology:
    description: >-
      The node's GPU topology (node_facts_gpu_topology: nvidia-smi topo -m parsed) the instances' GPU groups are
      chosen from; empty = unknown, groups in index order.
    type: dict
  load_format:
    description:
      - vLLM's weight loader (--load-format; auto adds no flag), one of O(loaders)' formats. A loader whose package
        a lock of the release in O(locks) does not pin is refused, naming the fix.
    type: str
    default: auto
  load_disk:
    description: The storage the weights are read from (auto = unknown), one of O(loaders)' disks.
    type: str
    default: auto
  loaders:
    description:
      - The loader catalog (vllm_node_loaders, roles/vllm_node/vars/main/loaders.yml). With it the plan has
        C(loader) (the loader, its predicted load time and the timeouts it sets, a table over every loader and
        disk) and C(compile_cache) (the key of the compile-cache directory); without it neither.
    type: dict
  locks:
    description: The lock catalog (vllm_node_vllm_locks); its pins decide the loaders available and enter the key.
    type: dict
  driver:
    description: The node's NVIDIA driver version (or "branch N" before it reports one); enters the cache key.
    type: str
attributes:
  action:
    support: full
    description: Runs on the controller only.
  check_mode:
    support: full
    description: Computes the same plan in check mode; it changes nothing in either mode.
  diff_mode:
    support: none
    description: Nothing to diff.
seealso:
  - plugin: vllm_node.vllm_node.vllm_memory_plan
    plugin_type: filter
  - plugin: vllm_node.vllm_node.vllm_service_command
    plugin_type: filter
author: vllm-node
"""

EXAMPLES = r"""
- name: Plan 8 x RTX PRO 6000 Blackwell for the catalog's Kimi K2.5, the knobs as the inventory gives them
  vllm_node.vllm_node.vllm_plan:
    model: kimi-k2.5-nvfp4
    models: "{{ vllm_node_models }}"
    releases: "{{ vllm_node_vllm_releases }}"
    gpu: rtx-pro-6000-blackwell
    gpus: "{{ vllm_node_gpus }}"
    gpu_count: 8
    vllm_version: "{{ vllm_node_vllm_version }}"
    max_model_len: "131072"
    kv_cache_dtype: auto
    model_root: /srv/vllm/models
  register: planned
"""

RETURN = r"""
plan:
  description:
    - The plan (vllm_memory_plan's schema) plus config_source (catalog or node), revision, checkpoint_bytes and
      service (vllm_service_command's schema).
    - With O(instances), the split instead (plugins/module_utils/sizing/instances.py) - fits, gpu, gpu_count,
      instances (name, model, served_model_name, port, gpus, cuda_visible_devices, placement, shares_gpus_with,
      start_after, gpu_memory_utilization, fits, min_gpus, need, error and plan, the single-model plan above), gpus
      (per GPU - the instances on it, their memory fraction and bytes), start_order, checks, reasons, advice and
      message (the refusal, empty when it fits) and summary (the line a split that fits prints).
    - With O(loaders), also loader and compile_cache (plugins/module_utils/sizing/warmstart.py).
  returned: success
  type: dict
  sample: {fits: true, max_model_len: 131072, tensor_parallel_size: 8, service: {argv: [--model, /srv/vllm/models/x]}}
"""
