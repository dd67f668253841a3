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
    stages: tuple[Budget, ...] = ()   # per pipeline stage (cuda); budget is stages[bound]
    bound: int = 0                     # the stage with the fewest KV blocks


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


def _embedding_bytes(shape: ModelShape, checkpoint_bytes: int) -> tuple[int, int]:
    """(input embedding, lm_head) bytes of the checkpoint, bf16 (exports keep them unquantized); at most half of
    the checkpoint each, so a model without vocab_size / hidden_size is split by layers alone."""
    one = min(shape.vocab_size * shape.hidden_size * 2, checkpoint_bytes // 2)
    return one, (0 if shape.tie_word_embeddings else one)


def weights_per_stage(shape: ModelShape, checkpoint_bytes: int, tp: int, stages: list[int],
                      rel: Releases) -> list[tuple[int, str]]:
    """Per pipeline stage (``stages``: layers of each), weights per GPU and how that was made.

    One stage: checkpoint / TP. Several: each stage holds its own layers' share of what is not embedding
    (vLLM's get_pp_indices split), the first the input embedding, the last the lm_head (a tied lm_head is a
    second copy there); then / TP, + what every TP rank holds whole (per layer), + a margin.
    """
    num_layers = max(1, sum(stages))
    embed, head = _embedding_bytes(shape, checkpoint_bytes) if len(stages) > 1 else (0, 0)
    per_layer = (checkpoint_bytes - embed - head) / num_layers
    out = []
    for rank, layers in enumerate(stages):
        if len(stages) == 1:
            held = float(checkpoint_bytes)
            text = f"{checkpoint_bytes / 1e9:.1f} GB checkpoint / (TP {tp} x PP 1)"
        else:
            ends = (embed if rank == 0 else 0) + ((head or embed) if rank == len(stages) - 1 else 0)
            held = per_layer * layers + ends
            text = (f"stage {rank}: {layers} of {num_layers} layers of the {checkpoint_bytes / 1e9:.1f} GB checkpoint"
                    + (" + the input embedding" if rank == 0 else "")
                    + (" + the lm_head" if rank == len(stages) - 1 else "") + f" / TP {tp}")
        shard = held / tp
        replicated = shape.replicated_bytes * (1 - 1 / tp) * (layers / num_layers if len(stages) > 1 else 1)
        margin = shard * estimate(rel, "weights_margin_fraction")
        text += f" = {format_bytes(shard)}"
        if replicated:
            text += (f", + {format_bytes(replicated)} of layers every TP rank holds whole (MLA q_a/kv_a projections, "
                     "MoE router)")
        text += f", + {estimate(rel, 'weights_margin_fraction') * 100:g} % margin"
        out.append((int(shard + replicated + margin), text))
    return out


def weights_per_gpu(shape: ModelShape, checkpoint_bytes: int, tp: int, pp: int, rel: Releases) -> tuple[int, str]:
    """Weights on the most loaded GPU (the heaviest pipeline stage under vLLM's default split)."""
    counts = [len(x) for x in pp_stages(shape.num_layers, pp)]
    return max(weights_per_stage(shape, checkpoint_bytes, tp, counts, rel))


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


def _stage_budgets(inputs: PlanInputs, shape: ModelShape, layout: KVLayout, device: Device, par: Parallel,
                   ckpt: int, activation: int) -> list[tuple[Budget, str]]:
    """One Budget (utilization still 0) per pipeline stage: its own weights, layers' CUDA graphs, the same
    activation peak and driver memory; and how its weights were made."""
    rel, version = inputs.releases, inputs.vllm_version
    counts = [len(x) for x in pp_stages(shape.num_layers, par.pp, inputs.pp_layer_partition)]
    spec = speculative.resolve(inputs.config, inputs.speculative_config)
    adapters = lora.resolve(inputs.enable_lora, inputs.max_loras, inputs.max_lora_rank)
    non_torch = int(estimate(rel, "cuda_context_gib") * GiB
                    + (estimate(rel, "nccl_gib_if_distributed") * GiB if par.tp * par.pp > 1 else 0))
    out = []
    for rank, (weights, text) in enumerate(weights_per_stage(shape, ckpt, par.tp, counts, rel)):
        if spec is not None and spec.draft_bytes and rank == par.pp - 1:
            # The draft model runs with the target's tensor parallel size, on the last pipeline stage.
            weights += spec.draft_bytes // par.tp
            text += f", + {format_bytes(spec.draft_bytes // par.tp)} of {spec.method} draft weights"
        if adapters is not None:
            extra = lora.slot_bytes_per_gpu(inputs.config, shape, adapters, par.tp, counts[rank])
            weights += extra
            text += f", + {format_bytes(extra)} of LoRA slots ({adapters.max_loras} x rank {adapters.max_lora_rank})"
        cudagraph = 0 if inputs.enforce_eager else int(
            estimate(rel, "cudagraph_base_gib") * GiB
            + len(layout.stages[rank]) * estimate(rel, "cudagraph_per_layer_mib") * MiB)
        out.append((Budget(device.total, 0.0, weights, activation, cudagraph,
                           bool(rule(rel, "cudagraph_memory_subtracted", version)), non_torch), text))
    return out


def bounding_stage(layout: KVLayout, available: tuple[int, ...]) -> int:
    """The stage whose memory holds the fewest KV blocks (vLLM's engine takes the minimum over workers)."""
    return min(layout.active_stages(), key=lambda s: (layout.stage_blocks(available, s), available[s], -s))


def cuda_budget(inputs: PlanInputs, shape: ModelShape, layout: KVLayout, device: Device, par: Parallel,
                batch: Batch, needs: list[int]) -> MemoryBudget:
    """Per-GPU memory model per pipeline stage and the one utilization choice; SizingError when the weights
    cannot fit. ``budget`` is the bounding stage's (the fewest KV blocks).

    ``needs``: per stage, KV bytes (+ the null block) of the length the plan aims at, for the `auto` utilization.
    """
    rel, version = inputs.releases, inputs.vllm_version
    ckpt = _checkpoint_bytes(inputs.checkpoint_bytes)
    activation, activation_text = activation_peak(shape, batch, rel)
    bases = _stage_budgets(inputs, shape, layout, device, par, ckpt, activation)
    default_util = float(rule(rel, "gpu_memory_utilization_default", version))
    max_util = max(default_util, estimate(rel, "max_auto_gpu_memory_utilization"))
    util_auto = is_auto(inputs.gpu_memory_utilization)
    # One --gpu-memory-utilization for every rank: the highest any stage needs.
    util = max(_auto_util(base, default_util, max_util, need) for (base, _), need in zip(bases, needs, strict=True)) \
        if util_auto else _explicit_util(inputs.gpu_memory_utilization, default_util, version)
    for base, text in sorted(bases, key=lambda b: -b[0].fixed):
        _refuse_too_small(shape, replace(base, util=max(util, max_util)), ckpt, par, device.count, rel, text)
    stages = tuple(replace(base, util=util) for base, _ in bases)
    bound = bounding_stage(layout, tuple(b.kv for b in stages))
    return MemoryBudget(stages[bound], util, util_auto, default_util, max_util,
                        bases[bound][1], activation_text, stages=stages, bound=bound)


def cpu_budget(inputs: PlanInputs, shape: ModelShape, device: Device, par: Parallel) -> tuple[MemoryBudget, list[int]]:
    """On cpu the KV space is fixed (VLLM_CPU_KVCACHE_SPACE); (budget, weights per rank of each stage, for the
    report)."""
    ckpt = to_int("checkpoint_bytes", inputs.checkpoint_bytes) if inputs.checkpoint_bytes else 0
    if par.pp == 1 or not ckpt:
        weights = [ckpt // par.tp]
    else:
        counts = [len(x) for x in pp_stages(shape.num_layers, par.pp, inputs.pp_layer_partition)]
        weights = [w for w, _ in weights_per_stage(shape, ckpt, par.tp, counts, inputs.releases)]
    util = float(rule(inputs.releases, "gpu_memory_utilization_default", inputs.vllm_version))
    note = (f"cpu: the KV cache is exactly VLLM_CPU_KVCACHE_SPACE = {device.total // GiB} GiB per rank; "
            "weights and activations live in system RAM and are not budgeted here")
    return MemoryBudget(None, util, True, util, util, notes=(note,)), weights
