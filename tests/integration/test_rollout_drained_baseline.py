"""playbooks/rollout.yml's gate with rollout_baseline_source drained: the node is benchmarked once drained, before
anything changes, and its gate compares the changed node with those figures, not with the benchmark kept on the node
(measured at the last site.yml run, maybe under other load). The rollout's own steps (roles/rollout/tasks: check,
decide, drain, baseline_drained, enable, report) through ansible-playbook, on a node and a gateway that are both this
machine (connection local), behind the machine's own HAProxy (tests/integration/playbooks/rollout_drained_baseline.yml).
The node's service is a stand-in whose completions take a set time (harness.backends.BenchVllm), benchmarked by the
real inference_check_benchmark module through the inference check's benchmark task (tests/fixtures/vllm_bench stands
in for `vllm bench serve`); the change sets the stand-in's speed.

What must hold: with drained, the benchmark runs after the drain's wait and before the change; the gate passes a node
as fast as before although the kept record is far faster, and fails one the change made slower; the kept record is
not rewritten; the report names the baseline's source and time and shows both sides. With stored, the same node fails
against the kept record."""
from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import haproxy, playbook
from harness.backends import BenchVllm
from harness.project import PROJECT

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")
PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "rollout_drained_baseline.yml"
NODE, GATEWAY = "rollout-node", "rollout-gateway"
MODEL = "tiny-llama"
PLAN = {"model": MODEL, "served_model_name": MODEL, "gpu": "cpu", "gpu_count": 0, "vllm_version": "0.32.0"}
# each completion of the stand-in before the change (seconds); the gate's tolerance a factor 2 either way
BEFORE = 0.1
TOLERANCE = 1.0
# the record kept at the last site.yml run, on an idle machine: 20 times faster than the node is now
KEPT = {"time": "2026-12-01T08:00:00+00:00", "key": "kept",
        "levels": {"single": {"concurrency": 1, "successful": 4, "failed": 0, "output_tps": 12800.0,
                              "per_user_tps": 12800.0, "ttft_ms_p50": 5.0, "ttft_ms_p99": 6.0,
                              "tpot_ms_p50": 0.08, "tpot_ms_p99": 0.09, "itl_ms_p50": 0.08, "itl_ms_p99": 0.09}}}


@pytest.fixture()
def node() -> Iterator[BenchVllm]:
    server = BenchVllm(MODEL, BEFORE).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def gateway(tmp_path: Path, node: BenchVllm) -> Iterator[Path]:
    """HAProxy with the node as a server of backend vllm (checked on the stand-in's /health); its runtime socket."""
    with haproxy.one_server(tmp_path, NODE, node.port) as runtime:
        yield runtime


