"""Shared pytest fixtures: generated tiny model repos and a running local Hugging Face hub."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tiny_models

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REV_B = "rev-b"  # the second revision of vllm-node-test/tiny-llama in the session's hub


@pytest.fixture(scope="session")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub root with every tiny repo, generated once per test session, and revision rev-b of tiny-llama
    (shard 1 with other weights, shards 2 and 3 unchanged)."""
    root = tmp_path_factory.mktemp("hub")
    tiny_models.generate(root)
    tiny_models.write_revision(root, "tiny-llama", REV_B, 7, [1])
    return root


class Hub:
    """A running tests/fixtures/hf_hub/server.py and helpers to talk to its control API."""

    REV_B = REV_B

    def __init__(self, process: subprocess.Popen[str], port: int, root: Path, token: str) -> None:
        self.process, self.port, self.root, self.token = process, port, root, token
        self.endpoint = f"http://127.0.0.1:{port}"

    def request(self, path: str, method: str = "GET", data: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """Plain HTTP call; returns (status, headers, body) also for error statuses."""
        body = json.dumps(data).encode() if data is not None else None
        req = urllib.request.Request(self.endpoint + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def json(self, path: str, method: str = "GET", data: Any = None) -> Any:
        status, _, body = self.request(path, method, data)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def counters(self) -> dict[str, Any]:
        return self.json("/_control/counters")

    def reset(self) -> None:
        self.json("/_control/reset", "POST", {})

    def drop(self, glob: str, after_bytes: int, times: int) -> None:
        self.json("/_control/drop", "POST", {"glob": glob, "after_bytes": after_bytes, "times": times})

    def throttle(self, glob: str, bytes_per_second: int) -> None:
        self.json("/_control/throttle", "POST", {"glob": glob, "bytes_per_second": bytes_per_second})

    def corrupt(self, glob: str, times: int) -> None:
        self.json("/_control/corrupt", "POST", {"glob": glob, "times": times})

    def commit(self, repo: str, revision: str = "main") -> str:
        return self.json(f"/api/models/{repo}/revision/{revision}")["sha"]


def server_python() -> str:
    """The node containers run the server with Debian 12's python3.11: use it when present."""
    return shutil.which("python3.11") or sys.executable


@pytest.fixture(scope="session")
def hub_server(hub_root: Path) -> Iterator[Hub]:
    token = "hf_vllm_node_test_token"
    process = subprocess.Popen(
        [server_python(), str(FIXTURES / "hf_hub" / "server.py"), "--root", str(hub_root), "--port", "0",
         "--token", token, "--quiet"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    port = int(line.rsplit(":", 1)[1])
    try:
        yield Hub(process, port, hub_root, token)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def hub(hub_server: Hub) -> Hub:
    """The session's hub with counters and drop rules cleared for this test."""
    hub_server.reset()
    return hub_server
