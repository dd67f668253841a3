"""End-to-end checks of site.yml on the node container (testinfra, run by `molecule verify`).

The tests run in file order: the read-only checks first, then the paths that change the node
(fail-fast refusal, crash and restart, the MLA model served, a failing configuration rolled back).
Timings are printed (pytest -s) and appended to artifacts/site_e2e-measurements.json.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from harness import api, node, playbook
from harness.figures import Figures
from harness.project import ARTIFACTS, PROJECT
from harness.unit import show

HOST = "site_e2e-bookworm"
SCENARIO = Path(__file__).resolve().parents[1]
PORT = 8000
URL = f"http://127.0.0.1:{PORT}"
# The fault paths' inference checks skip the serving benchmark (~35 s a start): test_benchmark.py proves it on the
# converge's check; here the check's health, completion and KV figures are what the tests read.
NO_BENCHMARK = ("-e", "inference_check_benchmark=false")
KEY_FILE = "/etc/vllm/api-key"
UNIT = ("ActiveState", "SubState", "MainPID", "NRestarts", "ActiveEnterTimestamp", "InvocationID", "UnitFileState")
record = Figures(ARTIFACTS / "site_e2e-measurements.json").record

testinfra_hosts = [f"ansible://{HOST}"]


def unit(host) -> dict:
    """systemctl show of the vllm unit as a dict."""
    return show(host, "vllm", UNIT)


def model_dir() -> str:
    """The model directory the unit serves (--model of the planned argv)."""
    argv = node.planned(HOST)["service"]["argv"]
    return argv[argv.index("--model") + 1]


def logged_kv_tokens(host) -> int:
    """vLLM's "CPU KV cache size: N tokens" of the running invocation."""
    invocation = unit(host)["InvocationID"]
    out = host.check_output(f"journalctl _SYSTEMD_INVOCATION_ID={invocation} -o cat --no-pager")
    found = re.findall(r"CPU KV cache size: ([\d,]+) tokens", out)
    assert found, "vLLM did not log its CPU KV cache size"
    return int(found[-1].replace(",", ""))


def check_kv_tokens_match(host, label: str) -> None:
    """The plan's KV tokens vs vLLM's logged "CPU KV cache size" within 1 % (recorded as kv_tokens_<label>)."""
    planned = node.planned(HOST)["kv"]["tokens"]
    actual = logged_kv_tokens(host)
    record(f"kv_tokens_{label}", {"plan": planned, "vllm": actual, "relative": (actual - planned) / planned})
    assert abs(actual - planned) / planned <= 0.01


def wait_healthy(host, timeout: int = 1500) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        state = unit(host)
        if state["ActiveState"] == "active" and api.curl(host, URL + "/health")[0] == 200:
            return time.monotonic() - start
        time.sleep(3)
    raise AssertionError(f"vllm not healthy within {timeout} s: {unit(host)}")


# ---- the converged node -------------------------------------------------------------------------------


def test_unit_active_and_enabled(host):
    svc = host.service("vllm")
    assert svc.is_running
    assert svc.is_enabled


def test_idempotent_run_did_not_restart(host):
    """converge.yml wrote MainPID + ActiveEnterTimestamp after site.yml; the idempotence run changed nothing."""
    witness = host.file("/var/lib/vllm-node-e2e-witness").content_string.strip().splitlines()
    state = unit(host)
    assert f"MainPID={state['MainPID']}" in witness
    assert f"ActiveEnterTimestamp={state['ActiveEnterTimestamp']}" in witness


def test_check_mode_on_the_converged_node_changes_and_restarts_nothing(converged_reruns):
    """`converge.yml --check --diff` on the converged node (conftest.py): changed=0, the same process serves."""
    run = converged_reruns["check"]
    record("check_mode_seconds", round(run["seconds"], 1))
    assert run["rc"] == 0, run["out"][-4000:]
    record("check_mode_changed", playbook.recap(run["out"], HOST)["changed"])
    assert playbook.recap(run["out"], HOST)["changed"] == 0, playbook.changed_tasks(run["out"])
    assert run["after"] == run["before"]


