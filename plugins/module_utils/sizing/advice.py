"""The plan's prose: the length verdict, concrete fixes (each checked with the same maths), checks, reasons."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import kv_blocks
from .backends import DTYPE_LABEL, cc_text, cc_tuple, fp8_support_since
from .context import Sizing
from .errors import SizingError
from .kv_layout import build_layout
from .model import kv_bytes
from .parallel import kv_heads_per_rank, validate_parallel
from .units import format_bytes
from .versions import estimate, version_tuple


@dataclass(frozen=True)
class FitOptions:
    """Fixes for a context that does not fit: short forms for the verdict, sentences for the advice."""

    short: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()


def _power_of_two_at_most(value: int) -> int:
    return 1 << (value.bit_length() - 1) if value > 0 else 0


def length_message(s: Sizing) -> str:
    """The verdict on the context length, with the numbers."""
    label = DTYPE_LABEL.get(s.kv.dtype, s.kv.dtype)
    if s.chosen_len > s.model_max:
        return (f"max_model_len {s.chosen_len:,} exceeds the model's maximum {s.model_max:,}; "
                f"choose <= {s.model_max:,}")
    if s.safe <= 0:
        return (f"no KV cache room: {format_bytes(max(s.available, 0))} is available for KV {s.where}; even one "
                f"{s.layout.block_size}-token block ({format_bytes(s.per_block)}) plus the null block does not fit")
    pinned = f" in the {s.kv_cache_blocks:,} pinned blocks" if s.kv_cache_blocks is not None else ""
    text = (f"{label} KV needs {format_bytes(s.needed)} {s.where} for {s.chosen_len:,} tokens; "
            f"{format_bytes(s.available - s.per_block)} is available{pinned}")
    return text if not s.len_ok else text + f" (largest safe length {s.safe:,})"


def _fits_with(s: Sizing, **overrides: Any) -> tuple[bool, int]:
    """Whether the chosen length fits with other layout knobs (same memory), and what it needs then."""
    alt = build_layout(s.inputs.config, s.shape, replace(s.layout_inputs, **overrides))
    need = alt.needed_bytes(s.chosen_len)
    return need <= s.available - alt.worst_block_bytes(), need


def _fp8_option(s: Sizing) -> FitOptions:
    cc = s.device.compute_capability
    cc_name = cc_text(cc_tuple(cc))
    since = fp8_support_since(s.shape.mla, cc, s.inputs.releases)
    if since and version_tuple(since) <= version_tuple(s.inputs.vllm_version):
        ok, need = _fits_with(s, kv_cache_dtype="fp8_e4m3")
        if ok:
            return FitOptions((f"fp8 KV (supported on {cc_name} from vLLM {since})",),
                              (f"Use --kv-cache-dtype fp8_e4m3: {format_bytes(need)} for {s.chosen_len:,} tokens "
                               f"(supported on {cc_name} from vLLM {since}).",))
    elif since:
        return FitOptions((), (f"fp8 KV would halve the KV cache, but on {cc_name} it needs vLLM >= {since}.",))
    return FitOptions()


def _dcp_option(s: Sizing) -> FitOptions:
    tp = s.par.tp
    for cand in range(2, tp + 1):
        if tp % cand:
            continue
        try:
            validate_parallel(s.shape, tp, cand)
        except SizingError:
            continue
        ok, need = _fits_with(s, decode_context_parallel_size=cand)
        if ok:
            return FitOptions((f"--decode-context-parallel-size {cand}",),
                              (f"Use --decode-context-parallel-size {cand}: each request's KV is split over "
                               f"{cand} ranks, {format_bytes(need)} per GPU for {s.chosen_len:,} tokens.",))
    return FitOptions()


def _util_option(s: Sizing) -> FitOptions:
    budget = s.memory.budget
    if budget is None:
        return FitOptions()
    top = max(s.memory.util, estimate(s.inputs.releases, "max_auto_gpu_memory_utilization"))
    if top > s.memory.util:
        higher = replace(budget, util=top)
        if higher.headroom >= 0 and s.layout.needed_bytes(s.chosen_len) + s.layout.bytes_per_block(0) <= higher.kv:
            return FitOptions((f"--gpu-memory-utilization {top:g}",),
                              (f"Raise --gpu-memory-utilization to {top:g}: {format_bytes(higher.kv)} for KV.",))
    return FitOptions()


def _blocks_option(s: Sizing) -> FitOptions:
    """With the cache pinned: the pin that holds one request of the chosen length, if the budget holds it."""
    length = max(s.chosen_len, 1)
    need = kv_blocks.blocks_for(s.layout, length)
    if need > s.budget_blocks:
        return FitOptions()
    return FitOptions((f"vllm_node_kv_cache_blocks >= {need:,}",),
                      (f"Raise vllm_node_kv_cache_blocks to at least {need:,}: one request of {length:,} token(s) "
                       f"plus the null block (the memory budget holds {s.budget_blocks:,}).",))


def fit_options(s: Sizing) -> FitOptions:
    """Concrete fixes for a context that does not fit, each checked with the same maths."""
    options: list[FitOptions] = []
    if s.kv_cache_blocks is not None:   # pinned: the pin or the length decides what one request gets
        options.append(_blocks_option(s))
    elif s.cuda:
        if not s.kv.dtype.startswith("fp8") and s.kv.dtype != "nvfp4":
            options.append(_fp8_option(s))
        if s.par.dcp == 1 and "sliding" not in s.shape.kinds:
            options.append(_dcp_option(s))
        options.append(_util_option(s))
    if s.safe > 0:
        nice = _power_of_two_at_most(s.safe)
        options.append(FitOptions((f"lower max-model-len to {nice:,}",),
                                  (f"Lower --max-model-len to {nice:,} (the largest safe length is {s.safe:,}).",)))
    return FitOptions(tuple(x for o in options for x in o.short), tuple(x for o in options for x in o.advice))


def headroom_advice(s: Sizing) -> list[str]:
    """A utilization that leaves no room for the CUDA context and NCCL outside vLLM's budget."""
    budget = s.memory.budget
    if not s.cuda or budget is None or budget.headroom >= 0:
        return []
    graphs = "" if budget.cg_subtracted else " and CUDA graphs"
    outside = budget.outside_torch + (0 if budget.cg_subtracted else budget.cudagraph)
    return [f"Lower --gpu-memory-utilization: {s.memory.util:g} leaves "
            f"{format_bytes(budget.budget_total - budget.requested)} "
            f"outside vLLM's budget, but the CUDA context, NCCL{graphs} need about {format_bytes(outside)}."]


