"""The GPU health watch on a node: a systemd timer runs ``gpu_watch.py check`` (the health verdict from the cheap
probes: ``nvidia-smi -q -x`` and the kernel log's Xid lines, no dcgmi) and writes it to a file; a socket-activated
unit runs ``gpu_watch.py answer`` for each connection of HAProxy's ``agent-check`` and prints one line from that
file: ``down #<reason>`` on a FAIL (HAProxy takes the server out of rotation and shows the reason in its stats),
``up`` otherwise (HAProxy puts it back once its own health check passes too).

The agent only ever says ``up`` or ``down``: those change the server's operational state. It never says ``ready``,
``drain`` or ``maint`` (the administrative state), so a drain set through HAProxy's runtime API (playbooks/rollout.yml)
is never undone by the agent. A verdict that is missing or unreadable answers ``up``: HAProxy ignores an agent it
cannot reach too, and its regular health check still decides (HAProxy configuration manual, ``agent-check``).

Stdlib only. On the node it runs as a script beside a copy of gpu_health.py (the vllm_service role installs both).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gpu_health
except ImportError:  # on the node: installed beside this file
    import gpu_health  # type: ignore[import-not-found,no-redef]

# HAProxy splits the answer in words at spaces and commas; a word starting with '#' starts the description, which
# runs to the line's end and is shown in its stats and log ("via agent : down (<description>)"): hence the space in
# "down #<description>" (HAProxy 2.6 takes "down#x" for one unknown word), no newline and no comma in it.
_DESCRIPTION_UNSAFE = re.compile(r"[^A-Za-z0-9 _.:;()/=+-]")
DESCRIPTION_MAX = 200


def verdict_document(report: Mapping[str, Any], checked_at: float) -> dict[str, Any]:
    """What the check writes: the time, the verdict, the reason HAProxy will show, the brief and the summary."""
    brief = gpu_health.brief(report)
    return {"checked_at": round(checked_at, 3), "verdict": report["verdict"], "reason": failure_reason(brief),
            "brief": brief}


def failure_reason(brief: Mapping[str, Any]) -> str:
    """``GPU 1 (serial 1654..., bus 0000:28:00.0): xid_79; node: nvidia_smi_failed``; "" when nothing failed."""
    parts = [f"{gpu_health.gpu_label(gpu)}: {' '.join(gpu['findings'])}"
             for gpu in brief["gpus"] if gpu["verdict"] == gpu_health.FAIL]
    if brief["verdict"] == gpu_health.FAIL and not parts:
        parts.append("node: " + " ".join(brief["node_findings"]))
    return "; ".join(parts)


def agent_reply(document: Mapping[str, Any] | None) -> str:
    """The agent-check line (without the newline) for a verdict document; ``up`` without one."""
    if not document or document.get("verdict") != gpu_health.FAIL:
        return "up"
    reason = "GPU health FAIL: " + str(document.get("reason") or "see the node's verdict file")
    reason = _DESCRIPTION_UNSAFE.sub(" ", reason.replace(",", ";"))[:DESCRIPTION_MAX]
    return f"down #{reason}"


def read_document(path: str) -> dict[str, Any] | None:
    """The verdict file, None when it is missing or not a JSON object."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def write_document(path: str, document: Mapping[str, Any]) -> None:
    """Write atomically (a reader never sees half a file)."""
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".verdict-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2, sort_keys=True)
            out.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def run_command(argv: list[str]) -> tuple[int, str, str]:
    """A probe with a timeout (a hung driver must not hang the timer); 127 when the command is missing."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              env=dict(os.environ, LC_ALL="C"))
    except OSError as err:
        return 127, "", str(err)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer within 60 s"
    return proc.returncode, proc.stdout, proc.stderr


def main(argv: Sequence[str] | None = None) -> int:
    """``check --out FILE [--kernel-log auto] [--accept CODE ...]`` or ``answer --verdict FILE``."""
    parser = argparse.ArgumentParser(prog="gpu_watch.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="write the verdict file")
    check.add_argument("--out", required=True)
    check.add_argument("--nvidia-smi", default="nvidia-smi")
    check.add_argument("--kernel-log", default="auto", choices=["auto", "journalctl", "dmesg", "none"])
    check.add_argument("--accept", nargs="*", default=[])
    answer = commands.add_parser("answer", help="print the agent-check line")
    answer.add_argument("--verdict", required=True)
    args = parser.parse_args(argv)
    if args.command == "answer":
        sys.stdout.write(agent_reply(read_document(args.verdict)) + "\n")
        return 0
    report = gpu_health.collect(run_command, args.nvidia_smi, args.kernel_log, accepted=args.accept)
    document = verdict_document(report, time.time())
    previous = read_document(args.out)
    write_document(args.out, document)
    if previous is None or previous.get("verdict") != document["verdict"]:
        sys.stdout.write(f"GPU health {document['verdict']}{': ' + document['reason'] if document['reason'] else ''}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