def test_fingerprint_record(host):
    """The record of what the process depends on: root-only, hashes only (the API key never in it)."""
    record_file = host.file("/etc/vllm/vllm.fingerprint")
    assert (record_file.user, record_file.group, record_file.mode) == ("root", "root", 0o600)
    text = record_file.content_string
    assert node.api_key(host) not in text
    data = json.loads("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    inputs = data["inputs"]
    assert inputs["service"] == node.planned(HOST)["service"]["fingerprint"]
    assert inputs["venv"] == host.check_output("readlink /opt/vllm/current")
    assert len(inputs["venv_lock_sha256"]) == 64
    assert inputs["unit_sha256"] == host.check_output("sha256sum /etc/systemd/system/vllm.service").split()[0]
    assert inputs["env_sha256"] == host.check_output("sha256sum /etc/vllm/vllm.env").split()[0]
    assert inputs["model_config_files_sha256"]["config.json"] == host.check_output(
        f"sha256sum {model_dir()}/config.json").split()[0]


def rerun_bound(seconds: float, load: float, cpus: int) -> float:
    """The wall-time bound of an idempotent re-run: `seconds` on an idle machine, stretched by the load per CPU
    above 1 (a CI lane beside other scenarios), so a busy machine does not flake and an idle one is held to it."""
    return seconds * max(1.0, load / max(cpus, 1))


def test_rerun_is_fast_and_changes_nothing(converged_reruns):
    """The second run of converge.yml right after the converge (conftest.py; molecule's idempotence stage, with
    the project's ansible.cfg as `make demo` runs it): changed=0, no handler, no restart, and the wall time recorded
    with the task count and the load average."""
    run = converged_reruns["rerun"]
    out, seconds, load = run["out"], run["seconds"], run["load"]
    assert run["rc"] == 0, out[-4000:]
    recap = re.search(rf"^{HOST}\s+: ok=(\d+)\s+changed=(\d+)\s+.*skipped=(\d+)", out, re.M)
    assert recap, out[-2000:]
    tasks = len(re.findall(r"^TASK \[", out, re.M))
    cpus = os.cpu_count() or 1
    record("rerun", {"seconds": round(seconds, 1), "tasks": tasks, "ok": int(recap.group(1)),
                     "skipped": int(recap.group(3)), "load_average": round(load, 2), "cpus": cpus})
    assert playbook.recap(out, HOST)["changed"] == 0, playbook.changed_tasks(out)
    assert playbook.service_restarts(out) == 0
    assert run["after"] == run["before"]
    assert seconds <= rerun_bound(120, load, cpus), f"re-run took {seconds:.0f} s at load {load:.1f} on {cpus} CPUs"


def test_listens_only_where_configured(host):
    listening = host.check_output("ss -Hltn").splitlines()
    on_port = [line.split()[3] for line in listening if line.split()[3].endswith(f":{PORT}")]
    assert on_port == [f"127.0.0.1:{PORT}"]


def test_refuses_requests_without_key(host):
    status, _ = api.curl(host, URL + "/v1/models")
    assert status == 401
    status, _ = api.curl(host, URL + "/v1/models", api_key="sk-wrong")
    assert status == 401


def test_lists_served_model_with_key(host):
    status, body = api.curl(host, URL + "/v1/models", api_key=node.api_key(host))
    assert status == 200
    assert node.planned(HOST)["served_model_name"] in [m["id"] for m in json.loads(body)["data"]]


def test_real_completion(host):
    body = {"model": node.planned(HOST)["served_model_name"], "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 16, "ignore_eos": True}
    status, answer = api.curl(host, URL + "/v1/chat/completions", api_key=node.api_key(host), body=body)
    assert status == 200, answer
    data = json.loads(answer)
    assert data["usage"]["completion_tokens"] == 16


def test_secret_files(host):
    assert host.file("/etc/vllm").mode == 0o700
    for path in (KEY_FILE, "/etc/vllm/vllm.env"):
        f = host.file(path)
        assert (f.user, f.group, f.mode) == ("root", "root", 0o600), path
    secret = node.api_key(host)
    assert len(secret) >= 32
    assert secret not in host.file("/etc/systemd/system/vllm.service").content_string
    pid = unit(host)["MainPID"]
    assert secret not in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")


def exec_start_line(unit_text: str) -> str:
    """The ExecStart= value of a unit, its backslash-continued lines joined (what follows it is not part of it)."""
    lines = unit_text.split("ExecStart=", 1)[1].splitlines()
    taken = [lines[0]]
    while taken[-1].endswith("\\") and len(taken) < len(lines):
        taken.append(lines[len(taken)])
    return " ".join(taken)


def test_unit_renders_the_plan(host):
    text = host.file("/etc/systemd/system/vllm.service").content_string
    for arg in node.planned(HOST)["vllm_args"]:
        assert f'"{arg}"' in text
    for name, value in node.planned(HOST)["environment"].items():
        assert f'"{name}={value}"' in text
    assert '"HF_HUB_OFFLINE=1"' in text
    # the compile caches in the plan's keyed directory (vllm_service README, "Compile caches")
    cache = f"/var/lib/vllm/cache/{node.planned(HOST)['compile_cache']['dir']}"
    assert f'"VLLM_CACHE_ROOT={cache}/vllm"' in text
    assert '"--enforce-eager"' in text
    # The unit runs exactly the command the preflight computed (plan.service), nothing assembled elsewhere.
    service = node.planned(HOST)["service"]
    exec_start = exec_start_line(text)
    assert re.findall(r'"((?:[^"\\]|\\.)*)"', exec_start)[3:] == service["argv"]
    for name, value in service["environment"].items():
        assert f'"{name}={value}"' in text
    assert f"TimeoutStartSec={service['start_timeout']}\n" in text
    assert f"TimeoutStopSec={service['stop_timeout']}\n" in text and "--shutdown-timeout" in service["argv"]
    assert host.file("/var/lib/vllm/cache").user == "vllm"
    assert host.file(cache).is_directory and host.file(cache).user == "vllm"


def test_hardening_exposure(host):
    out = host.check_output("systemd-analyze security vllm.service --no-pager")
    score = float(re.search(r"Overall exposure level for vllm.service: ([\d.]+)", out).group(1))
    record("systemd_analyze_security_exposure", score)
    assert score <= 3.5
    assert host.user("vllm").shell == "/usr/sbin/nologin"
    status = host.file(f"/proc/{unit(host)['MainPID']}/status").content_string
    uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
    assert int(uid) == host.user("vllm").uid


def test_plan_kv_tokens_match_vllm_gqa(host):
    """tiny Llama (GQA): the plan's KV tokens vs vLLM's logged "CPU KV cache size" within 1 %."""
    check_kv_tokens_match(host, "tiny_llama")
    checked = node.inference_check(HOST)
    assert checked["failures"] == []
    assert checked["stream"]["time_to_first_token_s"] is not None
    record("check_tiny_llama", {k: checked[k] for k in ("stream", "unit", "plan_vs_actual")})


# ---- fault paths -------------------------------------------------------------------------------------


def test_fail_fast_on_impossible_context(host):
    """A max-model-len that cannot fit is refused by the preflight in seconds; the running service is untouched."""
    before = unit(host)
    unit_sum = host.check_output("sha256sum /etc/systemd/system/vllm.service")
    rc, out, seconds = playbook.in_scenario("site_e2e", "fail-fast", PROJECT / "playbooks/site.yml",
                                            "-e", "vllm_node_max_model_len=4194304")
    record("fail_fast_seconds", round(seconds, 1))
    assert rc != 0
    failed_task = re.findall(r"TASK \[([^\]]+)\]", out.split("fatal:")[0])[-1] if "fatal:" in out else ""
    assert failed_task.startswith("preflight"), failed_task
    assert "4194304" in out
    assert "TASK [vllm_env" not in out and "TASK [vllm_service" not in out
    assert unit(host)["MainPID"] == before["MainPID"]
    assert host.check_output("sha256sum /etc/systemd/system/vllm.service") == unit_sum


def test_crash_is_restarted_and_check_passes(host):
    before = unit(host)
    host.run(f"kill -9 {before['MainPID']}")
    deadline = time.monotonic() + 60
    while unit(host)["NRestarts"] == before["NRestarts"] and time.monotonic() < deadline:
        time.sleep(1)
    assert int(unit(host)["NRestarts"]) == int(before["NRestarts"]) + 1
    record("crash_restart_to_healthy_seconds", round(wait_healthy(host), 1))
    assert unit(host)["MainPID"] != before["MainPID"]
    rc, out, seconds = playbook.in_scenario("site_e2e", "verify-after-crash", PROJECT / "playbooks/verify.yml",
                                            *NO_BENCHMARK)
    assert rc == 0, out[-3000:]
    record("verify_seconds", round(seconds, 1))


def test_a_dependency_change_restarts_once(host):
    """Only a file the process reads changes - a config rule now patches tiny-llama's config.json; the unit, the
    env file and the plan stay the same: exactly one restart. (That a rerun after a change restarts nothing is
    day2's last step, after a venv switch, and the fingerprint's unit tests; a second run here cost ~190 s of the
    CI budget.)"""
    rule = {"id": "e2e-drop-pretraining-tp", "description": "e2e: a config patch the process must pick up",
            "when": {"model": "tiny-llama"}, "remove": [{"file": "config.json", "path": ["pretraining_tp"]}]}
    extra = json.dumps({"model_config_extra_rules": [rule]})
    files = "sha256sum /etc/systemd/system/vllm.service /etc/vllm/vllm.env /usr/local/libexec/vllm-node/wait-healthy.py"
    sums, before = host.check_output(files), unit(host)
    rc, out, seconds = playbook.in_scenario("site_e2e", "dependency-change", PROJECT / "playbooks/site.yml",
                                            "-e", extra, *NO_BENCHMARK)
    assert rc == 0, out[-4000:]
    record("dependency_change_converge_seconds", round(seconds, 1))
    after = unit(host)
    record("dependency_change_restarts", playbook.service_restarts(out))
    assert playbook.service_restarts(out) == 1
    assert (after["MainPID"], after["ActiveEnterTimestamp"]) != (before["MainPID"], before["ActiveEnterTimestamp"])
    assert host.check_output(files) == sums                     # nothing but the dependency changed
    assert "pretraining_tp" not in host.file(f"{model_dir()}/config.json").content_string
    assert api.curl(host, URL + "/v1/models", api_key=node.api_key(host))[0] == 200


def test_mla_model_kv_tokens_match(host):
    """Switch to the tiny DeepseekV3 (MLA): one restart, and the plan's KV tokens match vLLM's within 1 %. (LoRA off:
    the inventory's adapters are tiny-llama's, which the plan refuses on another base, test_lora.py.)"""
    before = unit(host)
    no_lora = json.dumps({"vllm_node_enable_lora": False, "vllm_node_lora_adapters": []})
    rc, out, seconds = playbook.in_scenario("site_e2e", "tiny-deepseek-v3", PROJECT / "playbooks/site.yml",
                                            "-e", "vllm_node_model=tiny-deepseek-v3", "-e", no_lora, *NO_BENCHMARK)
    assert rc == 0, out[-4000:]
    record("converge_tiny_deepseek_v3_seconds", round(seconds, 1))
    after = unit(host)
    assert after["InvocationID"] != before["InvocationID"]
    assert playbook.service_restarts(out) == 1
    assert node.planned(HOST)["attention"] == "mla"
    check_kv_tokens_match(host, "tiny_deepseek_v3")
    assert node.inference_check(HOST)["failures"] == []


def test_failing_config_is_rolled_back(host):
    """A unit vLLM cannot start (KV cache too small for the context) fails with the cause and the fix,
    and the previous unit is restored and serving again."""
    unit_sum = host.check_output("sha256sum /etc/systemd/system/vllm.service /etc/vllm/vllm.fingerprint")
    rc, out, seconds = playbook.in_scenario("site_e2e", "break-service", SCENARIO / "break_service.yml")
    record("vllm_own_kv_failure_and_rollback_seconds", round(seconds, 1))
    failed_after = re.search(r"did not become healthy on \S+ within (\d+) s", out)
    record("vllm_own_kv_failure_seconds", int(failed_after.group(1)) if failed_after else None)
    assert rc != 0
    assert "estimated maximum model length" in out
    assert re.search(r"Set vllm_node_max_model_len: \d+", out)
    assert "Rolled back to the previous configuration, which is healthy again" in out
    assert host.check_output("sha256sum /etc/systemd/system/vllm.service /etc/vllm/vllm.fingerprint") == unit_sum
    assert unit(host)["ActiveState"] == "active"
    assert api.curl(host, URL + "/v1/models", api_key=node.api_key(host))[0] == 200
    backups = host.check_output("ls /etc/systemd/system/ | grep -c '^vllm.service.*~$' || true")
    assert int(backups or 0) >= 1
