"""A fleet changed by playbooks/rollout.yml while clients use it (issue 12), driven step by step: each step is one
real `ansible-playbook playbooks/rollout.yml` run against this scenario's inventory, with a restart witness on both
nodes and, where it matters, a client loop sending chat completions through the gateway the whole time.

The sequence (file order; pytest -x, each step starts from the state the one before left):
  01 the converge left both nodes on 0.31.0 behind the gateway, both UP in HAProxy
  02 from outside the fleet network (fleet-client, on the front network only) only the gateway's port answers
  03 conversations (issue 31): the same multi-turn workload without a key (least connections) and with one
     (affinity): prefix-cache hit rate (per replica from vLLM's counters, per turn from the answers) and time to
     first token of both; then more clients than the gateway's limits: only 200 or 429 with Retry-After
  04 rollout to vLLM 0.32.0 under the client loop and the conversations: 0 failed requests, both nodes on 0.32.0,
     one restart each, a long generation in flight when each node's drain began; the hit rate's recovery after it;
     the canary published its compile caches and the second node started with them (it had none of its own:
     received the archive's bytes), each node's start-to-healthy (its gate's inference check report) recorded, the
     second's against the canary's
  05 the same rollout again: no restart (MainPID unchanged), no drain, both reports "unchanged"
  06 a serving flag change (max-model-len lowered by a quarter) with a flag vLLM refuses on the second node only,
     under the client loop: the first node serves the change, the second is rolled back and serving, the play fails
     naming it and the cause, 0 failed requests, a long generation in flight when each drain began
The client loop (steps 04 and 06): 8 concurrent clients through the gateway, streamed and not in turn. Six send short
completions with a think time between two; two send long generations (as many tokens as the smallest max-model-len
in force leaves, ignore_eos) back to back, the second started later, only from shortly before each drain until it
began (the gate: gate_rules), so some are in flight when each drain begins and none while the nodes converge.
Measurements go to artifacts/fleet/measurements.json (per step: seconds, client counts and p50/p99 per kind, each
node's drain start, wait and what was in flight then, time out of the pool, stop and start seconds); each run's output
to artifacts/fleet/<step>.log, the client loop's counts and every request to artifacts/fleet/client-<step>.json.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import vllm_metrics
from harness import api, haproxy, playbook
from harness import conversations as conv
from harness.clients import Client, ClientLoop
from harness.figures import Figures
from harness.node import inference_check
from harness.project import PROJECT, machine
from harness.unit import restarts, show, stop_start_seconds, witness

SCENARIO = Path(__file__).resolve().parents[1]
ARTIFACTS = PROJECT / "artifacts" / "fleet"
FIGURES = Figures(ARTIFACTS / "measurements.json")
NODES = ["fleet-node1", "fleet-node2"]
GATEWAY, CLIENT = "fleet-gateway", "fleet-client"
FRONT_ADDRESS = "10.212.13.10"    # the gateway on the front network (molecule.yml): what clients connect to
GATEWAY_PORT = 443
VLLM_PORT = 8000
FRONT = api.Gateway(FRONT_ADDRESS, GATEWAY_PORT)  # the gateway as clients reach it (TLS: the demo CA)
SOCKET = "/run/haproxy/gateway.sock"
KEY = yaml.safe_load((SCENARIO / "group_vars" / "all.yml").read_text())["vllm_node_api_key"]
ADDRESS = {node: yaml.safe_load((SCENARIO / "host_vars" / f"{node}.yml").read_text())["vllm_node_listen_address"]
           for node in NODES}
BAD_FLAG = "--rollout-test-unknown-flag"
# The client loop's bounds: it stops when the step's run ends, or at these.
CLIENT_MAX_REQUESTS = 20000
CLIENT_MAX_SECONDS = 3600
# Its clients: short completions with a think time (the shared cores' room: the CI machine runs three other lanes
# beside this one), and long generations back to back, the second client started LONG_STAGGER s after the first.
# The long ones run only around each drain (the gate, see under_load): generating throughout, they kept both
# engines busy for the whole rollout and took over half of the CI machine's CPU (docs/measurements.md).
SHORT_TOKENS, SHORT_CLIENTS, SHORT_THINK = 8, 6, 3.0
# No think time between long generations: two that end together (vLLM batches them) left a 1 s gap with none in
# flight, and step 06's second drain began in it.
LONG_CLIENTS, LONG_THINK, LONG_STAGGER = 2, 0.0, 8.0
# Where the rollout's log opens and closes the long generations' gate, so that they run ~10-30 s before each drain
# (on an idle machine) and not while nodes converge. Open: the first time the service role checks its plan (the check
# play, ~25 s before the first drain), and when a batch's node passed its benchmark (~9 s before the next batch's
# drain); the tasks right before a drain take only ~2 s, too little for the clients to start. Closed: the drained
# node's wait for its requests began (the drain is set: what is in flight then is what it waits for), and the recap
# (for the long generations only: step 04's conversations go on to show their hit rate's recovery).
FIRST_OPEN = r"^TASK \[[^\]]*vllm_service : Check the plan before anything changes\]"
NEXT_OPEN = r"^TASK \[[^\]]*inference_check : Judge the endpoint\]"
DRAIN_WAIT = r"^TASK \[[^\]]*Wait \(bounded, rollout_drain_timeout\)"
RECAP = r"^PLAY RECAP"
LONG_TIMEOUT = 900        # seconds a long generation's socket may wait (a non-streamed answer comes whole at the end)
PROMPT_MARGIN = 128       # tokens of max-model-len left for the prompt and the chat template
DRAIN_TIMEOUT = yaml.safe_load((PROJECT / "roles" / "rollout" / "defaults" / "main.yml").read_text())[
    "rollout_drain_timeout"]
# Where the rollout leaves the canary's packed compile caches, one archive per key (rollout_cache_store's default:
# beside the reports). Emptied before step 04: an archive of an earlier run would reach the canary itself.
CACHE_STORE = PROJECT / "artifacts" / "rollout" / "compile-cache"
# Whole seconds (the report's systemd timestamps) against the witness's microseconds, and the report's own rounding.
START_SLACK_S = 2.0

# The conversations (issue 31; steps 03 and 04): CONVERSATIONS keys per block, half of them on each replica
# (balanced_keys), each with its own system prompt of SYSTEM_WORDS words (~2,800 tiny-llama tokens: its prefill
# stands out of the gateway's and the shared cores' noise) and chats of TURNS turns of USER_WORDS words answered in
# ANSWER_TOKENS tokens, CONV_CONCURRENCY at a time, CONV_ROUNDS rounds (one chat each; two chats cost twice the
# CPU of the shared cores). The nodes' KV cache is
# pinned (group_vars/vllm_nodes/conversations.yml) below what half of the conversations need at their longest: with
# affinity each replica keeps most of its half cached; least connections sends every conversation to both, and each
# replica's cache turns over before most of them come back.
# A round's order alternates the two replicas' conversations (shuffled within each), as many conversations would
# spread their arrivals: with 4 in flight a random order put 3 or 4 on one replica, and that replica's queue, not
# the cache, decided the time to first token (hits 86-108 ms, misses 155-181 ms there against 108-136 ms for
# least connections' misses; docs/measurements.md).
CONVERSATIONS, TURNS, SYSTEM_WORDS, USER_WORDS, ANSWER_TOKENS = 32, 6, 400, 10, 16
CONV_CONCURRENCY, CONV_ROUNDS, CONV_MAX_SECONDS = 4, 6, 900
# The blocks of step 03, each its own conversations, in an order that gives both ways the machine's load alike: the
# other work on the shared cores moved a block's TTFT p50 by +-20 ms, as much as the cache saves at this scale.
BLOCKS = ("leastconn", "affinity", "affinity", "leastconn", "affinity", "leastconn", "leastconn", "affinity")
# The conversations beside the step 04 rollout: STEADY_ROUNDS rounds before it starts (their hit rate is the level),
# then only while the long generations' gate is open (shortly before each drain until it began: turns in flight at
# each drain) and from the last node's return until the hit rate is back (RECOVERY_SHARE of the level, at most
# RECOVERY_MAX_S after the rollout). Sending all along kept both engines busy for the whole rollout: ~2,500 CPU-s
# of the shared cores, and the nodes' converges and gates slower (docs/measurements.md).
ROLLOUT_CONV_CONCURRENCY, STEADY_ROUNDS, RECOVERY_SHARE, RECOVERY_MAX_S = 4, 6, 0.9, 300
# Keys tried (in order) until each replica has CONVERSATIONS / 2 of them: the consistent hash splits a few dozen
# keys unevenly (15/5 of 20 happens), and the comparison is about the caches, not about the ring's balance.
KEY_CANDIDATES = 6 * CONVERSATIONS
AFFINITY_HEADER = yaml.safe_load((PROJECT / "roles" / "gateway" / "defaults" / "main.yml").read_text())[
    "gateway_affinity_header"]
# Saturation: more clients than the gateway admits (group_vars/gateways.yml: connections per server and queue), each
# sending SATURATION_REQUESTS completions of SATURATION_TOKENS tokens, waiting Retry-After after a 429.
SATURATION_CLIENTS, SATURATION_REQUESTS, SATURATION_TOKENS, SATURATION_MAX_S = 60, 3, 64, 600

testinfra_hosts = [f"ansible://{NODES[0]}"]

# What the steps pass on: the extra vars in force (the fleet's inventory state after each successful rollout).
STATE: dict[str, Any] = {"vars": {}}


# ---- helpers -------------------------------------------------------------------------------------------------


def rollout(step: str, extra_vars: dict[str, Any], timeout: int = 3600) -> tuple[int, str, float]:
    """Run playbooks/rollout.yml with these extra vars; (rc, output, seconds). The output is kept in
    artifacts/fleet/<step>.log."""
    # step 05 reads the skipped drain
    return playbook.in_scenario("fleet", step, "playbooks/rollout.yml", extra_vars=extra_vars, timeout=timeout,
                                env=playbook.environment(ANSIBLE_DISPLAY_SKIPPED_HOSTS="true"))


def node_get(node, name: str, path: str) -> tuple[int, str]:
    """A request to a node's vLLM from inside the node (its fleet address), with the key."""
    return api.curl(node, f"http://{ADDRESS[name]}:{VLLM_PORT}{path}", KEY)


