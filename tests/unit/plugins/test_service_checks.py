"""The service URL, the inference check's verdict and report, its HTTP calls against a fake vLLM server,
and the wait action's loop (with the probe module replaced by a scripted sequence)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from unittest import mock

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.action import vllm_service_wait as wait
from ansible_collections.vllm_node.vllm_node.plugins.filter.service_url import service_url
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import startup_phases
from ansible_collections.vllm_node.vllm_node.plugins.modules import inference_check_measure as measure

KEY = "sk-test"
MODEL = "tiny-llama"

# ---- one service URL ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "port", "expected"),
    [
        ("127.0.0.1", 8000, "http://127.0.0.1:8000"),
        ("10.1.2.3", "9000", "http://10.1.2.3:9000"),
        ("::1", 8000, "http://[::1]:8000"),
        ("[::1]", 8000, "http://[::1]:8000"),
        ("fd00::5", 8000, "http://[fd00::5]:8000"),
        # a wildcard listen address is reached on loopback (the probe runs on the node itself)
        ("0.0.0.0", 8000, "http://127.0.0.1:8000"),
        ("::", 8000, "http://127.0.0.1:8000"),
        ("", 8000, "http://127.0.0.1:8000"),
        ("node1.example", 8000, "http://node1.example:8000"),
    ],
)
def test_service_url(address, port, expected):
    assert service_url(address, port) == expected


@pytest.mark.parametrize("port", [0, 65536, "http", None])
def test_service_url_refuses_a_bad_port(port):
    with pytest.raises(ValueError, match="port must be a number in 1..65535"):
        service_url("127.0.0.1", port)


# ---- the verdict -------------------------------------------------------------------------------------


def answer(status, body=None):
    """A request() result."""
    return {"status": status, "json": body, "text": json.dumps(body) if body is not None else "", "error": ""}


def observed(**changes) -> dict:
    """A healthy endpoint's answers, with changes."""
    base = {
        "health": answer(200, None),
        "models": answer(200, {"data": [{"id": MODEL}]}),
        "anonymous": answer(401, {"error": "Unauthorized"}),
        "chat": answer(200, {"choices": [{"message": {"content": "The sea is wide."}}],
                             "usage": {"completion_tokens": 5}}),
        "stream": {"time_to_first_token_s": 0.1, "tokens_per_second": 50.0, "completion_tokens": 64, "total_s": 1.4,
                   "text": "x", "reasoning": ""},
        "stream_error": "",
    }
    base.update(changes)
    return base


def pva(actual, planned):
    return {"kv_cache_tokens": {"actual": actual, "planned": planned,
                                "relative_difference": measure.relative_difference(actual, planned)}}


def test_verdict_passes_a_healthy_endpoint():
    assert measure.verdict(observed(), pva(2097152, 2097152), MODEL, enforce_plan=True) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"health": answer(503)}, "/health answered HTTP 503"),
        ({"models": answer(200, {"data": [{"id": "other"}]})}, "/v1/models lists ['other'], not \"tiny-llama\""),
        ({"anonymous": answer(200, {"data": []})},
         "a request without the API key was answered with HTTP 200 (expected 401): set vllm_node_api_key"),
        ({"chat": answer(500, {"error": "head_dim"})}, "chat completion answered HTTP 500: {\"error\": \"head_dim\"}"),
        ({"chat": answer(200, {"choices": [{"message": {"content": ""}}]})}, "chat completion returned no text"),
        ({"stream_error": "timed out"}, "streamed chat completion failed: timed out"),
    ],
)
def test_verdict_names_each_finding(changes, expected):
    failures = measure.verdict(observed(**changes), pva(None, None), MODEL)
    assert len(failures) == 1
    assert failures[0].startswith(expected)


def test_verdict_without_an_answer_says_why():
    gone = {"status": None, "json": None, "text": "", "error": "Connection refused"}
    failures = measure.verdict(observed(anonymous=gone), {}, MODEL)
    assert failures[0].startswith("a request without the API key was answered with no answer (Connection refused)")


