"""The conversations' harness (tests/harness/conversations.py): the turns a conversation sends, the stream reader,
the summaries and the recovery figure, with a fake gateway that caches prefixes per replica like vLLM does."""
from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

import pytest

from harness import conversations as conv


def turn(**fields: Any) -> conv.Turn:
    base = {"key": "k", "turn": 1, "round": 0, "start": 0.0, "ttft": 0.01, "seconds": 0.02, "status": 200,
            "prompt_tokens": 100, "cached_tokens": 0, "retry_after": None, "error": ""}
    return conv.Turn(**{**base, **fields})


def test_a_conversation_grows_by_a_turn_and_starts_again_after_its_last():
    one = conv.conversations(1, 20, "seed")[0]
    first = one.next_body("m", 5, 4)
    assert first["messages"][0] == {"role": "system", "content": one.system} and len(first["messages"]) == 2
    one.answered("an answer", turns=2)
    second = one.next_body("m", 5, 4)
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert second["messages"][:3] == first["messages"] + [{"role": "assistant", "content": "an answer"}]
    one.answered("again", turns=2)
    assert one.turn == 1 and one.messages == []          # a new chat, the same system prompt
    third = one.next_body("m", 5, 4)
    assert third["messages"][0]["content"] == one.system and len(third["messages"]) == 2


def test_an_unanswered_turn_is_taken_back():
    one = conv.conversations(1, 20, "seed")[0]
    one.next_body("m", 5, 4)
    one.answered(None, turns=6)
    assert one.messages == [] and one.turn == 1


def test_conversations_are_reproducible_and_distinct():
    again = conv.conversations(3, 30, "s")
    assert [c.system for c in again] == [c.system for c in conv.conversations(3, 30, "s")]
    assert len({c.system for c in again}) == 3 and len({c.key for c in again}) == 3


def test_the_stream_reader_takes_the_first_content_usage_and_text():
    lines = [b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n', b"\n",
             b'data: {"choices":[{"delta":{"content":"he"}}]}\n', b'data: {"choices":[{"delta":{"content":"y"}}]}\n',
             b'data: {"choices":[],"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":8}}}\n',
             b"data: [DONE]\n"]
    answer = conv.read_events(iter(lines), 0.0)
    assert answer.status == 200 and not answer.error and answer.text == "hey" and answer.ttft is not None
    assert answer.usage["prompt_tokens_details"]["cached_tokens"] == 8


@pytest.mark.parametrize(("lines", "error"), [
    ([b'data: {"choices":[{"delta":{"content":"a"}}]}\n'], "without [DONE]"),
    ([b'data: {"error":{"message":"boom"}}\n'], "error event"),
    ([b"data: [DONE]\n"], "before any content"),
])
def test_an_incomplete_stream_is_a_failure(lines, error):
    assert error in conv.read_events(iter(lines), 0.0).error


def test_the_summary_counts_429_apart_from_failures_and_rates_only_answers():
    turns = [turn(prompt_tokens=100, cached_tokens=80, ttft=0.010),
             turn(prompt_tokens=100, cached_tokens=0, ttft=0.030),
             turn(status=429, retry_after="2", error="status 429"), turn(status=429, error="status 429"),
             turn(status=500, error="status 500: x"), turn(status=200, error="stream ended without [DONE]")]
    out = conv.summary(turns)
    assert (out["answered"], out["refused_429"], out["refused_without_retry_after"], out["failed"]) == (2, 2, 1, 2)
    assert out["hit_rate"] == 0.4 and out["ttft_ms"]["p50"] == 20.0 and out["ttft_ms"]["p99"] == 30.0


def test_recovery_is_the_first_round_after_the_end_back_at_the_share():
    rounds = [{"start": 0, "end": 5, "hit_rate": 0.9}, {"start": 10, "end": 12, "hit_rate": 0.2},
              {"start": 12, "end": 15, "hit_rate": 0.5}, {"start": 15, "end": 18, "hit_rate": 0.85}]
    assert conv.recovery(rounds, after=11, steady=0.9) == {"rounds": 2, "seconds": 7.0, "hit_rate": 0.85,
                                                           "target": 0.81}
    assert conv.recovery(rounds[:3], after=11, steady=0.9)["rounds"] is None


