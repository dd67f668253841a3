"""The ONLY place that renders vLLM command-line flags and environment from a plan.

planned_args / planned_environment: the sizing flags of the plan (vllm_args, environment).
service_command: the service's whole command (argv, environment, start timeout, fingerprint) from a plan and
what the node adds (model directory, listen address, the catalog's serving block, the user's extras); extras
that repeat or contradict a planned flag are refused, naming the knob to set instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any

from . import lora, speculative
from .context import Sizing
from .errors import SizingError, refuse_unknown_keywords
from .units import GiB, MiB, is_auto, to_int


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
    if s.kv_cache_blocks is not None:
        args += ["--num-gpu-blocks-override", str(s.kv_cache_blocks)]
    if inputs.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(s.batch.max_num_batched_tokens)]
    if inputs.max_num_seqs:
        args += ["--max-num-seqs", str(s.batch.max_num_seqs)]
    if inputs.enforce_eager and s.cuda:
        args += ["--enforce-eager"]
    spec = speculative.resolve(inputs.config, inputs.speculative_config)
    if spec is not None:
        args += ["--speculative-config", spec.flag_json()]
    adapters = lora.resolve(inputs.enable_lora, inputs.max_loras, inputs.max_lora_rank)
    if adapters is not None:
        args += adapters.args()
    return args


def planned_environment(s: Sizing) -> dict[str, str]:
    """Environment the plan needs: the CPU KV space, the engine-ready timeout, the pipeline layer partition."""
    environment: dict[str, str] = {}
    if not s.cuda:
        environment["VLLM_CPU_KVCACHE_SPACE"] = str(s.device.total // GiB)
    # The engine core's start-up allowance, from the plan's predicted load (vLLM's default is 600 s).
    environment["VLLM_ENGINE_READY_TIMEOUT_S"] = str(dict(s.startup)["engine_ready_timeout_seconds"])
    if lora.resolve(s.inputs.enable_lora, s.inputs.max_loras, s.inputs.max_lora_rank) is not None:
        # adapters added or removed later are loaded and unloaded at runtime (module lora_adapters_sync)
        environment["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    partition = s.inputs.pp_layer_partition
    if partition:
        environment["VLLM_PP_LAYER_PARTITION"] = (partition if isinstance(partition, str)
                                                  else ",".join(str(x) for x in partition))
    return environment


# Flags the plan or a node-wide knob decides, and what to set instead. An extra argument repeating one of them
# would win over the planned value (argparse: the last occurrence wins) and run something that was not planned.
_OWNED_FLAGS = {
    "--model": "vllm_node_model (the model is served from vllm_node_model_root/<repo>)",
    "--served-model-name": "vllm_node_served_model_name",
    "--host": "vllm_node_listen_address",
    "--port": "vllm_node_port",
    "--api-key": "vllm_node_api_key (kept in a root-only EnvironmentFile, never on the command line)",
    "--tensor-parallel-size": "vllm_node_tensor_parallel_size",
    "--pipeline-parallel-size": "vllm_node_pipeline_parallel_size",
    "--decode-context-parallel-size": "vllm_node_decode_context_parallel_size",
    "--max-model-len": "vllm_node_max_model_len",
    "--gpu-memory-utilization": "vllm_node_gpu_memory_utilization",
    "--kv-cache-dtype": "vllm_node_kv_cache_dtype",
    "--num-gpu-blocks-override": "vllm_node_kv_cache_blocks (max-model-len, tokens and concurrency are sized from "
                                 "the pinned blocks)",
    "--enforce-eager": "preflight_enforce_eager (the cpu device always runs eager)",
    "--shutdown-timeout": "preflight_shutdown_timeout (the unit's TimeoutStopSec follows it)",
    "--block-size": "nothing: the plan uses the attention backend's block size, which the KV estimate depends on",
    "--max-num-batched-tokens": "nothing: the plan uses vLLM's default for this GPU, which the memory estimate "
                                "depends on",
    "--max-num-seqs": "nothing: the plan uses vLLM's default for this GPU, which the memory estimate depends on",
    "--enable-lora": "vllm_node_enable_lora (adapter memory is sized)",
    "--max-loras": "vllm_node_max_loras (adapter memory is sized)",
    "--max-lora-rank": "vllm_node_max_lora_rank (adapter memory is sized)",
    "--lora-modules": "vllm_node_lora_adapters (checked against the base, loaded without a restart)",
    "--speculative-config": "vllm_node_speculative_config (the drafter's KV layers and weights are sized)",
    "--trust-remote-code": "serving.trust_remote_code of the model's catalog entry",
    "--reasoning-parser": "serving.reasoning_parser of the model's catalog entry",
    "--tool-call-parser": "serving.tool_call_parser of the model's catalog entry",
}
_ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
            "-dcp": "--decode-context-parallel-size"}
# Environment the plan sets from a knob: an extra environment value would contradict the sizing.
_OWNED_ENVIRONMENT = {
    "VLLM_ENGINE_READY_TIMEOUT_S": "vllm_node_load_mib_per_second (the start-up budget) or preflight_start_timeout",
    "VLLM_PP_LAYER_PARTITION": "vllm_node_pp_layer_partition (the stages' layers are sized)",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "vllm_node_enable_lora (adapters are loaded and unloaded at runtime)",
}
# Plans without a start-up budget (made by hand): the unit's start timeout from the checkpoint, as before.
# After the graceful shutdown systemd waits this long for the engine's teardown before it kills what is left.
_TEARDOWN_SECONDS = 30
_LOAD_BYTES_PER_SECOND = 100 * MiB
_START_OVERHEAD_SECONDS = 1200


@dataclass(frozen=True)
class ServiceInputs:
    """What the node adds to a plan to run it: where the model is, where to listen, the catalog's serving block
    and the user's extras."""

    model_dir: str
    listen_address: str = "127.0.0.1"
    port: int = 8000
    serving: dict[str, Any] = field(default_factory=dict)   # trust_remote_code, *_parser, extra_args
    extra_args: tuple[str, ...] = ()
    extra_environment: dict[str, str] = field(default_factory=dict)
    start_timeout: int | None = None                         # None: sized from the checkpoint
    shutdown_timeout: int = 0                                # vLLM's --shutdown-timeout; 0: the flag is left out

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServiceInputs:
        """Validated inputs from the filter's keyword arguments."""
        known = {f.name for f in fields(cls)}
        refuse_unknown_keywords(kwargs, known)
        if not kwargs.get("model_dir"):
            raise SizingError("model_dir (the model's directory on the node) is required")
        values = dict(kwargs)
        values["port"] = to_int("port", kwargs.get("port", 8000))
        values["serving"] = dict(kwargs.get("serving") or {})
        values["extra_args"] = tuple(str(a) for a in kwargs.get("extra_args") or ())
        values["extra_environment"] = {str(k): str(v) for k, v in (kwargs.get("extra_environment") or {}).items()}
        timeout = kwargs.get("start_timeout")
        values["start_timeout"] = None if timeout in (None, "") else to_int("start_timeout", timeout)
        values["shutdown_timeout"] = to_int("shutdown_timeout", kwargs.get("shutdown_timeout") or 0)
        if values["shutdown_timeout"] < 0:
            raise SizingError(f"shutdown_timeout is {values['shutdown_timeout']}: give the seconds running requests "
                              "may finish in when the service stops (0 = vLLM aborts them)")
        return cls(**values)


