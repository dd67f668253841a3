"""The per-GPU memory budget: weights, activation peak, CUDA graphs, driver memory, the utilization choice.

These are calibrated, conservative estimates of what vLLM measures at start-up (the calibration is written
down in plugins/README.md); every constant comes from the releases data's sizing_estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from . import lora, speculative
from .errors import SizingError
from .inputs import Device, PlanInputs
from .kv_layout import KVLayout, pp_stages
from .model import ModelShape
from .parallel import Parallel, valid_tensor_parallel_sizes
from .units import GiB, MiB, format_bytes, is_auto, to_int
from .versions import Releases, estimate, rule, section


@dataclass(frozen=True)
class Budget:
    """Per-GPU memory model for one utilization value."""

    total: int
    util: float
    weights: int
    activation: int
    cudagraph: int
    cg_subtracted: bool
    non_torch: int

    @property
    def requested(self) -> int:
        """What vLLM may use: ceil(total x utilization)."""
        return math.ceil(self.total * self.util)

    @property
    def kv(self) -> int:
        """What is left for the KV cache inside vLLM's budget."""
        return self.requested - self.weights - self.activation - (self.cudagraph if self.cg_subtracted else 0)

    @property
    def headroom(self) -> int:
        """What is left outside vLLM's budget after the CUDA context, NCCL (and graphs before 0.20)."""
        return self.total - self.requested - self.non_torch - (0 if self.cg_subtracted else self.cudagraph)

    @property
    def fixed(self) -> int:
        """Weights + activation peak (+ CUDA graphs when they come out of the budget)."""
        return self.weights + self.activation + (self.cudagraph if self.cg_subtracted else 0)


@dataclass(frozen=True)
class MemoryBudget:
    """The chosen budget and how it was made (texts for the plan's reasons)."""

    budget: Budget | None          # None on cpu: the KV space is fixed
    util: float
    util_auto: bool
    default_util: float
    max_util: float
    weights_text: str = ""
    activation_text: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Batch:
    """Tokens per step and sequences per step (vLLM's defaults for the GPU unless given)."""

    max_num_batched_tokens: int
    max_num_seqs: int


def resolve_batch(inputs: PlanInputs, device: Device, world: int) -> Batch:
    """max_num_batched_tokens / max_num_seqs: the knobs, else vLLM's get_batch_defaults for this GPU."""
    table = section(inputs.releases, "batch_defaults")
    if device.kind == "cpu":
        cpu = section(table, "cpu")
        default = (int(section(cpu, "max_num_batched_tokens_per_rank")) * world,
                   int(section(cpu, "max_num_seqs_per_rank")) * world)
    else:
        name = device.gpu_name.lower()
        rows = [row for row in section(table, "cuda")
                if device.total >= float(row.get("min_memory_gib", 0)) * GiB
                and not any(x in name for x in row.get("excludes", []))]
        if not rows:
            raise SizingError("no batch_defaults.cuda row of the releases data matches this GPU; add a row with "
                              "min_memory_gib: 0")
        default = (int(rows[0]["max_num_batched_tokens"]), int(rows[0]["max_num_seqs"]))
    mnbt = to_int("max_num_batched_tokens", inputs.max_num_batched_tokens) if inputs.max_num_batched_tokens \
        else default[0]
    seqs = to_int("max_num_seqs", inputs.max_num_seqs) if inputs.max_num_seqs else default[1]
    return Batch(mnbt, seqs)


def weights_per_gpu(shape: ModelShape, checkpoint_bytes: int, tp: int, pp: int, rel: Releases) -> tuple[int, str]:
    """Checkpoint / (TP x PP) + what every TP rank holds whole + a margin; and how that was made."""
    shard = checkpoint_bytes / (tp * pp)
    replicated = shape.replicated_bytes * (1 - 1 / tp) / pp
    margin = shard * estimate(rel, "weights_margin_fraction")
    text = f"{checkpoint_bytes / 1e9:.1f} GB checkpoint / (TP {tp} x PP {pp}) = {format_bytes(shard)}"
    if replicated:
        text += (f", + {format_bytes(replicated)} of layers every TP rank holds whole (MLA q_a/kv_a projections, "
                 "MoE router)")
    text += f", + {estimate(rel, 'weights_margin_fraction') * 100:g} % margin"
    return int(shard + replicated + margin), text


