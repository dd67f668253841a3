"""PlanInputs -> the plan (a JSON-serialisable dict; schema in plugins/filter/vllm_memory_plan.yml)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import instances as split
from . import kv_blocks, lora, speculative, warmstart
from .advice import checks, fit_options, headroom_advice, length_message, reasons
from .argv import ServiceInputs, planned_args, planned_environment, service_command
from .budget import Batch, MemoryBudget, bounding_stage, cpu_budget, cuda_budget, resolve_batch
from .context import Sizing
from .errors import SizingError, refuse_unknown_keywords
from .inputs import (
    Device,
    GpuRequest,
    ModelRequest,
    PlanInputs,
    knob_bool,
    knob_count,
    knob_fraction,
    knob_kv_cache_blocks,
    knob_kv_cache_dtype,
    knob_optional_count,
    knob_partition,
    knob_rate,
    knob_variant,
    knob_version,
    resolve_device,
    resolve_gpu,
    resolve_model,
)
from .kv_dtype import choose_kv_dtype, kv_dtype_arg
from .kv_layout import KVLayout, LayoutInputs, build_layout, pp_stages
from .model import ModelShape, model_shape, require_max_len
from .parallel import Parallel, resolve_parallel
from .startup import startup_budget
from .units import GiB, is_auto, to_int
from .versions import rule, version_tuple


def _nice_length(safe: int, block: int) -> int:
    """A round context length <= safe: a multiple of 1024 (or of the block size for short contexts)."""
    if safe >= 4096:
        return safe // 1024 * 1024
    if safe >= block > 0:
        return safe // block * block
    return safe


def _version_notes(inputs: PlanInputs) -> list[str]:
    version = inputs.vllm_version
    known = inputs.releases.get("known_versions") or []
    if known and version not in known and version_tuple(version) > max(version_tuple(v) for v in known):
        return [f"vLLM {version} is newer than the releases data ({known[-1]}); its rules were assumed"]
    return []


def _chosen_length(inputs: PlanInputs, requested: int | None, safe: int, model_max: int, block: int,
                   cuda: bool) -> tuple[int, list[str]]:
    """The requested length, or (auto) the model's maximum when it fits, else the largest round safe one."""
    if requested is not None:
        return requested, []
    chosen = model_max if safe >= model_max else _nice_length(safe, block)
    if rule(inputs.releases, "max_model_len_auto", inputs.vllm_version) and cuda:
        return chosen, [f"max_model_len {chosen:,} is chosen here, before any download; vLLM {inputs.vllm_version} "
                        "could fit it itself with --max-model-len auto, but only after loading the weights"]
    return chosen, []


def _pinned(inputs: PlanInputs, shape: ModelShape, layout: KVLayout, device: Device, par: Parallel, batch: Batch,
            memory: MemoryBudget, stage_available: tuple[int, ...], blocks: int) -> tuple[tuple[int, ...], int, str]:
    """The stages' KV bytes pinned to `blocks` (vllm_node_kv_cache_blocks), the blocks the budget holds at most (on
    cuda at the utilization given, or (auto) at the highest the plan would choose; on cpu VLLM_CPU_KVCACHE_SPACE)
    and the plan's note on it."""
    if device.kind == "cuda":
        ceiling = memory if not memory.util_auto else \
            cuda_budget(inputs, shape, layout, device, par, batch, [1 << 62] * par.pp)
        text = (f"--gpu-memory-utilization {ceiling.util:g}" + (" (the highest auto chooses)" if memory.util_auto
                                                                 else ""))
        most = tuple(b.kv for b in ceiling.stages)
    else:
        text, most = f"VLLM_CPU_KVCACHE_SPACE={device.total // GiB} GiB", stage_available
    where = "per GPU" if device.kind == "cuda" else "per rank"
    fit = kv_blocks.budget_blocks(layout, most)
    return (kv_blocks.pin(layout, stage_available, most, blocks, text, where), fit,
            kv_blocks.pinned_note(layout, blocks, fit, where))


