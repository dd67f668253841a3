"""The test harness (tests/harness): one definition of each test helper, and its pure parts checked with fakes.

The rule the first test holds: a helper is any module-level function of a test module (molecule/*/tests,
tests/integration, the top-level modules of tests/fixtures, tests/harness) that is neither a pytest test (test_*),
a pytest hook (pytest_*) nor a pytest fixture (decorated with pytest.fixture). A helper's name defined in two of
those modules is a copy: it belongs in tests/harness, once.
"""
from __future__ import annotations

import ast
import json
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import api, clients, node, playbook, unit
from harness.figures import Figures
from repo_root import ROOT

# Where test helpers live (node-side programs such as tests/fixtures/hf_hub/server.py are not test modules).
HELPER_GLOBS = ("molecule/*/tests/**/*.py", "tests/integration/**/*.py", "tests/fixtures/*.py", "tests/harness/**/*.py")


def is_fixture(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with pytest.fixture (called or not)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target).split(".")[-1] == "fixture":
            return True
    return False


def helpers(source: str) -> list[str]:
    """The helper names a module defines at its top level (not tests, hooks or fixtures)."""
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not node.name.startswith(("test_", "pytest_")) and not is_fixture(node)]


def copies(modules: dict[str, str]) -> dict[str, list[str]]:
    """{helper name: the modules defining it} for every name defined in more than one module."""
    where: dict[str, list[str]] = defaultdict(list)
    for path, source in sorted(modules.items()):
        for name in sorted(set(helpers(source))):
            where[name].append(path)
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_helper_is_defined_in_two_test_modules():
    modules = {str(path.relative_to(ROOT)): path.read_text()
               for pattern in HELPER_GLOBS for path in ROOT.glob(pattern) if "__pycache__" not in path.parts}
    assert len(modules) > 20, f"the globs found {len(modules)} modules: the check would prove nothing"
    found = copies(modules)
    assert found == {}, "helpers defined in more than one test module (move each to tests/harness): " + "; ".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(found.items()))


def test_the_copy_rule_sees_copies_and_not_tests_or_fixtures():
    a = "import pytest\ndef curl(host):\n    pass\ndef test_x():\n    pass\n@pytest.fixture\ndef host():\n    pass\n"
    b = ("import pytest\ndef curl(host, port):\n    pass\ndef test_x():\n    pass\n"
         "@pytest.fixture(scope='module')\ndef host():\n    pass\ndef pytest_configure(config):\n    pass\n")
    assert copies({"a.py": a, "b.py": b}) == {"curl": ["a.py", "b.py"]}
    assert copies({"a.py": a, "c.py": "def other():\n    pass\n"}) == {}


# ---- the unit witness --------------------------------------------------------------------------------------


def journal(*entries: dict[str, str]) -> str:
    return "\n".join(json.dumps(entry) for entry in entries) + "\n"


def test_restarts_count_each_invocation_but_the_witnessed_one():
    before = {"InvocationID": "aaa", "now": "100"}
    out = journal({"INVOCATION_ID": "aaa"}, {"_SYSTEMD_INVOCATION_ID": "aaa", "MESSAGE": "x"},
                  {"INVOCATION_ID": "bbb"}, {"_SYSTEMD_INVOCATION_ID": "bbb"}, {"INVOCATION_ID": "ccc"},
                  {"MESSAGE": "no invocation"}, {"INVOCATION_ID": ""})
    assert unit.count_restarts(out, before) == 2           # bbb (failed start) and ccc
    assert unit.count_restarts(journal({"_SYSTEMD_INVOCATION_ID": "aaa"}), before) == 0
    assert unit.count_restarts("", before) == 0