def activation_peak(shape: ModelShape, batch: Batch, rel: Releases) -> tuple[int, str]:
    """The profile run's torch peak above the weights; and how that was made."""
    mnbt = batch.max_num_batched_tokens
    parts = [("floor", estimate(rel, "activation_floor_gib") * GiB)]
    hidden = shape.hidden_size or 8192   # unknown hidden size: assume a large model (conservative)
    parts.append(("hidden states", mnbt * hidden * 2 * estimate(rel, "activation_hidden_multiplier")))
    if shape.top_k:
        parts.append(("MoE workspaces", mnbt * shape.top_k * hidden * 2 * estimate(rel, "moe_workspace_multiplier")))
    vocab = shape.vocab_size or 152064
    parts.append(("sampler logits", min(batch.max_num_seqs, mnbt) * vocab * 4 * estimate(rel, "sampler_logits_copies")))
    if shape.has_vision:
        parts.append(("encoder profiling", estimate(rel, "encoder_profile_gib") * GiB))
    parts.append(("non-torch growth", estimate(rel, "non_torch_growth_gib") * GiB))
    total = int(sum(v for _, v in parts))
    text = " + ".join(f"{name} {v / GiB:.2f}" for name, v in parts) + f" = {format_bytes(total)}"
    return total, f"profile run with {mnbt:,} batched tokens: {text}"


def _checkpoint_bytes(value: Any) -> int:
    if value in (None, "", "auto"):
        raise SizingError("checkpoint_bytes is needed for the weights estimate (model.safetensors.index.json "
                          "metadata.total_size, or the model catalog's checkpoint_bytes)")
    return to_int("checkpoint_bytes", value)


def _auto_util(base: Budget, default_util: float, max_util: float, need: int) -> float:
    """The release default, raised in 0.01 steps only as far as `need` KV bytes require, while the CUDA
    context + NCCL still fit outside the budget."""
    util = default_util
    step = default_util
    while round(step, 2) <= max_util + 1e-9:
        candidate = replace(base, util=round(step, 2))
        if candidate.headroom < 0:
            break
        util = round(step, 2)
        if candidate.kv >= need:
            break
        step += 0.01
    return util


def _explicit_util(value: Any, default_util: float, version: str) -> float:
    try:
        util = float(value)
    except (TypeError, ValueError):
        raise SizingError(f"gpu_memory_utilization must be a number in (0, 1] or 'auto', got {value!r}") from None
    if not 0 < util <= 1:
        raise SizingError(f"gpu_memory_utilization {util} is out of range; choose a value in (0, 1], "
                          f"e.g. {default_util} (vLLM {version} default) up to 0.95")
    return util


def _refuse_too_small(shape: ModelShape, best: Budget, ckpt: int, par: Parallel, count: int, rel: Releases,
                      weights_text: str) -> None:
    """Too small for the weights = not even at the highest utilization the plan would choose; an explicit
    low utilization is a knob that does not fit (advice), not an error."""
    if best.fixed < best.requested:
        return
    fitting = []
    for cand in valid_tensor_parallel_sizes(shape, 1024):
        weights, _ = weights_per_gpu(shape, ckpt, cand, par.pp, rel)
        if replace(best, weights=weights).fixed < best.requested:
            fitting.append(cand)
            break
    hint = (f"Use tensor_parallel_size >= {fitting[0]} (needs {fitting[0] * par.pp} such GPUs)"
            if fitting else "No tensor parallel size of this model fits this GPU")
    raise SizingError(
        f"GPU too small for the weights: {format_bytes(best.weights)} of weights per GPU ({weights_text}) plus "
        f"{format_bytes(best.activation)} activation peak and {format_bytes(best.cudagraph)} CUDA graphs exceed the "
        f"{format_bytes(best.requested)} vLLM may use ({best.util:g} x {format_bytes(best.total)}). {hint}; valid TP "
        f"sizes with {count} GPU(s): {', '.join(map(str, par.valid_tp))}")