def size(inputs: PlanInputs) -> Sizing:
    """Resolve the device, parallelism, KV dtype, layout, memory budget and context length."""
    rel, version = inputs.releases, inputs.vllm_version
    shape = model_shape(inputs.config)
    model_max = require_max_len(shape)
    notes = _version_notes(inputs)
    device = resolve_device(inputs)
    par = resolve_parallel(shape, device.count, inputs.tensor_parallel_size, inputs.pipeline_parallel_size,
                           inputs.decode_context_parallel_size, inputs.node_count)
    kv = choose_kv_dtype(inputs, shape, device)
    batch = resolve_batch(inputs, device, par.tp * par.pp)
    layout_inputs = LayoutInputs(
        releases=rel, tensor_parallel_size=par.tp, pipeline_parallel_size=par.pp,
        decode_context_parallel_size=par.dcp, kv_cache_dtype=kv.dtype, block_size=inputs.block_size,
        quant=inputs.quant, compute_capability=device.compute_capability, vllm_version=version,
        max_num_batched_tokens=batch.max_num_batched_tokens, mamba_cache_mode=inputs.mamba_cache_mode,
        pp_layer_partition=inputs.pp_layer_partition, device=device.kind,
        speculative_config=inputs.speculative_config, cpu_amx=bool(inputs.cpu_amx))
    layout = build_layout(inputs.config, shape, layout_inputs)
    notes.extend(layout.notes)
    formula = str(rule(rel, "kv_cache_tokens_formula", version))
    requested = None if is_auto(inputs.max_model_len) else to_int("max_model_len", inputs.max_model_len)
    target_len = min(requested or model_max, model_max) if requested else model_max
    per_block = layout.worst_block_bytes()
    blocks = knob_kv_cache_blocks(inputs.kv_cache_blocks)
    if device.kind == "cuda":
        needs = [layout.needed_bytes(target_len, st) + layout.bytes_per_block(st) if st in layout.active_stages()
                 else 0 for st in range(par.pp)]
        if par.pp == 1:   # one stage: the null block of the most loaded stage, as always
            needs = [layout.needed_bytes(target_len) + per_block]
        if blocks is not None:   # pinned: the budget must hold the pinned blocks, whatever the length
            needs = [blocks * layout.bytes_per_block(st) for st in range(par.pp)]
        memory = cuda_budget(inputs, shape, layout, device, par, batch, needs)
        assert memory.budget is not None
        weights, available = memory.budget.weights, memory.budget.kv
        stage_weights = tuple(b.weights for b in memory.stages)
        stage_available = tuple(b.kv for b in memory.stages)
        bound = memory.bound
    else:
        memory, cpu_weights = cpu_budget(inputs, shape, device, par)
        available = device.total
        stage_weights = tuple(cpu_weights) if len(cpu_weights) == par.pp else tuple(cpu_weights * par.pp)
        stage_available = (available,) * par.pp
        bound = bounding_stage(layout, stage_available)
        weights = stage_weights[bound]
    notes.extend(memory.notes)
    fit = 0
    if blocks is not None:
        stage_available, fit, note = _pinned(inputs, shape, layout, device, par, batch, memory, stage_available,
                                             blocks)
        available = stage_available[bound]
        notes.append(note)
    safe = layout.estimate_max_model_len(stage_available, model_max) if available > 0 else 0
    chosen, length_notes = _chosen_length(inputs, requested, safe, model_max, layout.block_size, device.kind == "cuda")
    # The start-up budget follows the heaviest stage: every rank loads at once, the slowest decides.
    startup = startup_budget(max(stage_weights), device.kind, inputs.load_mib_per_second)
    return Sizing(inputs, shape, model_max, device, par, kv, batch, layout_inputs, layout, memory, weights,
                  available, per_block, formula, requested, chosen, safe, tuple(notes + length_notes),
                  stage_weights, stage_available, bound, tuple(startup.items()), kv_cache_blocks=blocks,
                  budget_blocks=fit)