class FakeHost:
    """A testinfra host that answers fixed commands."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers, self.asked = answers, []

    def check_output(self, command: str) -> str:
        self.asked.append(command)
        for prefix, answer in self.answers.items():
            if command.startswith(prefix):
                return answer
        raise AssertionError(f"unexpected command: {command}")


def test_witness_and_restarts_ask_systemd_and_the_journal_of_the_unit():
    host = FakeHost({"systemctl show": "MainPID=42\nInvocationID=aaa\nActiveEnterTimestamp=Sun 2026-12-06\n",
                     "date +%s": "1000\n", "journalctl": journal({"INVOCATION_ID": "aaa"}, {"INVOCATION_ID": "bbb"})})
    state = unit.witness(host, "gateway")
    assert state == {"MainPID": "42", "InvocationID": "aaa", "ActiveEnterTimestamp": "Sun 2026-12-06", "now": "1000"}
    assert host.asked[0].endswith(" gateway") and "-p MainPID" in host.asked[0] and "-p InvocationID" in host.asked[0]
    assert unit.restarts(host, state, "gateway") == 1
    assert "--since @999" in host.asked[-1] and "UNIT=gateway.service + _SYSTEMD_UNIT=gateway.service" in host.asked[-1]


def test_stop_start_seconds_from_the_monotonic_timestamps():
    state = {"ActiveExitTimestampMonotonic": "10000000", "InactiveEnterTimestampMonotonic": "12500000",
             "InactiveExitTimestampMonotonic": "13000000", "ActiveEnterTimestampMonotonic": "43250000"}
    assert unit.stop_start_seconds(state) == {"stop_s": 2.5, "start_s": 30.2}
    assert unit.stop_start_seconds({"ActiveEnterTimestampMonotonic": "5"}) == {"stop_s": None, "start_s": None}
    backwards = dict(state, InactiveEnterTimestampMonotonic="9000000")
    assert unit.stop_start_seconds(backwards)["stop_s"] is None


# ---- reading ansible-playbook's output ---------------------------------------------------------------------

OUTPUT = """
PLAY [Converge] ****************************************************************

TASK [node_manifest : Write the manifest on the node] **************************
ok: [node1]
changed: [node2]

TASK [rollout : Drain the node at the gateways (no new request; running ones go on)] ***
skipping: [node1]
ok: [node2 -> gateway]

RUNNING HANDLER [vllm_service : Restart vllm] **********************************
changed: [node2]

