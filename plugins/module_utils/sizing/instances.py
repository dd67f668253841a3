"""Several models on one node: the GPU split and one plan per instance (vllm_node_instances).

Each instance is planned exactly as a single-model node on its own GPUs (the single planner, node_plan, is passed
in: no sizing is repeated here); this module adds only what a split needs: the instances' knobs checked, disjoint
GPU groups chosen from the topology (placement.py), GPUs shared on purpose checked for their memory (the sum of the
fractions and of the bytes each process takes), the start order of instances that share GPUs, and one refusal that
names each instance's need and what fits, before anything is downloaded.

The document (vllm_node_plan when vllm_node_instances is set; without it the plan keeps its single-model shape):

    {"fits", "gpu", "gpu_count", "device", "vllm_version", "topology",
     "unseen_bytes",                            # per GPU, what no process's torch sees (counted once per GPU)
     "instances": [{"name", "model", "served_model_name", "gpus", "cuda_visible_devices", "placement",
                    "shares_gpus_with", "start_after", "gpu_memory_utilization", "fits", "min_gpus", "need",
                    "error", "plan"}],          # plan: the single-model plan with its service block (None: refused)
     "gpus": [{"index", "numa", "instances", "memory_fraction", "used_bytes", "total_bytes", "fits"}],
     "start_order": [[names that start together], ...], "checks", "reasons", "advice",
     "message" (the refusal; "" when it fits), "summary" (the line a split that fits prints; "" when refused)}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .budget import torch_total
from .errors import SizingError
from .inputs import Device, PlanInputs, knob_count, knob_variant, resolve_gpu
from .placement import Topology, describe_group, place
from .units import GiB, MiB
from .versions import estimate, releases_data

Planner = Callable[[Mapping[str, Any]], dict[str, Any]]

# What an instance may set (the single-model knobs of one model), with the value it has when not set.
INSTANCE_DEFAULTS: dict[str, Any] = {
    "model_config": {}, "quant_config": {}, "checkpoint_bytes": 0, "served_model_name": "",
    "speculative_config": {}, "tensor_parallel_size": "auto", "pipeline_parallel_size": 1,
    "decode_context_parallel_size": "auto", "kv_cache_dtype": "auto", "gpu_memory_utilization": "auto",
    "max_model_len": "auto", "kv_cache_blocks": None, "enable_lora": False, "max_loras": None, "max_lora_rank": None,
    "model_dir": "", "extra_args": [], "extra_environment": {}, "start_timeout": None,
}
INSTANCE_KEYS = ("name", "model", "gpus", "port", *INSTANCE_DEFAULTS)
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_KNOB = "vllm_node_instances"


@dataclass(frozen=True)
class Instance:
    """One instance as the inventory gives it: its name, its GPUs (a count or indices) and its knobs."""

    name: str
    gpus: int | tuple[int, ...]
    port: int
    knobs: Mapping[str, Any]   # model and INSTANCE_DEFAULTS' keys, the inventory's value or the default

    @property
    def model(self) -> str:
        """The catalog key (or, with model_config, the name the plan gives the config.json)."""
        return str(self.knobs.get("model") or "")

    @property
    def count(self) -> int:
        """How many GPUs it asked for."""
        return self.gpus if isinstance(self.gpus, int) else len(self.gpus)


def _gpus(name: str, value: Any, total: int, alone: bool) -> int | tuple[int, ...]:
    """An instance's gpus: a count, or a list of distinct indices 0..total-1; absent = every GPU when alone."""
    if value is None and alone:
        return total
    if isinstance(value, (list, tuple)):
        indices = [knob_count(f"{_KNOB}[{name}].gpus", v, auto=None, minimum=0, example="[6, 7]") for v in value]
        if indices and len(set(indices)) == len(indices) and max(indices) < total:
            return tuple(sorted(indices))
        raise SizingError(f"{_KNOB}[{name}].gpus is {list(value)!r}: give distinct GPU indices 0..{total - 1} "
                          f"(the node has {total}), or a count, e.g. gpus: 2.")
    if value is None:
        raise SizingError(f"{_KNOB}[{name}].gpus is missing: with several instances each one says how many GPUs it "
                          "gets (gpus: 2) or which (gpus: [6, 7]).")
    return int(knob_count(f"{_KNOB}[{name}].gpus", value, auto=None, example="2"))


