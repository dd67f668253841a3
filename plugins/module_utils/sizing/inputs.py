"""The plan's inputs as one value object, the device they describe, and the knobs as the inventory gives them.

The knobs (vllm_node_* through the preflight role) arrive as the inventory or -e wrote them: 'auto', ints, floats,
numeric strings, '' / None. They are coerced and checked here, once, with a message that names the knob, says what
is wrong and what to set instead; nothing repeats these checks in YAML.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .backends import KV_CACHE_DTYPES
from .errors import SizingError, refuse_unknown_keywords
from .model import KV_DTYPE_ALIASES
from .units import GiB, MiB, is_auto, to_int
from .versions import DEFAULT_VERSION, Releases, releases_data, version_tuple


@dataclass(frozen=True)
class PlanInputs:
    """Everything vllm_memory_plan takes (its keyword arguments; see plugins/filter/vllm_memory_plan.yml)."""

    config: dict[str, Any]                 # config.json as shipped (text_config nesting kept)
    releases: Releases                     # vllm_node_vllm_releases
    checkpoint_bytes: Any = None
    gpu: dict[str, Any] | None = None      # a GPU catalog entry; the explicit values below win over it
    gpu_memory_bytes: Any = None
    compute_capability: Any = None
    gpu_count: Any = 1
    device: str | None = None              # cuda | cpu (default: from gpu.kind / vllm_variant)
    cpu_kv_cache_space_gib: Any = None
    vllm_version: str = DEFAULT_VERSION
    vllm_variant: str | None = None
    quant: dict[str, Any] | None = None
    tensor_parallel_size: Any = "auto"
    pipeline_parallel_size: Any = 1
    decode_context_parallel_size: Any = "auto"
    kv_cache_dtype: Any = "auto"
    gpu_memory_utilization: Any = "auto"
    max_model_len: Any = "auto"
    kv_cache_blocks: Any = None            # --num-gpu-blocks-override: the KV cache pinned to N blocks (kv_blocks.py)
    block_size: Any = None
    max_num_batched_tokens: Any = None
    max_num_seqs: Any = None
    mamba_cache_mode: Any = None
    speculative_config: dict[str, Any] | None = None   # vLLM's --speculative-config as a dict (speculative.py)
    cpu_amx: bool = False                  # cpu device: the CPU has AMX tiles (x86 flag amx_tile)
    enable_lora: bool = False              # --enable-lora (adapter slots enter the budget)
    max_loras: Any = None                  # --max-loras (vLLM default 1)
    max_lora_rank: Any = None              # --max-lora-rank (vLLM default 16)
    pp_layer_partition: Any = None
    node_count: Any = 1                    # nodes one replica spans (gpu_count is per node); PP across them
    load_mib_per_second: Any = None        # weights one GPU loads per second (start-up budget); None: 138
    enforce_eager: bool = False
    flashinfer_sampler: bool = False       # FlashInfer is installed (sampler warm-up: its release rule)
    mxfp4_triton_kernels: bool = False     # triton_kernels is installed (MXFP4 MoE on Hopper: Triton, not Marlin)
    model_key: str = ""
    repo: str = ""
    served_model_name: str = ""
    gpu_key: str = ""
    gpu_name: str = ""

    @classmethod
    def from_kwargs(cls, config: dict[str, Any], **kwargs: Any) -> PlanInputs:
        """Inputs from the filter's keyword arguments; unknown names and a non-version are refused."""
        known = {f.name for f in fields(cls)} - {"config"}
        refuse_unknown_keywords(kwargs, known)
        values = dict(kwargs, releases=releases_data(kwargs.get("releases")))
        values["vllm_version"] = str(kwargs.get("vllm_version") or DEFAULT_VERSION)
        version_tuple(values["vllm_version"])
        return cls(config=config, **values)


@dataclass(frozen=True)
class Device:
    """What the plan runs on: cuda GPUs (memory per GPU) or the cpu backend (its fixed KV space)."""

    kind: str                  # cuda | cpu
    variant: str               # the vLLM build: cuda | cpu
    gpu_name: str
    compute_capability: Any
    total: int                 # bytes per GPU; on cpu the KV space (VLLM_CPU_KVCACHE_SPACE)
    count: int


