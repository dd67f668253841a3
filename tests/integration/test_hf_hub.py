"""The real `hf` CLI (huggingface_hub 2.x, from the controller venv) against the local hub fixture."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Hub  # tests/integration/conftest.py

HF = Path(sys.executable).with_name("hf")
ORG = "vllm-node-test"


def hf(hub: Hub, tmp_path: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `hf` with HF_ENDPOINT on the fixture, an isolated HF_HOME and no ambient token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_UPDATE_CHECK="1", NO_COLOR="1",
               HF_HUB_DOWNLOAD_TIMEOUT="10", HF_HUB_ETAG_TIMEOUT="10")
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([str(HF), *args], env=env, capture_output=True, text=True, timeout=300, check=False)


def repo_files(path: Path) -> dict[str, bytes]:
    """Content of every file of a repo or local dir, without hf's .cache bookkeeping."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(path).parts}


def get_bytes(hub: Hub, repo: str) -> dict[str, int]:
    """Body bytes the hub sent per file of one repo since the last reset."""
    prefix = f"{repo}/"
    return {k[len(prefix):]: v["bytes"] for k, v in hub.counters()["files"].items() if k.startswith(prefix)}


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek-v3", "tiny-deepseek-v3-fp8kv"])
def test_download_each_tiny_repo(hub: Hub, tmp_path: Path, name: str) -> None:
    out = hf(hub, tmp_path, "download", f"{ORG}/{name}", "--local-dir", str(tmp_path / name))
    assert out.returncode == 0, out.stderr
    assert repo_files(tmp_path / name) == repo_files(hub.root / ORG / name)
    assert not list((tmp_path / name).rglob("*.incomplete"))


def test_revision_by_branch_and_by_sha(hub: Hub, tmp_path: Path) -> None:
    repo = f"{ORG}/tiny-llama"
    sha = hub.commit(repo)
    assert len(sha) == 40 and int(sha, 16) >= 0
    cache = tmp_path / "cache"
    by_branch = hf(hub, tmp_path, "download", repo, "--revision", "main", "--cache-dir", str(cache))
    assert by_branch.returncode == 0, by_branch.stderr
    repo_cache = cache / "models--vllm-node-test--tiny-llama"
    assert (repo_cache / "refs" / "main").read_text() == sha
    assert repo_files(repo_cache / "snapshots" / sha) == repo_files(hub.root / repo)
    hub.reset()
    by_sha = hf(hub, tmp_path, "download", repo, "--revision", sha, "--local-dir", str(tmp_path / "by-sha"))
    assert by_sha.returncode == 0, by_sha.stderr
    assert repo_files(tmp_path / "by-sha") == repo_files(hub.root / repo)
    paths = [entry["path"] for entry in hub.counters()["log"]]
    assert not any("/revision/" in p for p in paths), "a 40-hex revision needs no revision lookup"
    assert any(f"/tree/{sha}" in p for p in paths)


def test_unknown_repo_revision_and_file(hub: Hub, tmp_path: Path) -> None:
    missing_repo = hf(hub, tmp_path, "download", f"{ORG}/does-not-exist", "--local-dir", str(tmp_path / "a"))
    assert missing_repo.returncode != 0
    assert "not found" in (missing_repo.stdout + missing_repo.stderr).lower()
    bad_rev = hf(hub, tmp_path, "download", f"{ORG}/tiny-llama", "--revision", "no-such-branch",
                 "--local-dir", str(tmp_path / "b"))
    assert bad_rev.returncode != 0
    assert "Revision not found" in bad_rev.stdout + bad_rev.stderr
    bad_file = hf(hub, tmp_path, "download", f"{ORG}/tiny-llama", "no-such-file.json",
                  "--local-dir", str(tmp_path / "c"))
    assert bad_file.returncode != 0
    assert "not found" in (bad_file.stdout + bad_file.stderr).lower()
    assert not (tmp_path / "c" / "no-such-file.json").exists()


@pytest.mark.parametrize(("path", "code"), [
    ("/api/models/vllm-node-test/nope/revision/main", "RepoNotFound"),
    ("/api/models/vllm-node-test/tiny-llama/revision/nope", "RevisionNotFound"),
    ("/vllm-node-test/tiny-llama/resolve/main/nope.json", "EntryNotFound"),
    ("/vllm-node-test/tiny-llama/resolve/0123456789012345678901234567890123456789/config.json", "RevisionNotFound"),
])
def test_error_codes_on_the_wire(hub: Hub, path: str, code: str) -> None:
    status, headers, _ = hub.request(path)
    assert (status, headers.get("X-Error-Code")) == (404, code)


