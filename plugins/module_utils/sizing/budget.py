"""The per-GPU memory budget: weights, activation peak, CUDA graphs, driver memory, the utilization choice.

These are calibrated, conservative estimates of what vLLM measures at start-up (the calibration is written
down in plugins/README.md and held by tests/unit/sizing_fullbudget.py against public full start-up logs); every
constant comes from the releases data's sizing_estimates, each with its evidence there. Where a rule is uncertain
it errs low on the KV cache, and the plan's notes say by how much (budget_notes).
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
    non_torch: int              # outside the budget: memory torch never sees + CUDA context + NCCL
    torch_total: int = 0        # torch's (cudaMemGetInfo) total, what vLLM budgets from; 0: the same as total

    @property
    def requested(self) -> int:
        """What vLLM may use: ceil(torch's total x utilization) (v1/worker/utils.py request_memory)."""
        return math.ceil((self.torch_total or self.total) * self.util)

    @property
    def budget_total(self) -> int:
        """The total vLLM's utilization multiplies: torch's."""
        return self.torch_total or self.total

    @property
    def outside_torch(self) -> int:
        """CUDA context + NCCL: the part of non_torch that torch's total still holds."""
        return self.non_torch - (self.total - self.budget_total)

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


def torch_total(inputs: PlanInputs, device: Device) -> tuple[int, str]:
    """The GPU total vLLM budgets from: torch's cudaMemGetInfo total, below nvidia-smi's memory.total.

    vLLM's requested memory is ceil(torch total x utilization) (v1/worker/utils.py request_memory). The driver
    keeps ~0.45-0.7 GiB that torch never sees (catalog torch_memory_gib, each with its public log: H100 79.11 of
    79.65 GiB, H200 139.8 of 140.4, B200 178.35 of 179.06, RTX PRO 6000 94.97 of 95.59, RTX 5090 31.4 of 31.84).
    A catalog GPU carries it; an explicit gpu_memory_bytes (nvidia-smi's total) loses the same difference; any
    other GPU loses sizing_estimates.torch_invisible_gib (more than any measured, so the plan errs low).
    """
    gpu = inputs.gpu or {}
    if gpu.get("torch_memory_gib") and gpu.get("memory_mib"):
        invisible = int(gpu["memory_mib"]) * MiB - round(float(gpu["torch_memory_gib"]) * GiB)
        text = f"torch sees {float(gpu['torch_memory_gib']):g} GiB (GPU catalog)"
    else:
        invisible = int(estimate(inputs.releases, "torch_invisible_gib") * GiB)
        text = f"torch sees nvidia-smi's total less {format_bytes(invisible)} (not measured for this GPU: assumed)"
    return device.total - max(invisible, 0), text


def mxfp4_padding_bytes(config: dict[str, Any], shape: ModelShape, compute_capability: Any, rel: Releases,
                        version: str, tp: int = 1, triton_kernels: bool = False) -> int:
    """Extra bytes per tensor parallel rank (all layers) vLLM allocates for MXFP4 MoE experts on GPUs without
    native FP4 (cc < 10).

    The backends round each rank's expert shard up to their tiles (release rule mxfp4_moe_alignment, with its
    evidence): gpt-oss's hidden 2880 becomes 3072 (+6.7 % per expert), and on Marlin the rank's intermediate
    (2880 / TP) is rounded up to 128: 2880 -> 2944 at TP 1, 720 -> 768 at TP 4 (+6.7 %, not the +2.2 % of the
    whole 2880: gpt-oss-120b at TP 4 on A100 loaded 17.22 GiB per GPU, vLLM 0.10.1, dennislee22/vLLM-benchmarking;
    the whole-model rounding gave 16.65). Expert bytes: layers x experts x 3 x hidden x intermediate x 4.25 bits
    (e2m1 + one e8m0 scale per 32 values). A row for the GPU's major is a backend that needs the triton_kernels
    package (Hopper's Triton matmul_ogs from 0.11): only with ``triton_kernels`` known installed, else vLLM falls
    back to Marlin, the "default" row.
    """
    tc = config.get("text_config") or config
    quant = tc.get("quantization_config") or config.get("quantization_config") or {}
    if str(quant.get("quant_method", "")).lower() != "mxfp4":
        return 0
    try:
        major = int(str(compute_capability).split(".")[0])
    except (TypeError, ValueError):
        major = 0   # unknown GPU: the padded layout (more weights, errs low on the KV cache)
    if major >= 10:
        return 0
    experts = int(tc.get("num_local_experts") or tc.get("n_routed_experts") or tc.get("num_experts") or 0)
    inter = int(tc.get("moe_intermediate_size") or tc.get("intermediate_size") or 0)
    hidden = shape.hidden_size
    if not (experts and inter and hidden):
        return 0
    table = rule(rel, "mxfp4_moe_alignment", version)
    row = table.get(str(major)) if triton_kernels else None
    align_h, align_i = (int(x) for x in (row or table["default"]))
    shard = -(-inter // max(tp, 1))
    padded = (-(-hidden // align_h) * align_h) * (-(-shard // align_i) * align_i)
    return int(shape.num_layers * experts * 3 * (padded - hidden * shard) * 4.25 / 8)


def skipped_mtp_bytes(config: dict[str, Any], shape: ModelShape, checkpoint_bytes: int, spec: Any) -> int:
    """Checkpoint bytes of MTP layers vLLM does not load: without MTP speculative decoding the model's
    load_weights skips them (deepseek_v2.py get_spec_layer_idx_from_weight_name -> continue, 0.32).

    Charged as the average layer's share of what is not embedding: an MTP module is a MoE layer plus its own
    embedding and head copies, heavier than the average (DeepSeek's 3 dense layers pull it down), so less is taken
    off than vLLM skips (DeepSeek-V3/R1 at TP 8: 1.3 GiB of the ~1.8 GiB per GPU; errs low).
    """
    layers = speculative.mtp_layers(config)
    if not layers or (spec is not None and spec.method == "mtp"):
        return 0
    embed, head = _embedding_bytes(shape, checkpoint_bytes)
    return int((checkpoint_bytes - embed - head) * layers / (shape.num_layers + layers))


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


def comm_growth(tp: int, rel: Releases) -> int:
    """Non-torch memory that communication adds inside vLLM's budget (after its start-up snapshot).

    NCCL connects its peers lazily, at the first collective of the profile run, so its buffers show up as
    non-torch growth inside the budget. Logged (H100, vLLM 0.11.0, llm-d-benchmark): non-torch 0.13 GiB at TP 1,
    0.54-0.55 GiB at TP 2 (Qwen3-32B, Llama-3.3-70B-FP8): +0.42 GiB for the one peer. Larger TP is not in the public
    logs found: every further peer is charged as much again (linear, the steeper of the simple extrapolations; see
    budget_notes).
    """
    return int(estimate(rel, "tp_comm_gib_per_peer") * GiB * max(tp - 1, 0))


def dense_mlp_bytes(shape: ModelShape, tokens: int, tp: int = 1) -> int:
    """The least a dense MLP holds at once in the profile's forward pass: its gate_up output and its activation's.

    vLLM's dense MLP (model_executor/models/llama.py LlamaMLP.forward, which Mistral, Qwen2/3 and others reuse)
    runs gate_up_proj into [tokens, 2 x intermediate / TP], then SiluAndMul writes [tokens, intermediate / TP]
    while reading it: 3 x intermediate / TP values of 2 bytes per token are live together. The forward estimate
    (hidden x activation_hidden_multiplier) misses this where the MLP is wide: Mistral-Small-3.2-24B (intermediate
    32,768 = 6.4 x hidden) at 8,192 tokens needs 1.5 GiB there against 1.25 (vLLM 0.11.0 logged a 2.12 GiB peak,
    llm-d-benchmark config_explorer/empirical-vllm-memory-results.md). A lower bound (residual and hidden copies
    are not added): 0 where the config states no dense intermediate size (MoE models: their workspaces count).
    """
    return tokens * 3 * shape.intermediate_size // max(tp, 1) * 2


def activation_peak(shape: ModelShape, batch: Batch, rel: Releases, tp: int = 1,
                    version: str = "0.33.0", flashinfer: bool = False) -> tuple[int, str]:
    """The profile run's torch peak above the weights (+ non-torch growth); and how that was made.

    vLLM's profile run (gpu_model_runner.py profile_run) is, in turn: the multimodal encoder on dummy items, a
    forward pass of max_num_batched_tokens, the sampler warm-up with max_num_seqs dummy requests
    (_dummy_sampler_run). Each phase's activations are freed before the next, so the peak is the largest of the
    three, not their sum. The sampler's peak (logits, penalties, softmax, top-k/top-p sort values and int64
    indices) is the release rule sampler_logits_copies x max_num_seqs x vocab x 4 B (10 copies while vLLM sorted
    the vocab, 2 since its top-k/top-p kernel does not; the evidence is in the releases data). With FlashInfer
    installed (``flashinfer``) the rule is sampler_logits_copies_flashinfer: the releases that sample with its kernel
    by default do not sort either.

    Nothing flat is added on top: vLLM's non-KV memory is the weights + the torch peak *allocated* during the profile
    + the non-torch growth (memory_profiling measures allocated_bytes.all.peak, not what the caching allocator
    reserved), so allocator slack is in none of its figures. The llm-d H100 logs (vLLM 0.11.0, five models, four
    vocabularies) put the whole torch peak at 9.56-9.64 logits copies + the dummy forward's output: the sampler
    rule alone, no floor beside it.
    """
    mnbt = batch.max_num_batched_tokens
    hidden = shape.hidden_size or 8192   # unknown hidden size: assume a large model (conservative)
    states, mlp = mnbt * hidden * 2 * estimate(rel, "activation_hidden_multiplier"), dense_mlp_bytes(shape, mnbt, tp)
    forward = [("dense MLP" if mlp > states else "hidden states", max(states, mlp))]
    if shape.top_k:
        forward.append(("MoE workspaces", mnbt * shape.top_k * hidden * 2 * estimate(rel, "moe_workspace_multiplier")))
    vocab = shape.vocab_size or 152064
    copies = rule(rel, "sampler_logits_copies_flashinfer" if flashinfer else "sampler_logits_copies", version)
    sampler = min(batch.max_num_seqs, mnbt) * vocab * 4 * float(copies)
    phases = [("forward (" + " + ".join(f"{n} {v / GiB:.2f}" for n, v in forward) + ")", sum(v for _, v in forward)),
              (f"sampler warm-up of {min(batch.max_num_seqs, mnbt):,} requests", sampler)]
    if shape.has_vision:
        phases.append(("encoder profiling", estimate(rel, "encoder_profile_gib") * GiB))
    name, peak = max(phases, key=lambda p: p[1])
    others = ", ".join(f"{n.split(' (')[0]} {v / GiB:.2f}" for n, v in phases if n != name)
    parts = [(f"{name} (the largest phase; {others})", peak)]
    parts.append(("non-torch growth", estimate(rel, "non_torch_growth_gib") * GiB))
    comm = comm_growth(tp, rel)
    if comm:
        parts.append((f"TP {tp} communication buffers", comm))
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
    total, _ = torch_total(inputs, device)
    # Outside vLLM's budget: what the driver keeps from torch, the CUDA context, NCCL's communicators.
    non_torch = int(device.total - total + estimate(rel, "cuda_context_gib") * GiB
                    + (estimate(rel, "nccl_gib_if_distributed") * GiB if par.tp * par.pp > 1 else 0))
    padding = mxfp4_padding_bytes(inputs.config, shape, device.compute_capability, rel, version, par.tp,
                                  inputs.mxfp4_triton_kernels)
    out = []
    for rank, (weights, text) in enumerate(weights_per_stage(shape, ckpt, par.tp, counts, rel)):
        if padding:
            extra = int(padding * counts[rank] / max(1, sum(counts)))
            weights += extra
            text += f", + {format_bytes(extra)} of MXFP4 experts padded to the tiles of a GPU without native FP4"
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
            + len(layout.stages[rank]) * estimate(
                rel, "cudagraph_per_moe_layer_mib" if shape.top_k else "cudagraph_per_layer_mib") * MiB)
        out.append((Budget(device.total, 0.0, weights, activation, cudagraph,
                           bool(rule(rel, "cudagraph_memory_subtracted", version)), non_torch, total), text))
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
    spec = speculative.resolve(inputs.config, inputs.speculative_config)
    skipped = skipped_mtp_bytes(inputs.config, shape, ckpt, spec)
    ckpt -= skipped
    activation, activation_text = activation_peak(shape, batch, rel, par.tp, version, inputs.flashinfer_sampler)
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
                        bases[bound][1], activation_text, notes=budget_notes(inputs, device, par, skipped),
                        stages=stages, bound=bound)


def budget_notes(inputs: PlanInputs, device: Device, par: Parallel, skipped_mtp: int = 0) -> tuple[str, ...]:
    """What the budget assumed where the evidence is thin, and by how much the KV estimate may err (low)."""
    rel = inputs.releases
    total, text = torch_total(inputs, device)
    notes = [f"GPU total: {text}, {format_bytes(total)} of nvidia-smi's {format_bytes(device.total)}"]
    if skipped_mtp:
        notes.append(f"weights: the checkpoint's MTP layers ({skipped_mtp / 1e9:.1f} GB, an average layer's share; "
                     "vLLM skips them without MTP speculative decoding) are not counted")
    if par.tp > 2:
        measured = estimate(rel, "tp_comm_gib_per_peer")
        notes.append(f"TP {par.tp} communication buffers inside the budget: {format_bytes(comm_growth(par.tp, rel))} "
                     f"({measured:g} GiB per peer, measured at TP 2 only); if they grow slower the KV estimate is "
                     f"low by up to {format_bytes(comm_growth(par.tp, rel) - comm_growth(2, rel))}, if faster it is "
                     "high by the difference")
    return tuple(notes)


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
