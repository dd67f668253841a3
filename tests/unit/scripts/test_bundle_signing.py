"""The signed apt closure of the offline bundle: scripts/bundle.py's signing key (generated once per controller,
reused), the signatures it makes (InRelease, Release.gpg, the exported key) and re-makes only when stale, and the
node side, the module bundle_fetch's checks with gpgv: the pinned key, a Release changed without re-signing, a
bundle re-signed by another key. Needs gpg and gpgv on the controller (scripts/ensure-docker.sh installs gnupg)."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import bundle
from ansible_collections.vllm_node.vllm_node.plugins.modules import bundle_fetch
from bundle import (
    SigningKey,
    generate_key,
    manifest_for,
    packages_index,
    primary_fingerprints,
    release_file,
    sign_release,
    signature_current,
    signing_key,
    stop_agent,
    validsig_fingerprints,
)

# Not skipped without them: a green run must have checked real signatures.
assert shutil.which("gpg") and shutil.which("gpgv"), "needs gpg and gpgv: scripts/ensure-docker.sh installs gnupg"

COLONS = """sec:u:255:22:DB6F7E0C8C2A8F8C:1796293166:::u:::scSC:::+::ed25519:::0:
fpr:::::::::65CBF7410F7B569CAE70B950DB6F7E0C8C2A8F8C:
grp:::::::::9910E0BAE9575166BCFF44CB249D3CB8C3CDD49E:
uid:u::::1796293166::DF1A::vllm-node bundle signing key (ctl) <bundle-signing@vllm-node.invalid>::::::::::0:
ssb:u:255:18:1111111111111111:1796293166::::::e:::+::cv25519::
fpr:::::::::AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:
sec:u:3072:1:2222222222222222:1796293166:::u:::scSC:::+:::23::0:
fpr:::::::::BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB:
"""
STATUS = """[GNUPG:] NEWSIG
[GNUPG:] GOODSIG DB6F7E0C8C2A8F8C vllm-node bundle signing key
[GNUPG:] VALIDSIG 65CBF7410F7B569CAE70B950DB6F7E0C8C2A8F8C 2026-12-03 1796293166 0 4 0 22 10 01 \
65cbf7410f7b569cae70b950db6f7e0c8c2a8f8c
"""


def test_primary_fingerprints_skip_subkeys() -> None:
    assert primary_fingerprints(COLONS) == ["65CBF7410F7B569CAE70B950DB6F7E0C8C2A8F8C",
                                            "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"]
    assert primary_fingerprints("") == []


def test_validsig_is_read_alike_on_controller_and_node() -> None:
    """The primary key's fingerprint (VALIDSIG's last field), upper case; GOODSIG alone is not a valid signature."""
    assert validsig_fingerprints(STATUS) == ["65CBF7410F7B569CAE70B950DB6F7E0C8C2A8F8C"]
    assert bundle_fetch.validsig_fingerprints(STATUS) == validsig_fingerprints(STATUS)
    assert validsig_fingerprints("[GNUPG:] GOODSIG DB6F7E0C8C2A8F8C x\n[GNUPG:] BADSIG DB6F x\n") == []


def test_normalize_fingerprint() -> None:
    assert bundle_fetch.normalize_fingerprint(" 0x65cb F741 0f7b\n") == "65CBF7410F7B"
    assert bundle_fetch.normalize_fingerprint("") == ""


FPR = "65CBF7410F7B569CAE70B950DB6F7E0C8C2A8F8C"
OTHER = "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
SIGNED_FILES = {rel: {"sha256": "0" * 64, "size": 1} for rel in bundle_fetch.SIGNED}


def test_declared_key_problem() -> None:
    """Checked on the manifest alone, before anything is downloaded: an unsigned apt repository is refused; with a
    pin, a bundle naming another key is refused with both fingerprints and the fix."""
    assert bundle_fetch.declared_key_problem({"files": {"wheels/a.whl": {}}}, FPR) is None
    unsigned = {"files": {"apt/Packages": {}, "apt/Release": {}}}
    problem = bundle_fetch.declared_key_problem(unsigned, "")
    assert problem is not None and problem.startswith("apt/InRelease: the bundle's apt repository is not signed")
    signed = {"files": SIGNED_FILES, "apt_signing_key": FPR}
    assert bundle_fetch.declared_key_problem(signed, "") is None
    assert bundle_fetch.declared_key_problem(signed, FPR.lower()) is None
    problem = bundle_fetch.declared_key_problem(signed, OTHER)
    assert problem is not None
    assert f"signed by key {FPR}, offline_bundle_apt_signing_key pins {OTHER}" in problem
    assert "make bundle" in problem and "vllm_node_bundle_signing_key" in problem


def test_signature_problem_needs_both_signatures_by_the_named_key() -> None:
    manifest = {"files": SIGNED_FILES, "apt_signing_key": FPR}
    assert bundle_fetch.signature_problem(manifest, FPR, lambda keyring, files: [FPR]) == (FPR, None)
    assert bundle_fetch.signature_problem({"files": {}}, FPR, lambda keyring, files: []) == ("", None)
    key, problem = bundle_fetch.signature_problem(
        manifest, "", lambda keyring, files: [] if files[0] == "apt/Release.gpg" else [FPR])
    assert key == "" and problem is not None and problem.startswith("apt/Release.gpg: no good signature")
    key, problem = bundle_fetch.signature_problem(manifest, "", lambda keyring, files: [OTHER])
    assert problem is not None and problem.startswith(f"apt/InRelease: signed by key {OTHER}, the manifest names {FPR}")


# Real keys, real signatures: a flat repository as build_apt writes it, signed as build() signs it.


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Two GnuPG homes with one key each (the controller's and another); their agents stopped afterwards."""
    first, second = tmp_path_factory.mktemp("g1") / "h", tmp_path_factory.mktemp("g2") / "h"
    generate_key(first)
    generate_key(second)
    yield first, second
    stop_agent(first)
    stop_agent(second)