def plan(inputs: PlanInputs) -> dict[str, Any]:
    """The whole sizing plan: what was chosen, whether it fits, why, and the flags that run it."""
    s = size(inputs)
    len_message = length_message(s)
    advice = list(s.kv.advice)
    if s.chosen_len > s.model_max:
        advice.append(f"Lower --max-model-len to at most {s.model_max:,} (the model's own maximum).")
    elif not s.len_ok:
        options = fit_options(s)
        advice.extend(options.advice)
        if options.short:
            len_message += ". Use " + ", or ".join(options.short)
    advice.extend(headroom_advice(s))
    plan_checks = checks(s, len_message)
    fits = all(c["fits"] for c in plan_checks)
    if not fits and not advice:
        advice.append("Use more or larger GPUs, or a smaller model.")
    kv_arg, kv_note = kv_dtype_arg(s.kv, s.shape, inputs, s.device)
    notes = list(s.notes) + ([kv_note] if kv_note else [])
    return _document(s, fits, plan_checks, reasons(s, len_message), advice, notes,
                     planned_args(s, kv_arg), planned_environment(s))


def _cluster(s: Sizing) -> dict[str, Any]:
    """plan.cluster: one replica over node_count x gpus_per_node GPUs, each pipeline stage with its own layers,
    weights and KV (kv_tokens: what that stage's memory alone would hold; the plan's kv.tokens is the minimum,
    vLLM's figure). Present for one node too (one stage unless PP is set)."""
    layers = pp_stages(s.shape.num_layers, s.par.pp, s.inputs.pp_layer_partition)
    stages = []
    for rank, stage_layers in enumerate(layers):
        available = max(s.stage_available[rank], 0) if s.stage_available else max(s.available, 0)
        tokens = s.layout.tokens(s.per_stage, s.chosen_len, s.formula, stage=rank) \
            if s.sized and rank in s.layout.active_stages() and available > 0 else 0
        weights = s.stage_weights[rank] if s.stage_weights else s.weights
        stages.append({"rank": rank, "node": rank // s.par.stages_per_node,
                       "layers": [stage_layers[0], stage_layers[-1] + 1],
                       "weights_gib": round(weights / GiB, 2), "kv_cache_gib": round(available / GiB, 2),
                       "kv_tokens": int(tokens), "weights_bytes": int(weights), "kv_cache_bytes": int(available)})
    return {"node_count": s.par.nodes, "gpus_per_node": s.device.count, "tensor_parallel_size": s.par.tp,
            "pipeline_parallel_size": s.par.pp, "stages_per_node": s.par.stages_per_node,
            "kv_bound_stage": s.bound, "stages": stages}


def _document(s: Sizing, fits: bool, plan_checks: list[dict[str, Any]], plan_reasons: list[str],
              advice: list[str], notes: list[str], args: list[str], environment: dict[str, str]) -> dict[str, Any]:
    """The plan as JSON-serialisable data (the house-rules plan contract)."""
    inputs, budget, layout = s.inputs, s.memory.budget, s.layout
    per_gpu = {
        "total_bytes": int(s.device.total),
        "requested_bytes": int(budget.requested if budget else s.device.total),
        "weights_bytes": int(s.weights),
        "activation_peak_bytes": int(budget.activation if budget else 0),
        "cudagraph_bytes": int(budget.cudagraph if budget else 0),
        "non_torch_bytes": int(budget.non_torch if budget else 0),
        "kv_cache_bytes": int(max(s.available, 0)),
        "headroom_bytes": int(budget.headroom if budget else 0),
    }
    spec = speculative.resolve(inputs.config, inputs.speculative_config)
    kv = {"bytes_per_token": layout.bytes_per_token, "block_size": layout.block_size,
          "needed_bytes": int(s.needed), "available_bytes": int(max(s.available, 0)), "tokens": int(s.tokens),
          "max_concurrency": round(s.concurrency, 4),
          "num_blocks": int(layout.num_blocks(s.per_stage)) if s.available > 0 else 0,
          "bytes_per_block": int(s.per_block), "backend": layout.backend.name, "groups": len(layout.groups),
          "max_num_batched_tokens": s.batch.max_num_batched_tokens}
    if s.kv_cache_blocks is not None:   # only when pinned: plans without the knob keep their exact shape
        kv.update(num_blocks_override=s.kv_cache_blocks, budget_num_blocks=s.budget_blocks)
    document = {
        "fits": bool(fits),
        "model": inputs.model_key, "repo": inputs.repo,
        "served_model_name": inputs.served_model_name or inputs.repo or inputs.model_key,
        "gpu": inputs.gpu_key or ("cpu" if not s.cuda else ""), "gpu_count": s.device.count,
        "device": s.device.kind, "vllm_version": inputs.vllm_version, "vllm_variant": s.device.variant,
        "attention": s.shape.attention,
        "checkpoint_kv_cache_dtype": s.kv.checkpoint,
        "checkpoint_kv_cache_dtype_supported": bool(s.kv.checkpoint_supported),
        "tensor_parallel_size": s.par.tp, "pipeline_parallel_size": s.par.pp,
        "decode_context_parallel_size": s.par.dcp, "kv_cache_dtype": s.kv.dtype,
        "gpu_memory_utilization": float(s.memory.util), "max_model_len": int(s.chosen_len),
        "model_max_model_len": int(s.model_max), "safe_max_model_len": int(min(s.safe, s.model_max)),
        "vllm_args": args, "environment": environment, "per_gpu": per_gpu, "kv": kv,
        "checks": plan_checks, "reasons": plan_reasons, "advice": advice, "notes": notes,
        "cluster": _cluster(s), "startup": dict(s.startup),
    }
    adapters = lora.resolve(inputs.enable_lora, inputs.max_loras, inputs.max_lora_rank)
    if adapters is not None:   # only when asked, like speculative_config
        document["lora"] = {"max_loras": adapters.max_loras, "max_lora_rank": adapters.max_lora_rank}
    if spec is not None:   # only when asked: plans without speculative decoding keep their exact shape
        document["speculative_config"] = {"method": spec.method, "num_speculative_tokens": spec.tokens,
                                          "draft_layers": spec.draft_layers, "draft_bytes": spec.draft_bytes,
                                          "flag": spec.flag_json()}
    return document


