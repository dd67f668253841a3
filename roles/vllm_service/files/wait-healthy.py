# Ansible managed: installed by the vllm_service role (a local change is overwritten on the next run).
"""Block until vLLM's /health answers 200 (ExecStartPost of the vllm unit); fail when the server dies first.

vLLM has no sd_notify; systemd keeps the unit "activating" while this runs, so the
unit is only "active" once the server really serves, and TimeoutStartSec bounds the load.
"""
import os
import sys
import time
import urllib.error
import urllib.request


def healthy(url: str) -> bool:
    """True when GET url answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def alive(pid: int) -> bool:
    """True while the process exists (the waiter runs as the same user as the server)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> int:
    url = sys.argv[1]
    # systemd passes the server's PID as $MAINPID to ExecStartPost.
    pid = int(os.environ.get("MAINPID") or 0)
    while not healthy(url):
        if not alive(pid):
            print(f"vLLM (pid {pid}) exited before {url} answered", file=sys.stderr)
            return 1
        time.sleep(2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