def _cuda_memory(gpu: dict[str, Any], gpu_memory_bytes: Any) -> int:
    if gpu_memory_bytes in (None, "", "auto"):
        if gpu.get("memory_mib") is None:
            raise SizingError("the GPU's total memory is unknown: pass gpu_memory_bytes (nvidia-smi MiB * 2**20) "
                              "or a GPU catalog entry with memory_mib")
        gpu_memory_bytes = int(gpu["memory_mib"]) * MiB
    total = to_int("gpu_memory_bytes", gpu_memory_bytes)
    if total <= 0:
        raise SizingError("gpu_memory_bytes must be > 0")
    return total


def _cpu_kv_space(gpu: dict[str, Any], cpu_kv_cache_space_gib: Any) -> int:
    space = cpu_kv_cache_space_gib if cpu_kv_cache_space_gib is not None else gpu.get("kv_cache_space_gib")
    if space is None:
        raise SizingError("device cpu needs cpu_kv_cache_space_gib (VLLM_CPU_KVCACHE_SPACE, whole GiB)")
    space_gib = to_int("cpu_kv_cache_space_gib", space)
    if space_gib < 1:
        raise SizingError("cpu_kv_cache_space_gib must be >= 1 (vLLM reads VLLM_CPU_KVCACHE_SPACE as whole GiB)")
    return space_gib * GiB


def resolve_device(inputs: PlanInputs) -> Device:
    """The device, its memory and the GPU count, from the knobs and the GPU catalog entry."""
    gpu = dict(inputs.gpu or {})
    kind = inputs.device
    if kind is None:
        kind = "cpu" if gpu.get("kind") == "cpu" or inputs.vllm_variant == "cpu" else "cuda"
    if kind not in ("cuda", "cpu"):
        raise SizingError(f"device {kind!r} is not supported; choose cuda or cpu")
    variant = inputs.vllm_variant or ("cpu" if kind == "cpu" else "cuda")
    cc = inputs.compute_capability if inputs.compute_capability not in (None, "") else gpu.get("compute_capability")
    total = _cuda_memory(gpu, inputs.gpu_memory_bytes) if kind == "cuda" \
        else _cpu_kv_space(gpu, inputs.cpu_kv_cache_space_gib)
    if is_auto(inputs.gpu_count):
        raise SizingError("gpu_count must be a number here (the preflight role resolves 'auto' from the node's GPUs)")
    count = to_int("gpu_count", inputs.gpu_count)
    if count < 1:
        raise SizingError("gpu_count must be >= 1")
    return Device(kind, variant, inputs.gpu_name or str(gpu.get("name") or ""), cc, total, count)


# --- The knobs as the inventory gives them -------------------------------------------------------------------------

_DIGITS = re.compile(r"^\+?[0-9]+$")
_TRUE = ("true", "yes", "on", "1", "y", "t")
_FALSE = ("false", "no", "off", "0", "n", "f", "")
_NONE = ("", "none", "null", "~")


def knob_name(name: str) -> str:
    """The inventory's name of a plan input: tensor_parallel_size -> vllm_node_tensor_parallel_size."""
    return name if name.startswith(("vllm_node_", "preflight_")) else f"vllm_node_{name}"


def _whole(value: Any) -> int | None:
    """A whole number from an int, an integral float or a string of digits; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and _DIGITS.match(value.strip()):
        return int(value.strip())
    return None


def knob_count(name: str, value: Any, *, auto: Any = "auto", minimum: int = 1, example: str = "8") -> Any:
    """`auto` for 'auto' (when auto is not None), else a whole number >= minimum; SizingError naming the knob."""
    if auto is not None and isinstance(value, str) and value.strip().lower() == "auto":
        return auto
    number = _whole(value)
    if number is None or number < minimum:
        allowed = "auto or " if auto is not None else ""
        kind = "a positive integer" if minimum >= 1 else "a whole number >= 0"
        raise SizingError(f"{knob_name(name)} must be {allowed}{kind}; got {value!r}. "
                          f"Set it to {'auto or ' if auto is not None else ''}a number, "
                          f"e.g. -e {knob_name(name)}={example}.")
    return number


def knob_optional_count(name: str, value: Any, example: str) -> int | None:
    """None for an unset knob (null, '', 'None'), else a positive integer."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    return int(knob_count(name, value, auto=None, example=example))


