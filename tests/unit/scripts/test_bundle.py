"""scripts/bundle.py (the plan hash, the wheel selection by the lock's hashes, the manifest and its verification) and
the node side: the module bundle_fetch's checks and the offline_bundle role's filter."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.filter.offline_bundle import model_files
from ansible_collections.vllm_node.vllm_node.plugins.modules.bundle_fetch import (
    check_manifest,
    file_problem,
    safe_relative,
)
from ansible_collections.vllm_node.vllm_node.plugins.modules.bundle_fetch import plan_hash as node_plan_hash
from bundle import (
    manifest_for,
    packages_index,
    plan_hash,
    select_wheels,
    sha256sums_ok,
    verify_bundle,
    wheel_name,
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(root: Path) -> dict[str, bytes]:
    files = {"wheels/a-1.0-py3-none-any.whl": b"wheel a", "model/org/m/c0ffee/model.safetensors": b"\x00" * 64,
             "apt/Packages": b"Package: x\n"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_plan_hash_is_canonical() -> None:
    """Key order and formatting do not change the hash; any value does."""
    a = {"lock": {"name": "x.txt", "sha256": "1"}, "apt": {"packages": ["g++"]}}
    b = {"apt": {"packages": ["g++"]}, "lock": {"sha256": "1", "name": "x.txt"}}
    assert plan_hash(a) == plan_hash(b)
    assert plan_hash(a) != plan_hash({**a, "apt": {"packages": ["gcc"]}})


def test_wheel_name_canonical() -> None:
    assert wheel_name("Typing_Extensions-4.0-py3-none-any.whl") == "typing-extensions"
    assert wheel_name("zope.interface-7.0-cp311-cp311-manylinux_2_17_x86_64.whl") == "zope-interface"


def test_select_wheels_by_lock_hash(tmp_path: Path) -> None:
    """Only a wheel whose sha256 the lock lists is chosen; a pin without one is reported missing."""
    good = tmp_path / "a-1.0-py3-none-any.whl"
    good.write_bytes(b"good")
    other = tmp_path / "b-2.0-py3-none-any.whl"
    other.write_bytes(b"tampered")
    extra = tmp_path / "c-1.0-py3-none-any.whl"
    extra.write_bytes(b"not in the lock")
    lock = (f"a==1.0 \\\n    --hash=sha256:{_sha(b'good')}\n"
            f"b==2.0 \\\n    --hash=sha256:{_sha(b'original')}\n")
    chosen, missing = select_wheels([good, other, extra], lock)
    assert chosen == {"a": good}
    assert missing == ["b"]


def test_manifest_verifies_then_names_each_tampered_file(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    plan = {"model": {"repo": "org/m"}}
    manifest = manifest_for(tmp_path, plan)
    assert set(manifest["files"]) == set(files)
    assert manifest["files"]["wheels/a-1.0-py3-none-any.whl"]["sha256"] == _sha(b"wheel a")
    assert verify_bundle(tmp_path, manifest) == []

    shard = tmp_path / "model/org/m/c0ffee/model.safetensors"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0x01  # one flipped bit, same size
    shard.write_bytes(bytes(data))
    (tmp_path / "wheels/a-1.0-py3-none-any.whl").unlink()
    (tmp_path / "wheels/smuggled.whl").write_bytes(b"x")
    problems = verify_bundle(tmp_path, manifest)
    assert len(problems) == 3
    assert problems[0].startswith("model/org/m/c0ffee/model.safetensors: sha256 ")
    assert problems[1] == "wheels/a-1.0-py3-none-any.whl: missing"
    assert problems[2] == "wheels/smuggled.whl: not in the manifest"


def test_manifest_plan_must_match_its_hash(tmp_path: Path) -> None:
    _tree(tmp_path)
    manifest = json.loads(json.dumps(manifest_for(tmp_path, {"model": {"commit": "a" * 40}})))
    manifest["plan"]["model"]["commit"] = "b" * 40
    assert verify_bundle(tmp_path, manifest) == ["manifest.json: plan_sha256 does not match its plan"]


def test_sha256sums(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"x")
    assert not sha256sums_ok(tmp_path)
    (tmp_path / "SHA256SUMS").write_text(f"{_sha(b'x')}  x\n")
    assert sha256sums_ok(tmp_path)
    (tmp_path / "x").write_bytes(b"y")
    assert not sha256sums_ok(tmp_path)


def test_packages_index_lists_each_deb_with_its_hash(tmp_path: Path) -> None:
    debs = []
    for name in ("b_1_all.deb", "a_1_amd64.deb"):
        (tmp_path / name).write_bytes(name.encode())
        debs.append(tmp_path / name)
    index = packages_index(debs, control=lambda deb: f"Package: {deb.name.split('_')[0]}\nVersion: 1")
    stanzas = index.split("\n\n")
    assert len(stanzas) == 2
    assert stanzas[0] == (f"Package: a\nVersion: 1\nFilename: ./pool/a_1_amd64.deb\nSize: 13\n"
                          f"SHA256: {_sha(b'a_1_amd64.deb')}")
    assert stanzas[1].startswith("Package: b\n")


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd"])
def test_verify_refuses_paths_outside(tmp_path: Path, bad: str) -> None:
    _tree(tmp_path)
    manifest = manifest_for(tmp_path, {})
    manifest["files"][bad] = {"sha256": "0" * 64, "size": 1}
    assert any(p.startswith(f"{bad}: outside the bundle") for p in verify_bundle(tmp_path, manifest))




def test_node_and_controller_hash_the_plan_alike() -> None:
    plan = {"model": {"repo": "org/m", "commit": "c" * 40}, "apt": {"packages": ["g++"]}}
    assert node_plan_hash(plan) == plan_hash(plan)


def test_check_manifest(tmp_path: Path) -> None:
    """The id pins the manifest's bytes; a plan that does not match its hash and unsafe paths are refused."""
    _tree(tmp_path)
    raw = json.dumps(manifest_for(tmp_path, {"x": 1})).encode()
    assert check_manifest(raw, "")[1] == []
    assert check_manifest(raw, _sha(raw))[1] == []
    assert check_manifest(raw, "0" * 64)[1][0].startswith("manifest.json: sha256 ")
    bad = json.loads(raw)
    bad["plan"]["x"] = 2
    bad["files"]["../etc/shadow"] = {"sha256": "0" * 64, "size": 1}
    problems = check_manifest(json.dumps(bad).encode(), "")[1]
    assert problems == ["manifest.json: plan_sha256 does not match its plan", "../etc/shadow: outside the bundle"]
    assert check_manifest(b"not json", "")[1][0].startswith("manifest.json: not JSON")
    assert not safe_relative("/abs") and not safe_relative("a/../b") and safe_relative("wheels/a.whl")


