"""A bounded client loop: concurrent clients, each sending requests of its kind one after another (streamed and not
in turn, a think time in between), until stopped or bounded, with a record of every request (kind, streamed, start and
end epoch, duration, status) and its accounting (per kind: sent, failed, durations; what was in flight at a moment)."""
from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile of values by nearest rank (the ceil(q x n)-th smallest); None without any."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def duration_summary(durations: list[float]) -> dict[str, float]:
    """min, p50, p99 and max of request durations in seconds ({} without any)."""
    d = sorted(durations)
    if not d:
        return {}
    return {"min": round(d[0], 3), "p50": round(statistics.median(d), 3),
            "p99": round(percentile(d, 0.99) or 0.0, 3), "max": round(d[-1], 3)}


class Gate:
    """An open/closed switch that loops' senders wait on, with the log of its windows ([opened, closed] epochs,
    closed 0 while open); thread-safe."""

    def __init__(self, is_open: bool) -> None:
        self.event = threading.Event()
        self.lock = threading.Lock()
        self.log: list[list[float]] = []
        if is_open:
            self.open()

    def open(self) -> None:
        with self.lock:
            if not self.event.is_set():
                self.log.append([round(time.time(), 3), 0.0])
                self.event.set()

    def close(self) -> None:
        with self.lock:
            if self.event.is_set():
                self.event.clear()
                self.log[-1][1] = round(time.time(), 3)

    def is_open(self) -> bool:
        return self.event.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait at most `timeout` s for the gate to be open; whether it is."""
        return self.event.wait(timeout)


@dataclass(frozen=True)
class Client:
    """One client of the loop: the kind of request it sends (passed to the request function), how long it waits
    between two of its requests (`think`, seconds) and after the loop starts (`delay`). A `gated` client sends only
    while the loop's gate is open, and waits its delay again each time the gate opens."""

    kind: str = "short"
    think: float = 0.1
    delay: float = 0.0
    gated: bool = False


@dataclass
class Record:
    """One request: its kind, streamed or not, start and end (epoch seconds; end 0 while in flight), duration
    (seconds, monotonic) and status ('ok', else why it failed)."""

    kind: str
    stream: bool
    start: float
    end: float = 0.0
    duration: float = 0.0
    status: str = ""

    @property
    def label(self) -> str:
        """kind and whether streamed: 'short-stream', 'long-plain', ..."""
        return f"{self.kind}-{'stream' if self.stream else 'plain'}"

    def in_flight(self, at: float) -> bool:
        """Whether the request had started and not ended at epoch `at` (an unended one is in flight from its start)."""
        return self.start <= at and (self.end == 0.0 or at < self.end)


def in_flight(records: Sequence[Record], at: float) -> dict[str, int]:
    """How many requests were in flight at epoch `at`: in all ('all') and per kind."""
    out: dict[str, int] = {"all": 0}
    for record in records:
        if record.in_flight(at):
            out["all"] += 1
            out[record.kind] = out.get(record.kind, 0) + 1
    return out


def per_label(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """Per kind and kind-stream/plain label, over ended requests: sent, failed and their durations' summary."""
    groups: dict[str, list[Record]] = {}
    for record in records:
        if record.end:
            for key in (record.kind, record.label):
                groups.setdefault(key, []).append(record)
    return {key: {"sent": len(group), "failed": sum(r.status != "ok" for r in group),
                  "duration_s": duration_summary([r.duration for r in group])}
            for key, group in sorted(groups.items())}


class ClientLoop:
    """Runs `clients` side by side, each a thread calling `request(kind, stream)` (it returns '' on success, else
    why not) one request after another, streamed on every second one (clients in turn start streamed or not), until
    stop() or a bound: `max_requests` sent by the loop in all, `max_seconds` since start()."""

    def __init__(self, request: Callable[[str, bool], str], max_requests: int, max_seconds: float,
                 clients: Sequence[Client] = (Client(),)) -> None:
        self.request, self.max_requests, self.max_seconds = request, max_requests, max_seconds
        self.clients = list(clients)
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.records: list[Record] = []
        self.threads = [threading.Thread(target=self.client, args=(i, c), daemon=True)
                        for i, c in enumerate(self.clients)]
        self.cpu_s = 0.0       # the client threads' own CPU time (time.thread_time), summed when each ends
        self.started = self.first = 0.0
        self.gate = Gate(is_open=False)    # open: the gated clients send

    def claim(self) -> bool:
        """Whether one more request may be sent now (not stopped, no bound reached)."""
        return not (self.halt.is_set() or len(self.records) >= self.max_requests
                    or time.monotonic() - self.started >= self.max_seconds)

    def once(self, kind: str, stream: bool) -> None:
        """One request, recorded from its start (in flight) to its end."""
        with self.lock:
            if not self.claim():
                self.halt.set()
                return
            record = Record(kind, stream, time.time())
            self.records.append(record)
        t0 = time.monotonic()
        why = self.request(kind, stream)
        record.duration = time.monotonic() - t0
        record.status = why or "ok"
        record.end = time.time()

    def open_gate(self) -> None:
        """Let the gated clients send (each after its delay)."""
        self.gate.open()

    def close_gate(self) -> None:
        """Stop the gated clients after the request each has in flight."""
        self.gate.close()

    def turn(self, client: Client, first: bool) -> bool:
        """Wait until `client` may send its next request: its delay over after the loop started, and for a gated
        client the gate open (its delay over again after the gate opened). False once the loop stops."""
        waited = client.gated and not self.gate.is_open()
        if waited:
            while not self.gate.wait(0.2):    # on the gate itself: it starts the moment the gate opens
                if self.halt.is_set():
                    return False
        if (first or waited) and self.halt.wait(client.delay):
            return False
        return not self.halt.is_set()

    def client(self, index: int, client: Client) -> None:
        """One client's requests: one after another with its think time in between, each when turn() allows."""
        n = 0
        while self.turn(client, n == 0):
            self.once(client.kind, (n + index) % 2 == 1)
            n += 1
            self.halt.wait(client.think)  # leaves the shared cores room; returns at once on stop()
        with self.lock:
            self.cpu_s += time.thread_time()

    def start(self) -> None:
        self.first, self.started = time.time(), time.monotonic()
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds in all) until every client has ended."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def is_alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def in_flight(self, at: float) -> dict[str, int]:
        """Requests in flight at epoch `at`, in all and per kind."""
        with self.lock:
            return in_flight(list(self.records), at)

    def counts(self) -> dict[str, Any]:
        """The accounting so far: sent, streamed, failed (the first 20 failures), first/last epoch, durations, per
        kind and label (per_label), the clients and their CPU seconds."""
        with self.lock:
            records = list(self.records)
        ended = [r for r in records if r.end]
        failures = [asdict(r) for r in ended if r.status != "ok"]
        return {"sent": len(records), "streamed": sum(r.stream for r in records), "failed": len(failures),
                "failures": failures[:20], "first": round(self.first, 3),
                "last": round(max((r.end for r in ended), default=0.0), 3),
                "duration_s": duration_summary([r.duration for r in ended]), "kinds": per_label(records),
                "clients": [asdict(c) for c in self.clients], "client_cpu_s": round(self.cpu_s, 2),
                "gate": [list(window) for window in self.gate.log]}

    def stop(self, timeout: float = 180) -> dict[str, Any]:
        """Stop the loop (the requests in flight end first) and return counts()."""
        self.halt.set()
        self.join(timeout)
        return self.counts()