def served(name: str) -> dict[str, Any]:
    """What a node serves: /version and /v1/models' entry (id, root, max_model_len)."""
    node = machine(name)
    status, version = node_get(node, name, "/version")
    assert status == 200, (name, status, version)
    status, models = node_get(node, name, "/v1/models")
    assert status == 200, (name, status, models)
    return {"version": json.loads(version)["version"], **json.loads(models)["data"][0]}


def gateway_servers() -> dict[str, dict[str, Any]]:
    """HAProxy's view of the backend `vllm`: server -> status, weight, stot (requests sent to it so far), ..."""
    return haproxy.servers(haproxy.runtime_command_on(machine(GATEWAY), SOCKET, "show stat"), "vllm")


def haproxy_log_since(since: str) -> list[str]:
    """HAProxy's own journal lines since an epoch second of the gateway (server state changes are logged there)."""
    out = machine(GATEWAY).check_output(f"journalctl -u haproxy --since @{since} -o cat")
    return [line for line in out.splitlines() if "vllm/" in line]


def report(name: str) -> dict[str, Any]:
    return json.loads((PROJECT / "artifacts" / "rollout" / f"{name}.json").read_text())


def client_loop(model: str, long_tokens: int) -> ClientLoop:
    """Chat completions through the gateway, bounded: SHORT_CLIENTS clients of SHORT_TOKENS tokens and LONG_CLIENTS
    of `long_tokens` (ignore_eos), streamed and not in turn."""
    tokens = {"short": SHORT_TOKENS, "long": long_tokens}

    def request(kind: str, stream: bool) -> str:
        return FRONT.chat_once(KEY, model, stream, tokens[kind], timeout=LONG_TIMEOUT if kind == "long" else 120)

    clients = ([Client("long", LONG_THINK, i * LONG_STAGGER, gated=True) for i in range(LONG_CLIENTS)]
               + [Client("short", SHORT_THINK, 0.25 * i) for i in range(SHORT_CLIENTS)])
    return ClientLoop(request, CLIENT_MAX_REQUESTS, CLIENT_MAX_SECONDS, clients)


