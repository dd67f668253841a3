"""argv.py: the service's whole command from a plan (argv, environment, start timeout, fingerprint) and the
refusal of extra arguments that repeat or contradict a planned flag."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import sizing
from sizing_cases import KIMI, STORY_HARDWARE, TINY_LLAMA

MiB = 1 << 20
KIMI_SERVING = {"trust_remote_code": True, "reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2",
                "extra_args": ["--enable-auto-tool-choice", "--mm-encoder-tp-mode", "data"]}


@pytest.fixture
def cpu_plan(releases: dict[str, Any]) -> dict[str, Any]:
    plan = sizing.memory_plan(TINY_LLAMA, gpu={"kind": "cpu", "kv_cache_space_gib": 1}, releases=releases,
                              repo="vllm-node-test/tiny-llama", model_key="tiny-llama")
    return dict(plan, checkpoint_bytes=819840)


@pytest.fixture
def story_plan(releases: dict[str, Any]) -> dict[str, Any]:
    plan = sizing.memory_plan(KIMI, releases=releases, kv_cache_dtype="bfloat16", max_model_len=131072,
                              gpu_memory_utilization=0.95, **STORY_HARDWARE)
    return dict(plan, checkpoint_bytes=591_000_000_000)


def test_cpu_demo_command_is_the_one_the_unit_ran(cpu_plan: dict[str, Any]) -> None:
    """The order the role used to assemble in YAML: node flags, the plan's, the catalog's, eager on cpu, extras."""
    service = sizing.service(cpu_plan, model_dir="/srv/vllm/models/vllm-node-test/tiny-llama",
                             listen_address="0.0.0.0", port=8000, serving={"trust_remote_code": False,
                                                                            "extra_args": []})
    assert service["argv"] == [
        "--model", "/srv/vllm/models/vllm-node-test/tiny-llama", "--served-model-name", "vllm-node-test/tiny-llama",
        "--host", "0.0.0.0", "--port", "8000", *cpu_plan["vllm_args"], "--enforce-eager"]
    # VLLM_HOST_IP and the socket interfaces are the vllm_service role's (one place, from the node count)
    assert service["environment"] == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENGINE_READY_TIMEOUT_S": "600"}
    # 819,840 bytes load in well under a second: vLLM's own 600 s for the engine, + 600 s of API-server imports.
    assert service["start_timeout"] == cpu_plan["startup"]["unit_start_timeout_seconds"] == 1200
    assert set(service) == {"argv", "environment", "start_timeout", "stop_timeout", "fingerprint", "listen_address",
                            "port", "model_dir", "lora_modules"}
    assert service["lora_modules"] == []
    assert service["argv"][:2] == ["--model", service["model_dir"]], "model_dir is --model's value"
    assert (service["listen_address"], service["port"]) == ("0.0.0.0", 8000)


def test_the_graceful_shutdown_is_in_the_command_and_the_stop_timeout_follows(cpu_plan: dict[str, Any]) -> None:
    """--shutdown-timeout N after the planned flags, before the user's extras; systemd waits N + 30 s; 0 = no flag."""
    base = {"model_dir": "/m", "extra_args": ["--enable-prefix-caching"]}
    graceful = sizing.service(cpu_plan, shutdown_timeout=45, **base)
    assert graceful["argv"][-3:] == ["--shutdown-timeout", "45", "--enable-prefix-caching"]
    assert graceful["stop_timeout"] == 75
    abrupt = sizing.service(cpu_plan, shutdown_timeout=0, **base)
    assert "--shutdown-timeout" not in abrupt["argv"] and abrupt["stop_timeout"] == 30
    assert abrupt["fingerprint"] != graceful["fingerprint"]
    with pytest.raises(sizing.SizingError, match="preflight_shutdown_timeout"):
        sizing.service(cpu_plan, model_dir="/m", extra_args=["--shutdown-timeout=5"])
    with pytest.raises(sizing.SizingError, match="shutdown_timeout is -1"):
        sizing.service(cpu_plan, model_dir="/m", shutdown_timeout=-1)


def test_cpu_pipeline_stages_run_the_compiled_path(cpu_plan: dict[str, Any]) -> None:
    """vllm-cpu 0.32 with PP > 1 and --enforce-eager answers /health but fails the first request: no eager there."""
    staged = dict(cpu_plan, pipeline_parallel_size=2)
    argv = sizing.service(staged, model_dir="/m")["argv"]
    assert "--enforce-eager" not in argv
    assert "--enforce-eager" in sizing.service(cpu_plan, model_dir="/m")["argv"]