def _flag_name(arg: str) -> str:
    name = arg.split("=", 1)[0]
    name = _ALIASES.get(name, name)
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def refuse_owned_flags(args: tuple[str, ...] | list[str], source: str) -> None:
    """SizingError for an argument that repeats or contradicts a planned flag, naming the knob to use."""
    if args and not args[0].startswith("-"):
        raise SizingError(f"{source} starts with {args[0]!r}, a positional model argument; the model is set by "
                          f"{_OWNED_FLAGS['--model']}")
    for arg in args:
        owner = _OWNED_FLAGS.get(_flag_name(arg)) if arg.startswith("-") else None
        if owner:
            raise SizingError(f"{_flag_name(arg)} in {source} is set by the plan or a knob; use {owner} instead")


def _serving_args(serving: dict[str, Any]) -> list[str]:
    """The catalog entry's serving flags: remote code, parsers (a tool parser needs auto tool choice), extras."""
    extra = [str(a) for a in serving.get("extra_args") or []]
    refuse_owned_flags(extra, "the catalog entry's serving.extra_args")
    args = ["--trust-remote-code"] if serving.get("trust_remote_code") else []
    if serving.get("reasoning_parser"):
        args += ["--reasoning-parser", str(serving["reasoning_parser"])]
    tool_parser = serving.get("tool_call_parser")
    if tool_parser and "--enable-auto-tool-choice" not in extra:
        args += ["--enable-auto-tool-choice"]
    if tool_parser:
        args += ["--tool-call-parser", str(tool_parser)]
    return args + extra