def instances_from(value: Any, total: int, base_port: int, cuda: bool = True) -> list[Instance]:
    """vllm_node_instances checked: a non-empty list of mappings with unique names, a model, GPUs (on the cpu device
    none: gpus left out, or 1) and only the per-model knobs; SizingError naming the instance and the fix."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, Mapping) for v in value):
        raise SizingError(f"{_KNOB} must be a list of instances, each a mapping with name, model and gpus; got "
                          f"{value!r}. Leave it [] to serve the one model of vllm_node_model.")
    out: list[Instance] = []
    for position, item in enumerate(value):
        name = str(item.get("name") or "")
        if not _NAME_RE.match(name) or name in [i.name for i in out]:
            raise SizingError(f"{_KNOB}[{position}].name is {item.get('name')!r}: give each instance a unique name of "
                              "lower-case letters, digits, - and _ (it names its unit and its GPUs), e.g. chat.")
        unknown = sorted(set(item) - set(INSTANCE_KEYS))
        if unknown:
            raise SizingError(f"{_KNOB}[{name}] has {', '.join(unknown)}, which an instance cannot set: it takes "
                              f"{', '.join(INSTANCE_KEYS)}; the node-wide knobs (vllm_node_gpu, vllm_node_vllm_version"
                              ", ...) stay vllm_node_* variables.")
        if not item.get("model"):
            raise SizingError(f"{_KNOB}[{name}].model is missing: a catalog key (vllm_node_models), or a name with "
                              "model_config and checkpoint_bytes.")
        knobs = dict(INSTANCE_DEFAULTS, **{k: v for k, v in item.items() if k in INSTANCE_DEFAULTS})
        knobs["model"] = item["model"]
        port = knob_count(f"{_KNOB}[{name}].port", item.get("port", base_port + position), auto=None, example="8001")
        if not cuda and item.get("gpus") not in (None, 1, "1"):
            raise SizingError(f"{_KNOB}[{name}].gpus is {item.get('gpus')!r} on the cpu device, which has no GPUs: "
                              "leave gpus out (every instance runs on the host's CPUs).")
        gpus = _gpus(name, item.get("gpus"), total, len(value) == 1 or not cuda)
        out.append(Instance(name, gpus, int(port), knobs))
    ports = [i.port for i in out]
    if len(set(ports)) != len(ports):
        raise SizingError(f"{_KNOB}: two instances listen on the same port ({', '.join(map(str, ports))}): give each "
                          "its own port, or leave port out (vllm_node_port + the instance's position).")
    return out


def instance_args(args: Mapping[str, Any], instance: Instance, gpus: Sequence[int] | None, count: int,
                  cuda: bool) -> dict[str, Any]:
    """The single planner's arguments for one instance: the node-wide ones, its knobs, its GPU count and port, and
    CUDA_VISIBLE_DEVICES for its group."""
    single = {k: v for k, v in args.items() if k not in ("instances", "topology")}
    single.update(instance.knobs, gpu_count=count, port=instance.port, node_count=1)
    single.update(_node_wide_extras(args, instance.knobs))
    if cuda and gpus is not None:
        single["extra_environment"] = dict(single["extra_environment"], CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
    single["lora_adapters"] = instance_adapters(args.get("lora_adapters"), instance)
    return single


def _adapter_base(adapter: Any) -> str:
    return str(adapter.get("base") or "") if isinstance(adapter, Mapping) else ""


def instance_adapters(adapters: Any, instance: Instance) -> Any:
    """The LoRA adapters one instance serves: those whose base is the instance's name (named as its model for the
    single plan's check) or its model."""
    if not isinstance(adapters, (list, tuple)):
        return adapters
    return [dict(a, base=instance.model) if _adapter_base(a) == instance.name else a
            for a in adapters if _adapter_base(a) in (instance.name, instance.model)]


def refuse_orphan_adapters(adapters: Any, instances: Sequence[Instance]) -> None:
    """SizingError for an adapter whose base is no instance's name or model (it would be served nowhere)."""
    known = sorted({i.name for i in instances} | {i.model for i in instances})
    for adapter in adapters if isinstance(adapters, (list, tuple)) else []:
        if _adapter_base(adapter) not in known:
            name = adapter.get("name") if isinstance(adapter, Mapping) else repr(adapter)
            raise SizingError(f"adapter {name} "
                              f"belongs to base {_adapter_base(adapter) or '(none)'}, which no instance serves: set "
                              f"its base to an instance or its model ({', '.join(known)})")