def _repo(apt: Path) -> Path:
    """apt/ with two .debs (stand-in bytes), Packages and Release as build_apt writes them."""
    (apt / "pool").mkdir(parents=True)
    for name in ("a_1_all.deb", "b_1_all.deb"):
        (apt / "pool" / name).write_bytes(name.encode())
    (apt / "Packages").write_text(packages_index((apt / "pool").glob("*.deb"),
                                                 control=lambda deb: f"Package: {deb.name[0]}\nVersion: 1"))
    (apt / "Release").write_text(release_file(apt, "test"))
    return apt


def _node_check(root: Path, pinned: str = "") -> tuple[str, str | None]:
    """The module's check of the signatures on a bundle root, with the manifest build() writes for it."""
    key = bundle_fetch.normalize_fingerprint(
        next(line.split()[-1] for line in (root / "fpr").read_text().splitlines()))
    manifest = manifest_for(root, {}, key)
    gpgv = shutil.which("gpgv") or "gpgv"
    return bundle_fetch.signature_problem(manifest, pinned, lambda keyring, files: bundle_fetch.gpgv_fingerprints(
        gpgv, str(root / keyring), [str(root / rel) for rel in files]))


def _rehash_release(apt: Path) -> None:
    """Change Packages and put its new sha256 and size into Release, without signing again."""
    (apt / "Packages").write_text((apt / "Packages").read_text() + "\nPackage: evil\nVersion: 1\n")
    digest = hashlib.sha256((apt / "Packages").read_bytes()).hexdigest()
    size = (apt / "Packages").stat().st_size
    (apt / "Release").write_text(re.sub(r"^ [0-9a-f]{64} \d+ Packages$", f" {digest} {size} Packages",
                                        (apt / "Release").read_text(), flags=re.M))