def test_story_command_carries_the_catalog_serving_block(story_plan: dict[str, Any]) -> None:
    service = sizing.service(story_plan, model_dir="/srv/vllm/models/nvidia/Kimi-K2.5-NVFP4", serving=KIMI_SERVING,
                             extra_args=["--enable-prefix-caching"], extra_environment={"NCCL_DEBUG": "WARN"})
    argv = service["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "131072"
    assert argv[-9:] == ["--trust-remote-code", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
                         "--enable-auto-tool-choice", "--mm-encoder-tp-mode", "data", "--enable-prefix-caching"]
    assert "--enforce-eager" not in argv
    startup = story_plan["startup"]
    assert service["environment"] == {"NCCL_DEBUG": "WARN",
                                      "VLLM_ENGINE_READY_TIMEOUT_S": str(startup["engine_ready_timeout_seconds"])}
    # From the plan's start-up budget: the heaviest GPU's weights at 138 MiB/s, + 300 s, x 2, + 600 s.
    load = -(-story_plan["per_gpu"]["weights_bytes"] // (138 * MiB))
    assert startup["predicted_load_seconds"] == load
    assert service["start_timeout"] == startup["unit_start_timeout_seconds"] == 2 * (load + 300) + 600


def test_a_tool_parser_turns_on_auto_tool_choice_once(story_plan: dict[str, Any]) -> None:
    serving = dict(KIMI_SERVING, extra_args=[])
    argv = sizing.service(story_plan, model_dir="/m", serving=serving)["argv"]
    assert argv.count("--enable-auto-tool-choice") == 1


def test_the_start_timeout_follows_the_plans_startup_or_the_override(story_plan: dict[str, Any]) -> None:
    startup = dict(story_plan["startup"], unit_start_timeout_seconds=4321)
    assert sizing.service(dict(story_plan, startup=startup), model_dir="/m")["start_timeout"] == 4321
    assert sizing.service(story_plan, model_dir="/m", start_timeout="900")["start_timeout"] == 900
    # A plan made without a start-up budget (by hand): from its checkpoint, 1200 s + 1 s per 100 MiB.
    bare = {k: v for k, v in story_plan.items() if k != "startup"}
    assert sizing.service(dict(bare, checkpoint_bytes=100 * MiB * 60), model_dir="/m")["start_timeout"] == 1260


@pytest.mark.parametrize(("name", "knob"), [("VLLM_ENGINE_READY_TIMEOUT_S", "vllm_node_load_mib_per_second"),
                                            ("VLLM_PP_LAYER_PARTITION", "vllm_node_pp_layer_partition")])
def test_an_extra_environment_the_plan_sizes_is_refused_naming_the_knob(story_plan: dict[str, Any], name: str,
                                                                        knob: str) -> None:
    with pytest.raises(sizing.SizingError, match=f"sets {name}, which the plan sizes; use {knob}"):
        sizing.service(story_plan, model_dir="/m", extra_environment={name: "1"})


def test_the_fingerprint_is_stable_and_covers_argv_environment_and_timeout(cpu_plan: dict[str, Any]) -> None:
    def fingerprint(**kwargs: Any) -> str:
        return str(sizing.service(cpu_plan, **dict({"model_dir": "/m"}, **kwargs))["fingerprint"])

    base = fingerprint()
    assert len(base) == 64 and base == fingerprint()
    assert base == fingerprint(extra_environment={})      # nothing added, nothing changed
    assert len({base, fingerprint(port=9000), fingerprint(extra_environment={"A": "1"}),
                fingerprint(start_timeout=60), fingerprint(extra_args=["--seed", "1"])}) == 5


@pytest.mark.parametrize(("extra", "knob"), [
    (["--max-model-len", "8192"], "vllm_node_max_model_len"),
    (["--max_model_len=8192"], "vllm_node_max_model_len"),
    (["--port", "9000"], "vllm_node_port"),
    (["--host=0.0.0.0"], "vllm_node_listen_address"),
    (["-tp", "2"], "vllm_node_tensor_parallel_size"),
    (["--tensor-parallel-size", "2"], "vllm_node_tensor_parallel_size"),
    (["--kv-cache-dtype", "fp8"], "vllm_node_kv_cache_dtype"),
    (["--gpu-memory-utilization", "0.99"], "vllm_node_gpu_memory_utilization"),
    (["--enforce-eager"], "preflight_enforce_eager"),
    (["--served-model-name", "x"], "vllm_node_served_model_name"),
    (["--model", "/elsewhere"], "vllm_node_model"),
    (["/elsewhere"], "vllm_node_model"),
    (["--api-key", "secret"], "vllm_node_api_key"),
    (["--seed", "1", "--max-num-seqs", "8"], "memory estimate"),
])
def test_extra_arguments_that_repeat_a_planned_flag_are_refused(story_plan: dict[str, Any], extra: list[str],
                                                                 knob: str) -> None:
    with pytest.raises(sizing.SizingError, match=knob):
        sizing.service(story_plan, model_dir="/m", extra_args=extra)


def test_the_catalogs_extra_args_are_held_to_the_same_rule(story_plan: dict[str, Any]) -> None:
    serving = dict(KIMI_SERVING, extra_args=["--max-model-len", "65536"])
    with pytest.raises(sizing.SizingError, match=r"catalog entry's serving.extra_args .*vllm_node_max_model_len"):
        sizing.service(story_plan, model_dir="/m", serving=serving)


def test_extra_environment_may_not_override_the_plan(cpu_plan: dict[str, Any]) -> None:
    with pytest.raises(sizing.SizingError, match=r"VLLM_CPU_KVCACHE_SPACE, which the plan sets \(VLLM_CPU_KVCACHE"):
        sizing.service(cpu_plan, model_dir="/m", extra_environment={"VLLM_CPU_KVCACHE_SPACE": "8"})


def test_bad_service_inputs_are_named(cpu_plan: dict[str, Any]) -> None:
    with pytest.raises(sizing.SizingError, match="model_dir"):
        sizing.service(cpu_plan)
    with pytest.raises(sizing.SizingError, match="unknown keyword argument"):
        sizing.service(cpu_plan, model_dir="/m", extra_argv=["--seed"])
    with pytest.raises(sizing.SizingError, match="the plan has no vllm_args"):
        sizing.service({"device": "cpu", "served_model_name": "x"}, model_dir="/m")
