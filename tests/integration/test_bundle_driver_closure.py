"""The bundle's apt closure of an NVIDIA driver branch (scripts/bundle.py --apt-flat-repo), end to end with apt:
against the signed stand-in of NVIDIA's CUDA repository (tests/fixtures/nvidia_apt_repo, served on loopback; NVIDIA's
own is not reachable here), build_apt downloads branch 580's packages and their dependencies, not 590's, into the
bundle's flat repository; signed with a bundle key, a container with no network at all installs the branch from it,
read signed-by that key as the offline_bundle role does."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bundle import build_apt, generate_key, sign_release, signing_key, stop_agent

IMAGE = "local/debian-systemd:bookworm"
DOCKER = shutil.which("docker") or "/usr/bin/docker"
BUILD_REPO = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia_apt_repo" / "build.py"
# What the nvidia_driver role installs for branch 580, open modules, full install type on Debian 12 (vars/Debian.yml)
BRANCH_580 = ["nvidia-driver-pinning-580", "nvidia-open=580.*"]
# The node: no network; the bundle's repository as the offline_bundle role lists it, then the role's installs.
INSTALL = r"""
set -e
echo "deb [signed-by=/bundle/apt/signing-key.gpg] file:/bundle/apt ./" > /etc/apt/sources.list.d/bundle.list
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/debian.sources
apt-get -qq update
DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends nvidia-driver-pinning-580 > /dev/null
DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends 'nvidia-open=580.*' > /dev/null
dpkg-query -W -f '${Package} ${Version}\n' 'nvidia-*'
"""


class QuietHandler(SimpleHTTPRequestHandler):
    """The repository's files, without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # the base class's name
        """Say nothing."""


@pytest.fixture()
def nvidia_repo(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The stand-in repositories served on loopback: (debian12's flat repository URL, its signing key file)."""
    subprocess.run([sys.executable, str(BUILD_REPO), "--out", str(tmp_path / "nv")], check=True,
                   capture_output=True, timeout=120)
    handler = functools.partial(QuietHandler, directory=str(tmp_path / "nv"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield (f"http://127.0.0.1:{server.server_address[1]}/repos/debian12/x86_64/",
               tmp_path / "nv" / "repos" / "debian12" / "x86_64" / "testkey.asc")
    finally:
        server.shutdown()


def test_driver_branch_closure_installs_with_no_network(tmp_path: Path, nvidia_repo: tuple[str, Path]) -> None:
    # Not skipped when missing: a green run must have run apt (make integration builds the image first).
    assert subprocess.run([DOCKER, "image", "inspect", IMAGE], capture_output=True, check=False).returncode == 0, (
        f"needs the {IMAGE} base image: make images")
    bundle = tmp_path / "bundle"
    downloaded = build_apt(bundle, IMAGE, BRANCH_580, nvidia_repo)
    debs = sorted(p.name for p in (bundle / "apt" / "pool").glob("*.deb"))
    print(f"closure: {downloaded} .debs: {debs}")
    names = {name.split("_")[0]: name.split("_")[1] for name in debs}
    # the branch with its dependencies (the image lacks them all), nothing of the other branch
    assert names["nvidia-open"] == "580.95.05-1", debs
    assert {"nvidia-driver-pinning-580", "nvidia-kernel-open-dkms", "nvidia-driver-cuda",
            "nvidia-persistenced"} <= set(names), debs
    assert not any("590" in name for name in debs), debs
    # a second build finds the closure complete and downloads nothing
    assert build_apt(bundle, IMAGE, BRANCH_580, nvidia_repo) == 0

    home = tmp_path / "g"
    generate_key(home)
    try:
        sign_release(bundle / "apt", signing_key(home, None))
    finally:
        stop_agent(home)
    bundle.chmod(0o755)
    proc = subprocess.run([DOCKER, "run", "--rm", "--network", "none", "-v", f"{bundle}:/bundle:ro", IMAGE,
                           "bash", "-c", INSTALL], capture_output=True, text=True, timeout=300, check=False)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = dict(re.findall(r"^(\S+) (\S+)$", proc.stdout, flags=re.M))
    assert installed.get("nvidia-open") == "580.95.05-1", proc.stdout
    assert installed.get("nvidia-kernel-open-dkms") == "580.95.05-1", proc.stdout
