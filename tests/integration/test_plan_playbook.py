"""playbooks/plan.yml end to end: the real ansible-playbook from .venv, run from the repository root.

The story: 262,144 tokens of bf16 MLA KV cache for nvidia/Kimi-K2.5-NVFP4 on 8 x RTX PRO 6000 Blackwell did
not fit beside the weights, and vLLM said so only after a 15-minute download and a 9-minute load. The plan
playbook must refuse that request in seconds, name a safe length, and explain the bad inputs it cannot plan.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_plan_refusals import refusal_budget

from harness import playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
# The generated test models are not in the product catalog: merged like a user's own models.
TEST_MODELS = ("-e", f"@{ROOT / 'tests/fixtures/catalog/models.yml'}")
STORY = ("-e", "vllm_node_model=kimi-k2.5-nvfp4", "-e", "vllm_node_gpu=rtx-pro-6000-blackwell",
         "-e", "vllm_node_gpu_count=8")


@dataclass
class Run:
    rc: int
    out: str
    seconds: float
    plan: dict[str, Any] | None


def plan(tmp_path: Path, *args: str) -> Run:
    """Run playbooks/plan.yml with extra -e arguments; the plan JSON goes to tmp_path/plan.json."""
    plan_file = tmp_path / "plan.json"
    plan_file.unlink(missing_ok=True)
    rc, out, seconds = playbook.run("playbooks/plan.yml", "-e", f"vllm_node_plan_file={plan_file}", *args, timeout=300)
    data = json.loads(plan_file.read_text()) if plan_file.exists() else None
    return Run(rc, out, seconds, data)


def one_line(text: str) -> str:
    """Ansible wraps long messages; compare on whitespace-collapsed text."""
    return re.sub(r"\s+", " ", text)


def test_story_262144_bf16_is_refused_in_seconds_with_a_safe_length(tmp_path: Path) -> None:
    run = plan(tmp_path, *STORY, "-e", "vllm_node_kv_cache_dtype=bfloat16", "-e", "vllm_node_max_model_len=262144",
               "-e", "vllm_node_gpu_memory_utilization=0.95")
    print(f"\nstory refusal: rc={run.rc} in {run.seconds:.1f} s")
    assert run.rc != 0, run.out
    assert run.seconds < refusal_budget()   # "fails in seconds": far below vLLM's ~24 min of download + load
    assert run.plan is not None, "the refused plan is still written, with its estimate"
    p = run.plan
    assert p["fits"] is False
    assert (p["kv_cache_dtype"], p["tensor_parallel_size"], p["max_model_len"]) == ("bfloat16", 8, 262144)
    assert p["attention"] == "mla"
    assert p["kv"]["bytes_per_token"] == 61 * 576 * 2  # MLA latent, replicated on every TP rank
    assert p["kv"]["needed_bytes"] > p["kv"]["available_bytes"]
    assert 131072 <= p["safe_max_model_len"] < 262144
    text = one_line(run.out)
    assert "do not fit" in text
    safe = p["safe_max_model_len"]
    assert f"{safe:,}" in text or str(safe) in text, "the refusal names the safe length"
    assert "17.16 GiB" in text or "17.2 GiB" in text, "the refusal states the estimate (bf16 MLA KV for 262,144)"
    assert "Fixes:" in text and p["advice"]


def test_story_262144_bf16_fits_on_two_nodes_with_tp8_pp2(tmp_path: Path) -> None:
    """The same request over two such nodes: TP 8 inside each node, PP 2 across them, each stage its own layers."""
    run = plan(tmp_path, *STORY, "-e", "vllm_node_node_count=2", "-e", "vllm_node_kv_cache_dtype=bfloat16",
               "-e", "vllm_node_max_model_len=262144")
    assert run.rc == 0, run.out
    assert run.plan is not None
    p, cluster = run.plan, run.plan["cluster"]
    assert p["fits"] is True and p["max_model_len"] == 262144
    assert (p["tensor_parallel_size"], p["pipeline_parallel_size"]) == (8, 2)
    assert (cluster["node_count"], cluster["gpus_per_node"]) == (2, 8)
    assert [s["layers"] for s in cluster["stages"]] == [[0, 31], [31, 61]]
    for stage in cluster["stages"]:
        layers = stage["layers"][1] - stage["layers"][0]
        assert layers * 576 * 2 * 262144 < stage["kv_cache_bytes"]   # this stage's bf16 MLA KV for one request
    assert p["kv"]["tokens"] == min(s["kv_tokens"] for s in cluster["stages"])
    text = one_line(run.out)
    assert "Plan fits: max-model-len 262144" in text and "TP 8 x PP 2 over 2 nodes" in text
    assert re.search(r"stage +node +layers", text), "the per-stage table is printed"
    assert p["environment"]["VLLM_ENGINE_READY_TIMEOUT_S"] == str(p["startup"]["engine_ready_timeout_seconds"])
    assert p["service"]["start_timeout"] == p["startup"]["unit_start_timeout_seconds"]


def test_story_without_max_model_len_recommends_a_safe_length(tmp_path: Path) -> None:
    run = plan(tmp_path, *STORY, "-e", "vllm_node_kv_cache_dtype=bfloat16",
               "-e", "vllm_node_gpu_memory_utilization=0.95")
    assert run.rc == 0, run.out
    p = run.plan
    assert p is not None and p["fits"] is True
    assert 131072 <= p["max_model_len"] <= p["safe_max_model_len"] < 262144
    assert p["kv"]["needed_bytes"] <= p["kv"]["available_bytes"]
    args = p["vllm_args"]
    assert args[args.index("--max-model-len") + 1] == str(p["max_model_len"])
    assert args[args.index("--kv-cache-dtype") + 1] == "bfloat16"
    assert (p["model"], p["repo"], p["gpu"], p["gpu_count"], p["device"]) == (
        "kimi-k2.5-nvfp4", "nvidia/Kimi-K2.5-NVFP4", "rtx-pro-6000-blackwell", 8, "cuda")
    assert "FITS" in run.out and f"{p['max_model_len']:,}" in run.out


def test_story_kv_auto_on_0_33_keeps_the_checkpoints_fp8_and_fits_262144(tmp_path: Path) -> None:
    run = plan(tmp_path, *STORY, "-e", "vllm_node_max_model_len=262144", "-e", "vllm_node_gpu_memory_utilization=0.95",
               "-e", "vllm_node_vllm_version=0.33.0")
    p = run.plan
    assert p is not None, run.out
    assert p["checkpoint_kv_cache_dtype"] == "fp8_e4m3"
    assert p["checkpoint_kv_cache_dtype_supported"] is True  # TRITON_MLA fp8 on SM120 since 0.18
    assert p["kv_cache_dtype"] == "fp8_e4m3"
    assert p["kv"]["bytes_per_token"] == 61 * 576
    # Half of the 17.16 GiB bf16 need: the full context fits, and the run says so.
    assert p["fits"] is True and run.rc == 0, run.out
    assert p["safe_max_model_len"] == 262144


def test_story_kv_auto_on_0_17_reports_the_unsupported_checkpoint_kv(tmp_path: Path) -> None:
    """Before 0.18 the only SM120 MLA backend refused FP8 KV: the plan must say so instead of choosing it."""
    run = plan(tmp_path, *STORY, "-e", "vllm_node_vllm_version=0.17.0", "-e", "vllm_node_gpu_memory_utilization=0.95")
    p = run.plan
    assert p is not None, run.out
    assert p["checkpoint_kv_cache_dtype"] == "fp8_e4m3"
    assert p["checkpoint_kv_cache_dtype_supported"] is False
    # The story's workaround, planned: bf16 KV passed explicitly (auto would make vLLM pick fp8 and fail).
    assert p["kv_cache_dtype"] == "bfloat16"
    assert p["vllm_args"][p["vllm_args"].index("--kv-cache-dtype") + 1] == "bfloat16"
    assert run.rc == 0 and p["fits"] is True and p["max_model_len"] >= 131072


@pytest.mark.parametrize("version", ["0.17.0", "0.33.0"])
def test_story_outcome_131072_fits_where_262144_did_not(tmp_path: Path, version: str) -> None:
    """What happened on the node: bf16 KV at 0.95 failed at 262,144 and served at 131,072."""
    run = plan(tmp_path, *STORY, "-e", "vllm_node_kv_cache_dtype=bfloat16", "-e", "vllm_node_max_model_len=131072",
               "-e", "vllm_node_gpu_memory_utilization=0.95", "-e", f"vllm_node_vllm_version={version}")
    assert run.rc == 0, run.out
    assert run.plan["fits"] is True and run.plan["max_model_len"] == 131072


@pytest.mark.parametrize(("args", "expected"), [
    (("-e", "vllm_node_model=kimi-k3", "-e", "vllm_node_gpu=b200", "-e", "vllm_node_gpu_count=8"),
     ["Unknown model 'kimi-k3'", "kimi-k2.5-nvfp4", "qwen3-235b-a22b", "vllm_node_extra_models"]),
    (("-e", "vllm_node_model=kimi-k2.5-nvfp4", "-e", "vllm_node_gpu=rtx-6000", "-e", "vllm_node_gpu_count=8"),
     ["Unknown GPU 'rtx-6000'", "rtx-pro-6000-blackwell", "b200"]),
    (("-e", "vllm_node_model=kimi-k2.5-nvfp4", "-e", "vllm_node_gpu_count=8"),
     ["no GPU was detected", "rtx-pro-6000-blackwell"]),
    (("-e", "vllm_node_model=kimi-k2.5-nvfp4", "-e", "vllm_node_gpu=b200"),
     ["vllm_node_gpu_count is auto", "vllm_node_gpu_count=8"]),
    ((*STORY, "-e", "vllm_node_gpu_memory_utilization=1.5"),
     ["vllm_node_gpu_memory_utilization must be auto or a fraction in (0, 1]"]),
    ((*STORY, "-e", "vllm_node_max_model_len=128k"),
     ["vllm_node_max_model_len must be auto or a positive integer", "'128k'"]),
    ((*STORY, "-e", "vllm_node_kv_cache_dtype=int8"),
     ["vllm_node_kv_cache_dtype", "bfloat16", "fp8_e4m3"]),
    ((*STORY, "-e", '{"vllm_node_extra_models": {"mine": {"repo": "acme/Mine-8B", "config": {}}}}'),
     ["vllm_node_extra_models['mine'].checkpoint_bytes is missing", "metadata.total_size",
      "vllm_node_extra_models['mine'].config is not a non-empty mapping"]),
    ((*TEST_MODELS, "-e", "vllm_node_model=tiny-llama", "-e", "vllm_node_gpu=rtx-pro-6000-blackwell",
      "-e", "vllm_node_gpu_count=1",
      "-e", "vllm_node_vllm_variant=cpu"),
     ["vllm_node_vllm_variant=cpu", "cpu build runs only on the cpu device"]),
])
def test_bad_inputs_are_named_with_the_valid_choices(
    tmp_path: Path, args: tuple[str, ...], expected: list[str]
) -> None:
    run = plan(tmp_path, *args)
    assert run.rc != 0, run.out
    text = one_line(run.out)
    for needle in expected:
        assert needle in text, needle
    assert run.plan is None, "nothing is planned from bad input"


def test_tp_that_does_not_divide_the_heads_is_refused_with_valid_choices(tmp_path: Path) -> None:
    run = plan(tmp_path, *STORY, "-e", "vllm_node_tensor_parallel_size=3")
    assert run.rc != 0, run.out
    text = one_line(run.out)
    assert "Cannot plan kimi-k2.5-nvfp4 on 8 x rtx-pro-6000-blackwell (vLLM 0.33.0): tensor_parallel_size 3" in text
    assert re.search(r"\b64\b", text) and "heads" in text  # names the problem: 3 does not divide 64 heads
    assert re.search(r"\b1, 2, 4, 8\b", text), "lists the tensor-parallel sizes that work"


def test_gpu_too_small_for_the_weights_is_refused(tmp_path: Path) -> None:
    run = plan(tmp_path, "-e", "vllm_node_model=llama-3.1-70b-instruct", "-e", "vllm_node_gpu=rtx-5090",
               "-e", "vllm_node_gpu_count=1")
    assert run.rc != 0, run.out
    text = one_line(run.out).lower()
    assert "weights" in text and ("too small" in text or "do not fit" in text or "does not fit" in text), run.out


def write_config(tmp_path: Path, name: str, config: dict[str, Any]) -> Path:
    model_dir = tmp_path / name
    model_dir.mkdir()
    path = model_dir / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_config_json_with_missing_fields_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, "broken", {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8,
                                             "num_key_value_heads": 8, "hidden_size": 1024})
    run = plan(tmp_path, "-e", f"vllm_node_model_config={path}", "-e", "vllm_node_checkpoint_bytes=2000000000",
               "-e", "vllm_node_gpu=l40s", "-e", "vllm_node_gpu_count=1")
    assert run.rc != 0, run.out
    text = one_line(run.out)
    assert "num_hidden_layers" in text and "Cannot plan broken" in text


def test_config_json_without_a_size_asks_for_checkpoint_bytes(tmp_path: Path) -> None:
    path = write_config(tmp_path, "unsized", {"num_hidden_layers": 2, "num_attention_heads": 4})
    run = plan(tmp_path, "-e", f"vllm_node_model_config={path}",
               "-e", "vllm_node_gpu=l40s", "-e", "vllm_node_gpu_count=1")
    assert run.rc != 0
    assert "vllm_node_checkpoint_bytes" in one_line(run.out)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hub")
    subprocess.run([sys.executable, str(ROOT / "tests/fixtures/tiny_models.py"), "--out", str(out)], check=True,
                   capture_output=True)
    return out / "vllm-node-test"


# vLLM's own logs with VLLM_CPU_KVCACHE_SPACE=1 (test-environment.md): "CPU KV cache size: N tokens".
@pytest.mark.parametrize(("model", "bytes_per_token", "vllm_tokens"), [
    ("tiny-llama", 512, 2_097_152),
    ("tiny-deepseek-v3", 2304, 466_032),
])
def test_cpu_plan_from_the_generated_files_matches_vllms_log(tmp_path: Path, hub: Path, model: str,
                                                             bytes_per_token: int, vllm_tokens: int) -> None:
    """The node's re-plan path: a real config.json + index read from disk, CPU device with 1 GiB of KV space."""
    run = plan(tmp_path, "-e", f"vllm_node_model_config={hub / model / 'config.json'}", "-e", "vllm_node_gpu=cpu",
               "-e", "vllm_node_vllm_variant=cpu", "-e", "vllm_node_max_model_len=4096")
    assert run.rc == 0, run.out
    p = run.plan
    assert p["model"] == model and p["config_source"] == "node"
    index = json.loads((hub / model / "model.safetensors.index.json").read_text())
    assert p["checkpoint_bytes"] == index["metadata"]["total_size"]
    assert p["device"] == "cpu" and p["environment"].get("VLLM_CPU_KVCACHE_SPACE") == "1"
    assert p["kv"]["bytes_per_token"] == bytes_per_token
    assert abs(p["kv"]["tokens"] - vllm_tokens) <= 0.01 * vllm_tokens