class CachingReplicas:
    """Two fake replicas behind a fake gateway: each caches whole 16-token blocks of the prompts it saw (a prompt's
    tokens are its characters), least recently used first out beyond `capacity` blocks; the gateway sends a request
    with the key by a hash of it, one without to the replica with fewer requests so far."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.lock = capacity, threading.Lock()
        self.caches: list[dict[str, None]] = [{}, {}]
        self.sent = [0, 0]

    def send(self, body: dict[str, Any], headers: dict[str, str]) -> conv.Answer:
        text = "".join(m["content"] for m in body["messages"])
        blocks = [text[: (i + 1) * 16] for i in range(len(text) // 16)]
        with self.lock:
            key = headers.get("X-Session-Id")
            replica = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 2 if key else self.sent.index(min(self.sent))
            self.sent[replica] += 1
            cache = self.caches[replica]
            hits = 0
            for block in blocks:
                if block not in cache:
                    break
                hits += 1
            for block in blocks:
                cache.pop(block, None)
                cache[block] = None
            while len(cache) > self.capacity:
                cache.pop(next(iter(cache)))
        return conv.Answer(200, 0.001 * (len(blocks) - hits + 1), 0.01, {
            "prompt_tokens": len(text), "prompt_tokens_details": {"cached_tokens": hits * 16}}, "answer text")


def test_with_a_key_the_conversations_find_their_prefixes_and_without_one_they_do_not():
    """The loop against fake replicas whose caches hold about half of the conversations: with the key the hit rate
    is high, without it far lower (the comparison the fleet scenario makes against real vLLM)."""
    rates = {}
    for header in ("X-Session-Id", None):
        replicas = CachingReplicas(capacity=8 * 30)
        convs = conv.conversations(16, 60, f"unit-{header}")
        loop = conv.ConversationLoop(replicas.send, "m", convs, turns=6, concurrency=1, user_words=4,
                                     answer_tokens=4, header=header, max_rounds=12, max_seconds=60)
        out = loop.run()
        assert out["answered"] == 16 * 12 and out["failed"] == 0 and len(loop.rounds) == 12
        rates[header] = conv.summary([t for t in loop.records if t.round > 0])["hit_rate"]
    assert rates["X-Session-Id"] >= 2 * rates[None], rates


def test_a_loop_started_beside_stops_when_asked():
    replicas = CachingReplicas(capacity=1000)
    loop = conv.ConversationLoop(replicas.send, "m", conv.conversations(2, 10, "stop"), turns=3, concurrency=2,
                                 user_words=2, answer_tokens=2, header=None, max_rounds=10_000, max_seconds=30)
    loop.start()
    deadline = time.monotonic() + 10
    while len(loop.rounds) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.running and len(loop.rounds) >= 3
    out = loop.stop(timeout=10)
    assert not loop.running and out["failed"] == 0 and out["answered"] == 2 * len(loop.rounds) < 2 * 10_000


def test_a_closed_gate_holds_the_next_round_and_opening_it_lets_the_rounds_go_on():
    loop = conv.ConversationLoop(CachingReplicas(1000).send, "m", conv.conversations(2, 10, "gate"), turns=3,
                                 concurrency=2, user_words=2, answer_tokens=2, header=None, max_rounds=10_000,
                                 max_seconds=30)
    loop.start()
    assert loop.wait_rounds(2, timeout=10)
    loop.close_gate()
    held, deadline = -1, time.monotonic() + 10
    while held != len(loop.rounds) and time.monotonic() < deadline:   # the round in flight when it closed ends
        held = len(loop.rounds)
        time.sleep(0.3)
    time.sleep(0.6)
    assert len(loop.rounds) == held and loop.running
    loop.open_gate()
    assert loop.wait_rounds(held + 2, timeout=10)
    out = loop.stop(timeout=10)
    assert out["failed"] == 0 and len(loop.gate.log) == 2 and loop.gate.log[0][1] > 0 and loop.gate.log[1][1] == 0
    assert loop.dump()["gate"] == loop.gate.log


def test_a_loop_stopped_while_its_gate_is_closed_ends():
    loop = conv.ConversationLoop(CachingReplicas(1000).send, "m", conv.conversations(2, 10, "closed"), turns=3,
                                 concurrency=1, user_words=2, answer_tokens=2, header=None, max_rounds=10_000,
                                 max_seconds=30)
    loop.close_gate()
    loop.start()
    time.sleep(0.3)
    assert loop.rounds == [] and loop.running
    loop.stop(timeout=5)
    assert not loop.running and loop.rounds == []


def test_an_interleaved_round_alternates_the_groups_and_shuffles_within_them():
    convs = conv.conversations(8, 5, "groups")
    loop = conv.ConversationLoop(CachingReplicas(100).send, "m", convs, turns=2, concurrency=1, user_words=2,
                                 answer_tokens=2, header=None, max_rounds=1, max_seconds=10, interleave=2)
    orders = [loop.round_order() for _ in range(20)]
    for order in orders:
        assert sorted(c.key for c in order) == sorted(c.key for c in convs)
        assert [convs.index(c) % 2 for c in order] == [0, 1] * 4
    assert len({tuple(c.key for c in order) for order in orders}) > 1
