"""Multi-turn conversations through a gateway (issue 31): each conversation has its own long system prompt and a key
(the gateway's affinity header), and grows by one user message and the model's answer per turn; after its last turn
it starts again from its system prompt (a new chat of the same session, the prompt still worth caching). Every turn
is one streamed chat completion whose time to first token, prompt tokens and cached prompt tokens (vLLM's
`usage.prompt_tokens_details.cached_tokens`, served with --enable-prompt-tokens-details) are recorded.

The turns go in rounds: in each round every conversation sends its next turn, in a shuffled order (a fixed order
would let least-connections hand a conversation the same replica again by accident; `interleave` shuffles groups
and alternates them), `concurrency` at a time. A
round's hit rate is its cached over its prompt tokens: what the replicas' prefix caches saved, as the clients see it.

Bounded: a loop stops at its round, request and time limits, or when stopped. Its gate, open at the start, holds the
next round while closed (the round in flight finishes): a test runs conversations only in the windows it cares about
and leaves the shared cores to the rest between them."""
from __future__ import annotations

import http.client
import itertools
import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.clients import Gate, percentile

# Words the prompts are made of; the test models' tokenizers split them into several tokens each.
WORDS = ("alpha", "river", "stone", "cloud", "north", "green", "table", "light", "music", "paper", "quick", "silver",
         "ocean", "forest", "garden", "window", "amber", "bridge", "candle", "desert", "engine", "falcon", "harbor")


@dataclass
class Answer:
    """One streamed chat completion as the client saw it: HTTP status (0: no answer), seconds to the first content
    event and to the end, the usage the stream reported, the answer's text, the Retry-After of a 429, and why it
    failed ('' when it did not)."""

    status: int
    ttft: float | None = None
    seconds: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    retry_after: str | None = None
    error: str = ""


Send = Callable[[dict[str, Any], dict[str, str]], Answer]


