"""playbooks/observability.yml (role observability, scrape-config-only mode) with the real ansible-playbook, and its
alert rules through the real promtool (Debian's prometheus package; scripts/ensure-test-tools.sh extracts it).

Two nodes on the controller's local connection: node-a, a GPU node whose vLLM listens on a wildcard (targets on its
cluster address 10.0.0.11), node-b, a CPU node listening on loopback. The thresholds read a plan JSON with
kv.max_concurrency 3.2 (waiting threshold 4). tests/prometheus/vllm-node.rules.test.yml tests every alert firing and
not firing on the rendered rules; the same tests fail on those rules with a threshold moved.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_plan_playbook import ROOT

import metric_names as mn
from harness.playbook import command, environment

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


def needs_promtool() -> Path:
    """promtool, or skip (fail under CI, where scripts/ensure-test-tools.sh must have provided it)."""
    if PROMTOOL is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI: scripts/ensure-test-tools.sh (make test-tools) extracts it",
                        pytrace=False)
        pytest.skip("promtool is not in .cache/tools: run scripts/ensure-test-tools.sh (make test-tools)")
    return PROMTOOL


def playbook(tmp: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """playbooks/observability.yml on the two local nodes, files under `out`."""
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump(INVENTORY))
    plan_file = tmp / "plan.json"
    plan_file.write_text(json.dumps(PLAN))
    cmd = [command(), "-i", str(inventory), "playbooks/observability.yml",
           "-e", f"observability_config_dir={out}", "-e", f"observability_plan_file={plan_file}", *args]
    return subprocess.run(cmd, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300, check=False)


def changed(out: str) -> dict[str, int]:
    """changed= per host from the play recap."""
    return {host: int(n) for host, n in re.findall(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)", out, re.M)}


def promtool_tests(rules_dir: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """promtool test rules with the project's test file beside a copy of the rendered rules/ directory."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(rules_dir, workdir / "rules")
    shutil.copy(RULES_TEST, workdir / RULES_TEST.name)
    return subprocess.run([str(needs_promtool()), "test", "rules", RULES_TEST.name], cwd=workdir,
                          capture_output=True, text=True, timeout=120, check=False)


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
        text = (out / "file_sd" / name).read_text()
        assert text.startswith("#") and "Ansible managed" in text.splitlines()[1]
        return yaml.safe_load(text)

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
    alerts = [rule["alert"] for group in yaml.safe_load((out / "rules" / "vllm-node.rules.yml").read_text())["groups"]
              for rule in group["rules"]]
    cases = [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test["alert_rule_test"]]
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
    rules = tmp_path / "moved"
    shutil.copytree(out / "rules", rules)
    rules_file = rules / "vllm-node.rules.yml"
    text = rules_file.read_text()
    assert text.count(rendered_text) == 1, f"the rendered rules changed shape: {rendered_text!r} not found once"
    rules_file.write_text(text.replace(rendered_text, mutated_text))
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


def test_a_mode_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    run = playbook(tmp_path, tmp_path / "prometheus", "-e", "observability_mode=full")
    assert run.returncode != 0
    assert "observability_mode" in run.stdout + run.stderr
    assert not (tmp_path / "prometheus").exists(), "nothing is written before the refusal"