def test_verdict_reasoning():
    assert measure.verdict(observed(), {}, MODEL, require_reasoning=True, reasoning_parser="deepseek_r1") == [
        "the catalog names reasoning parser deepseek_r1 but the answer has no reasoning content"]
    thinking = answer(200, {"choices": [{"message": {"content": None, "reasoning_content": "hm"}}]})
    assert measure.verdict(observed(chat=thinking), {}, MODEL, require_reasoning=True) == []
    # the stream's reasoning counts too (vLLM >= 0.33 names the field `reasoning`)
    streamed = dict(observed()["stream"], reasoning="hm")
    assert measure.verdict(observed(stream=streamed), {}, MODEL, require_reasoning=True) == []


def test_verdict_kv_tolerance_only_when_enforced():
    off = pva(2_120_000, 2_097_152)  # +1.09 %
    assert measure.verdict(observed(), off, MODEL) == []
    failures = measure.verdict(observed(), off, MODEL, enforce_plan=True, kv_tolerance=0.01)
    assert failures == ["vLLM logged 2120000 KV cache tokens, the plan predicted 2097152 (+1.09 %, tolerance 1 %)"]
    assert measure.verdict(observed(), off, MODEL, enforce_plan=True, kv_tolerance=0.02) == []
    assert measure.verdict(observed(), pva(None, 2_097_152), MODEL, enforce_plan=True) == [
        "could not compare KV cache tokens (vLLM logged None, plan 2097152)"]


def test_report_has_every_field_and_a_summary():
    plan = {"model": MODEL, "device": "cpu", "vllm_version": "0.32.0", "max_model_len": 4096,
            "vllm_args": ["--max-model-len", "4096"], "kv": {"tokens": 2097152}}
    startup = {"kv_cache_tokens": 2097152, "available_kv_cache_bytes": [], "model_loading_bytes": [],
               "max_concurrency": None}
    rows = measure.compare_with_plan(startup, plan)
    unit = {"seconds_to_healthy": 42}
    failures = ["x"]
    report = measure.build_report("node1", "2026-12-01T00:00:00+00:00", "http://127.0.0.1:8000", MODEL, plan,
                                  observed(), startup, unit, rows, failures)
    assert list(report) == ["host", "time", "url", "served_model_name", "plan", "health", "models",
                            "unauthenticated_status", "chat", "stream", "adapters", "startup", "unit",
                            "plan_vs_actual", "failures", "summary"]
    assert report["adapters"] == {}
    assert report["plan"] == {"model": MODEL, "device": "cpu", "vllm_version": "0.32.0", "max_model_len": 4096,
                              "vllm_args": ["--max-model-len", "4096"]}
    assert (report["health"], report["models"], report["unauthenticated_status"]) == (200, [MODEL], 401)
    assert report["chat"] == {"status": 200, "content": "The sea is wide.", "reasoning_content": None,
                              "usage": {"completion_tokens": 5}}
    assert report["stream"] == {"time_to_first_token_s": 0.1, "tokens_per_second": 50.0, "completion_tokens": 64,
                                "total_s": 1.4}
    assert report["summary"] == [
        "node1: http://127.0.0.1:8000 serves tiny-llama, anonymous -> HTTP 401",
        "chat: HTTP 200, TTFT 0.1 s, 50.0 tokens/s",
        "KV cache tokens: vLLM 2097152 vs plan 2097152 (+0.000 %)",
        "start to healthy: 42 s",
        "FAILED: x",
    ]


ADAPTER_ANSWER = answer(200, {"choices": [{"message": {"content": "Tide."}}], "usage": {"completion_tokens": 2}})