def test_agent_harnesses_is_404_and_no_xet_headers(hub: Hub) -> None:
    assert hub.request("/api/agent-harnesses")[0] == 404
    status, headers, _ = hub.request("/vllm-node-test/tiny-llama/resolve/main/model-00001-of-00003.safetensors",
                                     method="HEAD")
    assert status == 200
    assert not any(h.lower().startswith("x-xet") for h in headers)
    assert "xet" not in headers.get("Link", "")


def test_head_headers_and_tree_hashes(hub: Hub) -> None:
    repo = f"{ORG}/tiny-llama"
    sha = hub.commit(repo)
    tree = hub.json(f"/api/models/{repo}/tree/main?recursive=true&expand=false")
    by_path = {entry["path"]: entry for entry in tree}
    shard = (hub.root / repo / "model-00002-of-00003.safetensors").read_bytes()
    entry = by_path["model-00002-of-00003.safetensors"]
    assert entry["size"] == len(shard)
    assert entry["lfs"]["oid"] == hashlib.sha256(shard).hexdigest()
    assert entry["oid"] == hashlib.sha1(b"blob %d\0" % len(shard) + shard).hexdigest()
    config = (hub.root / repo / "config.json").read_bytes()
    assert "lfs" not in by_path["config.json"]
    status, headers, _ = hub.request(f"/{repo}/resolve/main/config.json", method="HEAD")
    assert status == 200 and headers["X-Repo-Commit"] == sha
    git_blob_sha = hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    assert headers["ETag"] == f'"{git_blob_sha}"'
    assert int(headers["Content-Length"]) == len(config)
    status, headers, _ = hub.request(f"/{repo}/resolve/{sha}/model-00002-of-00003.safetensors", method="HEAD")
    assert headers["ETag"] == f'"{hashlib.sha256(shard).hexdigest()}"'


