"""playbooks/observability.yml (role observability, scrape-config-only mode) with the real ansible-playbook, and its
alert rules through the real promtool (Debian's prometheus package; scripts/ensure-test-tools.sh extracts it).

Two nodes on the controller's local connection: node-a, a GPU node whose vLLM listens on a wildcard (targets on its
cluster address 10.0.0.11), node-b, a CPU node listening on loopback. The thresholds read a plan JSON with
kv.max_concurrency 3.2 (waiting threshold 4). tests/prometheus/vllm-node.rules.test.yml tests every alert firing and
not firing on the rendered rules; the same tests fail on those rules with a threshold moved.

Several models per node (vllm_node_instances): with a plan of two instances (chat, mla) each node gets one vLLM target
per instance (its own port, labelled instance_name and model), every serving alert is per instance and the waiting
threshold is each instance's own (tests/prometheus/vllm-node-instances.rules.test.yml); the same holds for the plan
that playbooks/plan.yml writes for a real split.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_plan_playbook import ROOT

import metric_names as mn
from harness.playbook import command, environment, run

PROMTOOLS = sorted((ROOT / ".cache" / "tools").glob("prometheus-*/promtool"))
PROMTOOL = PROMTOOLS[-1] if PROMTOOLS else None
RULES_TEST = ROOT / "tests" / "prometheus" / "vllm-node.rules.test.yml"
METRIC_FAMILIES = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32.0-metric-families.txt"
DCGM_EXPOSITION = ROOT / "tests" / "fixtures" / "dcgm_exporter" / "metrics"
INVENTORY = {
    "vllm_nodes": {
        "hosts": {
            "node-a": {"ansible_host": "10.0.0.11", "vllm_node_listen_address": "0.0.0.0"},
            "node-b": {"ansible_host": "10.0.0.12", "vllm_node_listen_address": "127.0.0.1",
                       "observability_dcgm_exporter": False},
        },
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
    }
}
PLAN = {"device": "cuda", "vllm_version": "0.32.0", "kv": {"max_concurrency": 3.2, "tokens": 177184}}
INSTANCES_RULES_TEST = ROOT / "tests" / "prometheus" / "vllm-node-instances.rules.test.yml"


def instance_row(name: str, port: int, concurrency: float, tokens: int) -> dict:
    """One instance of a split's plan (plugins/module_utils/sizing/instances.py), the parts the role reads."""
    return {"name": name, "model": f"tiny-{name}", "served_model_name": f"org/{name}",
            "plan": {"served_model_name": f"org/{name}", "kv": {"max_concurrency": concurrency, "tokens": tokens},
                     "service": {"port": port, "listen_address": "0.0.0.0"}}}


# Thresholds 2 and 13, KV tokens 4096 and 65536: what vllm-node-instances.rules.test.yml expects.
PLAN_INSTANCES = {"device": "cuda", "vllm_version": "0.32.0", "fits": True,
                  "instances": [instance_row("chat", 8000, 1.5, 4096), instance_row("mla", 8001, 12.2, 65536)]}


def needs_promtool() -> Path:
    """promtool, or skip (fail under CI, where scripts/ensure-test-tools.sh must have provided it)."""
    if PROMTOOL is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI: scripts/ensure-test-tools.sh (make test-tools) extracts it",
                        pytrace=False)
        pytest.skip("promtool is not in .cache/tools: run scripts/ensure-test-tools.sh (make test-tools)")
    return PROMTOOL


def playbook(tmp: Path, out: Path, *args: str, plan: dict | None = None) -> subprocess.CompletedProcess[str]:
    """playbooks/observability.yml on the two local nodes, files under `out`, thresholds from `plan` (PLAN)."""
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump(INVENTORY))
    plan_file = tmp / "plan.json"
    plan_file.write_text(json.dumps(PLAN if plan is None else plan))
    cmd = [command(), "-i", str(inventory), "playbooks/observability.yml",
           "-e", f"observability_config_dir={out}", "-e", f"observability_plan_file={plan_file}", *args]
    return subprocess.run(cmd, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300, check=False)


