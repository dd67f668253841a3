"""HAProxy's runtime API as a test asks it (on this machine or on a node), and a socket that answers every
connection the way a runtime API or an agent does, for the gateway's tests."""
from __future__ import annotations

import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import haproxy_stat

# The same client, run on a node with its own python3 (the node has no project code).
RUNTIME_CLIENT = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                  "s.sendall(sys.argv[2].encode()+b'\\n')\nd=b''\nwhile (c:=s.recv(65536)): d+=c\n"
                  "sys.stdout.write(d.decode())")


def runtime_command(path: str | Path, command: str, wait: float = 10.0) -> str:
    """One command to the runtime API socket at `path` on this machine (waiting up to `wait` s for it to appear)."""
    deadline = time.monotonic() + wait
    while not Path(path).exists():
        assert time.monotonic() < deadline, f"haproxy did not open its runtime socket {path}"
        time.sleep(0.1)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.sendall(command.encode() + b"\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data.decode()


def runtime_command_on(host: Any, path: str, command: str) -> str:
    """One command to the runtime API socket at `path` on a testinfra host."""
    return str(host.check_output(f"python3 -c {shlex.quote(RUNTIME_CLIENT)} {shlex.quote(path)} "
                                 f"{shlex.quote(command)}"))


@contextmanager
def one_server(directory: Path, name: str, port: int, server_options: str = "") -> Iterator[Path]:
    """This machine's HAProxy with backend `vllm` holding one server `name` (127.0.0.1:port, checked on GET /health,
    `server_options` appended to its line), its runtime socket in `directory`; yields the socket once it answers."""
    runtime = directory / "haproxy.sock"
    config = directory / "haproxy.cfg"
    config.write_text(f"""global
    stats socket {runtime} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
backend vllm
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 1s fall 3 rise 2
    server {name} 127.0.0.1:{port} {server_options}
""")
    proc = subprocess.Popen(["haproxy", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        runtime_command(runtime, "show info")
        yield runtime
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def servers(show_stat: str, backend: str) -> dict[str, dict[str, Any]]:
    """A backend's servers in `show stat` output, as the project's parser reads them (status, weight, scur, stot...)."""
    return haproxy_stat.parse_show_stat(show_stat)[backend]


class AnsweringSocket:
    """A listening socket (a UNIX path, else TCP on 127.0.0.1 at a free port) that answers every connection with
    `reply()` and closes it: HAProxy's runtime API (`read_request`: it reads the command first) or an agent-check
    agent (it speaks first). Use as a context manager; `address` is the path or the port."""

    def __init__(self, reply: Callable[[], bytes], path: str | Path | None = None, read_request: bool = False) -> None:
        self.reply, self.read_request = reply, read_request
        if path is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(str(path))
            self.address: str | int = str(path)
        else:
            self.sock = socket.socket()
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("127.0.0.1", 0))
            self.address = int(self.sock.getsockname()[1])
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self) -> None:
        while not self.halt.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                if self.read_request:
                    conn.recv(1024)
                conn.sendall(self.reply())

    def __enter__(self) -> AnsweringSocket:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.halt.set()
        self.thread.join(timeout=5)
        self.sock.close()
