#!/usr/bin/python
"""Fetch an offline bundle (scripts/bundle.py) onto the node and verify every byte before anything uses it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: bundle_fetch
short_description: Fetch an offline bundle and refuse any file whose sha256 differs from its manifest
description:
  - Reads C(manifest.json) of a bundle built by C(make bundle) (C(scripts/bundle.py)) from O(url), checks its plan
    hash (and its own sha256 when O(bundle_id) is given), then makes C(dest/<plan hash[:16]>/) hold exactly the
    manifest's files. Files already there with the right sha256 are kept; the others are downloaded into a staging
    directory and each is checked against the manifest's sha256 and size.
  - When any file differs the module fails naming every such file, removes what it staged and leaves the node as it
    was (a C(dest) it created is removed again). Only when every file matched are the staged files moved into place.
  - A bundle with an apt repository must carry it signed (C(apt/InRelease), C(apt/Release.gpg) and the public key
    C(apt/signing-key.gpg)); both signatures are checked with C(gpgv) and that key alone before anything is moved into
    place, and must be by the key the manifest names (C(apt_signing_key)). With O(apt_signing_key) that key must be
    the pinned one too; a manifest naming another key is refused before anything is downloaded.
options:
  url:
    description: The bundle's base URL (C(http://), C(https://), C(file://)) or an absolute directory on the node.
    type: str
    required: true
  dest:
    description: The directory on the node holding the verified bundles, one subdirectory per plan hash.
    type: path
    required: true
  bundle_id:
    description: The expected sha256 of C(manifest.json) (printed by C(make bundle)); empty = not checked.
    type: str
    default: ""
  apt_signing_key:
    description:
      - The expected fingerprint of the key that signs the bundle's apt repository (spaces and a C(0x) prefix
        ignored); empty = the key the bundle carries (its signature is still checked).
    type: str
    default: ""
  timeout:
    description: Seconds per HTTP request.
    type: int
    default: 60
attributes:
  check_mode:
    support: full
    description: Verifies what is on the node and reports whether files would be fetched; downloads nothing.
author: vllm-node
"""

EXAMPLES = r"""
- name: Fetch and verify the bundle
  vllm_node.vllm_node.bundle_fetch:
    url: http://bundle.internal:8080/1209ed8be295bb89
    dest: /var/lib/vllm-node/bundle
"""

RETURN = r"""
dir:
  description: The verified bundle's directory on the node.
  type: str
  returned: success
plan:
  description: The bundle's plan (lock, uv version, model repo and commit, apt image and packages).
  type: dict
  returned: success
plan_sha256:
  description: The plan hash.
  type: str
  returned: success
files:
  description: The manifest's files, relative path -> {sha256, size}.
  type: dict
  returned: success
apt_signing_key:
  description: The fingerprint of the key whose signatures of the apt repository gpgv accepted; empty without apt.
  type: str
  returned: success
fetched:
  description: The files downloaded by this run (relative paths).
  type: list
  elements: str
  returned: success
problems:
  description: One sentence per refused file (path first).
  type: list
  elements: str
  returned: failure
"""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any
from urllib.parse import quote
from urllib.request import urlopen

from ansible.module_utils.basic import AnsibleModule

MANIFEST = "manifest.json"
KEYRING = "apt/signing-key.gpg"
SIGNED = ("apt/Release", "apt/InRelease", "apt/Release.gpg", KEYRING)
SIGNING_FIX = ("rebuild the bundle with make bundle (it signs with the controller's bundle key, or an operator's "
               "with --signing-key), or set offline_bundle_apt_signing_key (vllm_node_bundle_signing_key) to the "
               "fingerprint of the key that signs your bundles, as make bundle prints it")
CHANGED_FIX = "the bundle was changed after make bundle signed it: build it again with make bundle and serve that"