def stream_answer(connection: http.client.HTTPConnection, body: dict[str, Any], headers: dict[str, str]) -> Answer:
    """Send one chat completion with stream=True on `connection` (closed afterwards) and read its events."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    start = time.monotonic()
    try:
        connection.request("POST", "/v1/chat/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        if response.status != 200:
            text = response.read()[:300].decode(errors="replace")
            return Answer(response.status, seconds=time.monotonic() - start, retry_after=response.getheader(
                "Retry-After"), error=f"status {response.status}: {text}")
        return read_events(iter(response.readline, b""), start)
    except (OSError, http.client.HTTPException, ValueError) as err:
        return Answer(0, seconds=time.monotonic() - start, error=f"{type(err).__name__}: {err}")
    finally:
        connection.close()


def read_events(lines: Any, start: float) -> Answer:
    """A 200 stream's events: the first content event's time, the text, the usage; an answer without [DONE] or with
    an error event failed."""
    ttft, usage, parts = None, {}, []
    for line in lines:
        if line.strip() == b"data: [DONE]":
            error = "" if ttft is not None else "stream ended with [DONE] before any content event"
            return Answer(200, ttft, time.monotonic() - start, usage, "".join(parts), error=error)
        if line.startswith(b"data: "):
            event = json.loads(line[6:])
            if "error" in event:
                return Answer(200, ttft, time.monotonic() - start, usage, "".join(parts),
                              error=f"error event: {line[:200]!r}")
            for choice in event.get("choices") or []:
                if ttft is None:
                    ttft = time.monotonic() - start
                parts.append((choice.get("delta") or {}).get("content") or "")
            usage = event.get("usage") or usage
    return Answer(200, ttft, time.monotonic() - start, usage, "".join(parts), error="stream ended without [DONE]")


def words(rnd: random.Random, count: int) -> str:
    """`count` random words, each with a number (more distinct tokens than the words alone)."""
    return " ".join(f"{rnd.choice(WORDS)}{rnd.randint(0, 99)}" for _ in range(count))


@dataclass
class Conversation:
    """One conversation: its key, its system prompt, the messages after it and its next turn (1-based)."""

    key: str
    system: str
    seed: int
    messages: list[dict[str, str]] = field(default_factory=list)
    turn: int = 1

    def next_body(self, model: str, user_words: int, answer_tokens: int) -> dict[str, Any]:
        """The chat completion of the next turn: the system prompt, the history and a new user message."""
        rnd = random.Random(f"{self.seed}-{self.turn}-{len(self.messages)}")
        self.messages.append({"role": "user", "content": words(rnd, user_words)})
        return {"model": model, "messages": [{"role": "system", "content": self.system}, *self.messages],
                "max_tokens": answer_tokens, "ignore_eos": True}

    def answered(self, text: str | None, turns: int) -> None:
        """Keep the answer (or drop the unanswered user message); after `turns` turns start a new chat."""
        if text is None:
            self.messages.pop()
            return
        self.messages.append({"role": "assistant", "content": text})
        self.turn += 1
        if self.turn > turns:
            self.messages, self.turn = [], 1


def conversations(count: int, system_words: int, seed: str) -> list[Conversation]:
    """`count` conversations, each with its own system prompt of `system_words` words and key `<seed>-<i>`."""
    return [Conversation(f"{seed}-{i:02d}", words(random.Random(f"{seed}-system-{i}"), system_words), i)
            for i in range(count)]


@dataclass
class Turn:
    """One turn's record: conversation key, turn, round, start (epoch), time to first token and duration (s),
    status, prompt and cached tokens, Retry-After, why it failed ('' if it did not)."""

    key: str
    turn: int
    round: int
    start: float
    ttft: float | None
    seconds: float
    status: int
    prompt_tokens: int
    cached_tokens: int
    retry_after: str | None
    error: str


def summary(turns: Sequence[Turn]) -> dict[str, Any]:
    """Counts, the hit rate (cached / prompt tokens of the answered turns) and the time to first token's p50 and p99
    (ms) of a set of turns; `failed` counts every answer but 200 and 429, `refused` the 429s and whether each had a
    Retry-After."""
    answered = [t for t in turns if t.status == 200 and not t.error]
    refused = [t for t in turns if t.status == 429]
    failed = [t for t in turns if t not in answered and t not in refused]
    prompt = sum(t.prompt_tokens for t in answered)
    ttfts = [t.ttft * 1000 for t in answered if t.ttft is not None]
    return {
        "turns": len(turns), "answered": len(answered), "refused_429": len(refused),
        "refused_without_retry_after": sum(1 for t in refused if not t.retry_after),
        "failed": len(failed), "failures": sorted({t.error[:200] for t in failed})[:10],
        "prompt_tokens": prompt, "cached_tokens": sum(t.cached_tokens for t in answered),
        "hit_rate": round(sum(t.cached_tokens for t in answered) / prompt, 4) if prompt else None,
        "ttft_ms": {"p50": round(statistics.median(ttfts), 1) if ttfts else None,
                    "p99": round(percentile(ttfts, 0.99) or 0.0, 1) if ttfts else None},
    }


class ConversationLoop:
    """Conversations sent in rounds (see the module) through `send`, with the affinity header or without it, until
    stopped or at `max_rounds` / `max_seconds`; `run()` in the caller's thread, or `start()` / `stop()` beside it."""

    def __init__(self, send: Send, model: str, convs: list[Conversation], *, turns: int, concurrency: int,
                 user_words: int, answer_tokens: int, header: str | None, max_rounds: int, max_seconds: float,
                 seed: str = "order", interleave: int = 1) -> None:
        self.send, self.model, self.convs = send, model, convs
        self.turns, self.concurrency, self.header = turns, concurrency, header
        self.user_words, self.answer_tokens = user_words, answer_tokens
        self.max_rounds, self.max_seconds, self.interleave = max_rounds, max_seconds, interleave
        self.order = random.Random(seed)
        self.records: list[Turn] = []
        self.rounds: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self.gate = Gate(is_open=True)
        self._thread: threading.Thread | None = None

    def _turn(self, conv: Conversation, round_no: int) -> Turn:
        body = conv.next_body(self.model, self.user_words, self.answer_tokens)
        turn, start = conv.turn, time.time()
        answer = self.send(body, {self.header: conv.key} if self.header else {})
        conv.answered(answer.text if answer.status == 200 and not answer.error else None, self.turns)
        details = answer.usage.get("prompt_tokens_details") or {}
        return Turn(conv.key, turn, round_no, round(start, 3), answer.ttft, round(answer.seconds, 4), answer.status,
                    int(answer.usage.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0),
                    answer.retry_after, answer.error)

    def round_order(self) -> list[Conversation]:
        """One round's order: shuffled; with `interleave` n, the conversations at positions i, i+n, i+2n, ... form
        group i, each group is shuffled and the groups take turns (e.g. the keys of two replicas in alternation, so
        that a few requests in flight spread over them as many conversations would)."""
        groups = [list(self.convs[i::self.interleave]) for i in range(self.interleave)]
        for group in groups:
            self.order.shuffle(group)
        return [conv for turn in itertools.zip_longest(*groups) for conv in turn if conv is not None]

    def open_gate(self) -> None:
        """Let the next round start."""
        self.gate.open()

    def close_gate(self) -> None:
        """Hold the next round until open_gate() (the round in flight finishes)."""
        self.gate.close()

    def _may_send(self, deadline: float) -> bool:
        """Wait for the gate; False once stopped or past the deadline."""
        while not self.gate.wait(0.2):
            if self._stop.is_set() or time.monotonic() > deadline:
                return False
        return not self._stop.is_set() and time.monotonic() <= deadline

    def wait_rounds(self, count: int, timeout: float) -> bool:
        """Wait (at most `timeout` s) until `count` rounds have ended; whether they did."""
        deadline = time.monotonic() + timeout
        while len(self.rounds) < count and self.running and time.monotonic() < deadline:
            time.sleep(0.5)
        return len(self.rounds) >= count

    def run(self) -> dict[str, Any]:
        """Send rounds until a bound or stop(); the summary of every turn."""
        deadline = time.monotonic() + self.max_seconds
        with ThreadPoolExecutor(self.concurrency) as pool:
            for round_no in range(self.max_rounds):
                if not self._may_send(deadline):
                    break
                order = self.round_order()
                start = time.time()
                turns = list(pool.map(lambda conv, n=round_no: self._turn(conv, n), order))
                self.records.extend(turns)
                self.rounds.append({"round": round_no, "start": round(start, 3), "end": round(time.time(), 3),
                                    **{k: v for k, v in summary(turns).items() if k != "failures"}})
        return summary(self.records)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the loop started beside (start()) is still sending."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float) -> dict[str, Any]:
        """Stop after the round in flight (bounded by `timeout` seconds); the summary."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        return summary(self.records)

    def dump(self) -> dict[str, Any]:
        """Everything for the artifacts: the summary, each round's and each turn's record."""
        return {"summary": summary(self.records), "rounds": self.rounds, "gate": [list(w) for w in self.gate.log],
                "turns": [asdict(t) for t in self.records]}


def recovery(rounds: Sequence[dict[str, Any]], after: float, steady: float, share: float = 0.9) -> dict[str, Any]:
    """How fast the hit rate came back after epoch `after` (e.g. the rollout's end): the first round that started
    after it with a hit rate of at least `share` x `steady`, its number of rounds and seconds after `after`; None
    where no round did."""
    later = [r for r in rounds if r["start"] >= after and r.get("hit_rate") is not None]
    for index, rnd in enumerate(later):
        if rnd["hit_rate"] >= share * steady:
            return {"rounds": index + 1, "seconds": round(rnd["end"] - after, 1), "hit_rate": rnd["hit_rate"],
                    "target": round(share * steady, 4)}
    return {"rounds": None, "seconds": None, "hit_rate": later[-1]["hit_rate"] if later else None,
            "target": round(share * steady, 4)}