def test_config_dir_without_an_index_is_sized_by_its_shards(tmp_path: Path, hub: Path) -> None:
    """The node's fallback rule on the controller too: no index beside config.json -> the sum of the shards."""
    model = tmp_path / "tiny-llama-no-index"
    model.mkdir()
    shards = sorted((hub / "tiny-llama").glob("*.safetensors"))
    for src in [hub / "tiny-llama" / "config.json", *shards]:
        (model / src.name).write_bytes(src.read_bytes())
    run = plan(tmp_path, "-e", f"vllm_node_model_config={model / 'config.json'}", "-e", "vllm_node_gpu=cpu",
               "-e", "vllm_node_vllm_variant=cpu", "-e", "vllm_node_max_model_len=4096")
    assert run.rc == 0, run.out
    assert len(shards) == 3 and run.plan["checkpoint_bytes"] == sum(p.stat().st_size for p in shards)


def test_fp8kv_test_model_plans_fp8_from_its_quant_config(tmp_path: Path, hub: Path) -> None:
    run = plan(tmp_path, "-e", f"vllm_node_model_config={hub / 'tiny-deepseek-v3-fp8kv' / 'config.json'}",
               "-e", "vllm_node_gpu=rtx-pro-6000-blackwell", "-e", "vllm_node_gpu_count=1")
    assert run.rc == 0, run.out
    assert run.plan["checkpoint_kv_cache_dtype"] == "fp8_e4m3"


