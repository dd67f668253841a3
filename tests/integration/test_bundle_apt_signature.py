"""apt itself against the bundle's signed flat repository (scripts/bundle.py's signing), in one throwaway container
of the target OS: the sources line the offline_bundle role writes (signed-by the bundle's key, no trusted=yes)
reads the signed repository and refuses it once Packages was changed and Release re-hashed without signing again
(with and without InRelease), or once it was signed by another key than the keyring's."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

from bundle import generate_key, packages_index, release_file, sign_release, signing_key, stop_agent

IMAGE = "local/debian-systemd:bookworm"
DOCKER = shutil.which("docker") or "/usr/bin/docker"
# What the role runs, on each repository mounted at /b/<name> (its own sources list and lists, like the role's).
SCRIPT = r"""
for repo in /b/*/; do
  name=$(basename "$repo"); dir=/tmp/$name
  mkdir -p "$dir/lists/partial"
  echo "deb [signed-by=/b/$name/signing-key.gpg] file:/b/$name ./" > "$dir/sources.list"
  apt-get -o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
    -o Dir::State::Lists="$dir/lists" update > "$dir/out" 2>&1
  echo "== $name rc=$?"; cat "$dir/out"
done
"""


def _repo(apt: Path) -> None:
    """A flat repository as build_apt writes it (stand-in .debs: apt update reads only the indexes)."""
    (apt / "pool").mkdir(parents=True)
    (apt / "pool" / "a_1_all.deb").write_bytes(b"a")
    (apt / "Packages").write_text(packages_index((apt / "pool").glob("*.deb"),
                                                 control=lambda deb: "Package: a\nVersion: 1\nArchitecture: all"))
    (apt / "Release").write_text(release_file(apt, IMAGE))


def _rehash_release(apt: Path) -> None:
    """Packages changed, Release given its new sha256 and size, nothing signed again."""
    (apt / "Packages").write_text((apt / "Packages").read_text() + "\nPackage: evil\nVersion: 1\nArchitecture: all\n")
    digest, size = hashlib.sha256((apt / "Packages").read_bytes()).hexdigest(), (apt / "Packages").stat().st_size
    (apt / "Release").write_text(re.sub(r"^ [0-9a-f]{64} \d+ Packages$", f" {digest} {size} Packages",
                                        (apt / "Release").read_text(), flags=re.M))


def test_apt_reads_the_signed_repository_and_refuses_tampered_ones(tmp_path: Path) -> None:
    # Not skipped when missing: a green run must have run apt (make integration builds the image first).
    assert subprocess.run([DOCKER, "image", "inspect", IMAGE], capture_output=True, check=False).returncode == 0, (
        f"needs the {IMAGE} base image: make images")
    ours, theirs = tmp_path / "g1", tmp_path / "g2"
    generate_key(ours)
    generate_key(theirs)
    try:
        key, other = signing_key(ours, None), signing_key(theirs, None)
        repos = tmp_path / "repos"
        for name in ("good", "rehashed", "rehashed-no-inrelease", "other-key"):
            _repo(repos / name)
            sign_release(repos / name, key)
        _rehash_release(repos / "rehashed")
        _rehash_release(repos / "rehashed-no-inrelease")
        (repos / "rehashed-no-inrelease" / "InRelease").unlink()  # apt falls back to Release + Release.gpg
        ours_public = (repos / "other-key" / "signing-key.gpg").read_bytes()
        sign_release(repos / "other-key", other)
        (repos / "other-key" / "signing-key.gpg").write_bytes(ours_public)  # the node's keyring: ours
    finally:
        stop_agent(ours)
        stop_agent(theirs)
    repos.chmod(0o755)
    proc = subprocess.run([DOCKER, "run", "--rm", "-v", f"{repos}:/b:ro", IMAGE, "bash", "-c", SCRIPT],
                          capture_output=True, text=True, timeout=300, check=True)
    runs = dict(re.findall(r"^== (\S+ rc=\d+)\n(.*?)(?=^== |\Z)", proc.stdout, flags=re.M | re.S))
    out = {name.split()[0]: (int(name.split("rc=")[1]), text) for name, text in runs.items()}
    print(proc.stdout)
    assert set(out) == {"good", "rehashed", "rehashed-no-inrelease", "other-key"}, proc.stdout
    assert out["good"][0] == 0 and "InRelease" in out["good"][1] and "W:" not in out["good"][1], out["good"]
    # InRelease still signs the old Packages: apt refuses the new one
    assert out["rehashed"][0] != 0 and "Hash Sum mismatch" in out["rehashed"][1], out["rehashed"]
    # Release.gpg does not sign the re-hashed Release
    assert out["rehashed-no-inrelease"][0] != 0, out["rehashed-no-inrelease"]
    assert "BADSIG" in out["rehashed-no-inrelease"][1], out["rehashed-no-inrelease"]
    # signed by a key the keyring does not hold
    assert out["other-key"][0] != 0 and "NO_PUBKEY" in out["other-key"][1], out["other-key"]