def _node_wide_extras(args: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """vllm_node_extra_args / extra_environment apply to every instance, the instance's own added after them (its
    variables win); a value of the wrong type is passed on as it is, for node_plan to refuse by name."""
    node_args, own_args = args.get("extra_args") or [], knobs.get("extra_args") or []
    node_env, own_env = args.get("extra_environment") or {}, knobs.get("extra_environment") or {}
    out: dict[str, Any] = {"extra_args": own_args, "extra_environment": own_env}
    if isinstance(node_args, (list, tuple)) and isinstance(own_args, (list, tuple)):
        out["extra_args"] = [*node_args, *own_args]
    if isinstance(node_env, Mapping) and isinstance(own_env, Mapping):
        out["extra_environment"] = {**node_env, **own_env}
    return out


def short_reason(text: str) -> str:
    """A single plan's refusal as one clause of the split's: without its 'Cannot plan ... :' lead, the breakdown of
    the weights in parentheses and the tensor-parallel hint (the split's fix says how many GPUs instead)."""
    if text.startswith("Cannot plan ") and "): " in text:
        text = text.split("): ", 1)[1]
    text = text.split(". Use tensor_parallel_size", 1)[0]
    mark = text.find("weights per GPU (")
    if mark >= 0:
        start = mark + len("weights per GPU ")
        depth = 0
        for end in range(start, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                text = text[:start - 1] + text[end + 1:]
                break
    return text


def _plan_or_error(planner: Planner, args: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The single plan, or None and the refusal's reason (short_reason)."""
    try:
        return planner(args), ""
    except SizingError as exc:
        return None, short_reason(str(exc))


def uses_all(plan: Mapping[str, Any], count: int) -> bool:
    """Whether a plan runs on every GPU of its group (TP x PP = the group), none idle."""
    return int(plan["tensor_parallel_size"]) * int(plan["pipeline_parallel_size"]) == count


def min_gpus(planner: Planner, args: Mapping[str, Any], instance: Instance, total: int, cuda: bool) -> int | None:
    """The fewest GPUs (1..total) on which the instance's own plan fits and uses every GPU; None when none does."""
    if not cuda:
        return 1
    for count in range(1, total + 1):
        plan, _ = _plan_or_error(planner, instance_args(args, instance, None, count, cuda))
        if plan is not None and plan["fits"] and uses_all(plan, count):
            return count
    return None


def gib(value: int) -> str:
    """Bytes as the refusal prints them: 66.36 GiB."""
    return f"{value / GiB:.2f} GiB"


def need_text(plan: Mapping[str, Any] | None, error: str, count: int) -> str:
    """What an instance takes per GPU of its group (or why it cannot be planned there), in one clause."""
    if plan is None:
        return error.rstrip(".")
    g = plan["per_gpu"]
    fixed = g["weights_bytes"] + g["activation_peak_bytes"] + g["cudagraph_bytes"]
    text = (f"{gib(g['weights_bytes'])} weights + {gib(fixed - g['weights_bytes'])} activation and graphs + "
            f"{gib(g['kv_cache_bytes'])} KV cache per GPU (gpu-memory-utilization {plan['gpu_memory_utilization']}"
            f", TP {plan['tensor_parallel_size']}), max-model-len {int(plan['max_model_len']):,}")
    if not uses_all(plan, count):
        text += (f"; it runs on {plan['tensor_parallel_size'] * plan['pipeline_parallel_size']} of its {count} "
                 "GPUs, the rest would idle")
    if not plan["fits"]:
        failing = [c["message"] for c in plan["checks"] if not c["fits"]] or list(plan["reasons"])
        text += "; " + "; ".join(failing)
    return text


def invisible_bytes(args: Mapping[str, Any], gpu_entry: Mapping[str, Any], total: int) -> int:
    """Memory on each GPU no process's torch sees (counted once however many processes share the GPU)."""
    device = Device("cuda", "cuda", "", None, total, 1)
    seen, _ = torch_total(PlanInputs(config={}, releases=releases_data(args["releases"]), gpu=dict(gpu_entry)), device)
    return total - seen


def shared_gpus(rows: list[dict[str, Any]], safe_total: float, invisible: int, total: int) -> list[dict[str, Any]]:
    """Per GPU: who is on it, the sum of their fractions and of the bytes their processes take, and whether that
    stays within safe_total of the GPU and within its memory (each process: its budget, its CUDA context and NCCL;
    the memory torch never sees counted once)."""
    gpus: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        for g in row["gpus"]:
            gpus.setdefault(g, []).append(row)
    out = []
    for index in sorted(gpus):
        on = gpus[index]
        plans = [r["plan"] for r in on if r["plan"] is not None]
        fraction = round(sum(float(p["gpu_memory_utilization"]) for p in plans), 4)
        used = sum(total - int(p["per_gpu"]["headroom_bytes"]) for p in plans) - invisible * max(len(plans) - 1, 0)
        fits = len(on) == 1 or (len(plans) == len(on) and fraction <= safe_total + 1e-9 and used <= total)
        out.append({"index": index, "instances": [r["name"] for r in on], "memory_fraction": fraction,
                    "used_bytes": int(used), "total_bytes": int(total), "fits": bool(fits)})
    return out


def start_order(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Waves of instances: one that shares a GPU with an earlier instance starts after it (vLLM measures free
    memory at start), the others start together."""
    waves: list[list[str]] = []
    placed: dict[str, int] = {}
    for row in rows:
        wave = max((placed[n] + 1 for n in row["start_after"]), default=0)
        placed[row["name"]] = wave
        while len(waves) <= wave:
            waves.append([])
        waves[wave].append(row["name"])
    return waves


def _row(instance: Instance, group: tuple[int, ...] | None, topology: Topology, plan: dict[str, Any] | None,
         error: str, cuda: bool) -> dict[str, Any]:
    """One instance's entry in the document (before its neighbours and its need are known)."""
    gpus = list(group or ())
    served = (plan or {}).get("served_model_name") or instance.knobs.get("served_model_name") or instance.model
    return {"name": instance.name, "model": instance.model, "served_model_name": served, "port": instance.port,
            "gpu_count": instance.count, "gpus": gpus,
            "cuda_visible_devices": ",".join(map(str, gpus)) if cuda else "",
            "placement": describe_group(topology, gpus) if cuda and gpus and topology.known else "",
            "gpu_memory_utilization": (plan or {}).get("gpu_memory_utilization"),
            "fits": bool(plan is not None and plan["fits"] and (uses_all(plan, instance.count) or not cuda)),
            "error": error or None, "plan": plan, "shares_gpus_with": [], "start_after": [], "min_gpus": None,
            "need": ""}


def _neighbours(rows: list[dict[str, Any]], cuda: bool) -> None:
    """Who shares GPUs with whom, and whom each waits for (every earlier instance on a shared GPU; on the cpu
    device every earlier instance: they share the host's memory)."""
    for i, row in enumerate(rows):
        for other in rows[:i]:
            if not cuda or set(row["gpus"]) & set(other["gpus"]):
                row["start_after"].append(other["name"])
                if cuda:
                    row["shares_gpus_with"].append(other["name"])
                    other["shares_gpus_with"].append(row["name"])


def _sharing_checks(rows: list[dict[str, Any]], gpus: list[dict[str, Any]], safe_total: float) -> list[dict[str, Any]]:
    """One check per group of GPUs several instances share: explicit fractions, their sum, the bytes."""
    checks = []
    for g in gpus:
        if len(g["instances"]) < 2:
            continue
        on = [r for r in rows if r["name"] in g["instances"]]
        auto = [r["name"] for r in on if str(r["plan_args_util"]).strip().lower() == "auto"]
        parts = ", ".join(f"{r['name']} {r['gpu_memory_utilization']}" for r in on)
        message = (f"GPU {g['index']} is shared by {', '.join(g['instances'])}: gpu-memory-utilization {parts} = "
                   f"{g['memory_fraction']:g} of the GPU (at most {safe_total:g}); their processes take "
                   f"{gib(g['used_bytes'])} of {gib(g['total_bytes'])}")
        if auto:
            message += f"; {', '.join(auto)} left gpu_memory_utilization auto, which plans as if alone on the GPU"
        checks.append({"knob": f"{_KNOB}[{','.join(g['instances'])}].gpu_memory_utilization",
                       "fits": bool(g["fits"] and not auto), "message": message, "gpu": g["index"]})
    return checks


def _merge_shared(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shared GPUs with the same instances and figures read as one check naming the GPUs."""
    merged: dict[str, dict[str, Any]] = {}
    for c in checks:
        key = c["message"].split(": ", 1)[1]
        if key in merged:
            merged[key]["gpus"].append(c["gpu"])
        else:
            merged[key] = dict(c, gpus=[c["gpu"]])
    out = []
    for c in merged.values():
        label = f"GPU {c['gpus'][0]}" if len(c["gpus"]) == 1 else f"GPUs {', '.join(map(str, c['gpus']))}"
        out.append({"knob": c["knob"], "fits": c["fits"], "message": f"{label} {'is' if len(c['gpus']) == 1 else 'are'}"
                    f" shared by {c['message'].split(' is shared by ', 1)[1]}"})
    return out


def advice(rows: list[dict[str, Any]], total: int, safe_total: float, shared_ok: bool) -> list[str]:
    """The fix, computed: a split that fits when one exists (each instance's fewest GPUs), else who must move."""
    out = []
    mins = {r["name"]: r["min_gpus"] for r in rows}
    unplaceable = [n for n, m in mins.items() if m is None]
    if unplaceable:
        out.append(f"{', '.join(unplaceable)} fits no GPU count of this node (1..{total}): serve it on a larger node "
                   "(vllm_node_node_count), or pick a smaller or more quantized checkpoint.")
    needed = sum(m for m in mins.values() if m is not None)
    failing = [r for r in rows if not r["fits"] and r["min_gpus"] is not None]
    if needed > total:
        kept, used = [], 0
        for r in rows:
            if r["min_gpus"] is not None and used + r["min_gpus"] <= total:
                kept.append(r["name"])
                used += r["min_gpus"]
        moved = [r["name"] for r in rows if r["name"] not in kept and r["min_gpus"] is not None]
        out.append(f"The smallest split needs {needed} GPUs ({', '.join(f'{n} {m}' for n, m in mins.items() if m)})"
                   f" and the node has {total}: keep {', '.join(kept) or 'none'} here and serve {', '.join(moved)} on "
                   "another node, or pick smaller models.")
    elif failing:
        out.append("A split that fits: " + "; ".join(f"{n}: gpus: {m}" for n, m in mins.items() if m)
                   + f" ({needed} of {total} GPUs; the rest can go to any instance whose plan uses them all).")
    if not shared_ok:
        out.append(f"On shared GPUs set gpu_memory_utilization on every instance, summing to at most {safe_total:g} "
                   "and each high enough for its own plan, or give the instances GPUs of their own.")
    return out


def refusal(rows: list[dict[str, Any]], checks: list[dict[str, Any]], fixes: list[str], gpu: str, total: int) -> str:
    """The one message: each instance, its GPUs and its need (or why it does not fit), the failing checks, the fix."""
    parts = []
    for r in rows:
        where = f"GPUs {','.join(map(str, r['gpus']))}" if r["gpus"] else f"{r['gpu_count']} GPU(s) (none left)"
        verdict = "fits" if r["fits"] else "DOES NOT FIT"
        needs = f"; it needs {r['min_gpus']} GPU(s)" if not r["fits"] and r["min_gpus"] else ""
        parts.append(f"{r['name']} ({r['model']}) on {where}: {verdict}: {r['need']}{needs}.")
    failing = [c["message"] + "." for c in checks if not c["fits"]]
    return (f"The instances do not fit {total} x {gpu}: " + " ".join(parts + failing)
            + (" Fix: " + " ".join(fixes) if fixes else ""))


def summary(rows: list[dict[str, Any]], waves: list[list[str]], gpu: str, total: int) -> str:
    """The one line a split that fits prints: each instance, its GPUs, port, length and memory share; the order."""
    parts = [f"{r['name']} ({r['served_model_name']}) on GPU(s) {r['cuda_visible_devices'] or 'cpu'}, port {r['port']}"
             f", max-model-len {int(r['plan']['max_model_len']):,}, gpu-memory-utilization "
             f"{r['plan']['gpu_memory_utilization']}" for r in rows if r["plan"]]
    order = " -> ".join(" + ".join(w) for w in waves)
    return f"The split fits {total} x {gpu}: {'; '.join(parts)}; start order: {order}."


def _count_check(instances: list[Instance], total: int) -> dict[str, Any]:
    """The GPUs the instances ask for against the node's (GPUs named explicitly and shared count once)."""
    explicit = {g for i in instances if not isinstance(i.gpus, int) for g in i.gpus}
    asked = len(explicit) + sum(i.gpus for i in instances if isinstance(i.gpus, int))
    return {"knob": f"{_KNOB}[*].gpus", "fits": asked <= total,
            "message": f"the instances ask for {asked} GPUs ({', '.join(f'{i.name} {i.count}' for i in instances)}); "
                       f"the node has {total}"}


def instances_plan(args: Mapping[str, Any], planner: Planner) -> dict[str, Any]:
    """vllm_node_plan for vllm_node_instances: the split, one single-model plan per instance, the checks of the
    split as a whole and, when it does not fit, one refusal message (the document in the module docstring)."""
    if int(knob_count("node_count", args.get("node_count", 1), auto=None, example="1")) != 1:
        raise SizingError(f"{_KNOB} plans several models on one node; vllm_node_node_count must be 1 with it (one "
                          "replica over several nodes serves one model).")
    variant = knob_variant(args.get("vllm_variant"))
    node_gpu = resolve_gpu(args.get("gpu", "auto"), args.get("gpus") or {}, args.get("detected_gpus"),
                           variant=variant, gpu_count=args.get("gpu_count", "auto"),
                           cpu_kv_cache_space_gib=args.get("cpu_kv_cache_space_gib"),
                           host=str(args.get("host") or "the node"), source=str(args.get("gpu_source") or ""))
    cuda = str(node_gpu.entry.get("kind") or "cuda") == "cuda"
    total = node_gpu.count if cuda else 1
    base_port = int(knob_count("port", args.get("port", 8000), auto=None, example="8000"))
    instances = instances_from(args.get("instances"), total, base_port, cuda)
    refuse_orphan_adapters(args.get("lora_adapters"), instances)
    topology = Topology.of(args.get("topology") if cuda else None, total)
    groups = place(topology, [i.gpus for i in instances]) if cuda else [() for _ in instances]
    rows = []
    for instance, group in zip(instances, groups, strict=True):
        plan, error = _plan_or_error(planner, instance_args(args, instance, group, instance.count if cuda else 1,
                                                            cuda))
        row = _row(instance, group, topology, plan, error, cuda)
        row["plan_args_util"] = instance.knobs["gpu_memory_utilization"]
        rows.append(row)
    _neighbours(rows, cuda)
    safe_total = estimate(releases_data(args["releases"]), "max_auto_gpu_memory_utilization")
    memory = int(node_gpu.entry.get("memory_mib") or 0) * MiB
    unseen = invisible_bytes(args, node_gpu.entry, memory) if cuda else 0
    gpus = shared_gpus(rows, safe_total, unseen, memory) if cuda else []
    for g in gpus:
        g["numa"] = topology.numa.get(g["index"])
    checks = [_count_check(instances, total)] if cuda else []
    checks += _merge_shared(_sharing_checks(rows, gpus, safe_total))
    fits = all(c["fits"] for c in checks) and all(r["fits"] for r in rows)
    for instance, row in zip(instances, rows, strict=True):
        row["need"] = need_text(row["plan"], row["error"] or "", instance.count)
        if not fits:
            row["min_gpus"] = min_gpus(planner, args, instance, total, cuda)
        del row["plan_args_util"]
    shared_ok = all(c["fits"] for c in checks[1:])
    fixes = advice(rows, total, safe_total, shared_ok) if not fits else []
    reasons = [f"{r['name']}: {r['model']} on GPU(s) {r['cuda_visible_devices'] or 'cpu'}"
               f"{' (' + r['placement'] + ')' if r['placement'] else ''}" for r in rows]
    if cuda and not topology.known:
        reasons.append(describe_group(topology, []))
    return {
        "fits": bool(fits), "gpu": node_gpu.key, "gpu_count": total, "device": "cuda" if cuda else "cpu",
        "vllm_version": (next((r["plan"] for r in rows if r["plan"]), None) or {}).get("vllm_version", ""),
        "topology": "nvidia-smi topo -m" if topology.known else "unknown", "unseen_bytes": int(unseen),
        "instances": rows, "gpus": gpus, "start_order": start_order(rows), "checks": checks,
        "reasons": reasons, "advice": fixes,
        "message": "" if fits else refusal(rows, checks, fixes, node_gpu.key, total),
        "summary": summary(rows, start_order(rows), node_gpu.key, total) if fits else "",
    }


def instance_plans(plan: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any] | None]]:
    """(name, single-model plan) for every instance of vllm_node_plan: a single-model plan is one instance,
    named vllm (today's unit)."""
    if "instances" in plan:
        return [(str(r["name"]), r["plan"]) for r in plan["instances"]]
    return [("vllm", plan)]