def roll(tmp_path: Path, gateway: Path, node: BenchVllm, source: str, after: float) -> tuple[str, dict[str, Any],
                                                                                            dict[str, Any], Path]:
    """The rollout's steps with rollout_baseline_source `source` and a change that makes each completion take `after`
    seconds; (output, what the play wrote, the node's report, the kept record's path)."""
    kept = tmp_path / "benchmark-last.json"
    kept.write_text(json.dumps(KEPT))
    python = tmp_path / "python"
    fake = PROJECT / "tests" / "fixtures" / "vllm_bench"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"children": {
        "vllm_nodes": {"hosts": {NODE: {**local, "vllm_node_plan": PLAN, "vllm_service_url": node.url}}},
        "gateways": {"hosts": {GATEWAY: local}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    result = tmp_path / "result.json"
    extra = {"rollout_gateway_socket": str(gateway), "rollout_report_dir": str(tmp_path / "reports"),
             "rollout_drain_timeout": 5, "rollout_drain_interval": 1, "rollout_page_cache": False,
             "rollout_gateway_timeout": 30, "rollout_baseline_source": source,
             "rollout_benchmark_tolerance": TOLERANCE, "result_file": str(result), "after_delay": after,
             "inference_check_benchmark_state_file": str(kept), "inference_check_benchmark_python": str(python),
             "inference_check_benchmark_num_prompts": 4, "inference_check_benchmark_bands": {}}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    rc, out, _ = playbook.run(PLAYBOOK, "-e", f"@{tmp_path / 'extra.json'}", inventory=str(tmp_path / "hosts.yml"),
                              env=playbook.environment(ANSIBLE_LOCALHOST_WARNING="false"), timeout=300)
    assert rc == 0 and result.exists(), out[-4000:]
    report = json.loads((tmp_path / "reports" / f"{NODE}.json").read_text())
    return out, json.loads(result.read_text()), report, kept


def phases(events: list[str]) -> list[str]:
    """The stand-in's events with repeats folded: ["metrics", "completion", "change", "completion"]."""
    return [event for i, event in enumerate(events) if i == 0 or events[i - 1] != event]


def test_drained_gates_the_node_against_itself_just_before_the_change(tmp_path: Path, gateway: Path,
                                                                        node: BenchVllm) -> None:
    out, result, report, kept = roll(tmp_path, gateway, node, "drained", after=BEFORE)
    assert result["failure"] == "", result["failure"]
    # the drain's wait read /metrics, then the benchmark ran (4 prompts), then the change, then the gate's benchmark
    assert phases(node.events) == ["metrics", "completion", "change", "completion"], node.events
    assert node.events.count("completion") == 8
    baseline = result["baseline"]
    assert baseline["source"] == "drained" and baseline["failure"] == ""
    assert baseline["levels"]["single"]["ttft_ms_p50"] >= 1000 * BEFORE, "the figures are the stand-in's, measured"
    assert result["stored"]["time"] == KEPT["time"]
    assert result["verdict"]["passed"], result["verdict"]
    previous = {row["figure"]: row["previous"] for row in result["verdict"]["rows"]}
    assert previous["ttft_ms_p50"] == baseline["levels"]["single"]["ttft_ms_p50"], "the gate read the drained figures"
    assert json.loads(kept.read_text()) == KEPT, "the pre-change benchmark rewrote the kept record"
    assert report["outcome"] == "changed" and report["baseline_source"] == "drained"
    assert report["baseline_time"] == baseline["time"] and report["stored_baseline_time"] == KEPT["time"]
    assert report["baseline_levels"] == baseline["levels"]
    assert report["gate_levels"]["single"]["ttft_ms_p50"] >= 1000 * BEFORE
    times = report["times"]
    assert times["drained"] <= times["baselined"]
    assert report["seconds"]["baseline"] is not None and report["seconds"]["baseline"] >= 0
    assert "gated against its benchmark of the moment it is drained" in re.sub(r"\s+", " ", out)


def test_drained_fails_a_node_the_change_made_slower(tmp_path: Path, gateway: Path, node: BenchVllm) -> None:
    _, result, report, kept = roll(tmp_path, gateway, node, "drained", after=5 * BEFORE)
    assert "GATE FAILED" in result["failure"] and "ttft_ms_p50" in result["failure"], result["failure"]
    assert phases(node.events) == ["metrics", "completion", "change", "completion"], node.events
    assert report["outcome"] == "failed" and report["baseline_source"] == "drained"
    assert report["gate_levels"]["single"]["ttft_ms_p50"] > 2 * report["baseline_levels"]["single"]["ttft_ms_p50"]
    assert json.loads(kept.read_text()) == KEPT


def test_stored_fails_the_same_node_against_the_kept_record(tmp_path: Path, gateway: Path, node: BenchVllm) -> None:
    _, result, report, kept = roll(tmp_path, gateway, node, "stored", after=BEFORE)
    assert "GATE FAILED" in result["failure"] and "previous run 5 " in result["failure"], result["failure"]
    assert phases(node.events) == ["metrics", "change", "completion"], "no benchmark before the change"
    assert result["baseline"] == KEPT and result["stored"] is None
    assert report["baseline_source"] == "stored" and report["baseline_time"] == KEPT["time"]
    assert report["baseline_levels"] == KEPT["levels"]


def test_the_test_playbook_gates_as_rollout_yml_does() -> None:
    """Its block's vars and its pre-change step are playbooks/rollout.yml's, so what it shows holds there."""
    def block(path: Path, name: str) -> dict[str, Any]:
        plays = yaml.safe_load(path.read_text())
        return next(task for play in plays for task in play.get("tasks", []) if task.get("name") == name)

    ours = block(PLAYBOOK, "Drain, change, gate and put back")
    theirs = block(PROJECT / "playbooks" / "rollout.yml",
                   "Drain, change, gate and put back a node whose service restarts")
    assert ours["vars"] == theirs["vars"]
    step = "Benchmark the drained node before the change as the gate's baseline (rollout_baseline_source drained)"
    names = [task["name"] for task in theirs["block"]]
    assert names.index(step) == names.index("Drain the node and wait for its requests") + 1
    assert names.index(step) < names.index("Note that the service may change from here on")
    assert [t for t in ours["block"] if t["name"] == step] == [t for t in theirs["block"] if t["name"] == step]