def _service_environment(plan: dict[str, Any], inputs: ServiceInputs) -> dict[str, str]:
    """The plan's environment, then the user's. Where vLLM's own inter-process sockets listen (VLLM_HOST_IP,
    GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) is not the plan's: the vllm_service role sets it, from the node count."""
    environment = {str(k): str(v) for k, v in (plan.get("environment") or {}).items()}
    owned = sorted(set(inputs.extra_environment) & set(_OWNED_ENVIRONMENT))
    if owned:
        raise SizingError(f"the extra environment sets {owned[0]}, which the plan sizes; use "
                          f"{_OWNED_ENVIRONMENT[owned[0]]} instead")
    clash = sorted(set(inputs.extra_environment) & set(environment))
    if clash:
        raise SizingError(f"the extra environment sets {', '.join(clash)}, which the plan sets "
                          f"({', '.join(f'{k}={environment[k]}' for k in clash)}); drop it from the extra environment")
    return dict(sorted({**environment, **inputs.extra_environment}.items()))


def service_command(plan: dict[str, Any], inputs: ServiceInputs) -> dict[str, Any]:
    """The service's whole vLLM command from a plan: argv (after the interpreter / entrypoint), environment,
    start and stop timeouts and a fingerprint over them (sha256, stable ordering)."""
    for key in ("served_model_name", "vllm_args", "device"):
        if key not in plan:
            raise SizingError(f"the plan has no {key}: pass the vllm_memory_plan result")
    refuse_owned_flags(inputs.extra_args, "the extra arguments")
    argv = ["--model", inputs.model_dir, "--served-model-name", str(plan["served_model_name"]),
            "--host", inputs.listen_address, "--port", str(inputs.port)]
    argv += [str(a) for a in plan["vllm_args"]] + _serving_args(inputs.serving)
    # The cpu build runs eager (no CUDA graphs; the plan's cuda rule is in planned_args), except with pipeline
    # stages: vllm-cpu 0.32's eager path answers /health but fails the first request (HTTP 500) there.
    if plan["device"] == "cpu" and int(plan.get("pipeline_parallel_size") or 1) == 1:
        argv += ["--enforce-eager"]
    if inputs.shutdown_timeout > 0:
        argv += ["--shutdown-timeout", str(inputs.shutdown_timeout)]
    argv += list(inputs.extra_args)
    if inputs.start_timeout is not None:
        timeout = inputs.start_timeout
    elif isinstance(plan.get("startup"), dict) and plan["startup"].get("unit_start_timeout_seconds"):
        timeout = to_int("the plan's startup.unit_start_timeout_seconds", plan["startup"]["unit_start_timeout_seconds"])
    else:
        checkpoint = to_int("the plan's checkpoint_bytes", plan.get("checkpoint_bytes", 0) or 0)
        timeout = _START_OVERHEAD_SECONDS + checkpoint // _LOAD_BYTES_PER_SECOND
    command = {"argv": argv, "environment": _service_environment(plan, inputs), "start_timeout": timeout,
               "stop_timeout": inputs.shutdown_timeout + _TEARDOWN_SECONDS}
    digest = hashlib.sha256(json.dumps(command, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    # Where it listens and what it reads, as the argv says it: the health URL is built from these (one source for
    # --host/--port), the rollout warms the page cache from model_dir (--model).
    # The adapters served at start are outside the fingerprint: an adapter change is loaded at runtime, not by a
    # restart; the unit reads them from a file of their own (vllm_service) when it starts.
    return dict(command, fingerprint=digest, listen_address=inputs.listen_address, port=inputs.port,
                model_dir=inputs.model_dir, lora_modules=lora_modules(plan))


def lora_modules(plan: dict[str, Any]) -> list[str]:
    """--lora-modules name=path ... for the plan's adapters ([] when it has none)."""
    adapters = (plan.get("lora") or {}).get("adapters") or []
    if not adapters:
        return []
    return ["--lora-modules"] + [f"{a['name']}={a['path']}" for a in adapters]
