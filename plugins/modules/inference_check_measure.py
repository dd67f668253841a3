#!/usr/bin/python
"""Ansible module: check a vLLM endpoint from the node, measure it, compare it with the plan, give the verdict."""

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_check_measure
short_description: Check a vLLM endpoint, time it, hold its startup numbers against the plan (read-only)
description:
  - Sends from the node itself C(/health), C(/v1/models) with and without the key, one chat completion and one
    streamed chat completion (time to first token, decode tokens/s from the usage vLLM reports), and one chat
    completion asked of each LoRA adapter in O(adapters) by its name (each must be listed and answer text).
  - Reads vLLM's KV cache tokens, blocks and maximum concurrency from C(/metrics) (the C(vllm:cache_config_info)
    gauge's labels), and the journal of the unit's current invocation for what C(/metrics) lacks (KV cache bytes
    per rank, model loading; also the fallback for the KV figures) and the time from start to healthy with its
    parts (imports, weights, compile, memory profiling, KV cache, CUDA graphs, API up), and compares them with the
    plan.
  - Returns the verdict (RV(failures), RV(passed)) and the whole report; it does not fail on findings, so the
    caller can write the report first and judge afterwards.
  - Changes nothing.
options:
  url:
    description: Base URL of the server, e.g. C(http://127.0.0.1:8000) or C(http://[::1]:8000).
    type: str
    required: true
  api_key:
    description: Bearer key; empty sends every request without one.
    type: str
  model:
    description: Served model name; C(/v1/models) must list it.
    type: str
    required: true
  prompt:
    description: User message of the test completions.
    type: str
    default: Say hello.
  max_tokens:
    description: Tokens to generate per completion (the stream sets C(ignore_eos) so the rate stays meaningful).
    type: int
    default: 64
  unit:
    description: systemd unit whose journal is read.
    type: str
    default: vllm
  timeout:
    description: Seconds allowed per completion request.
    type: int
    default: 300
  plan:
    description: The vllm_node_plan to compare with (C(kv), C(per_gpu), and the fields copied into the report).
    type: dict
    default: {}
  host:
    description: Name of the node in the report and its summary (the inventory hostname).
    type: str
    default: ""
  require_reasoning:
    description: Fail when the answer carries no reasoning content.
    type: bool
    default: false
  reasoning_parser:
    description: The catalog's reasoning parser, named in the finding when O(require_reasoning) fails.
    type: str
    default: ""
  enforce_plan:
    description: Fail when vLLM's logged KV cache tokens differ from the plan by more than O(kv_tolerance).
    type: bool
    default: false
  kv_tolerance:
    description: Allowed relative difference of the KV cache tokens (0.01 is 1 %).
    type: float
    default: 0.01
  adapters:
    description:
      - Names of the LoRA adapters served (the plan's plan.lora.adapters); each is asked for a completion.
      - In check mode only those vLLM lists already (an adapter the run would add is not loaded yet).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
author: vllm-node
"""

EXAMPLES = r"""
- name: Check the endpoint and compare vLLM's numbers with the plan
  vllm_node.vllm_node.inference_check_measure:
    url: http://127.0.0.1:8000
    api_key: "{{ key }}"
    model: tiny-llama
    unit: vllm
    plan: "{{ vllm_node_plan }}"
    host: "{{ inventory_hostname }}"
    enforce_plan: "{{ vllm_node_plan.device == 'cpu' }}"
  register: measured

- name: Judge it
  ansible.builtin.assert:
    that: measured.passed
    fail_msg: "{{ measured.failures | join('; ') }}"
"""

RETURN = r"""
passed:
  description: True when RV(failures) is empty.
  returned: success
  type: bool
failures:
  description: What is wrong, one sentence each, with the fix where one is known.
  returned: success
  type: list
  elements: str
  sample: ["a request without the API key was answered with HTTP 200 (expected 401): set vllm_node_api_key ..."]
report:
  description:
    - The whole report, as written to C(artifacts/inference-check-<host>.json) by the inference_check role.
    - Keys C(host), C(time), C(url), C(served_model_name), C(plan), C(health), C(models), C(unauthenticated_status),
      C(chat), C(stream), C(startup), C(unit), C(plan_vs_actual), C(metrics_kv), C(prefix_cache) (C(queries),
      C(hits), C(hit_rate) since the start), C(failures), C(summary).
  returned: success
  type: dict
stream:
  description: The streamed completion (C(time_to_first_token_s), C(tokens_per_second), C(completion_tokens),
    C(total_s), C(text), C(reasoning)); empty when the chat completion failed.
  returned: success
  type: dict
startup:
  description: vLLM's logged startup numbers (C(kv_cache_tokens), C(available_kv_cache_bytes) per rank, ...).
  returned: success
  type: dict
plan_vs_actual:
  description: For C(kv_cache_tokens), C(kv_cache_blocks), C(kv_cache_bytes), C(weights_bytes_per_gpu),
    C(max_concurrency) the C(actual), C(planned), C(relative_difference) and C(source) (C(metrics) or C(journal)).
  returned: success
  type: dict
unit:
  description:
    - C(main_pid), C(restarts), C(invocation_id), C(started_at), C(healthy_at), C(seconds_to_healthy).
    - C(phases) splits the start into its parts from vLLM's own log (module_utils/startup_phases.py),
      C(parts) (each C(name), C(seconds) from the journal's timestamps, C(vllm_seconds) where vLLM logs its own
      figure, C(status) ran / not run / unknown), C(total_seconds), C(accounted_seconds), C(compile_cache)
      (hit, miss, load failed), C(figures), C(summary).
  returned: success
  type: dict
"""

import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.error import HTTPError

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import startup_phases, systemd
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.vllm_log import parse_startup
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.vllm_metrics import kv_from_metrics, prefix_cache

UNIT_PROPERTIES = ("InvocationID", "InactiveExitTimestamp", "ActiveEnterTimestamp", "MainPID", "NRestarts")
SHORT_TIMEOUT = 30


def relative_difference(actual: float | None, planned: float | None) -> float | None:
    """(actual - planned) / planned, or None when either side is unknown or the plan is zero."""
    if actual is None or planned in (None, 0):
        return None
    return (actual - planned) / planned


def compare_with_plan(startup: dict, plan: dict, metrics: dict | None = None) -> dict:
    """Plan vs what vLLM reported: KV tokens, blocks and max concurrency from /metrics (vllm:cache_config_info)
    where it exposes them, else from the start-up log; KV bytes (smallest rank) and weights per GPU from the log.

    Each row says where its actual figure came from (`source`: metrics, journal, or None when unknown).
    """
    kv = plan.get("kv") or {}
    per_gpu = plan.get("per_gpu") or {}
    metrics = metrics or {}
    available = min(startup["available_kv_cache_bytes"]) if startup["available_kv_cache_bytes"] else None
    weights = max(startup["model_loading_bytes"]) if startup["model_loading_bytes"] else None

    def pick(metric_key: str, journal_value: Any) -> tuple[Any, str | None]:
        """The /metrics figure when there is one, else the journal's."""
        if metrics.get(metric_key) is not None:
            return metrics[metric_key], "metrics"
        return journal_value, ("journal" if journal_value is not None else None)

    rows = {
        "kv_cache_tokens": (*pick("kv_cache_tokens", startup["kv_cache_tokens"]), kv.get("tokens")),
        "kv_cache_blocks": (*pick("num_gpu_blocks", None), kv.get("num_blocks")),
        "kv_cache_bytes": (available, "journal" if available is not None else None,
                           kv.get("available_bytes") or per_gpu.get("kv_cache_bytes")),
        "weights_bytes_per_gpu": (weights, "journal" if weights is not None else None, per_gpu.get("weights_bytes")),
        "max_concurrency": (*pick("max_concurrency", startup["max_concurrency"]), kv.get("max_concurrency")),
    }
    return {
        name: {"actual": actual, "planned": planned, "relative_difference": relative_difference(actual, planned),
               "source": source}
        for name, (actual, source, planned) in rows.items()
    }


def sse_events(response) -> Iterable[dict]:
    """Decoded `data:` events of a server-sent-event stream, until [DONE]."""
    for raw in response:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _headers(key: str | None, body: bool) -> dict:
    """Request headers: the bearer key when there is one, JSON when there is a body."""
    headers = {"Content-Type": "application/json"} if body else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def request(url: str, key: str | None = None, body: dict | None = None, timeout: int = SHORT_TIMEOUT) -> dict:
    """One request: {status, json, text, error}; an HTTP error status is an answer, not an exception.

    status is None when no answer came at all (refused, timed out); error then says why.
    """
    answer: dict[str, Any] = {"status": None, "json": None, "text": "", "error": ""}
    try:
        response = open_url(
            url, method="POST" if body is not None else "GET", headers=_headers(key, body is not None),
            data=json.dumps(body) if body is not None else None, timeout=timeout, validate_certs=False,
        )
        answer["status"] = response.status
        answer["text"] = response.read().decode("utf-8", "replace")
    except HTTPError as exc:
        answer["status"] = exc.code
        answer["text"] = exc.read().decode("utf-8", "replace") if exc.fp else ""
    except Exception as exc:  # pylint: disable=broad-except  # URLError, socket timeout, reset: "no answer"
        answer["error"] = str(exc)
        return answer
    with contextlib.suppress(ValueError):  # not every answer is JSON (e.g. a proxy's error page)
        answer["json"] = json.loads(answer["text"])
    return answer


def stream_completion(url: str, key: str | None, model: str, prompt: str, max_tokens: int, timeout: int) -> dict:
    """One streamed chat completion: time to first token, decode tokens/s, the text."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Random-weight test models may emit EOS at once; a fixed length keeps the rate meaningful.
        "ignore_eos": True,
    }
    start = time.monotonic()
    first = None
    text, reasoning, usage = [], [], {}
    response = open_url(
        f"{url}/v1/chat/completions", method="POST", headers=_headers(key, True), data=json.dumps(body),
        timeout=timeout, validate_certs=False,
    )
    with response:
        for event in sse_events(response):
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                if (piece or thought) and first is None:
                    first = time.monotonic()
                text.append(piece)
                reasoning.append(thought)
            if event.get("usage"):
                usage = event["usage"]
    end = time.monotonic()
    tokens = int(usage.get("completion_tokens") or 0)
    decode_seconds = end - first if first is not None else None
    return {
        "time_to_first_token_s": round(first - start, 4) if first is not None else None,
        "total_s": round(end - start, 4),
        "completion_tokens": tokens,
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        # tokens after the first one, over the time after the first one
        "tokens_per_second": round((tokens - 1) / decode_seconds, 2) if decode_seconds and tokens > 1 else None,
        "text": "".join(text),
        "reasoning": "".join(reasoning),
    }


def probe_endpoint(url: str, key: str | None, model: str, prompt: str, max_tokens: int, timeout: int,
                   adapters: Sequence[str] = (), served_only: bool = False) -> dict:
    """Every request of the check, as answers: health, models, anonymous, chat, the stream (when chat worked) and
    one chat completion asked of each LoRA adapter by its name (served_only: of those /v1/models lists, the others
    named in `not_asked`: check mode, where an adapter being added is not loaded yet)."""
    def chat(name: str) -> dict:
        """One greedy chat completion asked of the base model or an adapter, by its served name."""
        return request(f"{url}/v1/chat/completions", key,
                       {"model": name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                        "temperature": 0},
                       timeout)

    models = request(f"{url}/v1/models", key)
    listed = served_models({"models": models})
    asked = [name for name in adapters if name in listed or not served_only]
    observed: dict[str, Any] = {
        "health": request(f"{url}/health"),
        "models": models,
        "anonymous": request(f"{url}/v1/models"),
        "chat": chat(model),
        "stream": {},
        "stream_error": "",
        "adapters": {name: chat(name) for name in asked},
        "not_asked": [name for name in adapters if name not in asked],
    }
    if observed["chat"]["status"] == 200:
        try:
            observed["stream"] = stream_completion(url, key, model, prompt, max_tokens, timeout)
        except Exception as exc:  # pylint: disable=broad-except  # any transport or decode error is a finding
            observed["stream_error"] = str(exc)
    return observed


def served_models(observed: dict) -> list:
    """Ids listed by /v1/models (empty when the answer was not a model list)."""
    data = observed["models"]["json"]
    return [entry.get("id") for entry in data.get("data") or []] if isinstance(data, dict) else []


def first_message(answer: dict) -> dict:
    """The first choice's message of a chat completion's answer ({} when there is none)."""
    data = answer["json"]
    choices = data.get("choices") if isinstance(data, dict) else None
    return (choices[0].get("message") or {}) if choices else {}


def chat_message(observed: dict) -> dict:
    """The first choice's message of the check's chat completion ({} when there is none)."""
    return first_message(observed["chat"])


def reasoning_of(observed: dict) -> str:
    """Reasoning content of the chat answer, else of the stream ("" when neither has any)."""
    message = chat_message(observed)
    return message.get("reasoning_content", message.get("reasoning")) or observed["stream"].get("reasoning") or ""


def answer_text(answer: dict) -> str:
    """The first choice's content (or reasoning) of a chat completion's answer ("" when there is none)."""
    message = first_message(answer)
    return str(message.get("content") or message.get("reasoning_content") or message.get("reasoning") or "")


def adapter_failures(observed: dict) -> list[str]:
    """What is wrong with the LoRA adapters' answers, one sentence each ([] when each listed and answered text)."""
    failures = []
    served = served_models(observed)
    for name, answer in observed.get("adapters", {}).items():
        if name not in served:
            failures.append(f'LoRA adapter {name} is not in /v1/models ({served}): it was not loaded; see the '
                            "vllm_service role's lora_adapters_sync task and vLLM's journal")
        if answer["status"] != 200:
            failures.append(f"LoRA adapter {name}: chat completion answered {_status(answer)}: {answer['text'][:300]}")
        elif not answer_text(answer):
            failures.append(f"LoRA adapter {name}: chat completion returned no text")
    return failures


def _status(answer: dict) -> str:
    """HTTP status for a sentence, or why there was none."""
    return f"HTTP {answer['status']}" if answer["status"] is not None else f"no answer ({answer['error']})"


def verdict(observed: dict, pva: dict, served_model_name: str, require_reasoning: bool = False,
            reasoning_parser: str = "", enforce_plan: bool = False, kv_tolerance: float = 0.01) -> list[str]:
    """What is wrong with the endpoint, one sentence each (with the fix where one is known); [] means it passed."""
    failures = adapter_failures(observed)
    if observed["health"]["status"] != 200:
        failures.append(f"/health answered {_status(observed['health'])}")
    served = served_models(observed)
    if served_model_name not in served:
        failures.append(f'/v1/models lists {served}, not "{served_model_name}"')
    anonymous = observed["anonymous"]["status"]
    if anonymous not in (401, 403):
        failures.append(
            f"a request without the API key was answered with {_status(observed['anonymous'])} (expected 401): "
            "set vllm_node_api_key or let vllm_service generate one"
        )
    chat = observed["chat"]
    reasoning = reasoning_of(observed)
    if chat["status"] != 200:
        failures.append(
            f"chat completion answered {_status(chat)}: {chat['text'][:300]} "
            "(on the CPU backend an unsupported head_dim gives HTTP 500 while /health is 200)"
        )
    elif not (chat_message(observed).get("content") or "") and not reasoning:
        failures.append("chat completion returned no text")
    if observed["stream_error"]:
        failures.append(f"streamed chat completion failed: {observed['stream_error']}")
    if require_reasoning and not reasoning:
        failures.append(
            f"the catalog names reasoning parser {reasoning_parser} but the answer has no reasoning content"
        )
    if enforce_plan:
        kv = pva.get("kv_cache_tokens") or {}
        difference = kv.get("relative_difference")
        if difference is None:
            failures.append(
                f"could not compare KV cache tokens (vLLM logged {kv.get('actual')}, plan {kv.get('planned')})"
            )
        elif abs(difference) > kv_tolerance:
            failures.append(
                f"vLLM logged {kv['actual']} KV cache tokens, the plan predicted {kv['planned']} "
                f"({difference * 100:+.2f} %, tolerance {kv_tolerance * 100:g} %)"
            )
    return failures


def unit_times(state: dict) -> dict:
    """The unit's process and its start-to-healthy time from `systemctl show` properties."""
    started = systemd.unix_time(state.get("InactiveExitTimestamp"))
    active = systemd.unix_time(state.get("ActiveEnterTimestamp"))
    return {
        "main_pid": int(state.get("MainPID") or 0),
        "restarts": int(state.get("NRestarts") or 0),
        "invocation_id": state.get("InvocationID") or None,
        "started_at": started,
        "healthy_at": active,
        "seconds_to_healthy": active - started if started is not None and active is not None else None,
    }


def adapters_summary(observed: dict) -> list[str]:
    """The report's line on the LoRA adapters ([] when none are served): each one's answer, and those not asked."""
    answers = observed.get("adapters") or {}
    not_asked = observed.get("not_asked") or []
    if not answers and not not_asked:
        return []
    asked = ", ".join(f"{name} {_status(answer)}" for name, answer in answers.items())
    line = "LoRA adapters: " + (asked or "none asked")
    return [line + (f"; not loaded yet (check mode): {', '.join(not_asked)}" if not_asked else "")]


def prefix_cache_line(cache: dict) -> str:
    """The report's line for the prefix cache (vllm_metrics.prefix_cache)."""
    if cache.get("hit_rate") is None:
        return "prefix cache: no lookup yet (or not exposed)"
    return (f"prefix cache: {cache['hit_rate'] * 100:.1f} % of {int(cache['queries']):,} prompt tokens found cached "
            "since the start")


def _or_unknown(value: Any) -> Any:
    """'?' for a number that is not known, for the one-line summary."""
    return "?" if value is None else value


def build_report(host: str, when: str, url: str, served_model_name: str, plan: dict, observed: dict,
                 startup: dict, unit: dict, pva: dict, failures: list[str]) -> dict:
    """The report written to artifacts/inference-check-<host>.json, with its human summary."""
    message = chat_message(observed)
    stream = observed["stream"]
    served = served_models(observed)
    kv = pva.get("kv_cache_tokens") or {}
    difference = kv.get("relative_difference")
    chat_json = observed["chat"]["json"]
    adapters = {name: {"status": answer["status"], "content": answer_text(answer) or None,
                       "usage": answer["json"].get("usage") if isinstance(answer["json"], dict) else None}
                for name, answer in observed.get("adapters", {}).items()}
    return {
        "host": host,
        "time": when,
        "url": url,
        "served_model_name": served_model_name,
        "plan": {**{key: plan.get(key) for key in ("model", "device", "vllm_version", "max_model_len")},
                 "vllm_args": plan.get("vllm_args") or []},
        "health": observed["health"]["status"],
        "models": served,
        "unauthenticated_status": observed["anonymous"]["status"],
        "chat": {
            "status": observed["chat"]["status"],
            "content": message.get("content"),
            "reasoning_content": reasoning_of(observed) or None,
            "usage": chat_json.get("usage") if isinstance(chat_json, dict) else None,
        },
        "stream": {key: stream.get(key) for key in
                   ("time_to_first_token_s", "tokens_per_second", "completion_tokens", "total_s")},
        "adapters": adapters,
        "startup": startup,
        "unit": unit,
        "plan_vs_actual": pva,
        "failures": failures,
        "summary": [
            f"{host}: {url} serves {','.join(str(name) for name in served)}, "
            f"anonymous -> {_status(observed['anonymous'])}",
            f"chat: {_status(observed['chat'])}, TTFT {_or_unknown(stream.get('time_to_first_token_s'))} s, "
            f"{_or_unknown(stream.get('tokens_per_second'))} tokens/s",
            *adapters_summary(observed),
            f"KV cache tokens: vLLM {_or_unknown(kv.get('actual'))} vs plan {_or_unknown(kv.get('planned'))}"
            + (f" ({difference * 100:+.3f} %)" if difference is not None else ""),
            f"start to healthy: {_or_unknown(unit.get('seconds_to_healthy'))} s"
            + (f" ({unit['phases']['summary']})" if unit.get("phases") else ""),
            ("FAILED: " + "; ".join(failures)) if failures else "all checks passed",
        ],
    }


def main() -> None:
    """Probe, read the journal, compare, judge, report."""
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "model": {"type": "str", "required": True},
            "prompt": {"type": "str", "default": "Say hello."},
            "max_tokens": {"type": "int", "default": 64},
            "unit": {"type": "str", "default": "vllm"},
            "timeout": {"type": "int", "default": 300},
            "plan": {"type": "dict", "default": {}},
            "host": {"type": "str", "default": ""},
            "require_reasoning": {"type": "bool", "default": False},
            "reasoning_parser": {"type": "str", "default": ""},
            "enforce_plan": {"type": "bool", "default": False},
            "kv_tolerance": {"type": "float", "default": 0.01},
            "adapters": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    url = p["url"].rstrip("/")
    try:
        state = systemd.show(module.run_command, p["unit"], UNIT_PROPERTIES)
    except RuntimeError as exc:
        # The endpoint can still be checked; only the startup numbers and timings stay unknown.
        module.warn(f"{exc}; vLLM's startup numbers are not read")
        state = {}
    entries: list[startup_phases.Entry] = []
    if state.get("InvocationID"):
        rc, out, _err = module.run_command(
            ["journalctl", f"_SYSTEMD_INVOCATION_ID={state['InvocationID']}", "-o", "json", "--no-pager"]
        )
        entries = startup_phases.journal_entries(out.splitlines()) if rc == 0 else []
    lines = [message for _when, message in entries]
    startup = parse_startup(lines)
    observed = probe_endpoint(url, p["api_key"], p["model"], p["prompt"], p["max_tokens"], p["timeout"],
                              p["adapters"], served_only=module.check_mode)
    scrape = request(f"{url}/metrics", p["api_key"])
    metrics = kv_from_metrics(scrape["text"]) if scrape["status"] == 200 else {}
    pva = compare_with_plan(startup, p["plan"], metrics)
    failures = verdict(observed, pva, p["model"], p["require_reasoning"], p["reasoning_parser"],
                       p["enforce_plan"], p["kv_tolerance"])
    unit = unit_times(state)
    unit["phases"] = startup_phases.startup_phases(entries, unit["started_at"], unit["healthy_at"],
                                                   str(p["plan"].get("device") or "cuda"))
    report = build_report(p["host"], datetime.now(UTC).isoformat(), url, p["model"], p["plan"], observed,
                          startup, unit, pva, failures)
    report["metrics_kv"] = metrics
    # the replica's prefix-cache hit rate since its start (a gateway without affinity spreads conversations: lower)
    report["prefix_cache"] = prefix_cache(scrape["text"]) if scrape["status"] == 200 else {}
    report["summary"].insert(-1, prefix_cache_line(report["prefix_cache"]))
    module.exit_json(
        changed=False, passed=not failures, failures=failures, report=report, stream=observed["stream"],
        startup=startup, plan_vs_actual=pva, unit=unit,
    )


if __name__ == "__main__":
    main()