def gate_rules(client: ClientLoop, talks: conv.ConversationLoop | None) -> list[tuple[str, Callable[[str], None]]]:
    """The log follower's rules that open and close the client loop's gate and the conversations' (FIRST_OPEN only
    once: the same task runs again in each batch's converge)."""
    first_seen: list[str] = []
    loops: list[ClientLoop | conv.ConversationLoop] = [client, *([talks] if talks else [])]

    def open_gates(_line: str) -> None:
        for loop in loops:
            loop.open_gate()

    def first_open(line: str) -> None:
        if not first_seen:
            first_seen.append(line)
            open_gates(line)

    def close_gates(_line: str) -> None:
        for loop in loops:
            loop.close_gate()

    return [(FIRST_OPEN, first_open), (NEXT_OPEN, open_gates), (DRAIN_WAIT, close_gates),
            (RECAP, lambda _line: client.close_gate())]


def under_load(step: str, extra_vars: dict[str, Any], model: str, long_tokens: int,
               talks: conv.ConversationLoop | None = None) -> tuple[int, str, float, dict[str, Any], ClientLoop]:
    """A rollout with the client loop running from before it starts until after it ends (its requests in flight
    then included); the long generations, and `talks` where given, only from shortly before each drain until it
    began (gate_rules: the rollout's log as it is written)."""
    client = client_loop(model, long_tokens)
    log = playbook.scenario_log("fleet", step)
    log.unlink(missing_ok=True)   # the follower reads this run's log only
    client.start()
    time.sleep(5)  # requests in flight before the first drain
    try:
        with playbook.LogFollower(log, gate_rules(client, talks)):
            rc, output, seconds = rollout(step, extra_vars)
        time.sleep(5)  # and after the last node is back
    finally:
        counts = client.stop(timeout=LONG_TIMEOUT)
    (ARTIFACTS / f"client-{step}.json").write_text(json.dumps(
        dict(counts, requests=[vars(r) for r in client.records]), indent=1) + "\n")
    return rc, output, seconds, counts, client


def start_figures(name: str, start_s: float | None) -> dict[str, Any]:
    """A node's last start from its inference check report (the rollout's gate writes it): when it began,
    start-to-healthy (systemd's InactiveExit to ActiveEnter, whole seconds), the parts' total and summary, what vLLM
    found in its compile cache; beside it `start_s`, the same start from the witness's monotonic timestamps."""
    unit = inference_check(name)["unit"]
    phases = unit.get("phases") or {}
    return {"started_at": unit["started_at"], "start_to_healthy_s": unit["seconds_to_healthy"], "start_s": start_s,
            "phases_total_s": phases.get("total_seconds"), "compile_cache": phases.get("compile_cache"),
            "phases": phases.get("summary")}


def archive_files(archive: Path, key: str) -> dict[str, int]:
    """The regular files of the canary's packed keyed directory (members `<key>/...`): path below it -> bytes."""
    with tarfile.open(archive) as tar:
        return {member.name.removeprefix(f"{key}/"): member.size for member in tar.getmembers() if member.isfile()}


def cache_files(name: str) -> dict[str, int]:
    """The files of the compile-cache directory the node's vLLM runs with (its unit's XDG_CACHE_HOME, the plan's
    keyed directory): path below it -> bytes."""
    host = machine(name)
    environment = dict(item.split("=", 1) for item in shlex.split(show(host, properties=["Environment"])["Environment"])
                       if "=" in item)
    out = host.check_output(f"find {shlex.quote(environment['XDG_CACHE_HOME'])} -type f -printf '%P\\t%s\\n'")
    return {path: int(size) for path, size in (line.rsplit("\t", 1) for line in out.splitlines() if line)}