def sha256_file(path: str) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def plan_hash(plan: dict[str, Any]) -> str:
    """The plan's canonical JSON sha256 (the same rule as scripts/bundle.py)."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def safe_relative(rel: str) -> bool:
    """Whether a manifest path stays inside the bundle (relative, no `..`)."""
    return bool(rel) and not rel.startswith("/") and ".." not in rel.split("/")


def check_manifest(raw: bytes, bundle_id: str) -> tuple[dict[str, Any], list[str]]:
    """The parsed manifest and what is wrong with it (its id, its plan hash, unsafe paths)."""
    problems = []
    if bundle_id and hashlib.sha256(raw).hexdigest() != bundle_id.lower():
        problems.append(f"{MANIFEST}: sha256 {hashlib.sha256(raw).hexdigest()}, expected bundle id {bundle_id}")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        return {}, [*problems, f"{MANIFEST}: not JSON ({exc})"]
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return {}, [*problems, f"{MANIFEST}: no 'files' mapping"]
    if manifest.get("plan_sha256") != plan_hash(manifest.get("plan", {})):
        problems.append(f"{MANIFEST}: plan_sha256 does not match its plan")
    problems += [f"{rel}: outside the bundle" for rel in manifest["files"] if not safe_relative(rel)]
    return manifest, problems


def normalize_fingerprint(value: str) -> str:
    """A fingerprint as gpg prints it in status lines: hex, upper case, no spaces, no 0x."""
    value = "".join(value.split()).upper()
    return value[2:] if value.startswith("0X") else value


def validsig_fingerprints(status: str) -> list[str]:
    """The primary key fingerprint of each good signature in gpgv's --status-fd output (VALIDSIG's last field)."""
    return [line.split()[-1].upper() for line in status.splitlines() if line.startswith("[GNUPG:] VALIDSIG ")]


def declared_key_problem(manifest: dict[str, Any], pinned: str) -> str | None:
    """What is wrong with the apt signing the manifest declares, before any file is fetched: an apt repository
    without its signature files, or (with a pin) signed by another key than the pinned one."""
    files = manifest["files"]
    if not any(rel.startswith("apt/") for rel in files):
        return None
    missing = [rel for rel in SIGNED if rel not in files]
    if missing:
        return (f"{missing[0]}: the bundle's apt repository is not signed (no {', '.join(missing)} in its manifest); "
                f"{SIGNING_FIX}")
    declared = normalize_fingerprint(str(manifest.get("apt_signing_key", "")))
    if pinned and declared != normalize_fingerprint(pinned):
        return (f"apt/InRelease: signed by key {declared or '(none named)'}, offline_bundle_apt_signing_key pins "
                f"{normalize_fingerprint(pinned)}; {SIGNING_FIX}")
    return None


def signature_problem(manifest: dict[str, Any], pinned: str,
                      verify: Callable[[str, list[str]], list[str]]) -> tuple[str, str | None]:
    """The fingerprint gpgv accepted for the apt repository, and what is wrong with its signatures. `verify(keyring
    rel, [signed rel(s)])` returns the fingerprints of the good signatures (gpgv with that keyring alone)."""
    if not any(rel.startswith("apt/") for rel in manifest["files"]):
        return "", None
    problem = declared_key_problem(manifest, pinned)
    if problem:
        return "", problem
    declared = normalize_fingerprint(str(manifest["apt_signing_key"]))
    for signed in (["apt/InRelease"], ["apt/Release.gpg", "apt/Release"]):
        found = verify(KEYRING, signed)
        if not found:
            return "", f"{signed[0]}: no good signature by the key in {KEYRING} (gpgv); {CHANGED_FIX}"
        if found[0] != declared:
            return "", f"{signed[0]}: signed by key {found[0]}, the manifest names {declared}; {CHANGED_FIX}"
    return declared, None


def gpgv_fingerprints(gpgv: str, keyring: str, files: list[str]) -> list[str]:
    """Run gpgv on `files` with `keyring` alone (an empty home of its own); the good signatures' fingerprints."""
    with tempfile.TemporaryDirectory(prefix="bundle-gpgv-") as home:
        proc = subprocess.run([gpgv, "--homedir", home, "--status-fd", "1", "--keyring", keyring, *files],
                              capture_output=True, text=True, check=False)
    return validsig_fingerprints(proc.stdout) if proc.returncode == 0 else []

def file_problem(path: str, rel: str, entry: dict[str, Any]) -> str | None:
    """Why the file at `path` is not the manifest's `rel`, or None when it is."""
    if not os.path.isfile(path):
        return f"{rel}: missing"
    size = os.path.getsize(path)
    if size != entry["size"]:
        return f"{rel}: {size} bytes, the manifest says {entry['size']}"
    actual = sha256_file(path)
    if actual != entry["sha256"]:
        return f"{rel}: sha256 {actual}, the manifest says {entry['sha256']}"
    return None


def read_source(url: str, rel: str, timeout: int) -> Any:
    """A readable stream of the bundle's file `rel`."""
    if url.startswith("/"):
        return open(os.path.join(url, rel), "rb")  # noqa: SIM115 - closed by the caller
    # quoted: pool file names carry epochs as %3a (cpp_4%3a12.2.0-3_amd64.deb). The standard library's urlopen, not
    # Ansible's open_url: that one costs about a second per request here (hundreds of files), this one 0.1 s.
    return urlopen(url.rstrip("/") + "/" + quote(rel), timeout=timeout)