def test_each_lora_adapter_must_be_listed_and_answer_and_the_report_says_how_each_did():
    models = answer(200, {"data": [{"id": MODEL}, {"id": "a1"}, {"id": "a2"}]})
    good = observed(models=models, adapters={"a1": ADAPTER_ANSWER, "a2": ADAPTER_ANSWER})
    assert measure.verdict(good, {}, MODEL) == []
    gone = answer(404, {"error": {"message": "The model `a2` does not exist."}})
    empty = answer(200, {"choices": [{"message": {"content": ""}}]})
    failures = measure.verdict(observed(models=answer(200, {"data": [{"id": MODEL}, {"id": "a1"}]}),
                                        adapters={"a1": empty, "a2": gone}), {}, MODEL)
    assert failures == [
        "LoRA adapter a1: chat completion returned no text",
        "LoRA adapter a2 is not in /v1/models (['tiny-llama', 'a1']): it was not loaded; see the vllm_service role's "
        "lora_adapters_sync task and vLLM's journal",
        'LoRA adapter a2: chat completion answered HTTP 404: {"error": {"message": "The model `a2` does not exist."}}',
    ]
    report = measure.build_report("node1", "t", "http://127.0.0.1:8000", MODEL, {}, good, {}, {}, {}, [])
    assert report["adapters"] == {"a1": {"status": 200, "content": "Tide.", "usage": {"completion_tokens": 2}},
                                  "a2": {"status": 200, "content": "Tide.", "usage": {"completion_tokens": 2}}}
    assert "LoRA adapters: a1 HTTP 200, a2 HTTP 200" in report["summary"]


def test_report_summary_names_where_the_start_went():
    plan = {"model": MODEL, "device": "cpu"}
    startup = {"kv_cache_tokens": None, "available_kv_cache_bytes": [], "model_loading_bytes": [],
               "max_concurrency": None}
    lines = ["INFO 01-01 00:00:03 [api_utils.py:1] non-default args: {}",
             "INFO 01-01 00:00:09 [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: x",
             "INFO 01-01 00:00:10 [cpu_model_runner.py:68] Starting to load model m...",
             "INFO 01-01 00:00:10 [default_loader.py:501] Loading weights took 0.01 seconds",
             "INFO 01-01 00:00:30 [cpu_model_runner.py:91] Warming up done.",
             "INFO 01-01 00:00:30 [kv_cache_utils.py:1] CPU KV cache size: 2,097,152 tokens",
             "INFO 01-01 00:00:31 [core.py:402] init engine (profile, create kv cache, warmup model) took 21.00 s",
             "INFO:     Application startup complete."]
    entries = startup_phases.prefix_entries(lines, 2026)
    begin = entries[0][0] - 3
    unit = {"seconds_to_healthy": 35,
            "phases": startup_phases.startup_phases(entries, begin, begin + 35, "cpu")}
    report = measure.build_report("node1", "t", "http://127.0.0.1:8000", MODEL, plan, observed(), startup, unit,
                                  measure.compare_with_plan(startup, plan), [])
    assert report["summary"][3] == (
        "start to healthy: 35 s (imports 3.0 s, engine_start 6.0 s, workers_start 1.0 s, weights 0.0 s (vLLM 0.01 s),"
        " compile 20.0 s, memory_profiling not run, kv_cache 1.0 s, cuda_graphs not run, api_up 0.0 s,"
        " health_wait 4.0 s; total 35.0 s)")


# ---- the HTTP calls, against a fake vLLM ---------------------------------------------------------------