def _check(knob: str, requested: Any, chosen: Any, fits: bool, message: str) -> dict[str, Any]:
    return {"knob": knob, "requested": requested, "chosen": chosen, "fits": bool(fits), "message": message}


def _util_check(s: Sizing) -> dict[str, Any]:
    budget, memory = s.memory.budget, s.memory
    message, ok = "", True
    if s.cuda and budget is not None:
        ok = budget.headroom >= 0
        message = (f"{memory.util:g} x {format_bytes(budget.budget_total)} (torch's total) = "
                   f"{format_bytes(budget.requested)} for vLLM; {format_bytes(budget.budget_total - budget.requested)} "
                   f"left for the CUDA context and NCCL (~{format_bytes(budget.outside_torch)})"
                   + ("" if budget.cg_subtracted else f" and CUDA graphs (~{format_bytes(budget.cudagraph)})"))
        if memory.util_auto:
            message = (f"auto (vLLM {s.inputs.vllm_version} default {memory.default_util:g}, raised up to "
                       f"{memory.max_util:g} when the context needs it): " + message)
    return _check("gpu_memory_utilization", s.inputs.gpu_memory_utilization, memory.util, ok,
                  message or "not used on cpu (VLLM_CPU_KVCACHE_SPACE sizes the KV cache)")