def test_range_requests(hub: Hub) -> None:
    path = f"/{ORG}/tiny-llama/resolve/main/tokenizer.json"
    content = (hub.root / ORG / "tiny-llama" / "tokenizer.json").read_bytes()
    status, headers, body = hub.request(path, headers={"Range": "bytes=10-19"})
    assert (status, body) == (206, content[10:20])
    assert headers["Content-Range"] == f"bytes 10-19/{len(content)}"
    status, headers, body = hub.request(path, headers={"Range": "bytes=-5"})
    assert (status, body) == (206, content[-5:])
    status, headers, _ = hub.request(path, headers={"Range": f"bytes={len(content)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(content)}"


def test_private_repo_needs_the_token(hub: Hub, tmp_path: Path) -> None:
    repo = f"{ORG}/tiny-llama-private"
    anonymous = hf(hub, tmp_path, "download", repo, "--local-dir", str(tmp_path / "anon"))
    assert anonymous.returncode != 0
    assert not (tmp_path / "anon" / "config.json").exists()
    wrong = hf(hub, tmp_path, "download", repo, "--local-dir", str(tmp_path / "wrong"), token="hf_wrong")
    assert wrong.returncode != 0
    assert hub.request(f"/api/models/{repo}/revision/main")[1].get("X-Error-Code") == "RepoNotFound"
    good = hf(hub, tmp_path, "download", repo, "--local-dir", str(tmp_path / "good"), token=hub.token)
    assert good.returncode == 0, good.stderr
    assert repo_files(tmp_path / "good") == repo_files(hub.root / repo)
    assert all(entry["auth"] for entry in hub.counters()["log"] if entry["status"] == 200)


def test_in_process_retry_after_one_dropped_connection(hub: Hub, tmp_path: Path) -> None:
    repo = f"{ORG}/tiny-deepseek-v3"
    shard = "model-00001-of-00003.safetensors"
    hub.drop(f"{repo}/{shard}", after_bytes=100_000, times=1)
    out = hf(hub, tmp_path, "download", repo, "--local-dir", str(tmp_path / "d"))
    assert out.returncode == 0, out.stderr
    assert repo_files(tmp_path / "d") == repo_files(hub.root / repo)
    stats = hub.counters()["files"][f"{repo}/{shard}"]
    assert stats["drops"] == 1 and stats["gets"] == 2
    assert stats["bytes"] == 100_000 + (hub.root / repo / shard).stat().st_size


def test_interrupted_download_leaves_no_corrupt_file_and_rerun_fetches_only_the_missing_file(
        hub: Hub, tmp_path: Path) -> None:
    repo = f"{ORG}/tiny-deepseek-v3"
    shard = "model-00001-of-00003.safetensors"
    target = tmp_path / "d"
    hub.drop(f"{repo}/{shard}", after_bytes=65_536, times=1000)  # every attempt fails
    first = hf(hub, tmp_path, "download", repo, "--local-dir", str(target))
    assert first.returncode != 0, "hf must fail when the file can never be fetched"
    assert hub.counters()["files"][f"{repo}/{shard}"]["drops"] >= 1
    assert not (target / shard).exists(), "no partial shard may be left under its final name"
    assert not [p for p in target.rglob("*.incomplete")], "temporary files must be cleaned up"
    source = repo_files(hub.root / repo)
    got = repo_files(target)
    assert got == {k: v for k, v in source.items() if k in got}, "every file present must be complete"

    hub.reset()
    second = hf(hub, tmp_path, "download", repo, "--local-dir", str(target))
    assert second.returncode == 0, second.stderr
    assert repo_files(target) == source
    sent = {path: count for path, count in get_bytes(hub, repo).items() if count}
    assert sent == {shard: len(source[shard])}, f"re-run must fetch only the missing shard, got {sent}"


def test_cache_verify_detects_a_silently_corrupted_file(hub: Hub, tmp_path: Path) -> None:
    repo = f"{ORG}/tiny-llama"
    target = tmp_path / "v"
    assert hf(hub, tmp_path, "download", repo, "--local-dir", str(target)).returncode == 0
    verify = ["cache", "verify", repo, "--local-dir", str(target), "--fail-on-missing-files"]
    clean = hf(hub, tmp_path, *verify)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    shard = target / "model-00003-of-00003.safetensors"
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, same mtime: invisible to `hf download`
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rerun = hf(hub, tmp_path, "download", repo, "--local-dir", str(target))
    assert rerun.returncode == 0 and shard.read_bytes() == bytes(data), "hf download trusts its metadata"
    corrupt = hf(hub, tmp_path, *verify)
    assert corrupt.returncode != 0
    assert "model-00003-of-00003.safetensors" in corrupt.stdout + corrupt.stderr
    (target / "tokenizer.json").unlink()
    shard.write_bytes((hub.root / repo / shard.name).read_bytes())
    missing = hf(hub, tmp_path, *verify)
    assert missing.returncode != 0 and "tokenizer.json" in missing.stdout + missing.stderr


def test_throttle_paces_a_transfer_and_reset_lifts_it(hub: Hub) -> None:
    """The slow-link switch the progress test relies on: a throttled file arrives no faster than the rate."""
    path = f"/{ORG}/tiny-deepseek-v3/resolve/main/model-00001-of-00003.safetensors"
    size = len(hub.request(path)[2])
    assert size > 256 * 1024
    rate = size // 2                                   # about 2 s for the whole file
    hub.throttle("*tiny-deepseek-v3/*.safetensors", rate)
    try:
        start = time.monotonic()
        status, _, body = hub.request(path)
        elapsed = time.monotonic() - start
        assert status == 200 and len(body) == size
        assert elapsed >= 1.5, f"throttled to {rate} B/s but {size} B took {elapsed:.2f} s"
        rule = {"glob": "*tiny-deepseek-v3/*.safetensors", "bytes_per_second": rate}
        assert hub.counters()["throttle_rules"] == [rule]
    finally:
        hub.reset()
    start = time.monotonic()
    hub.request(path)
    assert time.monotonic() - start < 1.0
    status, _, body = hub.request("/_control/throttle", "POST", {"glob": "*", "bytes_per_second": 0})
    assert status == 400 and b"bytes_per_second" in body


def test_revisions_by_tag_and_by_sha(hub: Hub, tmp_path: Path) -> None:
    """ROOT/<org>/<name>@<tag> is revision <tag> of the repo and has its own content-derived sha; main is unchanged."""
    repo = f"{ORG}/tiny-llama"
    sha_a, sha_b = hub.commit(repo), hub.commit(repo, hub.REV_B)
    assert sha_a != sha_b and len(sha_b) == 40
    assert hub.json(f"/api/models/{repo}/revision/{sha_b}")["sha"] == sha_b
    by_tag = hf(hub, tmp_path, "download", repo, "--revision", hub.REV_B, "--local-dir", str(tmp_path / "tag"))
    assert by_tag.returncode == 0, by_tag.stderr
    assert repo_files(tmp_path / "tag") == repo_files(hub.root / ORG / f"tiny-llama@{hub.REV_B}")
    by_sha = hf(hub, tmp_path, "download", repo, "--revision", sha_b, "--local-dir", str(tmp_path / "sha"))
    assert by_sha.returncode == 0, by_sha.stderr
    assert repo_files(tmp_path / "sha") == repo_files(tmp_path / "tag")
    main = hf(hub, tmp_path, "download", repo, "--revision", sha_a, "--local-dir", str(tmp_path / "main"))
    assert main.returncode == 0 and repo_files(tmp_path / "main") == repo_files(hub.root / repo)
    assert repo_files(tmp_path / "main") != repo_files(tmp_path / "tag")
    tree_a = {e["path"]: e for e in hub.json(f"/api/models/{repo}/tree/{sha_a}?recursive=true")}
    tree_b = {e["path"]: e for e in hub.json(f"/api/models/{repo}/tree/{hub.REV_B}?recursive=true")}
    changed = sorted(p for p in tree_a if tree_a[p] != tree_b[p])
    assert changed == ["model-00001-of-00003.safetensors"]
    assert hub.request(f"/api/models/{ORG}/tiny-llama@{hub.REV_B}/revision/main")[0] == 404, "a tag dir is no repo"


@pytest.mark.parametrize("with_metadata", [True, False])
def test_local_dir_accepts_hard_linked_unchanged_shards(hub: Hub, tmp_path: Path, with_metadata: bool) -> None:
    """What model_download relies on: revision B in its own --local-dir, the shards whose sha256 did not change
    hard-linked from revision A's directory (with A's hf metadata file copied, or none): `hf download` fetches only
    the changed shard and the small files, keeps the links, and `hf cache verify` passes."""
    repo = f"{ORG}/tiny-llama"
    sha_b = hub.commit(repo, hub.REV_B)
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    assert hf(hub, tmp_path, "download", repo, "--local-dir", str(dir_a)).returncode == 0
    unchanged = ["model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    meta = Path(".cache") / "huggingface" / "download"
    (dir_b / meta).mkdir(parents=True)
    for name in unchanged:
        os.link(dir_a / name, dir_b / name)
        if with_metadata:
            (dir_b / meta / f"{name}.metadata").write_bytes((dir_a / meta / f"{name}.metadata").read_bytes())
    hub.reset()
    out = hf(hub, tmp_path, "download", repo, "--revision", sha_b, "--local-dir", str(dir_b))
    assert out.returncode == 0, out.stderr
    assert repo_files(dir_b) == repo_files(hub.root / ORG / f"tiny-llama@{hub.REV_B}")
    sent = {path: count for path, count in get_bytes(hub, repo).items() if count}
    assert not set(sent) & set(unchanged), f"an unchanged shard was fetched again: {sent}"
    assert "model-00001-of-00003.safetensors" in sent
    for name in unchanged:
        assert (dir_b / name).stat().st_ino == (dir_a / name).stat().st_ino, f"{name}: the hard link was replaced"
        assert (dir_b / meta / f"{name}.metadata").read_text().splitlines()[0] == sha_b
    verify = hf(hub, tmp_path, "cache", "verify", repo, "--revision", sha_b, "--local-dir", str(dir_b),
                "--fail-on-missing-files")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert repo_files(dir_a) == repo_files(hub.root / repo), "revision A's directory is untouched"


def test_corrupt_control_flips_a_byte_only_verification_notices(hub: Hub, tmp_path: Path) -> None:
    repo = f"{ORG}/tiny-llama"
    shard = "model-00001-of-00003.safetensors"
    hub.corrupt(f"{repo}/{shard}", times=1)
    out = hf(hub, tmp_path, "download", repo, "--revision", hub.REV_B, "--local-dir", str(tmp_path / "c"))
    assert out.returncode == 0, out.stderr
    good = (hub.root / ORG / f"tiny-llama@{hub.REV_B}" / shard).read_bytes()
    got = (tmp_path / "c" / shard).read_bytes()
    assert len(got) == len(good) and sum(a != b for a, b in zip(got, good, strict=True)) == 1
    assert hub.counters()["files"][f"{repo}/{shard}"]["corrupted"] == 1
    verify = hf(hub, tmp_path, "cache", "verify", repo, "--revision", hub.REV_B, "--local-dir", str(tmp_path / "c"))
    assert verify.returncode != 0 and shard in verify.stdout + verify.stderr
    assert hub.request(f"/{repo}/resolve/{hub.REV_B}/{shard}")[2] == good, "the rule was used up"