class FakeVllm(BaseHTTPRequestHandler):
    """/health, /v1/models and /v1/chat/completions (plain and streamed) as vLLM answers them, key required."""

    anonymous_status = 401
    asked: ClassVar[list[str]] = []  # the model of every POST, in order

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {KEY}"

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path == "/health":
            self._send(200, {})
        elif not self._authorized():
            self._send(self.anonymous_status, {"error": "Unauthorized"})
        else:
            self._send(200, {"data": [{"id": MODEL}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeVllm.asked.append(body.get("model"))
        if not self._authorized():
            self._send(401, {"error": "Unauthorized"})
            return
        if not body.get("stream"):
            self._send(200, {"choices": [{"message": {"content": "Waves."}}], "usage": {"completion_tokens": 2}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        tokens = body["max_tokens"]
        for _ in range(tokens):
            self.wfile.write(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n')
        usage = {"choices": [], "usage": {"completion_tokens": tokens, "prompt_tokens": 3}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture
def fake_vllm():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield service_url("127.0.0.1", server.server_address[1])
    server.shutdown()
    server.server_close()


def test_probe_endpoint_against_a_fake_vllm(fake_vllm):
    seen = measure.probe_endpoint(fake_vllm, KEY, MODEL, "hi", 8, 30)
    assert (seen["health"]["status"], seen["models"]["status"], seen["anonymous"]["status"]) == (200, 200, 401)
    assert seen["chat"]["json"]["choices"][0]["message"]["content"] == "Waves."
    assert seen["stream"]["completion_tokens"] == 8
    assert seen["stream"]["text"] == "a" * 8
    assert seen["stream"]["time_to_first_token_s"] is not None
    assert measure.verdict(seen, {}, MODEL) == []
    assert seen["adapters"] == {}


def test_probe_endpoint_asks_each_adapter_by_its_name(fake_vllm):
    seen = measure.probe_endpoint(fake_vllm, KEY, MODEL, "hi", 8, 30, adapters=["a1"])
    assert seen["adapters"]["a1"]["status"] == 200 and seen["not_asked"] == []
    assert "a1" in FakeVllm.asked


def test_in_check_mode_only_the_adapters_vllm_lists_are_asked(fake_vllm):
    FakeVllm.asked.clear()
    seen = measure.probe_endpoint(fake_vllm, KEY, MODEL, "hi", 8, 30, adapters=["a1"], served_only=True)
    assert seen["adapters"] == {} and seen["not_asked"] == ["a1"]
    assert "a1" not in FakeVllm.asked
    assert measure.verdict(seen, {}, MODEL) == []
    report = measure.build_report("node1", "t", fake_vllm, MODEL, {}, seen, {}, {}, {}, [])
    assert "LoRA adapters: none asked; not loaded yet (check mode): a1" in report["summary"]


def test_probe_endpoint_finds_an_open_endpoint(fake_vllm):
    with mock.patch.object(FakeVllm, "anonymous_status", 200):
        seen = measure.probe_endpoint(fake_vllm, KEY, MODEL, "hi", 4, 30)
    assert measure.verdict(seen, {}, MODEL)[0].startswith("a request without the API key was answered with HTTP 200")


def test_probe_endpoint_with_a_wrong_key_skips_the_stream(fake_vllm):
    seen = measure.probe_endpoint(fake_vllm, "sk-wrong", MODEL, "hi", 4, 30)
    assert seen["chat"]["status"] == 401
    assert seen["stream"] == {}
    failures = measure.verdict(seen, {}, MODEL)
    assert failures[0] == "/v1/models lists [], not \"tiny-llama\""
    assert failures[1].startswith("chat completion answered HTTP 401")


def test_probe_endpoint_when_nothing_listens():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    url = service_url("127.0.0.1", server.server_address[1])
    server.server_close()
    seen = measure.probe_endpoint(url, KEY, MODEL, "hi", 4, 5)
    assert seen["health"]["status"] is None and seen["health"]["error"]
    assert measure.verdict(seen, {}, MODEL)[0].startswith("/health answered no answer (")


# ---- the wait action ----------------------------------------------------------------------------------


def probe_result(status, elapsed, **extra):
    return {"status": status, "elapsed": elapsed, "since": 1000, "restarts": 0, "active_state": "activating",
            "sub_state": "start-post", "progress": [], "latest": "", "cause": [], "fix": "", **extra}


def run_wait(results, **args):
    """Run the action with the probe module replaced by `results` (one per call); (result, calls, printed)."""
    task = mock.MagicMock()
    task.args = {"unit": "vllm", "url": "http://127.0.0.1:8000/health", "timeout": 60, "interval": 15, **args}
    task.async_val = 0
    task.check_mode = False
    task.diff = False
    connection = mock.MagicMock()
    connection._shell.tmpdir = None
    action = wait.ActionModule(task, connection, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                               mock.MagicMock())
    calls = []

    def execute(module_name, module_args, task_vars):
        calls.append((module_name, dict(module_args)))
        return results[min(len(calls), len(results)) - 1]

    with mock.patch.object(action, "_execute_module", side_effect=execute), \
            mock.patch.object(wait.display, "display") as printed:
        result = action.run(task_vars={"inventory_hostname": "node1"})
    return result, calls, [c.args[0] for c in printed.call_args_list]


def test_wait_loops_until_healthy_and_prints_each_step():
    results = [probe_result("loading", 15, latest="Loading weights took 0.01 seconds"),
               probe_result("loading", 30, progress=["CPU KV cache size: 2,097,152 tokens"]),
               probe_result("healthy", 41, active_state="active", sub_state="running")]
    result, calls, printed = run_wait(results, since=999, not_invocation="old")
    assert result["status"] == "healthy" and result["steps"] == 3 and result["changed"] is False
    assert [name for name, _ in calls] == ["vllm_node.vllm_node.vllm_service_probe"] * 3
    assert calls[0][1] == {"unit": "vllm", "url": "http://127.0.0.1:8000/health", "wait": 15, "since": 999,
                           "not_invocation": "old"}
    # later steps continue the same watch
    assert calls[1][1]["since"] == 1000 and calls[1][1]["restarts"] == 0
    assert printed == [
        "node1: loading after 15 s (activating/start-post): Loading weights took 0.01 seconds",
        "node1: loading after 30 s (activating/start-post): CPU KV cache size: 2,097,152 tokens",
        "node1: healthy after 41 s (active/running): ",
    ]


def test_wait_stops_at_a_failure_with_its_cause():
    results = [probe_result("failed", 20, cause=["ValueError: too long"], fix="Set vllm_node_max_model_len: 5")]
    result, calls, _ = run_wait(results)
    assert (result["status"], result["steps"], len(calls)) == ("failed", 1, 1)
    assert result["fix"] == "Set vllm_node_max_model_len: 5"


def test_wait_stops_at_the_timeout():
    result, calls, _ = run_wait([probe_result("loading", 10), probe_result("loading", 61)], timeout=60)
    assert (result["status"], len(calls)) == ("loading", 2)


def test_wait_is_bounded_even_when_the_clock_does_not_move():
    # a node whose clock stands still would keep reporting 0 s: the step bound still ends the watch
    result, calls, _ = run_wait([probe_result("loading", 0)], timeout=60, interval=15)
    assert len(calls) == wait.max_steps(60, 15) == 7
    assert result["status"] == "loading"


def test_wait_returns_a_failed_probe_as_it_is():
    result, calls, printed = run_wait([{"failed": True, "msg": "systemctl show vllm failed (rc 1): denied"}])
    assert result["failed"] and "denied" in result["msg"] and len(calls) == 1 and printed == []


def test_wait_shows_the_processes_cpu_time_while_loading():
    """A start that takes long: each line says how many processes and how much CPU they used so far, so a stuck
    start (the sum stops growing) and a starved one (it grows slowly) read differently."""
    tree = [{"pid": 41, "name": "vllm", "state": "S", "cpu_seconds": 20.0, "wchan": "", "cpus": "0-1"},
            {"pid": 52, "name": "VLLM::EngineCore", "state": "R", "cpu_seconds": 11.4, "wchan": "", "cpus": "0"}]
    results = [probe_result("loading", 15, latest="Initializing a V1 LLM engine", processes=tree),
               probe_result("healthy", 30, active_state="active", sub_state="running", processes=[])]
    _result, _calls, printed = run_wait(results)
    assert printed[0] == ("node1: loading after 15 s (activating/start-post) [2 processes, 31 CPU-s]: "
                          "Initializing a V1 LLM engine")
    assert printed[1] == "node1: healthy after 30 s (active/running): "
