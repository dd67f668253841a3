"""Tensor / pipeline / decode-context parallelism: what vLLM accepts, and the plan's `auto` policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import SizingError
from .model import ModelShape
from .units import is_auto, to_int


def kv_heads_per_rank(total_kv: int, tp: int) -> int:
    """KV heads each TP rank holds (one, replicated, when there are fewer KV heads than ranks)."""
    if total_kv >= tp:
        if total_kv % tp:
            raise SizingError(f"tensor_parallel_size {tp} does not divide the {total_kv} KV heads")
        return total_kv // tp
    if tp % total_kv:
        raise SizingError(f"tensor_parallel_size {tp} is not a multiple of the {total_kv} KV heads")
    return 1


def valid_tensor_parallel_sizes(shape: ModelShape, limit: int) -> list[int]:
    """TP sizes vLLM accepts: divide the attention heads; GQA KV heads divide TP or TP divides them."""
    sizes = []
    for tp in range(1, max(1, limit) + 1):
        if shape.num_heads % tp:
            continue
        kv_counts = {h for _, h in shape.layer_heads} or {shape.num_kv_heads}
        if not shape.mla and any(kv % tp and tp % kv for kv in kv_counts):
            continue
        if shape.gdn and (shape.gdn["linear_num_value_heads"] % tp or shape.gdn["linear_num_key_heads"] % tp):
            continue
        if shape.kda and shape.kda["num_heads"] % tp:
            continue
        sizes.append(tp)
    return sizes


def _validate_dcp(shape: ModelShape, tp: int, dcp: int) -> None:
    if tp % dcp:
        raise SizingError(f"decode_context_parallel_size {dcp} must divide tensor_parallel_size {tp}; "
                          f"valid choices: {', '.join(str(d) for d in range(1, tp + 1) if tp % d == 0)}")
    if shape.mla:
        return
    if tp <= shape.num_kv_heads:
        raise SizingError(
            f"decode context parallel for GQA needs tensor_parallel_size ({tp}) > the model's "
            f"{shape.num_kv_heads} KV heads; use decode_context_parallel_size 1 or a larger TP")
    limit = tp // shape.num_kv_heads
    q_per_kv = shape.num_heads // shape.num_kv_heads
    if dcp > limit or q_per_kv % dcp:
        valid = [d for d in range(1, limit + 1) if tp % d == 0 and q_per_kv % d == 0]
        raise SizingError(f"decode_context_parallel_size {dcp} is not valid for TP {tp} and "
                          f"{shape.num_kv_heads} KV heads; valid choices: {', '.join(map(str, valid))}")


def validate_parallel(shape: ModelShape, tp: int, dcp: int, max_tp: int | None = None) -> None:
    """SizingError for a TP that does not divide the heads, or an invalid DCP (vLLM's own checks).

    ``max_tp`` (GPUs per pipeline stage, when known) bounds the valid choices the message lists.
    """
    if tp not in valid_tensor_parallel_sizes(shape, tp):
        valid = valid_tensor_parallel_sizes(shape, max_tp if max_tp else max(tp, 16))
        raise SizingError(
            f"tensor_parallel_size {tp} does not divide the model's {shape.num_heads} attention heads"
            + ("" if shape.mla else f" / {shape.num_kv_heads} KV heads")
            + f"; valid choices: {', '.join(map(str, valid))}")
    if dcp > 1:
        _validate_dcp(shape, tp, dcp)


@dataclass(frozen=True)
class Parallel:
    """The resolved parallelism of a plan (one replica over `nodes` nodes of `count` GPUs each)."""

    tp: int
    pp: int
    dcp: int
    valid_tp: tuple[int, ...]
    tp_auto: bool
    dcp_auto: bool
    nodes: int = 1

    @property
    def stages_per_node(self) -> int:
        """Pipeline stages each node holds (whole stages: TP never crosses a node)."""
        return self.pp // self.nodes


def _cluster_pp(nodes: int, count: int, pipeline_parallel_size: Any, num_layers: int) -> int:
    """PP across nodes: 1 (the knob's default) or auto = one stage per node; else a multiple of node_count."""
    if is_auto(pipeline_parallel_size) or to_int("pipeline_parallel_size", pipeline_parallel_size) == 1:
        pp = nodes
    else:
        pp = to_int("pipeline_parallel_size", pipeline_parallel_size)
        if pp < 1 or pp % nodes:
            raise SizingError(
                f"pipeline_parallel_size {pp} does not spread over {nodes} nodes: each node must hold whole "
                f"pipeline stages (tensor parallelism stays inside a node), so use a multiple of node_count "
                f"({', '.join(str(nodes * k) for k in range(1, 4))}) or leave it at 1 for one stage per node")
        if pp > nodes * count:
            raise SizingError(f"pipeline_parallel_size {pp} needs {pp} GPUs; {nodes} nodes x {count} GPUs have "
                              f"{nodes * count}")
    if num_layers < pp:
        raise SizingError(f"{pp} pipeline stages need at least {pp} layers; the model has {num_layers}: use "
                          f"fewer nodes (node_count <= {num_layers})")
    return pp


def resolve_parallel(shape: ModelShape, count: int, tensor_parallel_size: Any, pipeline_parallel_size: Any,
                     decode_context_parallel_size: Any, node_count: Any = 1) -> Parallel:
    """TP, PP and DCP validated, 'auto' resolved by the documented policies.

    ``count`` is GPUs per node. With node_count N > 1 one replica spans the nodes: PP across them (N stages by
    default), TP inside a node (at most count / stages per node), as vLLM's mp multi-node runtime places ranks
    (TP innermost, so a node's ranks are whole TP groups).
    """
    nodes = to_int("node_count", node_count)
    if nodes < 1:
        raise SizingError(f"node_count must be >= 1 (nodes one replica spans), got {nodes}")
    if nodes == 1:
        pp = 1 if is_auto(pipeline_parallel_size) else to_int("pipeline_parallel_size", pipeline_parallel_size)
        if pp < 1 or pp > count:
            raise SizingError(f"pipeline_parallel_size {pp} needs {pp} GPUs; gpu_count is {count}")
    else:
        pp = _cluster_pp(nodes, count, pipeline_parallel_size, shape.num_layers)
    per_stage = count // (pp // nodes)
    valid_tp = valid_tensor_parallel_sizes(shape, per_stage)
    if not valid_tp:
        raise SizingError(f"no tensor parallel size fits {count} GPU(s) with PP {pp}")
    tp_auto = is_auto(tensor_parallel_size)
    if tp_auto:
        # Policy: one vLLM instance per node uses every GPU it may: the largest valid TP <= gpu_count / PP
        # (more KV memory and bandwidth; GQA KV and weights shrink per GPU).
        tp = max(valid_tp)
    else:
        tp = to_int("tensor_parallel_size", tensor_parallel_size)
        validate_parallel(shape, tp, 1, max_tp=per_stage)
        if nodes > 1 and tp > per_stage:
            raise SizingError(
                f"tensor_parallel_size {tp} does not fit inside one node: {count} GPUs per node hold "
                f"{pp // nodes} pipeline stage(s) of TP <= {per_stage}, and tensor parallelism never spans nodes "
                f"(its all-reduce runs every layer). Valid TP sizes here: {', '.join(map(str, valid_tp))}")
        if tp * pp > count * nodes:
            raise SizingError(f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs {tp * pp} GPUs; "
                              f"gpu_count is {count}. Valid TP sizes here: {', '.join(map(str, valid_tp))}")
    dcp_auto = is_auto(decode_context_parallel_size)
    dcp = 1 if dcp_auto else to_int("decode_context_parallel_size", decode_context_parallel_size)
    validate_parallel(shape, tp, dcp)
    return Parallel(tp, pp, dcp, tuple(valid_tp), tp_auto, dcp_auto, nodes)