def test_file_problem_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "w.whl"
    path.write_bytes(b"abc")
    entry = {"sha256": _sha(b"abc"), "size": 3}
    assert file_problem(str(path), "wheels/w.whl", entry) is None
    path.write_bytes(b"abd")
    assert file_problem(str(path), "wheels/w.whl", entry) == (
        f"wheels/w.whl: sha256 {_sha(b'abd')}, the manifest says {_sha(b'abc')}")
    path.write_bytes(b"abcd")
    assert file_problem(str(path), "wheels/w.whl", entry) == "wheels/w.whl: 4 bytes, the manifest says 3"
    assert file_problem(str(tmp_path / "no"), "wheels/no.whl", entry) == "wheels/no.whl: missing"


def test_model_files_in_model_download_record_shape() -> None:
    files = {"model/o/m/c/config.json": {"sha256": "a" * 64, "size": 5},
             "model/o/m/c/SHA256SUMS": {"sha256": "b" * 64, "size": 9},
             "model/o/m/c/sub/x.safetensors": {"sha256": "c" * 64, "size": 7},
             "wheels/a.whl": {"sha256": "d" * 64, "size": 1}}
    assert model_files(files, "model/o/m/c/") == [
        {"path": "config.json", "size": 5, "sha256": "a" * 64},
        {"path": "sub/x.safetensors", "size": 7, "sha256": "c" * 64}]


def test_default_apt_packages_cover_what_the_roles_install_on_a_cpu_node() -> None:
    """A package a role installs with apt on the demo's cpu node but missing from the bundle's closure makes the
    offline converge wait on an unreachable mirror (the gateway's HAProxy did, 2026-12-06)."""
    import yaml

    from bundle import DEFAULT_APT_PACKAGES, ROOT

    env = yaml.safe_load((ROOT / "roles/vllm_env/vars/main.yml").read_text())
    gateway = yaml.safe_load((ROOT / "roles/gateway/vars/main.yml").read_text())
    installed = (set(env["__vllm_env_base_packages"]) | set(env["__vllm_env_variants"]["cpu"]["system_packages"])
                 | set(gateway["__gateway_packages"]))
    assert installed <= set(DEFAULT_APT_PACKAGES), sorted(installed - set(DEFAULT_APT_PACKAGES))