def cuda_budget(inputs: PlanInputs, shape: ModelShape, layout: KVLayout, device: Device, par: Parallel,
                batch: Batch, need: int) -> MemoryBudget:
    """Per-GPU memory model and the utilization choice; SizingError when the weights cannot fit.

    ``need``: KV bytes (+ the null block) of the length the plan aims at, for the `auto` utilization.
    """
    rel, version = inputs.releases, inputs.vllm_version
    ckpt = _checkpoint_bytes(inputs.checkpoint_bytes)
    weights, weights_text = weights_per_gpu(shape, ckpt, par.tp, par.pp, rel)
    spec = speculative.resolve(inputs.config, inputs.speculative_config)
    if spec is not None and spec.draft_bytes:
        # The draft model runs with the target's tensor parallel size, on the last pipeline stage.
        weights += spec.draft_bytes // par.tp
        weights_text += f", + {format_bytes(spec.draft_bytes // par.tp)} of {spec.method} draft weights"
    adapters = lora.resolve(inputs.enable_lora, inputs.max_loras, inputs.max_lora_rank)
    if adapters is not None:
        stage_layers = max(len(s) for s in pp_stages(shape.num_layers, par.pp, inputs.pp_layer_partition))
        extra = lora.slot_bytes_per_gpu(inputs.config, shape, adapters, par.tp, stage_layers)
        weights += extra
        weights_text += (f", + {format_bytes(extra)} of LoRA slots ({adapters.max_loras} x rank "
                         f"{adapters.max_lora_rank})")
    activation, activation_text = activation_peak(shape, batch, rel)
    layers_per_stage = max(len(s) for s in layout.stages)
    cudagraph = 0 if inputs.enforce_eager else int(estimate(rel, "cudagraph_base_gib") * GiB
                                                   + layers_per_stage * estimate(rel, "cudagraph_per_layer_mib") * MiB)
    non_torch = int(estimate(rel, "cuda_context_gib") * GiB
                    + (estimate(rel, "nccl_gib_if_distributed") * GiB if par.tp * par.pp > 1 else 0))
    base = Budget(device.total, 0.0, weights, activation, cudagraph,
                  bool(rule(rel, "cudagraph_memory_subtracted", version)), non_torch)
    default_util = float(rule(rel, "gpu_memory_utilization_default", version))
    max_util = max(default_util, estimate(rel, "max_auto_gpu_memory_utilization"))
    util_auto = is_auto(inputs.gpu_memory_utilization)
    util = _auto_util(base, default_util, max_util, need) if util_auto \
        else _explicit_util(inputs.gpu_memory_utilization, default_util, version)
    _refuse_too_small(shape, replace(base, util=max(util, max_util)), ckpt, par, device.count, rel, weights_text)
    return MemoryBudget(replace(base, util=util), util, util_auto, default_util, max_util,
                        weights_text, activation_text)


def cpu_budget(inputs: PlanInputs, device: Device, par: Parallel) -> tuple[MemoryBudget, int]:
    """On cpu the KV space is fixed (VLLM_CPU_KVCACHE_SPACE); (budget, weights per rank for the report)."""
    weights = (to_int("checkpoint_bytes", inputs.checkpoint_bytes) // (par.tp * par.pp)) \
        if inputs.checkpoint_bytes else 0
    util = float(rule(inputs.releases, "gpu_memory_utilization_default", inputs.vllm_version))
    note = (f"cpu: the KV cache is exactly VLLM_CPU_KVCACHE_SPACE = {device.total // GiB} GiB per rank; "
            "weights and activations live in system RAM and are not budgeted here")
    return MemoryBudget(None, util, True, util, util, notes=(note,)), weights
