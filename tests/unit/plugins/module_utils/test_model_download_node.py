"""What model_download does on the node (module_utils/model_download/node.py), on a temporary directory with a
stand-in `hf` (a shell script that records what it saw)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import node
from harness.models import downloaded_model, tree

UID, GID = os.getuid(), os.getgid()
A = "a" * 40


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def fake_hf(tmp_path: Path, body: str) -> str:
    """An executable standing in for hf: `body` is shell; $TOKEN_SEEN records the token file's content."""
    script = tmp_path / "hf"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_ensure_dir_creates_then_reports_no_change(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert node.ensure_dir(str(target), UID, GID, 0o750, check=True) and not target.exists()
    assert node.ensure_dir(str(target), UID, GID, 0o750, check=False) and mode(target) == 0o750
    assert not node.ensure_dir(str(target), UID, GID, 0o750, check=False)
    target.chmod(0o755)
    assert node.ensure_dir(str(target), UID, GID, 0o750, check=True) and mode(target) == 0o755
    assert node.ensure_dir(str(target), UID, GID, 0o750, check=False) and mode(target) == 0o750


def test_write_json_is_idempotent_and_returns_the_diff(tmp_path: Path) -> None:
    path = str(tmp_path / "r.json")
    first = node.write_json(path, {"b": 1, "a": [1]}, UID, GID, check=False)
    assert first["changed"] and first["diff"]["before"] == ""
    assert json.loads(first["diff"]["after"]) == {"a": [1], "b": 1}
    assert mode(Path(path)) == 0o640 and node.read_json(path) == {"a": [1], "b": 1}
    assert not node.write_json(path, {"a": [1], "b": 1}, UID, GID, check=False)["changed"]
    assert node.write_json(path, {"a": 2}, UID, GID, check=True)["changed"] and node.read_json(path)["b"] == 1
    assert node.read_json(str(tmp_path / "absent")) is None


def test_list_files_and_own_tree(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.json").write_text("12")
    (tmp_path / "run.py").write_text("1")
    (tmp_path / "run.py").chmod(0o700)
    (tmp_path / "link").symlink_to("run.py")
    assert node.list_files(str(tmp_path)) == {"sub/x.json": 2, "run.py": 1}
    assert node.tree_bytes(str(tmp_path)) == 3 and node.tree_bytes(str(tmp_path / "absent")) == 0
    assert node.own_tree(str(tmp_path), UID, GID, check=True) and mode(tmp_path / "sub" / "x.json") != 0o640
    assert node.own_tree(str(tmp_path), UID, GID, check=False)
    modes = (mode(tmp_path / "sub" / "x.json"), mode(tmp_path / "run.py"), mode(tmp_path / "sub"))
    assert modes == (0o640, 0o750, 0o750)
    assert not node.own_tree(str(tmp_path), UID, GID, check=False), "a second pass changes nothing"


def test_originals_hashes_and_forget(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("patched")
    (tmp_path / "config.json.orig").write_text("original")
    (tmp_path / "t.json").write_text("t")
    hashes = node.hash_small_files(str(tmp_path), ["config.json", "t.json"])
    assert hashes["config.json"] == node.file_sha256(str(tmp_path / "config.json.orig")), "the bytes as downloaded"
    assert node.restore_originals(str(tmp_path), ["config.json"], UID, GID)
    assert (tmp_path / "config.json").read_text() == "original"
    assert not node.restore_originals(str(tmp_path), ["config.json"], UID, GID)
    meta = tmp_path / mdf.HF_METADATA_DIR / "t.json.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text("m")
    node.forget(str(tmp_path), ["t.json", "gone.json"])
    assert not (tmp_path / "t.json").exists() and not meta.exists()


def test_the_old_layout_moves_without_clobbering(tmp_path: Path) -> None:
    base = tmp_path / "org" / "m"
    (base / "revisions" / A).mkdir(parents=True)
    for name in ("config.json", mdf.RECORD_NAME, ".vllm-node-bundle-copied-" + A, ".cache", "dup.json"):
        (base / name).write_text(name)
    (base / "revisions" / A / "dup.json").write_text("kept")
    assert node.flat_entries(str(base)) == [".cache", "config.json", "dup.json"]
    left = node.move_flat(str(base), node.flat_entries(str(base)), str(base / "revisions" / A))
    assert left == [str(base / "dup.json")] and (base / "revisions" / A / "config.json").read_text() == "config.json"
    assert (base / "revisions" / A / "dup.json").read_text() == "kept"
    assert node.flat_entries(str(tmp_path / "absent")) == []


def test_prune_deletes_unkept_revisions_and_markers_order_them(tmp_path: Path) -> None:
    revisions = tmp_path / "revisions"
    names = ["a" * 40, "b" * 40, "c" * 40, "not-a-commit"]
    for i, name in enumerate(names):
        (revisions / name).mkdir(parents=True)
        if i < 2:
            marker = revisions / name / mdf.MARKER_NAME
            marker.write_text(json.dumps({"commit": name}))
            os.utime(marker, (1000 + i, 1000 + i))
    assert set(node.markers(str(revisions))) == {"a" * 40, "b" * 40}
    assert node.prune(str(revisions), "c" * 40, 2, check=True) == ["a" * 40] and (revisions / ("a" * 40)).exists()
    assert node.prune(str(revisions), "c" * 40, 2, check=False) == ["a" * 40]
    assert sorted(os.listdir(revisions)) == ["b" * 40, "c" * 40, "not-a-commit"]
    assert node.prune(str(revisions), "c" * 40, 2, check=False) == []


def test_run_hf_has_the_token_file_only_while_hf_runs(tmp_path: Path) -> None:
    token_file = str(tmp_path / "token")
    hf = fake_hf(tmp_path, 'cat "$HF_TOKEN_PATH"; echo " $*"; echo oops >&2; exit 3')
    res = node.run_hf([hf, "models", "info"], {"HF_TOKEN_PATH": token_file}, token_file, "s3cret", 60)
    assert res["rc"] == 3 and res["stdout"] == "s3cret models info\n" and res["stderr"] == "oops\n"
    assert not os.path.exists(token_file)
    missing = node.run_hf([str(tmp_path / "nope")], {}, token_file, "", 60)
    assert missing["rc"] is None and "nope" in missing["msg"]


def wait_finished(job_dir: str, pid: int) -> dict:
    for _ in range(100):
        status = node.job_status(job_dir, pid)
        if status.get("finished") or status.get("lost"):
            return status
        time.sleep(0.05)
    raise AssertionError("the background job did not finish")


def test_a_background_job_reports_its_result_and_removes_the_token(tmp_path: Path) -> None:
    token_file, job_dir = str(tmp_path / "token"), str(tmp_path / "jobs" / "1")
    hf = fake_hf(tmp_path, 'cat "$HF_TOKEN_PATH" > "$OUT"; echo done; echo warn >&2; exit 0')
    env = {"HF_TOKEN_PATH": token_file, "OUT": str(tmp_path / "seen")}
    pid = node.spawn([hf, "download"], env, job_dir, token_file, "s3cret", 60)
    status = wait_finished(job_dir, pid)
    assert status["rc"] == 0 and status["stdout"] == "done\n" and status["stderr"] == "warn\n"
    assert (tmp_path / "seen").read_text() == "s3cret" and not os.path.exists(token_file)
    assert mode(Path(job_dir)) == 0o700
    assert not node.stop(job_dir, token_file) and not os.path.exists(job_dir)


def test_a_background_job_is_killed_at_its_limit_or_by_stop(tmp_path: Path) -> None:
    token_file = str(tmp_path / "token")
    hf = fake_hf(tmp_path, "exec sleep 30")
    pid = node.spawn([hf], {}, str(tmp_path / "j1"), token_file, "", 1)
    status = wait_finished(str(tmp_path / "j1"), pid)
    assert status["rc"] is None and status["msg"] == "Timeout exceeded"
    pid = node.spawn([hf], {}, str(tmp_path / "j2"), token_file, "t", 60)
    for _ in range(100):
        if (tmp_path / "j2" / "hf.pid").exists():
            break
        time.sleep(0.05)
    assert node.job_status(str(tmp_path / "j2"), pid) == {"finished": False}
    assert node.stop(str(tmp_path / "j2"), token_file) and not os.path.exists(token_file)
    assert not (tmp_path / "j2").exists()


def test_a_vanished_runner_is_a_lost_job(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    assert node.job_status(str(tmp_path / "j"), 0)["lost"] is True


@pytest.mark.parametrize("pid", [0, -1])
def test_alive_refuses_non_pids(pid: int) -> None:
    assert not node.alive(pid) and node.alive(os.getpid())


# ---- models no unit serves any more ------------------------------------------------------------------------------


def test_scan_models_lists_records_revisions_and_no_symbolic_link(tmp_path: Path) -> None:
    root = tmp_path / "models"
    downloaded_model(root, "org/kept", {"config.json": b"{}"}, [A])
    (root / "org" / "kept" / "revisions" / "stray").write_text("x")
    (root / "org" / "linked").symlink_to(root / "org" / "kept")
    (root / "hand" / "made").mkdir(parents=True)
    listing = node.scan_models(str(root))
    assert listing["orgs"]["org"]["entries"] == ["kept", "linked"]
    assert listing["orgs"]["org"]["repos"] == {"kept": {"record": "org/kept", "entries": [mdf.RECORD_NAME, "revisions"],
                                                         "revisions": [A], "revisions_other": ["stray"]}}
    assert listing["orgs"]["hand"]["repos"]["made"]["record"] is None
    assert node.scan_models(str(tmp_path / "absent")) == {"root": str(tmp_path / "absent"), "orgs": {}}


def test_delete_unserved_counts_each_linked_file_once_and_check_deletes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "models"
    base = downloaded_model(root, "org/gone", {"model.safetensors": b"w" * 1000, "config.json": b"{}"}, [A, "b" * 40])
    plan = mdf.unserved_plan(node.scan_models(str(root)), ["org/served"], [])
    before = tree(base)
    [checked] = node.delete_unserved(plan, check=True)
    assert tree(base) == before
    # the two revisions share the files (hard links): 1002 bytes of data, plus the two markers and the record
    markers = sum(size for path, size in before.items() if path.endswith(mdf.MARKER_NAME))
    assert checked["bytes"] == 1002 + markers + before[mdf.RECORD_NAME]
    [done] = node.delete_unserved(plan, check=False)
    assert done["bytes"] == checked["bytes"] and not (root / "org").exists() and root.is_dir()


def test_inodes_leaves_a_file_linked_from_elsewhere_unfreed(tmp_path: Path) -> None:
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "shard").write_bytes(b"s" * 64)
    os.link(tmp_path / "gone" / "shard", tmp_path / "stays")
    assert mdf.freed_bytes(node.inodes([str(tmp_path / "gone")])) == 0
    assert mdf.freed_bytes(node.inodes([str(tmp_path / "gone"), str(tmp_path / "stays")])) == 64