PLAY RECAP *********************************************************************
node1                      : ok=10   changed=0    unreachable=0    failed=0    skipped=3    rescued=0    ignored=0
node2                      : ok=12   changed=2    unreachable=0    failed=1    skipped=1    rescued=0    ignored=0
node10                     : ok=1    changed=7    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
"""


def test_recap_counters_of_one_host():
    assert playbook.recap(OUTPUT, "node2") == {"ok": 12, "changed": 2, "unreachable": 0, "failed": 1, "skipped": 1,
                                               "rescued": 0, "ignored": 0}
    assert playbook.recap(OUTPUT, "node1")["changed"] == 0, "node10's line is not node1's"
    assert playbook.recap(OUTPUT + OUTPUT, "node2")["changed"] == 4, "summed over the recaps"
    with pytest.raises(AssertionError, match="no PLAY RECAP line for node3"):
        playbook.recap(OUTPUT, "node3")


def test_changed_tasks_and_task_results():
    assert playbook.changed_tasks(OUTPUT) == ["node_manifest : Write the manifest on the node",
                                              "vllm_service : Restart vllm"]
    assert playbook.task_results(OUTPUT, "node_manifest : Write the manifest on the node") == [
        ("ok", "node1"), ("changed", "node2")]
    assert playbook.statuses(OUTPUT, "Drain the node at the gateways") == ["skipping", "ok"]
    assert playbook.task_results(OUTPUT, "Drain the node at the gateways")[1] == ("ok", "node2")
    assert playbook.task_results(OUTPUT, "node_manifest : Write the manifest") == [], "a whole header, or a name start"
    assert playbook.task_results(OUTPUT, "Restart vllm") == [], "handlers are not tasks"


def test_service_restarts_counts_the_changed_results_of_the_restart_task():
    block = (f"TASK [{playbook.RESTART_TASK}] ***\nchanged: [node1]\n\nTASK [{playbook.RESTART_TASK}] ***\n"
             "skipping: [node1]\n\n")
    assert playbook.service_restarts(OUTPUT) == 0, "the old handler is not the task"
    assert playbook.service_restarts(block + block + OUTPUT) == 2


def test_run_keeps_the_log_and_the_extra_vars(tmp_path: Path):
    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.debug:\n        msg: 'greeting {{ greeting }}'\n")
    log = tmp_path / "runs" / "01-hello.log"
    rc, output, seconds = playbook.run(play, "-c", "local", inventory="localhost,", extra_vars={"greeting": "hi"},
                                       log=log, timeout=300)
    assert rc == 0, output
    assert "greeting hi" in output and log.read_text() == output and seconds > 0
    assert json.loads((tmp_path / "runs" / "01-hello.vars.json").read_text()) == {"greeting": "hi"}
    assert playbook.recap(output, "localhost")["ok"] == 1
    failed = playbook.run(play, "-c", "local", inventory="localhost,", timeout=300)
    assert failed.rc != 0 and "greeting" in failed.output, "no extra vars: the undefined variable fails the run"
    assert not list(tmp_path.glob("*.json")), "a temporary vars file is not left behind"


def test_the_environment_is_the_projects():
    env = playbook.environment(drop=("ANSIBLE_CALLBACKS_ENABLED",), ANSIBLE_DISPLAY_SKIPPED_HOSTS="true")
    assert env["ANSIBLE_CONFIG"].endswith("ansible.cfg") and env["ANSIBLE_ROLES_PATH"].endswith("roles")
    assert env["ANSIBLE_DISPLAY_SKIPPED_HOSTS"] == "true" and "ANSIBLE_CALLBACKS_ENABLED" not in env


# ---- figures, clients, node readers -------------------------------------------------------------------------


def test_figures_keep_each_name_once_and_print_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    figures = Figures(tmp_path / "day2" / "measurements.json")
    figures.record("01-converge", {"rc": 0, "seconds": 12.5})
    figures.record("rerun", 3.25)
    figures.record("01-converge", {"rc": 1})
    assert json.loads(figures.path.read_text()) == {"01-converge": {"rc": 1}, "rerun": 3.25}
    assert figures.path.read_text().endswith("}\n")
    assert capsys.readouterr().out.splitlines() == ['MEASURED 01-converge: {"rc": 0, "seconds": 12.5}',
                                                    "MEASURED rerun: 3.25", 'MEASURED 01-converge: {"rc": 1}']
    figures.reset()
    assert figures.read() == {}


def test_the_client_loop_alternates_counts_and_stops_at_its_bound():
    asked: list[tuple[str, bool]] = []

    def request(kind: str, stream: bool) -> str:
        asked.append((kind, stream))
        return "status 503: b''" if len(asked) == 3 else ""

    loop = clients.ClientLoop(request, max_requests=5, max_seconds=60, clients=[clients.Client("short", think=0)])
    loop.start()
    loop.join(timeout=30)
    counts = loop.counts()
    assert asked == [("short", False), ("short", True), ("short", False), ("short", True), ("short", False)]
    assert (counts["sent"], counts["streamed"], counts["failed"]) == (5, 2, 1)
    assert counts["failures"][0]["status"] == "status 503: b''" and counts["failures"][0]["stream"] is False
    assert counts["first"] <= counts["last"] and set(counts["duration_s"]) == {"min", "p50", "p99", "max"}
    assert counts["kinds"]["short"]["sent"] == 5 and counts["kinds"]["short-stream"] == {
        "sent": 2, "failed": 0, "duration_s": counts["kinds"]["short-stream"]["duration_s"]}
    assert counts["kinds"]["short-plain"]["failed"] == 1 and not loop.is_alive()


def test_the_client_loop_runs_its_clients_side_by_side_and_knows_what_was_in_flight():
    release = threading.Event()
    started = threading.Barrier(3, timeout=10)

    def request(kind: str, stream: bool) -> str:
        if kind == "long":
            started.wait()
            release.wait(10)
        else:
            time.sleep(0.01)
        return ""

    loop = clients.ClientLoop(request, max_requests=10_000, max_seconds=600,
                              clients=[clients.Client("long", 0), clients.Client("long", 0),
                                       clients.Client("short", 0)])
    loop.start()
    started.wait()                  # both long requests in flight
    time.sleep(0.1)
    at = time.time()
    assert loop.in_flight(at)["long"] == 2 and loop.in_flight(at)["all"] in (2, 3)
    release.set()
    counts = loop.stop(timeout=30)
    assert not loop.is_alive() and counts["failed"] == 0 and counts["kinds"]["long"]["sent"] >= 2
    assert {r.stream for r in loop.records if r.kind == "long"} == {False, True}   # the clients start in turn
    assert loop.in_flight(at)["long"] == 2 and loop.in_flight(time.time()) == {"all": 0}
    assert counts["client_cpu_s"] >= 0 and len(counts["clients"]) == 3


def test_the_client_loop_stops_when_told():
    release = threading.Event()

    def request(kind: str, stream: bool) -> str:
        release.wait(5)
        return ""

    loop = clients.ClientLoop(request, max_requests=10_000, max_seconds=600, clients=[clients.Client(think=0)])
    loop.start()
    release.set()
    counts = loop.stop(timeout=30)
    assert not loop.is_alive() and 1 <= counts["sent"] < 10_000 and counts["failed"] == 0


def test_gated_clients_send_only_while_the_gate_is_open_each_after_its_delay():
    sent: list[tuple[str, float]] = []

    def request(kind: str, stream: bool) -> str:
        sent.append((kind, time.monotonic()))
        time.sleep(0.02)
        return ""

    loop = clients.ClientLoop(request, max_requests=10_000, max_seconds=600,
                              clients=[clients.Client("long", 0.01, 0.3, gated=True), clients.Client("short", 0.05)])
    loop.start()
    time.sleep(0.5)
    assert sent and {kind for kind, _ in sent} == {"short"}      # the gate is closed
    opened = time.monotonic()
    loop.open_gate()
    time.sleep(0.6)
    loop.close_gate()
    time.sleep(0.1)                                                # the request in flight ends
    longs = [at for kind, at in sent if kind == "long"]
    assert longs and min(longs) - opened >= 0.29                  # its delay again after the gate opened
    count = len(longs)
    time.sleep(0.3)
    assert len([1 for kind, _ in sent if kind == "long"]) == count  # closed again: no more long requests
    counts = loop.stop(timeout=30)
    assert len(counts["gate"]) == 1 and 0 < counts["gate"][0][0] < counts["gate"][0][1]
    assert not loop.is_alive() and counts["failed"] == 0


def test_a_gated_client_waiting_for_its_gate_ends_on_stop():
    loop = clients.ClientLoop(lambda kind, stream: "", max_requests=10, max_seconds=600,
                              clients=[clients.Client("long", 0, 0, gated=True)])
    loop.start()
    counts = loop.stop(timeout=5)
    assert not loop.is_alive() and counts["sent"] == 0 and counts["gate"] == []


def settle(seen: list[str], count: int, wait: float = 10.0) -> None:
    """Wait (bounded) until the follower has acted on `count` lines, then a few of its intervals more: a loaded
    machine may run its thread late, never early."""
    deadline = time.monotonic() + wait
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)


def test_the_log_follower_acts_on_new_lines_as_they_are_written(tmp_path):
    log = tmp_path / "run.log"
    seen: list[str] = []
    with playbook.LogFollower(log, [(r"^TASK \[.*Drain", seen.append), (r"^PLAY \[", seen.append)],
                              interval=0.05) as follower:
        time.sleep(0.1)                           # no log yet
        with log.open("w") as out:
            out.write("PLAY [Change the nodes]\nTASK [rollout : Dra")
            out.flush()
            settle(seen, 1)
            assert seen == ["PLAY [Change the nodes]"]     # the unfinished line waits for its end
            out.write("in the node]\nok: [n1]\n")
            out.flush()
            settle(seen, 2)
        assert seen == ["PLAY [Change the nodes]", "TASK [rollout : Drain the node]"]
        log.write_text("PLAY [again]\n")          # a new run truncated the log
        settle(seen, 3)
    assert seen[-1] == "PLAY [again]" and [line for _, line in follower.matched] == seen


def test_the_log_follower_keeps_a_character_split_between_two_reads(tmp_path):
    log = tmp_path / "run.log"
    seen: list[str] = []
    data = "TASK [rollout : Drain « fleet-node1 »]\n".encode()
    cut = data.index("«".encode()) + 1                  # inside the two bytes of «
    with playbook.LogFollower(log, [(r"Drain", seen.append)], interval=0.05), log.open("wb") as out:
        out.write(data[:cut])
        out.flush()
        time.sleep(0.2)
        out.write(data[cut:])
        out.flush()
        time.sleep(0.2)
    assert seen == ["TASK [rollout : Drain « fleet-node1 »]"]


def test_in_flight_counts_what_started_and_had_not_ended():
    records = [clients.Record("long", False, 10.0, 40.0), clients.Record("short", True, 19.0, 20.0),
               clients.Record("short", False, 20.0), clients.Record("long", True, 25.0)]
    assert clients.in_flight(records, 20.0) == {"all": 2, "long": 1, "short": 1}
    assert clients.in_flight(records, 30.0) == {"all": 3, "long": 2, "short": 1}
    assert clients.in_flight(records, 5.0) == {"all": 0}


def test_per_label_summarises_ended_requests_per_kind_and_stream():
    records = [clients.Record("long", False, 0, 30, 30.0, "ok"), clients.Record("long", True, 0, 20, 20.0, "ok"),
               clients.Record("short", True, 0, 1, 1.0, "status 502"), clients.Record("short", False, 5)]
    out = clients.per_label(records)
    assert sorted(out) == ["long", "long-plain", "long-stream", "short", "short-stream"]
    assert out["long"]["sent"] == 2 and out["long"]["duration_s"]["max"] == 30.0
    assert out["short"] == {"sent": 1, "failed": 1, "duration_s": {"min": 1.0, "p50": 1.0, "p99": 1.0, "max": 1.0}}


def test_a_stream_is_checked_to_its_end_and_its_token_count():
    def events(*data: str) -> list[bytes]:
        return [f"data: {d}\n".encode() for d in data] + [b"\n"]

    chunk = json.dumps({"choices": [{"delta": {"content": "a"}}]})
    usage = json.dumps({"choices": [], "usage": {"completion_tokens": 2}})
    assert api.read_sizes([0.0101, 0.0102, 0.5, 0.5001, 0.5004, 0.9]) == [2, 3, 1]
    assert api.read_sizes([]) == []
    assert api.stream_check(events(chunk, chunk, usage, "[DONE]"), 2) == ""
    assert api.stream_check(events(chunk, usage, "[DONE]"), 3).startswith("2 tokens instead of 3")
    assert api.stream_check(events(chunk, chunk), 2) == "stream ended without [DONE] after 2 events"
    assert api.stream_check(events(json.dumps({"error": {"message": "x"}})), 2).startswith("error event")
    assert api.stream_check(events("[DONE]"), 2) == "stream ended with [DONE] before any content event"
    assert api.tokens_check({"completion_tokens": 8}, 8, {}) == ""


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200),
       st.floats(min_value=0, max_value=1))
def test_the_percentile_is_one_of_the_values_and_monotone(values, q):
    got = clients.percentile(values, q)
    assert got in values and clients.percentile(values, 0) == min(values)
    assert clients.percentile(values, 1) == max(values)
    assert got <= clients.percentile(values, min(1.0, q + 0.1))


def test_duration_summary():
    assert clients.duration_summary([]) == {}
    assert clients.duration_summary([2.0]) == {"min": 2.0, "p50": 2.0, "p99": 2.0, "max": 2.0}
    durations = [float(n) for n in range(1, 201)]       # 1 .. 200 s
    assert clients.duration_summary(durations) == {"min": 1.0, "p50": 100.5, "p99": 198.0, "max": 200.0}


def test_listening_sockets_parsed_from_ss():
    out = ("LISTEN 0 4096 127.0.0.1:8000 0.0.0.0:* users:((\"vllm\",pid=7,fd=3))\n"
           "LISTEN 0 511 [::1]:9090 [::]:*\n\n")
    assert node.parse_listening(out) == [("127.0.0.1", 8000, 'users:(("vllm",pid=7,fd=3))'), ("::1", 9090, "")]