# What node_plan takes: the knobs as the inventory gives them (preflight's variables), the catalogs, the GPU the
# preflight matched on the node, and what the service adds. See plugins/modules/vllm_plan.py.
_NODE_PLAN_ARGS = (
    "model", "models", "model_config", "quant_config", "checkpoint_bytes", "served_model_name", "speculative_config",
    "releases", "gpu", "gpus", "detected_gpus", "gpu_source", "cpu_kv_cache_space_gib", "gpu_count", "host",
    "vllm_version", "vllm_variant",
    "tensor_parallel_size", "pipeline_parallel_size", "node_count", "pp_layer_partition", "load_mib_per_second",
    "decode_context_parallel_size", "kv_cache_dtype", "gpu_memory_utilization", "max_model_len", "kv_cache_blocks",
    "enforce_eager",
    "enable_lora", "max_loras", "max_lora_rank", "lora_adapters", "cpu_amx", "model_root", "model_dir",
    "listen_address", "port",
    "extra_args", "extra_environment", "start_timeout", "shutdown_timeout", "instances", "topology",
    # warm starts (sizing/warmstart.py): the loader knobs, its catalog, the lock catalog, the node's driver
    "load_format", "load_disk", "loaders", "locks", "driver",
)
# A refusal of the maths names a plan input; the knob that sets it, so the message ends with what to change.
_FIXES = {
    "tensor_parallel_size": "Set vllm_node_tensor_parallel_size to one of the valid sizes, or auto",
    "decode_context_parallel_size": "Set vllm_node_decode_context_parallel_size to a valid size, or auto",
    "pipeline_parallel_size": "Set vllm_node_pipeline_parallel_size (and vllm_node_node_count) to match the GPUs",
    "kv_cache_dtype": "Set vllm_node_kv_cache_dtype to auto or a dtype this GPU and release run",
    "speculative_config": "Fix vllm_node_speculative_config, or set it to {} (off)",
    "max_lora_rank": "Set vllm_node_max_lora_rank to one of those ranks",
    "max_loras": "Set vllm_node_max_loras to a positive integer",
    "node_count": "Set vllm_node_node_count to the nodes one replica spans",
}


def _with_fix(message: str) -> str:
    """The maths' message, plus the knob to change when it names a plan input and does not already say so."""
    for name, fix in _FIXES.items():
        if message.startswith(name):
            return message if f"vllm_node_{name}" in message else f"{message.rstrip('.')}. {fix}."
    return message