def checks(s: Sizing, len_message: str) -> list[dict[str, Any]]:
    """One check per sizing knob: requested, chosen, fits, and why."""
    inputs, par = s.inputs, s.par
    tp_message = (f"auto: the largest valid TP <= {s.device.count // par.pp} GPU(s) (valid: "
                  f"{', '.join(map(str, par.valid_tp))})" if par.tp_auto
                  else f"TP {par.tp} divides the {s.shape.num_heads} attention heads")
    return [
        _check("tensor_parallel_size", inputs.tensor_parallel_size, par.tp, True,
               tp_message + (f"; weights {format_bytes(s.weights)} per GPU" if s.cuda else "")),
        _check("pipeline_parallel_size", inputs.pipeline_parallel_size, par.pp, True,
               f"{par.pp} stage(s): {', '.join(str(len(x)) for x in s.layout.stages)} layers"
               + (f"; over {par.nodes} nodes of {s.device.count} GPUs ({par.stages_per_node} stage(s) per node, TP "
                  f"{par.tp} inside a node); KV bounded by stage {s.bound}" if par.nodes > 1 else "")),
        _check("decode_context_parallel_size", inputs.decode_context_parallel_size, par.dcp, True,
               "auto: 1 (DCP trades decode speed for KV room; see advice when the context does not fit)"
               if par.dcp_auto else f"DCP {par.dcp}: the KV cache of each request is split over {par.dcp} ranks"),
        _check("kv_cache_dtype", inputs.kv_cache_dtype, s.kv.dtype, True, s.kv.message),
        _util_check(s),
        _check("max_model_len", inputs.max_model_len, s.chosen_len, s.len_ok, len_message),
    ]


def kv_sentence(s: Sizing) -> str:
    """Plain words: where the per-token KV bytes come from."""
    shape, layout, kv_dtype = s.shape, s.layout, s.kv.dtype
    kinds: dict[str, int] = {}
    for spec in layout.specs:
        kinds[spec.kind] = kinds.get(spec.kind, 0) + 1
    parts = []
    if shape.mla:
        parts.append(f"{shape.num_layers if not shape.hybrid_state else kinds.get('mla', 0)} MLA layers x "
                     f"{shape.mla_dim} x {kv_bytes(kv_dtype)} B; the latent cache is replicated on every TP rank")
    else:
        heads = kv_heads_per_rank(shape.num_kv_heads, s.par.tp)
        rep = " (KV heads replicated: TP > KV heads)" if shape.num_kv_heads < s.par.tp else ""
        parts.append(f"{heads} of {shape.num_kv_heads} KV heads per rank{rep} x 2 (K,V) x {shape.head_dim} x "
                     f"{kv_bytes(kv_dtype) if kv_dtype != 'nvfp4' else 0.5625} B per attention layer")
    extra = [f"{n} {k}" for k, n in sorted(kinds.items()) if k not in ("full", "mla")]
    if extra:
        parts.append("layers: " + ", ".join(extra) + f"; {len(layout.groups)} KV cache groups, "
                     f"block {layout.block_size} tokens")
    if s.par.dcp > 1:
        parts.append(f"split over {s.par.dcp} DCP ranks")
    return f"KV cache: {layout.bytes_per_token:,} B per token on the most loaded rank, {kv_dtype} (" \
        + "; ".join(parts) + ")."


def reasons(s: Sizing, len_message: str) -> list[str]:
    """How the numbers were made, in plain words."""
    out = list(s.kv.reasons)
    budget = s.memory.budget
    if s.cuda and budget is not None:
        graphs = ("taken from the KV budget (vLLM >= 0.20 profiles them)." if budget.cg_subtracted
                  else "captured after the KV cache, out of the (1 - utilization) headroom.")
        out += [f"Weights: {format_bytes(budget.weights)} per GPU ({s.memory.weights_text}).",
                f"Activation peak: {format_bytes(budget.activation)} ({s.memory.activation_text}).",
                f"CUDA graphs: ~{format_bytes(budget.cudagraph)} " + graphs,
                f"Budget: ceil({s.memory.util:g} x {format_bytes(budget.budget_total)}) = "
                f"{format_bytes(budget.requested)}; "
                "minus weights, activations" + (", CUDA graphs" if budget.cg_subtracted else "")
                + f" leaves {format_bytes(budget.kv)} for the KV cache {s.where}"
                + (f", of which the {s.kv_cache_blocks:,} pinned blocks take {format_bytes(s.available)}."
                   if s.kv_cache_blocks is not None else ".")]
    out.append(kv_sentence(s))
    out.append(("Fits: " if s.len_ok else "Does not fit: ") + len_message + ".")
    return out
