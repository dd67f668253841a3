"""A bounded client loop: requests one after another, streamed and not in turn, until stopped or bounded, with
its accounting (sent, streamed, failed, durations)."""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any


def duration_summary(durations: list[float]) -> dict[str, float]:
    """min, p50, p99 and max of request durations in seconds ({} without any)."""
    d = sorted(durations)
    if not d:
        return {}
    return {"min": round(d[0], 3), "p50": round(statistics.median(d), 3),
            "p99": round(d[int(len(d) * 0.99) - 1 if len(d) > 1 else 0], 3), "max": round(d[-1], 3)}


class ClientLoop(threading.Thread):
    """Calls `request(stream)` (it returns '' on success, else why not) one after another, streamed on every
    second request, until stop() or a bound (`max_requests`, `max_seconds`), pausing `pause` seconds in between."""

    def __init__(self, request: Callable[[bool], str], max_requests: int, max_seconds: float,
                 pause: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.request, self.max_requests, self.max_seconds, self.pause = request, max_requests, max_seconds, pause
        self.halt = threading.Event()
        self.sent = self.streamed = 0
        self.durations: list[float] = []
        self.failures: list[dict[str, Any]] = []
        self.first = self.last = 0.0

    def bounded(self, started: float) -> bool:
        """Whether the loop must end now (stopped, or a bound reached)."""
        return (self.halt.is_set() or self.sent >= self.max_requests
                or time.monotonic() - started >= self.max_seconds)

    def once(self) -> None:
        """One request, accounted."""
        stream = self.sent % 2 == 1
        t0 = time.monotonic()
        why = self.request(stream)
        self.durations.append(time.monotonic() - t0)
        self.sent += 1
        self.streamed += stream
        if why:
            self.failures.append({"at": round(time.time(), 3), "stream": stream, "error": why})
        self.last = time.time()

    def run(self) -> None:
        self.first = time.time()
        started = time.monotonic()
        while not self.bounded(started):
            self.once()
            time.sleep(self.pause)  # leave the shared cores some room for what the loop runs beside

    def counts(self) -> dict[str, Any]:
        """The accounting so far: sent, streamed, failed (the first 20 failures), first/last epoch, durations."""
        return {"sent": self.sent, "streamed": self.streamed, "failed": len(self.failures),
                "failures": self.failures[:20], "first": round(self.first, 3), "last": round(self.last, 3),
                "duration_s": duration_summary(self.durations)}

    def stop(self, timeout: float = 180) -> dict[str, Any]:
        """Stop the loop (the request in flight ends first) and return counts()."""
        self.halt.set()
        self.join(timeout=timeout)
        return self.counts()