def _knobs(args: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs that need neither the model nor the GPU, coerced and checked once (the first refusal wins)."""
    return {
        "vllm_version": knob_version(args.get("vllm_version"), args["releases"]),
        "vllm_variant": knob_variant(args.get("vllm_variant")),
        "kv_cache_dtype": knob_kv_cache_dtype(args.get("kv_cache_dtype")),
        "tensor_parallel_size": knob_count("tensor_parallel_size", args.get("tensor_parallel_size", "auto")),
        "pipeline_parallel_size": knob_count("pipeline_parallel_size", args.get("pipeline_parallel_size", 1),
                                             auto=1, example="2"),
        "node_count": knob_count("node_count", args.get("node_count", 1), auto=None, example="2"),
        "pp_layer_partition": knob_partition(args.get("pp_layer_partition")),
        "load_mib_per_second": knob_rate(args.get("load_mib_per_second", "auto")),
        "decode_context_parallel_size": knob_count("decode_context_parallel_size",
                                                   args.get("decode_context_parallel_size", "auto"), example="2"),
        "gpu_memory_utilization": knob_fraction(args.get("gpu_memory_utilization", "auto")),
        "max_model_len": knob_count("max_model_len", args.get("max_model_len", "auto"), example="131072"),
        "kv_cache_blocks": knob_kv_cache_blocks(args.get("kv_cache_blocks")),
        "enforce_eager": knob_bool("preflight_enforce_eager", args.get("enforce_eager", False)),
        "enable_lora": knob_bool("enable_lora", args.get("enable_lora", False)),
        "max_loras": knob_optional_count("max_loras", args.get("max_loras"), "2"),
        "max_lora_rank": knob_optional_count("max_lora_rank", args.get("max_lora_rank"), "32"),
        "cpu_amx": knob_bool("cpu_amx", args.get("cpu_amx", False)),
    }


def _sizing_kwargs(args: Mapping[str, Any], knobs: dict[str, Any], model: ModelRequest,
                   gpu: GpuRequest) -> dict[str, Any]:
    """vllm_memory_plan's keyword arguments from the coerced knobs, the model and the GPU."""
    return dict(
        knobs, releases=args["releases"], checkpoint_bytes=model.checkpoint_bytes, gpu=gpu.entry,
        gpu_count=gpu.count, device=str(gpu.entry.get("kind") or "cuda"), quant=model.quant,
        speculative_config=model.speculative_config, model_key=model.key, repo=model.entry["repo"],
        served_model_name=model.served_model_name, gpu_key=gpu.key)


def _service_inputs(args: Mapping[str, Any], repo: str, serving: Any) -> ServiceInputs:
    """What the node adds to the plan to run it; --model is model_dir, else <model_root>/<repo>."""
    extra_args = args.get("extra_args") or []
    if not isinstance(extra_args, (list, tuple)):
        raise SizingError(f"vllm_node_extra_args must be a list of vLLM arguments; got {extra_args!r}. Write it as "
                          "a YAML list, e.g. [--enable-prefix-caching].")
    extra_environment = args.get("extra_environment") or {}
    if not isinstance(extra_environment, Mapping):
        raise SizingError(f"vllm_node_extra_environment must be a mapping of variables; got {extra_environment!r}.")
    model_dir = str(args.get("model_dir") or "") or f"{args.get('model_root') or '/srv/vllm/models'}/{repo}"
    return ServiceInputs.from_kwargs(
        model_dir=model_dir, listen_address=str(args.get("listen_address") or "127.0.0.1"),
        port=knob_count("port", args.get("port", 8000), auto=None, example="8000"), serving=serving or {},
        extra_args=list(extra_args), extra_environment=dict(extra_environment),
        start_timeout=knob_optional_count("preflight_start_timeout", args.get("start_timeout"), "3600"),
        shutdown_timeout=knob_count("preflight_shutdown_timeout", args.get("shutdown_timeout", 0), auto=None,
                                    minimum=0, example="30"))


def _adapters(args: Mapping[str, Any], knobs: dict[str, Any], model: ModelRequest) -> lora.AdapterPlan | None:
    """The inventory's LoRA adapters checked against the model and the slots (None: none listed). Their files
    live on the node under <model_root>/lora/<repository>/revisions/<revision>."""
    repo = str(model.entry.get("repo") or "")
    served = str(model.served_model_name or repo or model.key)
    try:
        return lora.plan_adapters(
            args.get("lora_adapters"), lora.resolve(knobs["enable_lora"], knobs["max_loras"], knobs["max_lora_rank"]),
            base=model.key, base_names=tuple(n for n in (model.key, repo, served) if n), config=model.config,
            served_model_name=served, adapter_root=f"{args.get('model_root') or '/srv/vllm/models'}/lora")
    except SizingError as exc:
        raise SizingError(f"Cannot serve the LoRA adapters of vllm_node_lora_adapters on {model.key}: {exc}") from exc


def node_plan(args: Mapping[str, Any]) -> dict[str, Any]:
    """vllm_node_plan: the plan with its service block, from the knobs as the inventory gives them.

    Every knob is coerced and checked here, once; a bad one is a SizingError naming it and the fix. A plan the
    maths cannot make (a tensor-parallel size that does not split the heads, ...) is a SizingError that starts
    with "Cannot plan <model> on <count> x <gpu> (vLLM <version>):". A plan that does not fit is returned with
    fits false: the preflight writes it and then refuses it.

    With instances (vllm_node_instances, several models on one node) the plan is the split's (instances.py), each
    instance planned by this function on its own GPUs; without them it is the single-model plan, unchanged.
    """
    refuse_unknown_keywords(args, _NODE_PLAN_ARGS)
    if args.get("instances"):
        return split.instances_plan(args, node_plan)
    if not isinstance(args.get("releases"), Mapping) or not args["releases"]:
        raise SizingError("releases is required: pass releases=vllm_node_vllm_releases")
    knobs = _knobs(args)
    host = str(args.get("host") or "the node")
    model = resolve_model(str(args.get("model") or ""), args.get("models") or {},
                          model_config=args.get("model_config"), quant_config=args.get("quant_config"),
                          checkpoint_bytes=args.get("checkpoint_bytes"),
                          served_model_name=args.get("served_model_name"),
                          speculative_config=args.get("speculative_config"))
    gpu = resolve_gpu(args.get("gpu", "auto"), args.get("gpus") or {}, args.get("detected_gpus"),
                      variant=knobs["vllm_variant"], gpu_count=args.get("gpu_count", "auto"),
                      cpu_kv_cache_space_gib=args.get("cpu_kv_cache_space_gib"), host=host,
                      source=str(args.get("gpu_source") or ""))
    adapters = _adapters(args, knobs, model)
    if adapters is not None:   # more adapters than slots: the raised count is what the plan sizes
        knobs["max_loras"] = adapters.settings.max_loras
    kwargs = _sizing_kwargs(args, knobs, model, gpu)
    warm = warmstart.resolve(args, vllm_version=knobs["vllm_version"], vllm_variant=knobs["vllm_variant"],
                             gpus_per_node=gpu.count, load_mib_per_second=knobs["load_mib_per_second"])
    if warm is not None:
        kwargs["load_mib_per_second"] = warm["rate"]
        args = {**args, "extra_args": warmstart.load_format_args(warm["load_format"], args.get("extra_args") or [])}
    service_inputs = _service_inputs(args, model.entry["repo"], model.entry.get("serving"))
    try:
        sized = plan(PlanInputs.from_kwargs(model.config, **kwargs))
        sized.update(config_source=model.config_source, revision=model.entry.get("revision") or "main",
                     checkpoint_bytes=model.checkpoint_bytes)
        if adapters is not None:
            sized["lora"]["adapters"] = [dict(a) for a in adapters.adapters]
            sized["notes"] = list(sized["notes"]) + list(adapters.notes)
        sized["service"] = service_command(sized, service_inputs)
        if warm is not None:
            sized.update(warmstart.blocks(sized, warm, gpu_key=gpu.key, gpu_entry=gpu.entry,
                                          driver=str(args.get("driver") or "")))
    except SizingError as exc:
        raise SizingError(f"Cannot plan {model.key} on {gpu.count} x {gpu.key} (vLLM {kwargs['vllm_version']}): "
                          f"{_with_fix(str(exc))}") from exc
    return sized
