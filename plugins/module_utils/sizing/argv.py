"""The ONLY place that renders vLLM command-line flags and environment from a plan."""

from __future__ import annotations

from .context import Sizing
from .units import GiB, is_auto


def planned_args(s: Sizing, kv_cache_dtype_arg: str) -> list[str]:
    """The sizing flags: what was planned, and the knobs the estimate depends on, so vLLM runs the plan."""
    inputs, par = s.inputs, s.par
    args = ["--tensor-parallel-size", str(par.tp)]
    if par.pp > 1:
        args += ["--pipeline-parallel-size", str(par.pp)]
    if par.dcp > 1:
        args += ["--decode-context-parallel-size", str(par.dcp)]
    args += ["--max-model-len", str(s.chosen_len)]
    if s.cuda:
        args += ["--gpu-memory-utilization", f"{s.memory.util:g}"]
    args += ["--kv-cache-dtype", kv_cache_dtype_arg]
    if not is_auto(inputs.block_size):
        args += ["--block-size", str(s.layout.block_size)]
    if inputs.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(s.batch.max_num_batched_tokens)]
    if inputs.max_num_seqs:
        args += ["--max-num-seqs", str(s.batch.max_num_seqs)]
    if inputs.enforce_eager and s.cuda:
        args += ["--enforce-eager"]
    return args


def planned_environment(s: Sizing) -> dict[str, str]:
    """Environment the plan needs: the CPU KV space, the pipeline layer partition."""
    environment: dict[str, str] = {}
    if not s.cuda:
        environment["VLLM_CPU_KVCACHE_SPACE"] = str(s.device.total // GiB)
    partition = s.inputs.pp_layer_partition
    if partition:
        environment["VLLM_PP_LAYER_PARTITION"] = (partition if isinstance(partition, str)
                                                  else ",".join(str(x) for x in partition))
    return environment