def knob_kv_cache_blocks(value: Any) -> int | None:
    """vllm_node_kv_cache_blocks (vLLM's --num-gpu-blocks-override): None when unset, else a positive integer."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    number = _whole(value)
    if number is None or number < 1:
        raise SizingError(f"vllm_node_kv_cache_blocks must be a positive integer (vLLM's --num-gpu-blocks-override: "
                          f"the KV cache blocks to allocate) or null; got {value!r}. Set it to a block count, e.g. "
                          "-e vllm_node_kv_cache_blocks=2048, or leave it null to size the cache from the memory "
                          "budget.")
    return number


def knob_fraction(value: Any) -> Any:
    """vllm_node_gpu_memory_utilization: 'auto' or a fraction in (0, 1]."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = float(value) if not isinstance(value, bool) else -1.0
    except (TypeError, ValueError):
        number = -1.0
    if not 0 < number <= 1:
        raise SizingError("vllm_node_gpu_memory_utilization must be auto or a fraction in (0, 1], e.g. 0.92 (vLLM's "
                          f"default since 0.20) or 0.95; got {value!r}: it is the share of each GPU's memory vLLM "
                          "may take. Set it to auto (the release's default, raised only as far as the context "
                          "needs) or a fraction.")
    return number


def knob_rate(value: Any) -> Any:
    """vllm_node_load_mib_per_second: 'auto' or MiB/s > 0."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = float(value) if not isinstance(value, bool) else 0.0
    except (TypeError, ValueError):
        number = 0.0
    if number <= 0:
        raise SizingError(f"vllm_node_load_mib_per_second must be auto or MiB/s of weights one GPU loads (> 0); got "
                          f"{value!r}. Set it to auto (138) or the disk's rate, e.g. 60 for network storage.")
    return number


def knob_bool(name: str, value: Any) -> bool:
    """A boolean knob from true/false, yes/no, on/off, 1/0."""
    if isinstance(value, bool):
        return value
    text = "" if value is None else str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise SizingError(f"{knob_name(name)} must be true or false; got {value!r}. Set it to true or false.")


def knob_kv_cache_dtype(value: Any) -> str:
    """vllm_node_kv_cache_dtype: one of vLLM's --kv-cache-dtype names the plan can size."""
    text = "auto" if value in (None, "") else str(value).strip().lower()
    if text not in KV_CACHE_DTYPES and text not in KV_DTYPE_ALIASES:
        raise SizingError(f"vllm_node_kv_cache_dtype is {value!r}, which is not a KV cache dtype vLLM takes: "
                          f"set it to auto (the checkpoint's KV dtype when the GPU and release support it, else "
                          f"the model's dtype) or one of {', '.join(c for c in KV_CACHE_DTYPES if c != 'auto')}.")
    return text


def knob_variant(value: Any) -> str:
    """vllm_node_vllm_variant: the vLLM build, cuda or cpu."""
    text = str(value or "cuda").strip().lower()
    if text not in ("cuda", "cpu"):
        raise SizingError(f"vllm_node_vllm_variant is {value!r}; the builds are cuda (NVIDIA GPUs) and cpu "
                          "(vLLM's CPU backend, vllm_node_gpu: cpu). Set it to cuda or cpu.")
    return text


def knob_version(value: Any, releases: Releases) -> str:
    """vllm_node_vllm_version: a release like 0.33.0, not older than the oldest the sizing rules were read from."""
    known = [str(v) for v in releases.get("known_versions") or []]
    span = f"{known[0]} - {known[-1]}" if known else DEFAULT_VERSION
    text = str(value if value not in (None, "") else DEFAULT_VERSION).strip()
    try:
        wanted = version_tuple(text)
    except SizingError:
        raise SizingError(f"vllm_node_vllm_version is {value!r}, not a vLLM release: set it to a release like "
                          f"\"{DEFAULT_VERSION}\" (quoted in YAML); the plan knows {span}.") from None
    if known and wanted < version_tuple(known[0]):
        raise SizingError(f"vllm_node_vllm_version {text} is older than every release the sizing rules were read "
                          f"from ({span}, vllm_node_vllm_releases.known_versions): its memory rules are unknown. "
                          f"Set it to one of {', '.join(known)}.")
    return text


def knob_partition(value: Any) -> str | None:
    """vllm_node_pp_layer_partition: '31,30' (or a list of layer counts); '' / None = vLLM's own split."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class ModelRequest:
    """The model to plan: its catalog entry (or a stand-in for a config.json given directly) and what the knobs
    and the node's files say about it."""

    key: str
    entry: dict[str, Any]
    config: dict[str, Any]
    quant: dict[str, Any] | None
    checkpoint_bytes: int
    served_model_name: str
    speculative_config: dict[str, Any] | None
    config_source: str          # catalog | node