def test_sign_once_then_current_then_refused_when_tampered(tmp_path: Path, homes: tuple[Path, Path]) -> None:
    key = signing_key(homes[0], None)
    root = tmp_path / "bundle"
    apt = _repo(root / "apt")
    assert sign_release(apt, key) is True
    files = {p.name: p.read_bytes() for p in apt.iterdir() if p.is_file()}
    assert {"InRelease", "Release.gpg", "signing-key.gpg"} <= set(files)
    assert files["InRelease"].startswith(b"-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n")
    # a second build signs nothing: same bytes
    assert sign_release(apt, key) is False
    assert {p.name: p.read_bytes() for p in apt.iterdir() if p.is_file()} == files
    (root / "fpr").write_text(key.fingerprint + "\n")
    assert _node_check(root) == (key.fingerprint, None)
    assert _node_check(root, key.fingerprint.lower()) == (key.fingerprint, None)
    assert manifest_for(root, {}, key.fingerprint)["apt_signing_key"] == key.fingerprint

    # Packages changed and Release re-hashed, not re-signed: the controller sees it stale, gpgv refuses Release.gpg
    # (apt, reading InRelease, refuses Packages: tests/integration/test_bundle_apt_signature.py)
    _rehash_release(apt)
    assert not signature_current(apt, key, (apt / "signing-key.gpg").read_bytes())
    _, problem = _node_check(root)
    assert problem is not None and problem.startswith("apt/Release.gpg: no good signature by the key in")
    # the same change inside InRelease's signed text
    clear = (apt / "InRelease").read_text()
    (apt / "InRelease").write_text(clear.replace("Origin: vllm-node bundle", "Origin: vllm-node bundlf"))
    _, problem = _node_check(root)
    assert problem is not None and problem.startswith("apt/InRelease: no good signature by the key in")
    assert problem.endswith(bundle_fetch.CHANGED_FIX)
    # build() signs the current Release again
    assert sign_release(apt, key) is True
    assert _node_check(root) == (key.fingerprint, None)


def test_resigned_by_another_key_is_refused_by_the_pin(tmp_path: Path, homes: tuple[Path, Path]) -> None:
    """A bundle re-signed (consistently: key, signatures, manifest) by another key passes without a pin and is
    refused with one, naming both fingerprints; a keyring swapped under the manifest's fingerprint is refused too."""
    ours, theirs = signing_key(homes[0], None), signing_key(homes[1], None)
    assert ours.fingerprint != theirs.fingerprint
    root = tmp_path / "bundle"
    apt = _repo(root / "apt")
    sign_release(apt, ours)
    assert sign_release(apt, theirs) is True  # another key: signed again, its public key exported
    (root / "fpr").write_text(theirs.fingerprint + "\n")
    assert _node_check(root) == (theirs.fingerprint, None)
    _, problem = _node_check(root, ours.fingerprint)
    assert problem == (f"apt/InRelease: signed by key {theirs.fingerprint}, offline_bundle_apt_signing_key pins "
                       f"{ours.fingerprint}; {bundle_fetch.SIGNING_FIX}")
    (root / "fpr").write_text(ours.fingerprint + "\n")  # the manifest names ours, the files are theirs
    _, problem = _node_check(root, ours.fingerprint)
    assert problem is not None
    assert problem.startswith(f"apt/InRelease: signed by key {theirs.fingerprint}, "
                              f"the manifest names {ours.fingerprint}")


def test_controller_key_generated_once_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "bs" / "gnupg"
    monkeypatch.setattr(bundle, "DEFAULT_SIGNING_HOME", home)
    try:
        first = signing_key(None, None)
        assert first == SigningKey(home, first.fingerprint) and re.fullmatch(r"[0-9A-F]{40}", first.fingerprint)
        assert home.stat().st_mode & 0o777 == 0o700
        pubring = (home / "pubring.kbx").read_bytes()
        assert signing_key(None, None) == first
        assert (home / "pubring.kbx").read_bytes() == pubring
        # an operator's home holding two keys: one must be named
        generate_key(home)
        with pytest.raises(SystemExit, match="2 secret keys match any key"):
            signing_key(home, None)
        assert signing_key(home, first.fingerprint) == first
    finally:
        stop_agent(home)
