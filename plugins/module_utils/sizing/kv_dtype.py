"""The plan's KV cache dtype: `auto` resolved against what the attention backend on this GPU can run."""

from __future__ import annotations

from dataclasses import dataclass

from .backends import (
    Backend,
    attention_backend,
    cc_text,
    cc_tuple,
    checkpoint_kv_cache_dtype,
    fp8_support_since,
    normalise_kv_dtype,
)
from .errors import SizingError
from .inputs import Device, PlanInputs
from .model import ModelShape
from .units import is_auto
from .versions import rule

_EXPLICIT_CHOICES = ("bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "nvfp4")


@dataclass(frozen=True)
class KVChoice:
    """The KV dtype the plan uses, what the checkpoint declares, and why."""

    dtype: str
    checkpoint: str | None          # the checkpoint's ModelOpt KV dtype
    checkpoint_supported: bool      # the backend on this GPU + version runs it
    message: str
    reasons: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()


def _auto_choice(inputs: PlanInputs, shape: ModelShape, device: Device, ckpt_kv: str | None,
                 ckpt_backend: Backend | None) -> KVChoice:
    rel, version, cc = inputs.releases, inputs.vllm_version, device.compute_capability
    supported = ckpt_backend.supported if ckpt_backend else True
    uses_ckpt = bool(rule(rel, "kv_cache_dtype_auto_uses_checkpoint", version))
    advice: tuple[str, ...] = ()
    if ckpt_kv and ckpt_backend and uses_ckpt and supported:
        dtype = ckpt_kv
        message = f"auto: the checkpoint declares {ckpt_kv} KV cache and {ckpt_backend.name} runs it"
    elif ckpt_kv and ckpt_backend and uses_ckpt:
        dtype = shape.dtype
        message = (f"auto: the checkpoint declares {ckpt_kv} KV cache, but {ckpt_backend.message}; "
                   f"planning {dtype} and passing --kv-cache-dtype {dtype} explicitly (with 'auto' "
                   f"vLLM {version} would pick {ckpt_kv} and fail at start-up)")
        since = fp8_support_since(shape.mla, cc, rel) if ckpt_kv.startswith("fp8") else None
        if since:
            advice = (f"Upgrade vLLM to >= {since} to run the checkpoint's {ckpt_kv} KV cache on "
                      f"{cc_text(cc_tuple(cc))} (half the KV memory of {dtype}).",)
    else:
        dtype = shape.dtype
        message = f"auto: the model dtype {dtype}" + (
            f" (vLLM {version} ignores the checkpoint's {ckpt_kv} KV setting for auto)" if ckpt_kv else "")
    return KVChoice(dtype, ckpt_kv, supported, message, ("KV cache dtype " + message + ".",), advice)


def choose_kv_dtype(inputs: PlanInputs, shape: ModelShape, device: Device) -> KVChoice:
    """The KV dtype: `auto` follows the checkpoint when its backend runs it; an explicit one must run."""
    rel, version, cc = inputs.releases, inputs.vllm_version, device.compute_capability
    ckpt_kv = checkpoint_kv_cache_dtype(inputs.config, inputs.quant)
    ckpt_backend = attention_backend(shape.mla, ckpt_kv, cc, device.kind, version, rel) if ckpt_kv else None
    requested = normalise_kv_dtype(inputs.kv_cache_dtype if not is_auto(inputs.kv_cache_dtype) else "auto")
    if requested == "auto":
        return _auto_choice(inputs, shape, device, ckpt_kv, ckpt_backend)
    backend = attention_backend(shape.mla, requested, cc, device.kind, version, rel)
    if not backend.supported:
        options = [d for d in _EXPLICIT_CHOICES
                   if attention_backend(shape.mla, d, cc, device.kind, version, rel).supported]
        raise SizingError(f"kv_cache_dtype {inputs.kv_cache_dtype} cannot run here: {backend.message}. "
                          f"Valid choices for this GPU and vLLM {version}: auto, {', '.join(options)}")
    return KVChoice(requested, ckpt_kv, ckpt_backend.supported if ckpt_backend else True,
                    f"{requested} as requested")


def kv_dtype_arg(choice: KVChoice, shape: ModelShape, inputs: PlanInputs, device: Device) -> tuple[str, str]:
    """The --kv-cache-dtype value (`auto` when it means the same, else the explicit name vLLM accepts),
    and a note when the backend takes the model dtype only as `auto`."""
    rel, version = inputs.releases, inputs.vllm_version
    uses_ckpt = choice.checkpoint and rule(rel, "kv_cache_dtype_auto_uses_checkpoint", version)
    auto_means = choice.checkpoint if uses_ckpt else shape.dtype
    if choice.dtype == auto_means and choice.dtype == shape.dtype:
        return "auto", ""
    backend = attention_backend(shape.mla, choice.dtype, device.compute_capability, device.kind, version, rel)
    if not backend.explicit_ok:
        return "auto", (f"{backend.name} takes the model dtype only as --kv-cache-dtype auto: the checkpoint's "
                        f"{choice.checkpoint} KV setting must be removed from its config (the model_config role "
                        "does this when checkpoint_kv_cache_dtype_supported is false)")
    return choice.dtype, ""
