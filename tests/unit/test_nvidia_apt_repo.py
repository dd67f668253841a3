"""The stand-in NVIDIA repository (tests/fixtures/nvidia_apt_repo/build.py) against the nvidia_driver role's package
tables: every package name the role can ask for exists in the stand-in of that distribution family, the index is
signed by the key the build reports, and the `cuda` trap is there. Needs dpkg-deb and gpg (no docker)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tests/fixtures/nvidia_apt_repo/build.py"
VARS = ROOT / "roles/nvidia_driver/vars"

pytestmark = pytest.mark.skipif(not (shutil.which("dpkg-deb") and shutil.which("gpg")), reason="needs dpkg-deb and gpg")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nvrepo")
    subprocess.run([sys.executable, str(BUILD), "--out", str(out), "--kernel", "6.1.0-test"], check=True,
                   capture_output=True)
    return out


def package_names(repo: Path, repo_dir: str) -> dict[str, set[str]]:
    """Package -> versions in one stand-in repository."""
    text = (repo / "repos" / repo_dir / "x86_64" / "Packages").read_text()
    names: dict[str, set[str]] = {}
    for stanza in text.strip().split("\n\n"):
        fields = dict(re.findall(r"^(\S+): (.*)$", stanza, flags=re.M))
        names.setdefault(fields["Package"], set()).add(fields["Version"])
    return names


def role_packages(family: str, branch: int) -> set[str]:
    """Every package name the role's vars file can produce for a branch, templates rendered with Jinja2."""
    data = yaml.safe_load((VARS / f"{family}.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    context: dict[str, object] = {"nvidia_driver_branch": branch}
    if "__nvidia_driver_suffix" in data:
        context["__nvidia_driver_suffix"] = env.from_string(data["__nvidia_driver_suffix"]).render(context)
    flat = [p for kind in data["__nvidia_driver_packages"].values() for flavour in kind.values() for p in flavour]
    flat += data["__nvidia_driver_persistenced_packages"] + [data["__nvidia_driver_fabricmanager_package"]]
    return {env.from_string(name).render(context) for name in flat}


@pytest.mark.parametrize("family,repo_dir", [("Debian", "debian12"), ("Debian", "debian13"),
                                             ("Ubuntu", "ubuntu2204"), ("Ubuntu", "ubuntu2404")])
@pytest.mark.parametrize("branch", [580, 590])
def test_every_role_package_exists_in_the_stand_in(repo, family, repo_dir, branch):
    names = package_names(repo, repo_dir)
    missing = role_packages(family, branch) - names.keys()
    assert not missing, f"{repo_dir} lacks {sorted(missing)} for branch {branch}"
    assert f"nvidia-driver-pinning-{branch}" in names
    assert {"cuda-toolkit-12-8", "cuda-toolkit-13-0", "cuda", "nvlsm", "libnvsdm", "dkms",
            "linux-headers-6.1.0-test"} <= names.keys()


def test_both_branches_offered_so_pinning_is_observable(repo):
    names = package_names(repo, "debian12")
    assert names["nvidia-driver-cuda"] == {"580.95.05-1", "590.48.01-1"}
    assert names["nvidia-open"] == {"580.95.05-1", "590.48.01-1"}


def test_release_is_signed_by_the_reported_key(repo, tmp_path):
    fingerprint = (repo / "fingerprint").read_text().strip()
    assert re.fullmatch(r"[0-9A-F]{40}", fingerprint)
    home = tmp_path / "g"
    home.mkdir(mode=0o700)
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--import", str(repo / "testkey.asc")], check=True,
                   capture_output=True)
    keyring = tmp_path / "k.gpg"
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", "-o", str(keyring), "--export", fingerprint],
                   check=True, capture_output=True)
    repo_dir = repo / "repos/ubuntu2404/x86_64"
    verified = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo_dir / "InRelease")], capture_output=True)
    assert verified.returncode == 0, verified.stderr
    # A tampered index must fail the check.
    tampered = tmp_path / "InRelease"
    tampered.write_text((repo_dir / "InRelease").read_text().replace("Packages.gz", "Packages.xz", 1))
    assert subprocess.run(["gpgv", "--keyring", str(keyring), str(tampered)], capture_output=True).returncode != 0