def check_start(name: str, start: dict[str, Any], times: dict[str, Any]) -> None:
    """The report's start is this rollout's (between the node's drain and the end of its converge) and agrees with
    the witness's start seconds."""
    started, seconds = start["started_at"], start["start_to_healthy_s"]
    assert started is not None and int(float(times["drained"])) <= started <= float(times["converged"]), (
        f"{name}: the inference check report's start ({started}) is not this rollout's ({times})")
    assert seconds is not None and start["start_s"] is not None and abs(seconds - start["start_s"]) <= START_SLACK_S, (
        f"{name}: start-to-healthy {seconds} s in the report, {start['start_s']} s from systemd's timestamps")


def drain_figures(client: ClientLoop, reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per node that was drained: the drain's start (epoch, its rollout report), its wait until the node ran no
    request, what was left then, and how many requests (all, long) the client loop had in flight at its start."""
    out = {}
    for name, rep in reports.items():
        if "drain" in rep["times"]:
            at = float(rep["times"]["drain"])
            flight = client.in_flight(at)
            out[name] = {"drain_start": round(at, 3), "drain_wait_s": rep["seconds"]["drain_wait"],
                         "requests_left": rep["drain"]["requests_left"], "in_flight": flight["all"],
                         "long_in_flight": flight.get("long", 0)}
    return out


def check_load(client: dict[str, Any], drains: dict[str, dict[str, Any]]) -> None:
    """0 failed requests, both kinds sent, every node drained with a long generation in flight at its drain's
    start and empty before rollout_drain_timeout, which no long generation reaches."""
    assert client["failed"] == 0, client["failures"]
    assert client["kinds"].get("short", {}).get("sent") and client["kinds"].get("long", {}).get("sent"), client
    assert sorted(drains) == NODES, drains
    for name, drain in drains.items():
        assert drain["long_in_flight"] >= 1, f"{name}: no long generation in flight when its drain began: {drain}"
        assert int(drain["requests_left"]) == 0 and drain["drain_wait_s"] < DRAIN_TIMEOUT, (name, drain)
    longest = client["kinds"]["long"]["duration_s"]["max"]
    assert longest < DRAIN_TIMEOUT, f"a long generation took {longest} s, rollout_drain_timeout is {DRAIN_TIMEOUT}"


def gateway_send(body: dict[str, Any], headers: dict[str, str]) -> conv.Answer:
    """One streamed chat completion through the gateway, as a client outside the fleet sends it."""
    return conv.stream_answer(FRONT.connection(300), body, {"Authorization": f"Bearer {KEY}", **headers})


def affinity_requests() -> dict[str, int]:
    """Requests HAProxy has sent each node through the affinity backend so far (its stot)."""
    servers = haproxy.servers(haproxy.runtime_command_on(machine(GATEWAY), SOCKET, "show stat"), "vllm_affinity")
    return {name: int(servers[name]["stot"]) for name in NODES}


def balanced_keys(model: str, count: int) -> tuple[list[conv.Conversation], dict[str, list[str]]]:
    """`count` conversations, half of their keys on each replica, in alternation: one short keyed request per
    candidate key, one at a time on an idle gateway (so the bounded load never moves it), and HAProxy's counters say
    where it went."""
    home: dict[str, list[str]] = {name: [] for name in NODES}
    by_node: dict[str, list[conv.Conversation]] = {name: [] for name in NODES}
    before = affinity_requests()
    for candidate in conv.conversations(KEY_CANDIDATES, SYSTEM_WORDS, "conversation"):
        answer = gateway_send({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                              {AFFINITY_HEADER: candidate.key})
        assert answer.status == 200 and not answer.error, (candidate.key, answer)
        after = affinity_requests()
        went, before = [name for name, count in after.items() if count > before[name]], after
        assert len(went) == 1, (candidate.key, went)
        if len(home[went[0]]) < count // 2:
            home[went[0]].append(candidate.key)
            by_node[went[0]].append(candidate)
        if sum(len(keys) for keys in home.values()) == count:
            return [c for pair in zip(*by_node.values(), strict=True) for c in pair], home
    raise AssertionError(f"{KEY_CANDIDATES} keys did not give {count // 2} per replica: {home}")


def prefix_counters() -> dict[str, dict[str, float | None]]:
    """Each node's prefix-cache counters since its vLLM started (queries, hits: prompt tokens)."""
    return {name: vllm_metrics.prefix_cache(node_get(machine(name), name, "/metrics")[1]) for name in NODES}


def replica_hit_rates(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per node between two reads of prefix_counters: prompt tokens looked up, found cached, and their ratio."""
    out = {}
    for name in NODES:
        queries = (after[name]["queries"] or 0) - (before[name]["queries"] or 0)
        hits = (after[name]["hits"] or 0) - (before[name]["hits"] or 0)
        out[name] = {"queries": int(queries), "hits": int(hits),
                     "hit_rate": round(hits / queries, 4) if queries else None}
    return out


def conversation_block(model: str, block: str, convs: list[conv.Conversation], keyed: bool) -> dict[str, Any]:
    """CONV_ROUNDS rounds of these conversations with the affinity key or without it: the turns after the first round
    (nothing is cached yet then, either way), every turn's summary, each replica's counters over the block."""
    loop = conv.ConversationLoop(gateway_send, model, convs, turns=TURNS, concurrency=CONV_CONCURRENCY,
                                 user_words=USER_WORDS, answer_tokens=ANSWER_TOKENS,
                                 header=AFFINITY_HEADER if keyed else None, max_rounds=CONV_ROUNDS,
                                 max_seconds=CONV_MAX_SECONDS, seed=block, interleave=len(NODES))
    before, start = prefix_counters(), time.monotonic()
    every = loop.run()
    seconds, after = time.monotonic() - start, prefix_counters()
    (ARTIFACTS / f"conversations-03-{block}.json").write_text(json.dumps(loop.dump(), indent=1) + "\n")
    return {"seconds": round(seconds, 1), "all_turns": every, "turns": [t for t in loop.records if t.round > 0],
            "replicas": replica_hit_rates(before, after), "rounds": [r["hit_rate"] for r in loop.rounds]}


def compared(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One way's blocks together: the clients' summary of their turns after the first round, every turn's, each
    replica's counters summed, and each block's seconds, hit rate and TTFT."""
    replicas = {name: {k: sum(b["replicas"][name][k] for b in blocks) for k in ("queries", "hits")} for name in NODES}
    for counts in replicas.values():
        counts["hit_rate"] = round(counts["hits"] / counts["queries"], 4) if counts["queries"] else None
    return {"after_first_round": conv.summary([t for b in blocks for t in b["turns"]]),
            "all_turns": {**{k: sum(b["all_turns"][k] for b in blocks) for k in ("turns", "answered", "refused_429",
                                                                                   "failed")},
                          "failures": [f for b in blocks for f in b["all_turns"]["failures"]][:10]},
            "replicas": replicas,
            "blocks": [{"seconds": b["seconds"], **{k: v for k, v in conv.summary(b["turns"]).items()
                                                    if k in ("hit_rate", "ttft_ms")},
                        "rounds": b["rounds"], "ttft_p50_ms_hit_miss": hit_miss_ttft(b["turns"])} for b in blocks]}


def hit_miss_ttft(turns: list[conv.Turn]) -> dict[str, float | None]:
    """TTFT p50 (ms) of the turns whose prompt was mostly cached (over 80 %) and of those mostly not (under 20 %)."""
    def p50(selected: list[conv.Turn]) -> float | None:
        return round(statistics.median(t.ttft for t in selected if t.ttft) * 1000, 1) if selected else None
    answered = [t for t in turns if t.status == 200 and t.prompt_tokens and t.ttft]
    return {"hit": p50([t for t in answered if t.cached_tokens > 0.8 * t.prompt_tokens]),
            "miss": p50([t for t in answered if t.cached_tokens < 0.2 * t.prompt_tokens])}


def saturate(model: str) -> dict[str, Any]:
    """SATURATION_CLIENTS clients at once through the gateway, each SATURATION_REQUESTS completions (after a 429 it
    waits the Retry-After it was given): every answer's status and whether a 429 carried Retry-After."""
    body = {"model": model, "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": SATURATION_TOKENS, "ignore_eos": True}
    deadline = time.monotonic() + SATURATION_MAX_S
    answers: list[conv.Answer] = []

    def client(_index: int) -> list[conv.Answer]:
        mine = []
        for _ in range(SATURATION_REQUESTS):
            if time.monotonic() > deadline:
                break
            answer = gateway_send(body, {})
            mine.append(answer)
            if answer.status == 429:
                time.sleep(float(answer.retry_after or 1))
        return mine

    start = time.monotonic()
    with ThreadPoolExecutor(SATURATION_CLIENTS) as pool:
        for mine in pool.map(client, range(SATURATION_CLIENTS)):
            answers.extend(mine)
    statuses: dict[str, int] = {}
    for answer in answers:
        ok = (answer.status == 200 and not answer.error) or answer.status == 429
        label = str(answer.status) if ok else f"{answer.status}: {answer.error[:80]}"
        statuses[label] = statuses.get(label, 0) + 1
    seconds_200 = [a.seconds for a in answers if a.status == 200 and not a.error]
    return {"seconds": round(time.monotonic() - start, 1), "requests": len(answers), "statuses": statuses,
            "429_without_retry_after": sum(1 for a in answers if a.status == 429 and not a.retry_after),
            "retry_after": sorted({a.retry_after for a in answers if a.status == 429 and a.retry_after}),
            "ok_seconds": {"p50": round(statistics.median(seconds_200), 2) if seconds_200 else None,
                           "max": round(max(seconds_200), 2) if seconds_200 else None}}


def conversations_beside(model: str) -> conv.ConversationLoop:
    """Step 03's conversations (with their key) continued beside a rollout, until stopped."""
    return conv.ConversationLoop(gateway_send, model, STATE["conversations"], turns=TURNS,
                                 concurrency=ROLLOUT_CONV_CONCURRENCY, user_words=USER_WORDS,
                                 answer_tokens=ANSWER_TOKENS, header=AFFINITY_HEADER, max_rounds=10_000,
                                 max_seconds=3600 + RECOVERY_MAX_S, seed="rollout", interleave=len(NODES))


def hit_rate_recovery(talks: conv.ConversationLoop, reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The conversations' hit rate before the first drain (the median of the rounds that ended before it, the first
    two left out: the saturation's prompts evicted some conversations), its lowest round during the rollout, and
    how fast it came back after the last node was put back in the pool (waiting for that at most RECOVERY_MAX_S)."""
    first_drain = min(float(rep["times"]["drain"]) for rep in reports.values())
    back = max(float(rep["times"]["enabled"]) for rep in reports.values())
    before = [r["hit_rate"] for r in talks.rounds if r["end"] <= first_drain and r["hit_rate"] is not None][2:]
    assert len(before) >= 3, f"only {len(before)} rounds of conversations before the first drain: {talks.rounds[:5]}"
    steady = statistics.median(before)
    deadline = time.monotonic() + RECOVERY_MAX_S
    came_back = conv.recovery(talks.rounds, back, steady, RECOVERY_SHARE)
    while came_back["rounds"] is None and time.monotonic() < deadline:
        time.sleep(2)
        came_back = conv.recovery(talks.rounds, back, steady, RECOVERY_SHARE)
    during = [r["hit_rate"] for r in talks.rounds if first_drain <= r["start"] <= back and r["hit_rate"] is not None]
    return {"steady": steady, "steady_rounds": len(before), "lowest_during": min(during) if during else None,
            "rounds_during": len(during), "recovery": came_back}


@pytest.fixture(scope="module")
def model() -> str:
    return served(NODES[0])["id"]


# ---- the sequence --------------------------------------------------------------------------------------------


def test_01_converged_fleet(model):
    """Both nodes serve 0.31.0 on their fleet address, both UP in the gateway (leastconn), a completion through it."""
    FIGURES.reset()
    versions = {name: served(name)["version"] for name in NODES}
    assert versions == {name: "0.31.0" for name in NODES}
    servers = gateway_servers()
    assert {name: servers[name]["status"] for name in NODES} == {name: "UP" for name in NODES}
    assert "balance leastconn" in machine(GATEWAY).file("/etc/haproxy/haproxy.cfg").content_string
    assert FRONT.chat_once(KEY, model, False) == "" and FRONT.chat_once(KEY, model, True) == ""
    for name in NODES:
        assert machine(name).file("/var/lib/vllm-node/benchmark-last.json").exists, "no baseline for the gate"
    FIGURES.record("01-converged", dict(versions=versions, gateway=servers))


def test_02_only_the_gateway_answers_outside_the_fleet_network():
    """From fleet-client (front network only): the gateway's port answers; every TCP port listening on a node
    (vLLM's API on the fleet address included) and every other port of the gateway's front address do not."""
    client = machine(CLIENT)
    probe = ("import socket,sys,json\nout={}\nfor a in sys.argv[2:]:\n h,p=a.rsplit(':',1)\n"
             " try:\n  socket.create_connection((h,int(p)),timeout=float(sys.argv[1])).close(); out[a]=True\n"
             " except OSError: out[a]=False\nprint(json.dumps(out))")

    def reachable(timeout: float, targets: list[str]) -> dict[str, bool]:
        return json.loads(client.check_output(f"python3 -c {shlex.quote(probe)} {timeout} {' '.join(targets)}"))

    node_targets = []
    for name in NODES:
        ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in machine(name).check_output("ss -Hltn").splitlines()}
        assert VLLM_PORT in ports
        node_targets += [f"{ADDRESS[name]}:{port}" for port in sorted(ports)]
    gateway_ports = {int(line.split()[3].rsplit(":", 1)[1])
                     for line in machine(GATEWAY).check_output("ss -Hltn").splitlines()}
    gateway_targets = [f"{FRONT_ADDRESS}:{port}" for port in sorted(gateway_ports | {VLLM_PORT, 22, 80})]
    for name in NODES:
        uid = machine(name).user("vllm").uid
        own = [line.split()[3] for line in machine(name).check_output("ss -Hltne").splitlines()
               if re.search(rf"\buid:{uid}\b", line)]
        beyond = [s for s in own
                  if not re.match(r"^127\.\d+\.\d+\.\d+:\d+$", s) and s != f"{ADDRESS[name]}:{VLLM_PORT}"]
        assert own and not beyond, f"{name}: the vllm user listens beyond loopback and its API address: {beyond}"
    nodes = reachable(2, node_targets)
    gateway = reachable(2, gateway_targets)
    FIGURES.record("02-outside", dict(nodes=nodes, gateway=gateway))
    assert gateway[f"{FRONT_ADDRESS}:{GATEWAY_PORT}"], "the gateway does not answer from outside the fleet network"
    assert [t for t, ok in gateway.items() if ok] == [f"{FRONT_ADDRESS}:{GATEWAY_PORT}"]
    assert not any(nodes.values()), [t for t, ok in nodes.items() if ok]


def test_03_conversations_keep_their_prefix_cache_with_affinity_and_saturation_is_refused_with_429(model):
    """The same workload without a key (least connections) and with one (consistent hash, bounded load), in blocks
    (BLOCKS) ordered so that both see the machine's load alike: with affinity the hit rate at least twice least
    connections' (each replica's higher) and the time to first token's p50 lower; no turn fails either way. Then
    more clients than the gateway admits: only 200 or 429 with Retry-After."""
    keyed_convs, home = balanced_keys(model, 2 * CONVERSATIONS)
    keyed_sets = (keyed_convs[:CONVERSATIONS], keyed_convs[CONVERSATIONS:])
    runs: dict[str, list[dict[str, Any]]] = {"leastconn": [], "affinity": []}
    for index, way in enumerate(BLOCKS):
        block = f"{index}-{way}"
        keyed_set = keyed_sets[len(runs["affinity"]) % 2]     # the two sets of keys in turn
        convs = keyed_set if way == "affinity" else conv.conversations(CONVERSATIONS, SYSTEM_WORDS, block)
        runs[way].append(conversation_block(model, block, convs, keyed=way == "affinity"))
    # the last affinity block's conversations (their prefixes cached): step 04 carries on with them
    STATE["conversations"] = keyed_sets[(len(runs["affinity"]) - 1) % 2]
    leastconn, affinity = compared(runs["leastconn"]), compared(runs["affinity"])
    saturation = saturate(model)
    FIGURES.record("03-conversations", dict(keys_per_replica={name: len(keys) for name, keys in home.items()},
                                            leastconn=leastconn, affinity=affinity, saturation=saturation))
    for way in (leastconn, affinity):
        assert way["all_turns"]["failed"] == 0 and way["all_turns"]["refused_429"] == 0, way["all_turns"]
        assert way["all_turns"]["answered"] == BLOCKS.count("affinity") * CONVERSATIONS * CONV_ROUNDS, way["all_turns"]
    plain, keyed = leastconn["after_first_round"], affinity["after_first_round"]
    assert keyed["hit_rate"] >= 2 * plain["hit_rate"], (
        f"affinity's hit rate {keyed['hit_rate']} is not twice least connections' {plain['hit_rate']}")
    for name in NODES:
        ours, theirs = affinity["replicas"][name]["hit_rate"], leastconn["replicas"][name]["hit_rate"]
        assert ours is not None and theirs is not None and ours > theirs, (name, ours, theirs)
    statuses = saturation["statuses"]
    assert set(statuses) <= {"200", "429"}, statuses
    assert statuses.get("429", 0) > 0, f"{SATURATION_CLIENTS} clients did not reach the gateway's limits: {statuses}"
    assert statuses.get("200", 0) > 0 and saturation["429_without_retry_after"] == 0, saturation
    assert keyed["ttft_ms"]["p50"] < plain["ttft_ms"]["p50"], (keyed["ttft_ms"], plain["ttft_ms"])


def test_04_rollout_to_0_32_0_under_load(model):
    STATE["vars"] = {"vllm_node_vllm_version": "0.32.0"}
    before = {name: witness(machine(name)) for name in NODES}
    gateway_clock = machine(GATEWAY).check_output("date +%s").strip()
    stot_before = gateway_servers()
    long_tokens = min(served(name)["max_model_len"] for name in NODES) - PROMPT_MARGIN
    for stale in CACHE_STORE.glob("*.tar.gz"):
        stale.unlink()
    talks = conversations_beside(model)
    talks.start()
    try:
        # the level before the rollout; then only around each drain (the gate) and after the last node's return
        assert talks.wait_rounds(STEADY_ROUNDS, timeout=CONV_MAX_SECONDS), f"conversations stalled: {talks.rounds}"
        talks.close_gate()
        rc, output, seconds, client, loop = under_load("04-rollout-0.32.0", STATE["vars"], model, long_tokens,
                                                       talks)
        reports = {name: report(name) for name in NODES}
        talks.open_gate()
        recovered = hit_rate_recovery(talks, reports) if rc == 0 else {}
    finally:
        talked = talks.stop(timeout=300)
    (ARTIFACTS / "conversations-04-rollout.json").write_text(json.dumps(talks.dump(), indent=1) + "\n")
    after = {name: witness(machine(name)) for name in NODES}
    stot_after = gateway_servers()
    drains = haproxy_log_since(gateway_clock)
    drained = drain_figures(loop, reports)
    FIGURES.record("04-rollout-0.32.0", dict(
        rc=rc, seconds=round(seconds, 1), long_tokens=long_tokens, client=client,
        conversations={k: v for k, v in talked.items() if k != "failures"}, hit_rate=recovered,
        nodes={name: {"restarts": restarts(machine(name), before[name]), **stop_start_seconds(after[name]),
                      "drain": drained.get(name),
                      "out_of_pool_s": reports[name]["seconds"]["out_of_pool"],
                      "gateway_requests": int(stot_after[name]["stot"]) - int(stot_before[name]["stot"])}
               for name in NODES},
        haproxy_log=drains[:12]))
    assert rc == 0, f"rollout failed; see {playbook.scenario_log('fleet', '04-rollout-0.32.0')}\n{output[-3000:]}"
    check_load(client, drained)
    assert talked["failed"] == 0 and talked["refused_429"] == 0, talked
    assert recovered["recovery"]["rounds"] is not None, (
        f"the conversations' hit rate did not come back to {RECOVERY_SHARE} x {recovered['steady']} within "
        f"{RECOVERY_MAX_S} s of the rollout's end: {recovered}")
    for name in NODES:
        assert served(name)["version"] == "0.32.0"
        assert restarts(machine(name), before[name]) == 1, name
        assert reports[name]["outcome"] == "changed"
        assert gateway_servers()[name]["status"] == "UP"
    # the canary went first: its time out of the pool ended before the second node's began
    assert reports[NODES[0]]["times"]["enabled"] <= reports[NODES[1]]["times"]["drain"]
    # the canary's compile caches: it compiled its own and published them, the follower (same key) had none and
    # started with them; then each start, the follower's against the canary's
    canary, follower = (reports[name]["compile_cache"] for name in NODES)
    archive = CACHE_STORE / f"{canary.get('key')}.tar.gz"
    starts = {name: start_figures(name, stop_start_seconds(after[name])["start_s"]) for name in NODES}
    first, second = (starts[name]["start_to_healthy_s"] for name in NODES)
    carried = archive_files(archive, canary["key"]) if archive.exists() else {}
    held = {name: cache_files(name) for name in NODES}
    FIGURES.record("04-warm-restart", dict(
        compile_cache={name: reports[name]["compile_cache"] for name in NODES},
        archive_bytes=archive.stat().st_size if archive.exists() else None,
        archive_files=len(carried), archive_file_bytes=sum(carried.values()), archive_paths=sorted(carried)[:20],
        cache_files={name: {"files": len(files), "bytes": sum(files.values())} for name, files in held.items()},
        starts=starts, follower_over_canary=round(second / first, 3) if first else None))
    for name in NODES:
        check_start(name, starts[name], reports[name]["times"])
    assert canary.get("key") and follower.get("key") == canary["key"], (canary, follower)
    assert canary.get("published_bytes", 0) > 0, f"the canary published no cache: {canary}"
    assert archive.exists(), f"no archive of the canary's caches at {archive}"
    assert follower["had_own"] is False, f"{NODES[1]} had its own cache of the key: {follower}"
    assert follower["received_bytes"] == archive.stat().st_size > 0, (follower, archive.stat().st_size)
    # the archive carries files (not an empty directory's), and each of them is in the follower's keyed directory
    assert carried, f"the canary's archive holds no file: {archive}"
    assert not set(carried) - set(held[NODES[1]]), sorted(set(carried) - set(held[NODES[1]]))
    # whether HAProxy's log shows a drain: step 04's log check means something only then
    STATE["drain_logged"] = any("drain" in line.lower() for line in drains)


def test_05_a_rollout_that_changes_nothing_restarts_and_drains_nothing():
    before = {name: witness(machine(name)) for name in NODES}
    gateway_clock = machine(GATEWAY).check_output("date +%s").strip()
    rc, output, seconds = rollout("05-unchanged", STATE["vars"])
    after = {name: witness(machine(name)) for name in NODES}
    drain_tasks = [f"{status}:{host}"
                   for status, host in playbook.task_results(output, "Drain the node at the gateways")]
    FIGURES.record("05-unchanged", dict(
        rc=rc, seconds=round(seconds, 1), drain_task=drain_tasks,
        main_pid={name: [before[name]["MainPID"], after[name]["MainPID"]] for name in NODES}))
    assert rc == 0, output[-3000:]
    for name in NODES:
        assert after[name]["MainPID"] == before[name]["MainPID"] != "0", name
        assert restarts(machine(name), before[name]) == 0, name
        assert report(name)["outcome"] == "unchanged"
    assert drain_tasks and all(result.startswith("skipping:") for result in drain_tasks), drain_tasks
    if STATE.get("drain_logged"):  # HAProxy logged step 04's drains: none now
        assert not [line for line in haproxy_log_since(gateway_clock) if "drain" in line.lower()]


def test_06_a_node_that_fails_is_rolled_back_and_the_play_stops_naming_it(model):
    """max-model-len lowered by a quarter on the fleet; the second node also gets a flag vLLM refuses. The first node
    serves the change, the second fails to start, is rolled back (serving its previous configuration) and put back.
    The long generations fit the lower max-model-len (the first node serves it while the loop runs)."""
    before_len = served(NODES[1])["max_model_len"]
    lower = before_len - before_len // 4
    change = {"vllm_node_max_model_len": lower}
    once = {"vllm_node_extra_args": "{{ fleet_vllm_extra_args + (['" + BAD_FLAG + "'] if inventory_hostname == '"
                                    + NODES[1] + "' else []) }}"}
    before = {name: witness(machine(name)) for name in NODES}
    rc, output, seconds, client, loop = under_load("06-failure-on-node2", dict(STATE["vars"], **change, **once), model,
                                                   lower - PROMPT_MARGIN)
    after = {name: witness(machine(name)) for name in NODES}
    reports = {name: report(name) for name in NODES}
    drained = drain_figures(loop, reports)
    first, second = served(NODES[0]), served(NODES[1])
    FIGURES.record("06-failure-on-node2", dict(
        rc=rc, seconds=round(seconds, 1), long_tokens=lower - PROMPT_MARGIN, client=client,
        nodes={name: {"restarts": restarts(machine(name), before[name]), **stop_start_seconds(after[name]),
                      "outcome": reports[name]["outcome"], "cause": reports[name]["cause"][:300],
                      "drain": drained.get(name), "out_of_pool_s": reports[name]["seconds"]["out_of_pool"]}
               for name in NODES},
        served={NODES[0]: first["max_model_len"], NODES[1]: second["max_model_len"]}))
    assert rc != 0, "the rollout passed with a node that cannot start"
    assert f"Rollout stopped at {NODES[1]}" in output
    assert f"unrecognized arguments: {BAD_FLAG}" in output, "the cause is not named"
    check_load(client, drained)
    assert first["max_model_len"] == lower and restarts(machine(NODES[0]), before[NODES[0]]) == 1
    assert second["max_model_len"] == before_len and second["version"] == "0.32.0"
    assert reports[NODES[1]]["outcome"] == "failed" and BAD_FLAG in reports[NODES[1]]["cause"]
    assert BAD_FLAG not in machine(NODES[1]).file("/etc/systemd/system/vllm.service").content_string
    assert gateway_servers()[NODES[1]]["status"] == "UP"
    assert FRONT.chat_once(KEY, model, False) == ""