def test_second_run_changes_nothing(tmp_path: Path) -> None:
    args = (*STORY, "-e", "vllm_node_kv_cache_dtype=bfloat16")
    first = plan(tmp_path, *args)
    assert first.rc == 0, first.out
    plan_file = tmp_path / "plan.json"
    second = playbook.run("playbooks/plan.yml", "-e", f"vllm_node_plan_file={plan_file}", *args, timeout=300)
    assert second.rc == 0
    assert re.search(r"localhost\s*:\s*ok=\d+\s+changed=0\b", second.output), second.output[-2000:]
    assert json.loads(plan_file.read_text()) == first.plan


def test_speculative_lora_and_amx_knobs_reach_the_plan_and_the_unit(tmp_path: Path) -> None:
    """vllm_node_speculative_config=catalog takes the entry's eagle3 draft; LoRA knobs are sized and rendered."""
    run = plan(tmp_path, *STORY, "-e", "vllm_node_kv_cache_dtype=bfloat16", "-e", "vllm_node_max_model_len=131072",
               "-e", "vllm_node_speculative_config=catalog", "-e", '{"vllm_node_enable_lora": true}',
               "-e", "vllm_node_max_loras=2", "-e", "vllm_node_max_lora_rank=32")
    assert run.rc == 0, run.out
    p = run.plan
    assert p is not None and p["speculative_config"]["method"] == "eagle3"
    assert p["lora"] == {"max_loras": 2, "max_lora_rank": 32}
    argv = p["service"]["argv"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": "lightseekorg/kimi-k2.5-eagle3-mla", "num_speculative_tokens": 3}
    assert argv[argv.index("--max-loras") + 1] == "2" and argv[argv.index("--max-lora-rank") + 1] == "32"
    assert "--enable-lora" in argv


def test_a_speculative_knob_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    run = plan(tmp_path, *STORY, "-e", "vllm_node_speculative_config=eagle3")
    assert run.rc != 0
    assert "vllm_node_speculative_config must be {} (off), catalog" in one_line(run.out), run.out[-2000:]


def test_the_cpu_amx_knob_gives_the_amx_mla_block(tmp_path: Path) -> None:
    """tiny DeepSeek-V3 on the cpu build: 466,032 tokens with the reference kernel, 465,920 with AMX (real run)."""
    args = (*TEST_MODELS, "-e", "vllm_node_model=tiny-deepseek-v3", "-e", "vllm_node_gpu=cpu",
            "-e", "vllm_node_vllm_variant=cpu", "-e", "vllm_node_vllm_version=0.32.0", "-e", "vllm_node_gpu_count=1")
    plain = plan(tmp_path, *args)
    amx = plan(tmp_path, *args, "-e", '{"vllm_node_cpu_amx": true}')
    assert plain.rc == 0 and amx.rc == 0, plain.out + amx.out
    assert (plain.plan["kv"]["block_size"], amx.plan["kv"]["block_size"]) == (16, 128)
    assert (plain.plan["kv"]["tokens"], amx.plan["kv"]["tokens"]) == (466032, 465920)