def download(url: str, rel: str, target: str, timeout: int) -> None:
    """Copy the bundle's `rel` to `target` (its directories created)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with read_source(url, rel, timeout) as src, open(target, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)


def run(module: AnsibleModule) -> dict[str, Any]:
    """Fetch, verify, then move into place; fail naming every refused file."""
    url, dest, timeout = module.params["url"], module.params["dest"], module.params["timeout"]
    try:
        with read_source(url, MANIFEST, timeout) as handle:
            raw = handle.read()
    except Exception as exc:  # noqa: BLE001 - any failure to read is reported the same way
        module.fail_json(msg=f"bundle_fetch: cannot read {url}/{MANIFEST}: {exc}. Check vllm_node_bundle_url and "
                             "that the bundle server is reachable from the node.")
    manifest, problems = check_manifest(raw, module.params["bundle_id"])
    pinned = module.params["apt_signing_key"]
    if not problems and (problem := declared_key_problem(manifest, pinned)):
        problems.append(problem)
    if problems:
        module.fail_json(msg="bundle_fetch: refused the bundle's manifest (nothing was downloaded or changed): "
                             + "; ".join(problems), problems=problems)
    plan_sha = manifest["plan_sha256"]
    target = os.path.join(dest, plan_sha[:16])
    staging = os.path.join(dest, f".staging-{plan_sha[:16]}")
    todo = [rel for rel, entry in sorted(manifest["files"].items())
            if file_problem(os.path.join(target, rel), rel, entry) is not None]
    result: dict[str, Any] = {"dir": target, "plan": manifest.get("plan", {}), "plan_sha256": plan_sha,
                              "files": manifest["files"], "fetched": todo, "changed": bool(todo),
                              "apt_signing_key": ""}

    def signatures(staged: bool) -> str | None:
        """Check the apt signatures of the files as they will be (staged ones from staging); the problem or None."""
        gpgv = module.get_bin_path("gpgv")
        if gpgv is None and any(rel.startswith("apt/") for rel in manifest["files"]):
            return "apt/InRelease: gpgv is missing on the node (apt needs it too: apt-get install gpgv)"

        def path(rel: str) -> str:
            return os.path.join(staging if staged and rel in todo else target, rel)

        key, problem = signature_problem(manifest, pinned, lambda keyring, files: gpgv_fingerprints(
            str(gpgv), path(keyring), [path(rel) for rel in files]))
        result["apt_signing_key"] = key
        return problem

    if not todo and os.path.isfile(os.path.join(target, MANIFEST)):
        if problem := signatures(staged=False):
            module.fail_json(msg=f"bundle_fetch: refused {url} before use (nothing on the node was changed): {problem}",
                             problems=[problem])
        return result
    if module.check_mode:
        result["changed"] = True
        return result
    created_dest = not os.path.isdir(dest)
    rel = ""
    try:
        for rel in todo:
            download(url, rel, os.path.join(staging, rel), timeout)
    except Exception as exc:  # noqa: BLE001 - cleaned up, then reported
        shutil.rmtree(dest if created_dest else staging, ignore_errors=True)
        module.fail_json(msg=f"bundle_fetch: downloading {rel} from {url} failed: {exc}; nothing was changed")
    problems = [p for rel in todo if (p := file_problem(os.path.join(staging, rel), rel, manifest["files"][rel]))]
    if not problems and (problem := signatures(staged=True)):
        shutil.rmtree(dest if created_dest else staging, ignore_errors=True)
        module.fail_json(msg=f"bundle_fetch: refused {url} before use, its apt signatures do not hold (nothing on the "
                             f"node was changed): {problem}", problems=[problem])
    if problems:
        shutil.rmtree(dest if created_dest else staging, ignore_errors=True)
        module.fail_json(msg=f"bundle_fetch: refused {url} before use, these files differ from its manifest "
                             f"(nothing on the node was changed): " + "; ".join(problems), problems=problems)
    for rel in todo:
        os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
        os.replace(os.path.join(staging, rel), os.path.join(target, rel))
    shutil.rmtree(staging, ignore_errors=True)
    with open(os.path.join(target, MANIFEST), "wb") as out:
        out.write(raw)
    result["changed"] = True
    return result


def main() -> None:
    """Module entry point."""
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "bundle_id": {"type": "str", "default": ""},
            "apt_signing_key": {"type": "str", "default": ""},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