def changed(out: str) -> dict[str, int]:
    """changed= per host from the play recap."""
    return {host: int(n) for host, n in re.findall(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)", out, re.M)}


def promtool_tests(rules_dir: Path, workdir: Path, tests: Path = RULES_TEST) -> subprocess.CompletedProcess[str]:
    """promtool test rules with one of the project's test files beside a copy of the rendered rules/ directory."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(rules_dir, workdir / "rules")
    shutil.copy(tests, workdir / tests.name)
    return subprocess.run([str(needs_promtool()), "test", "rules", tests.name], cwd=workdir,
                          capture_output=True, text=True, timeout=120, check=False)


def with_moved_text(rules_dir: Path, tmp: Path, old: str, new: str) -> Path:
    """A copy of the rendered rules/ directory with `old` (found exactly once) replaced by `new`."""
    rules = tmp / "moved"
    shutil.copytree(rules_dir, rules)
    rules_file = rules / "vllm-node.rules.yml"
    text = rules_file.read_text()
    assert text.count(old) == 1, f"the rendered rules changed shape: {old!r} not found once"
    rules_file.write_text(text.replace(old, new))
    return rules


def alerts_and_cases(rules_file: Path, tests: Path, group: str | None = None) -> tuple[list[str], list[dict]]:
    """The alerts of the rendered rules (of one group, or all) and the alert cases of a promtool test file."""
    alerts = [rule["alert"] for g in yaml.safe_load(rules_file.read_text())["groups"] if group in (None, g["name"])
              for rule in g["rules"]]
    cases = [case for test in yaml.safe_load(tests.read_text())["tests"] for case in test["alert_rule_test"]]
    return alerts, cases


def file_sd(out: Path, name: str) -> list[dict]:
    """One rendered file_sd file (Ansible's managed header first)."""
    text = (out / "file_sd" / name).read_text()
    assert text.startswith("#") and "Ansible managed" in text.splitlines()[1]
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The role's files, rendered once: (work dir, config dir)."""
    tmp = tmp_path_factory.mktemp("observability")
    out = tmp / "prometheus"
    run = playbook(tmp, out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert changed(run.stdout)["node-a"] > 0
    return tmp, out


def test_target_files_per_node_and_exporter(rendered) -> None:
    _tmp, out = rendered
    files = sorted(p.name for p in (out / "file_sd").iterdir())
    assert files == ["dcgm-node-a.yml", "node-node-a.yml", "node-node-b.yml", "vllm-node-a.yml", "vllm-node-b.yml"]

    def targets(name: str) -> list[dict]:
        return file_sd(out, name)

    # A wildcard listener is scraped on the node's cluster address, a loopback one stays on loopback.
    assert targets("vllm-node-a.yml") == [{"targets": ["10.0.0.11:8000"],
                                           "labels": {"cluster": "vllm-node", "node": "node-a"}}]
    assert targets("vllm-node-b.yml")[0]["targets"] == ["127.0.0.1:8000"]
    assert targets("node-node-b.yml")[0]["targets"] == ["10.0.0.12:9100"]
    assert targets("dcgm-node-a.yml")[0]["targets"] == ["10.0.0.11:9400"]


def test_second_run_and_check_mode_change_nothing(rendered) -> None:
    tmp, out = rendered
    second = playbook(tmp, out)
    assert second.returncode == 0 and changed(second.stdout) == {"node-a": 0, "node-b": 0}, second.stdout
    check = playbook(tmp, out, "--check", "--diff")
    assert check.returncode == 0 and changed(check.stdout) == {"node-a": 0, "node-b": 0}, check.stdout


def test_promtool_accepts_the_config_and_the_rules(rendered) -> None:
    _tmp, out = rendered
    promtool = needs_promtool()
    config = subprocess.run([str(promtool), "check", "config", str(out / "vllm-node-scrape.yml")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert config.returncode == 0, config.stdout + config.stderr
    rules = subprocess.run([str(promtool), "check", "rules", str(out / "rules" / "vllm-node.rules.yml")],
                           capture_output=True, text=True, timeout=60, check=False)
    assert rules.returncode == 0 and "SUCCESS: 9 rules found" in rules.stdout, rules.stdout + rules.stderr


def test_promtool_unit_tests_pass_on_the_rendered_rules(rendered, tmp_path: Path) -> None:
    _tmp, out = rendered
    run = promtool_tests(out / "rules", tmp_path)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    # Every alert of the rules file is tested, firing and not firing.
    alerts, cases = alerts_and_cases(out / "rules" / "vllm-node.rules.yml", RULES_TEST)
    for alert in alerts:
        assert any(c["alertname"] == alert and c["exp_alerts"] for c in cases), f"{alert}: no firing case"
        assert any(c["alertname"] == alert and not c["exp_alerts"] for c in cases), f"{alert}: no silent case"


@pytest.mark.parametrize("rendered_text, mutated_text, alert", [
    ("(vllm:kv_cache_usage_perc) > 0.9\n", "(vllm:kv_cache_usage_perc) > 0.96\n", "VllmKvCacheUsageHigh"),
    ("(vllm:num_requests_waiting) > 4\n", "(vllm:num_requests_waiting) > 20\n", "VllmWaitingQueueGrowing"),
    ("DCGM_FI_DEV_GPU_TEMP > 85\n", "DCGM_FI_DEV_GPU_TEMP > 95\n", "GpuTemperatureHigh"),
    ("[1h]) > 0\n", "[1h]) > 5\n", "GpuUncorrectableRowsRemapped"),
    ("< 0.1\n", "< 0.01\n", "VllmPrefixCacheHitRateCollapsed"),
], ids=["kv-cache", "waiting", "temperature", "remapped-rows", "prefix-cache"])
def test_promtool_unit_tests_fail_when_a_threshold_moves(rendered, tmp_path: Path, rendered_text: str,
                                                          mutated_text: str, alert: str) -> None:
    """The same tests against the rendered rules with one threshold moved: that alert's cases fail."""
    _tmp, out = rendered
    rules = with_moved_text(out / "rules", tmp_path, rendered_text, mutated_text)
    run = promtool_tests(rules, tmp_path / "work")
    assert run.returncode != 0 and alert in run.stdout + run.stderr, run.stdout + run.stderr


def test_the_rules_use_only_metric_names_vllm_0_32_and_dcgm_exporter_expose(rendered) -> None:
    """The metric-name contract on the rendered rules, against the recorded vLLM 0.32.0 families and the canned
    dcgm-exporter exposition (the live check is molecule/site_e2e/tests/test_observability.py)."""
    _tmp, out = rendered
    families = {line for line in METRIC_FAMILIES.read_text().splitlines() if line and not line.startswith("#")}
    exprs = mn.rule_expressions(yaml.safe_load((out / "rules" / "vllm-node.rules.yml").read_text()))
    used = {name for values in exprs.values() for expr in values for name in mn.promql_metric_names(expr)}
    assert {n for n in used if n.startswith("vllm:")} and {n for n in used if n.startswith("DCGM_")}, exprs
    assert mn.missing_metric_names(exprs, families, ["vllm:", "http_"]) == {}
    assert mn.missing_metric_names(exprs, mn.exposition_names(DCGM_EXPOSITION.read_text()), ["DCGM_"]) == {}
    assert "vllm:gpu_cache_usage_perc" not in str(exprs)


def test_the_dashboards_are_written_beside_the_rules(rendered) -> None:
    _tmp, out = rendered
    committed = sorted((ROOT / "roles" / "observability" / "files" / "dashboards").glob("*.json"))
    assert committed
    for path in committed:
        assert (out / "dashboards" / path.name).read_text() == path.read_text()


# ---- several models per node (vllm_node_instances) -----------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered_instances(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The role's files for a plan of two instances on each node, rendered once: (work dir, config dir)."""
    tmp = tmp_path_factory.mktemp("observability-instances")
    out = tmp / "prometheus"
    rendered_run = playbook(tmp, out, plan=PLAN_INSTANCES)
    assert rendered_run.returncode == 0, rendered_run.stdout + rendered_run.stderr
    return tmp, out


def test_one_vllm_target_per_instance_on_its_own_port_labelled_with_it(rendered_instances) -> None:
    tmp, out = rendered_instances
    files = sorted(p.name for p in (out / "file_sd").iterdir())
    assert files == ["dcgm-node-a.yml", "node-node-a.yml", "node-node-b.yml", "vllm-node-a.yml", "vllm-node-b.yml"]
    assert file_sd(out, "vllm-node-a.yml") == [
        {"targets": ["10.0.0.11:8000"],
         "labels": {"cluster": "vllm-node", "node": "node-a", "instance_name": "chat", "model": "org/chat"}},
        {"targets": ["10.0.0.11:8001"],
         "labels": {"cluster": "vllm-node", "node": "node-a", "instance_name": "mla", "model": "org/mla"}}]
    assert [t["targets"] for t in file_sd(out, "vllm-node-b.yml")] == [["127.0.0.1:8000"], ["127.0.0.1:8001"]]
    # the node's exporters stay one target per node
    assert file_sd(out, "node-node-a.yml") == [{"targets": ["10.0.0.11:9100"],
                                                "labels": {"cluster": "vllm-node", "node": "node-a"}}]
    second = playbook(tmp, out, plan=PLAN_INSTANCES)
    assert second.returncode == 0 and changed(second.stdout) == {"node-a": 0, "node-b": 0}, second.stdout


def test_the_instances_rules_pass_promtool_and_their_tests(rendered_instances, tmp_path: Path) -> None:
    _tmp, out = rendered_instances
    rules_file = out / "rules" / "vllm-node.rules.yml"
    check = subprocess.run([str(needs_promtool()), "check", "rules", str(rules_file)],
                           capture_output=True, text=True, timeout=60, check=False)
    # one waiting-queue rule per instance, no duplicate rule (promtool's lint)
    assert check.returncode == 0 and "SUCCESS: 10 rules found" in check.stdout, check.stdout + check.stderr
    assert "duplicate" not in check.stdout + check.stderr
    exprs = mn.rule_expressions(yaml.safe_load(rules_file.read_text()))
    assert [e.split(">")[0].strip() for e in exprs["VllmWaitingQueueGrowing"]] == [
        'max by (cluster, node, instance_name, model_name) (vllm:num_requests_waiting{instance_name="chat"})',
        'max by (cluster, node, instance_name, model_name) (vllm:num_requests_waiting{instance_name="mla"})']
    families = {line for line in METRIC_FAMILIES.read_text().splitlines() if line and not line.startswith("#")}
    assert mn.missing_metric_names(exprs, families, ["vllm:", "http_"]) == {}
    promtool_run = promtool_tests(out / "rules", tmp_path, INSTANCES_RULES_TEST)
    assert promtool_run.returncode == 0 and "SUCCESS" in promtool_run.stdout, promtool_run.stdout + promtool_run.stderr
    alerts, cases = alerts_and_cases(rules_file, INSTANCES_RULES_TEST, "vllm-node-serving")
    for alert in alerts:
        assert any(c["alertname"] == alert and c["exp_alerts"] for c in cases), f"{alert}: no firing case"
        assert any(c["alertname"] == alert and not c["exp_alerts"] for c in cases), f"{alert}: no silent case"


WAITING = "max by (cluster, node, instance_name, model_name) (vllm:num_requests_waiting"


@pytest.mark.parametrize("rendered_text, mutated_text, alert", [
    (WAITING + '{instance_name="chat"}) > 2\n', WAITING + '{instance_name="chat"}) > 20\n', "VllmWaitingQueueGrowing"),
    (WAITING + '{instance_name="mla"}) > 13\n', WAITING + '{instance_name="mla"}) > 2\n', "VllmWaitingQueueGrowing"),
    (WAITING + '{instance_name="chat"}) > 2\n', WAITING + '{instance_name="mla"}) > 2\n', "VllmWaitingQueueGrowing"),
    ("max by (cluster, node, instance_name, model_name) (vllm:kv_cache_usage_perc)",
     "max by (cluster, node, model_name) (vllm:kv_cache_usage_perc)", "VllmKvCacheUsageHigh"),
    ('sum by (cluster, node, instance_name) (rate(http_requests_total{job="vllm", status="5xx"}[5m]))\n'
     '          / sum by (cluster, node, instance_name)',
     'sum by (cluster, node) (rate(http_requests_total{job="vllm", status="5xx"}[5m]))\n'
     '          / sum by (cluster, node)', "VllmHttp5xxRate"),
], ids=["chat-threshold", "mla-threshold", "chat-selector", "kv-per-node", "5xx-per-node"])
def test_the_instances_tests_fail_on_one_threshold_or_one_node_wide_alert(rendered_instances, tmp_path: Path,
                                                                          rendered_text: str, mutated_text: str,
                                                                          alert: str) -> None:
    """The per-instance tests against the rendered rules with one instance's threshold moved, its series selected by
    the other's label, or an alert per node instead of per instance: that alert's cases fail."""
    _tmp, out = rendered_instances
    rules = with_moved_text(out / "rules", tmp_path, rendered_text, mutated_text)
    promtool_run = promtool_tests(rules, tmp_path / "work", INSTANCES_RULES_TEST)
    assert promtool_run.returncode != 0 and alert in promtool_run.stdout + promtool_run.stderr, promtool_run.stdout


def test_the_plan_of_a_real_split_gets_a_target_and_a_threshold_per_instance(tmp_path: Path) -> None:
    """playbooks/plan.yml's plan of two models on 8 RTX PRO 6000 (no node needed), then the role over it: each
    instance's port, served model and waiting threshold (its kv.max_concurrency rounded up) are the plan's."""
    plan_file = tmp_path / "split.json"
    split = [{"name": "llama", "model": "llama-3.1-70b-instruct", "gpus": 2},
             {"name": "gptoss", "model": "gpt-oss-120b", "gpus": 4}]
    planned = run("playbooks/plan.yml", "-e", f"vllm_node_plan_file={plan_file}", "-e",
                  "vllm_node_gpu=rtx-pro-6000-blackwell", "-e", "vllm_node_gpu_count=8",
                  "-e", json.dumps({"vllm_node_instances": split}), timeout=300)
    assert planned.rc == 0, planned.output[-3000:]
    plan = json.loads(plan_file.read_text())
    rows = plan["instances"]
    out = tmp_path / "prometheus"
    observed = playbook(tmp_path, out, plan=plan)
    assert observed.returncode == 0, observed.stdout + observed.stderr
    assert file_sd(out, "vllm-node-a.yml") == [
        {"targets": [f"10.0.0.11:{r['plan']['service']['port']}"],
         "labels": {"cluster": "vllm-node", "node": "node-a", "instance_name": r["name"],
                    "model": r["plan"]["served_model_name"]}} for r in rows]
    assert len({t["targets"][0] for t in file_sd(out, "vllm-node-a.yml")}) == len(split)
    rules = yaml.safe_load((out / "rules" / "vllm-node.rules.yml").read_text())
    waiting = [rule for group in rules["groups"] for rule in group["rules"]
               if rule["alert"] == "VllmWaitingQueueGrowing"]
    selected = re.compile(r'waiting\{instance_name="([^"]+)"\}\) > (\d+)')
    thresholds = [(rule["labels"]["instance_name"], selected.findall(rule["expr"])) for rule in waiting]
    assert thresholds == [(r["name"], [(r["name"], str(max(math.ceil(r["plan"]["kv"]["max_concurrency"]), 1)))])
                          for r in rows]
    print(f"\nreal split: thresholds {[(r['name'], r['plan']['kv']['max_concurrency']) for r in rows]}")


def test_a_mode_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    run = playbook(tmp_path, tmp_path / "prometheus", "-e", "observability_mode=full")
    assert run.returncode != 0
    assert "observability_mode" in run.stdout + run.stderr
    assert not (tmp_path / "prometheus").exists(), "nothing is written before the refusal"