def _speculative(model: str, entry: Mapping[str, Any], value: Any) -> dict[str, Any] | None:
    """vllm_node_speculative_config: {} = off, 'catalog' = the entry's draft, or a --speculative-config mapping."""
    catalog = isinstance(value, str) and value.strip() == "catalog"
    chosen = (entry.get("speculative_config") or {}) if catalog else (value or {})
    if not isinstance(chosen, Mapping) or (catalog and not chosen):
        missing = f" and the catalog entry of {model} has no speculative_config" if catalog else ""
        raise SizingError("vllm_node_speculative_config must be {} (off), catalog (the model entry's "
                          "speculative_config) or a mapping shaped like vLLM's --speculative-config JSON, e.g. "
                          f"{{method: mtp, num_speculative_tokens: 1}}; got {value!r}{missing}. Pass a mapping as "
                          "JSON: -e '{\"vllm_node_speculative_config\": {\"method\": \"mtp\", "
                          "\"num_speculative_tokens\": 1}}'.")
    return dict(chosen) or None


def resolve_model(model: str, models: Mapping[str, Any], *, model_config: Any = None, quant_config: Any = None,
                  checkpoint_bytes: Any = 0, served_model_name: Any = "",
                  speculative_config: Any = None) -> ModelRequest:
    """The model entry, its config (the catalog's, or the node's config.json), checkpoint size and served name."""
    source = "node" if model_config else "catalog"
    if model not in models and source == "catalog":
        raise SizingError(f"Unknown model {model!r} (vllm_node_model). Valid keys: {', '.join(sorted(models))}. "
                          "Add the model with vllm_node_extra_models in your inventory (roles/vllm_node/README.md), "
                          "or plan a config.json directly: ansible-playbook playbooks/plan.yml "
                          "-e vllm_node_model_config=PATH/config.json -e vllm_node_checkpoint_bytes=N")
    entry = dict(models[model]) if model in models else {
        "repo": model, "revision": "main", "checkpoint_bytes": 0, "quant": None,
        "serving": {"trust_remote_code": False, "reasoning_parser": None, "tool_call_parser": None, "extra_args": []}}
    config: Any = model_config if source == "node" else (entry.get("config") or {})
    quant: Any = (quant_config or None) if source == "node" else entry.get("quant")
    given = knob_count("vllm_node_checkpoint_bytes", checkpoint_bytes or 0, auto=None, minimum=0,
                       example="1234567890")
    size = given if given > 0 else _whole(entry.get("checkpoint_bytes") or 0) or 0
    problems = []
    if not isinstance(config, Mapping) or not config:
        problems.append("its config is empty (give the catalog entry a config, or pass the parsed config.json as "
                        "preflight_model_config);")
    if size <= 0:
        problems.append("its checkpoint size is unknown: pass vllm_node_checkpoint_bytes (model.safetensors.index.json"
                        " metadata.total_size) or set checkpoint_bytes in its vllm_node_extra_models entry.")
    if problems:
        raise SizingError(f"Cannot plan model {model!r}: {' '.join(problems)}")
    served = str(served_model_name or "") or str(entry.get("served_model_name") or entry["repo"])
    return ModelRequest(model, entry, dict(config), quant, size, served,
                        _speculative(model, entry, speculative_config), source)


def resolve_gpu_count(value: Any, available: int, *, kind: str, gpu_key: str, host: str) -> int:
    """vllm_node_gpu_count: auto = every detected GPU of the chosen type (1 on the cpu device), else 1..detected."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        if kind == "cpu":
            return 1
        if available < 1:
            raise SizingError(f"vllm_node_gpu_count is auto but no {gpu_key} GPU was detected on {host}: pass the "
                              "number of GPUs, e.g. -e vllm_node_gpu_count=8.")
        return available
    count = int(knob_count("gpu_count", value))
    if available and count > available:
        raise SizingError(f"vllm_node_gpu_count={count} but the node has {available} x {gpu_key}: use "
                          f"1..{available} (or auto).")
    return count


@dataclass(frozen=True)
class GpuRequest:
    """The GPU type the plan is for, its catalog entry with the node's real numbers, and how many."""

    key: str
    entry: dict[str, Any]
    count: int


