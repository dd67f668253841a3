#!/usr/bin/env python3
"""Cold against warm starts of a vLLM unit on a running node container (issue 29, "measure first").

    warm_start.py NODE [--unit vllm] [--restarts 3] [--out FILE]

A cold start: the unit stopped, its keyed compile-cache directory emptied (the directory the unit's VLLM_CACHE_ROOT
lies in: vLLM's torch.compile cache, inductor, Triton, FlashInfer), then started. A warm start: a restart with the
caches kept. They alternate (cold, warm, cold, ...), `--restarts` of each, in the same container, so load drift
touches both alike. Each start is timed by systemd (the unit turns active only once /health answers, as the role's
unit does: InactiveExit to ActiveEnter, monotonic) and split into its parts from vLLM's own log with the project's
parser (plugins/module_utils/startup_phases.py). The page cache is not dropped (a container cannot), so the
weights come from memory in both kinds; on a GPU node the warm start's gain is the compile and the JIT caches.

The output: one JSON document (every start, its parts and the compile cache's hit/miss, and the medians per kind).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections"))

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import startup_phases  # noqa: E402

DOCKER = "docker"
TIMES = ("InvocationID", "InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic", "ActiveEnterTimestamp")


def on_node(node: str, *argv: str, check: bool = True) -> str:
    """Run argv in the node container; its stdout."""
    done = subprocess.run([DOCKER, "exec", node, *argv], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed on {node}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def unit_show(node: str, unit: str, properties: tuple[str, ...]) -> dict[str, str]:
    """systemctl show's properties (timestamps in unix seconds)."""
    out = on_node(node, "systemctl", "show", unit, "--timestamp=unix", "-p", ",".join(properties))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cache_dir(node: str, unit: str) -> str:
    """The keyed compile-cache directory of the unit (the parent of its VLLM_CACHE_ROOT)."""
    for item in unit_show(node, unit, ("Environment",)).get("Environment", "").split():
        if item.startswith("VLLM_CACHE_ROOT="):
            return str(Path(item.split("=", 1)[1]).parent)
    raise SystemExit(f"{unit} on {node} has no VLLM_CACHE_ROOT in its environment: not a unit vllm_service wrote")


def one_start(node: str, unit: str, kind: str, directory: str) -> dict[str, Any]:
    """A cold or a warm start, timed and split into its parts."""
    # the unit's StartLimitBurst counts every start: these are on purpose, not a crash loop
    on_node(node, "systemctl", "reset-failed", unit, check=False)
    if kind == "cold":
        on_node(node, "systemctl", "stop", unit)
        on_node(node, "find", directory, "-mindepth", "1", "-delete")
        on_node(node, "systemctl", "start", unit)
    else:
        on_node(node, "systemctl", "restart", unit)
    state = unit_show(node, unit, TIMES)
    seconds = (int(state["ActiveEnterTimestampMonotonic"]) - int(state["InactiveExitTimestampMonotonic"])) / 1e6
    healthy_at = float(state["ActiveEnterTimestamp"].lstrip("@"))
    journal = on_node(node, "journalctl", f"_SYSTEMD_INVOCATION_ID={state['InvocationID']}", "-o", "json",
                      "--no-pager")
    entries = startup_phases.journal_entries(journal.splitlines())
    phases = startup_phases.startup_phases(entries, healthy_at - seconds, healthy_at, "cpu")
    cached = on_node(node, "du", "-sb", directory).split()[0]
    return {"kind": kind, "seconds_to_healthy": round(seconds, 3), "cache_bytes_after": int(cached),
            "compile_cache": phases.get("compile_cache"), "summary": phases.get("summary"),
            "parts": {p["name"]: p["seconds"] for p in phases["parts"]}}


def medians(starts: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The median start-to-healthy and the median of each part, over the starts of one kind."""
    mine = [s for s in starts if s["kind"] == kind]
    parts = {name: statistics.median(s["parts"][name] for s in mine if s["parts"].get(name) is not None)
             for name in mine[0]["parts"] if any(s["parts"].get(name) is not None for s in mine)}
    return {"starts": len(mine), "seconds_to_healthy": statistics.median(s["seconds_to_healthy"] for s in mine),
            "parts": {k: round(v, 3) for k, v in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("node")
    parser.add_argument("--unit", default="vllm")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    directory = cache_dir(args.node, args.unit)
    starts = []
    for _ in range(args.restarts):
        for kind in ("cold", "warm"):
            starts.append(one_start(args.node, args.unit, kind, directory))
            print(f"{kind}: {starts[-1]['seconds_to_healthy']} s ({starts[-1]['summary']})", file=sys.stderr)
    cold, warm = medians(starts, "cold"), medians(starts, "warm")
    result = {"node": args.node, "unit": args.unit, "cache_dir": directory, "starts": starts, "cold": cold,
              "warm": warm, "warm_over_cold": round(warm["seconds_to_healthy"] / cold["seconds_to_healthy"], 3)}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