def _unique(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def _gpu_key(gpu: str, gpus: Mapping[str, Any], detected: list[dict[str, Any]], *, variant: str, host: str,
             source: str) -> str:
    """vllm_node_gpu: a catalog key, or auto = the key the node's GPUs matched (cpu for the cpu build)."""
    if variant == "cpu" and gpu == "auto":
        key = "cpu"
    elif gpu != "auto":
        key = gpu
    else:
        key = next((str(k) for k in _unique([d.get("key") for d in detected]) if k), "")
    if key in gpus:
        return key
    if gpu != "auto":
        problem = f"Unknown GPU {gpu!r} (vllm_node_gpu)."
    elif not detected:
        problem = (f"vllm_node_gpu is auto but no GPU was detected on {host} "
                   f"(node_facts_gpu_source: {source or 'not gathered'}).")
    else:
        problem = (f"The node's GPUs are not in the GPU catalog: "
                   f"{', '.join(_unique([str(d.get('name')) for d in detected]))} "
                   f"({', '.join(_unique([str(d.get('pci_device_id')) for d in detected]))}).")
    raise SizingError(f"{problem} Set vllm_node_gpu to one of: {', '.join(sorted(gpus))} (cpu with "
                      "vllm_node_vllm_variant=cpu), or add the GPU with vllm_node_extra_gpus "
                      "(roles/vllm_node/README.md).")


def _check_gpu_type(key: str, kind: str, gpu: str, gpus: Mapping[str, Any], detected: list[dict[str, Any]],
                    variant: str) -> None:
    """The GPU type against the build (cpu device = cpu build) and against the GPUs the node reports."""
    known = [str(k) for k in _unique([d.get("key") for d in detected]) if k]
    if (kind == "cpu") != (variant == "cpu"):
        cuda_keys = sorted(k for k, v in gpus.items() if (v or {}).get("kind") != "cpu")
        raise SizingError(f"vllm_node_gpu={key} is a {kind} device but vllm_node_vllm_variant={variant}: the cpu "
                          "build runs only on the cpu device (vllm_node_gpu: cpu or auto), the cuda build needs a GPU "
                          f"key ({', '.join(cuda_keys)}).")
    if kind == "cpu":
        return
    if gpu == "auto" and len(known) > 1:
        raise SizingError(f"The node has different GPU types ({', '.join(known)}): set vllm_node_gpu and "
                          "vllm_node_gpu_count to the GPUs vLLM should use.")
    if known and key not in known:
        names = ", ".join(_unique([str(d.get("name")) for d in detected]))
        raise SizingError(f"vllm_node_gpu={key} but the node reports {len(detected)} x {names} ({', '.join(known)}): "
                          "set vllm_node_gpu to auto or to the detected key.")


def resolve_gpu(gpu: Any, gpus: Mapping[str, Any], detected: Any, *, variant: str, gpu_count: Any,
                cpu_kv_cache_space_gib: Any = None, host: str = "the node", source: str = "") -> GpuRequest:
    """The GPU type (vllm_node_gpu, checked against the catalog, the build and the node's GPUs), its entry with
    the numbers nvidia-smi reports (the smallest card decides, as in vLLM) and the count (vllm_node_gpu_count).

    `detected`: the node's GPUs matched to the catalog (the gpu_catalog_match filter over node_facts_gpus)."""
    found = [dict(d) for d in detected or [] if isinstance(d, Mapping)]
    wanted = str(gpu if gpu not in (None, "") else "auto").strip()
    key = _gpu_key(wanted, gpus, found, variant=variant, host=host, source=source)
    entry = dict(gpus[key] or {})
    kind = str(entry.get("kind") or "cuda")
    _check_gpu_type(key, kind, wanted, gpus, found, variant)
    mine = [d for d in found if d.get("key") == key]
    memory = [int(d["memory_total_mib"]) for d in mine if d.get("memory_total_mib")]
    capability = _unique([str(d["compute_capability"]) for d in mine if d.get("compute_capability")])
    if memory:
        entry["memory_mib"] = min(memory)
    if len(capability) == 1:
        entry["compute_capability"] = capability[0]
    if cpu_kv_cache_space_gib is not None and kind == "cpu":
        entry["kv_cache_space_gib"] = cpu_kv_cache_space_gib
    count = resolve_gpu_count(gpu_count, len(mine), kind=kind, gpu_key=key, host=host)
    return GpuRequest(key, entry, count)
