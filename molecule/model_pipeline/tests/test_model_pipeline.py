"""Fault paths and results of model_download / model_config on the molecule node, triggered for real.

Each test runs molecule/model_pipeline/run.yml with ansible-playbook against the molecule inventory, in its own
model root, and checks the node (testinfra `host`), the hub's counters and the Ansible output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from harness import playbook
from harness.project import PROJECT

SCENARIO = Path(__file__).resolve().parents[1]
HUB = "http://127.0.0.1:8999"
TOKEN = "hf_mpTEST_s3cr3t_7f3a9c2e"
TIMINGS: dict[str, float] = {}


def run_play(name: str, extra: dict[str, Any], expect_ok: bool = True) -> str:
    """ansible-playbook run.yml with extra vars; returns its output (kept in artifacts/model_pipeline/<name>.log);
    asserts the exit status."""
    proc = playbook.in_scenario("model_pipeline", name, SCENARIO / "run.yml", extra_vars=extra, timeout=1800,
                                inventory=os.environ["MOLECULE_INVENTORY_FILE"])
    TIMINGS[name] = round(proc.seconds, 1)
    assert (proc.rc == 0) == expect_ok, (
        f"{name}: rc={proc.rc}, expected ok={expect_ok}\n{proc.output[-6000:]}"
    )
    return proc.output


def hub(host, action: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call a control endpoint of the hub on the node (POST for everything but the counters)."""
    data = None if action in ("counters", "health") else json.dumps(payload or {}).encode()
    code = (
        "import urllib.request as u;"
        f"r=u.Request({HUB + '/_control/' + action!r}, data={data!r}, method={'GET' if data is None else 'POST'!r});"
        "print(u.urlopen(r).read().decode())"
    )
    res = host.run("python3 -c " + json.dumps(code))
    assert res.rc == 0, res.stderr
    return json.loads(res.stdout)


def hub_counters(host, repo: str) -> dict[str, dict[str, int]]:
    """Per-file counters of the hub for one repo, keyed by path inside the repo."""
    files = hub(host, "counters")["files"]
    prefix = repo + "/"
    return {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}


def result(host, path: str = "/tmp/mp-result.json") -> dict[str, Any]:
    return json.loads(host.file(path).content_string)


def base(root: str, repo: str, **extra: Any) -> dict[str, Any]:
    return {"model_download_root": root, "model_download_repo": repo, "model_download_revision": "main", **extra}


def revision_dir(host, root: str, repo: str) -> str:
    """<root>/<repo>/revisions/<commit> of the commit recorded for the repo (model_download's layout)."""
    manifest = json.loads(host.file(f"{root}/{repo}/.vllm-node-download.json").content_string)
    return f"{root}/{repo}/revisions/{manifest['commit']}"


def sha256_of_files(host, directory: str) -> dict[str, str]:
    """sha256 of every file below a directory, hf's .cache left out, by relative path."""
    out = host.run(f"cd {directory} && find . -path ./.cache -prune -o -type f -print0 | xargs -0 sha256sum")
    assert out.rc == 0, out.stderr
    return {line[66:].removeprefix("./"): line[:64] for line in out.stdout.splitlines()}


def test_converge_downloaded_and_patched(host) -> None:
    base_dir = "/srv/vllm/models/vllm-node-test/tiny-llama"
    model_dir = revision_dir(host, "/srv/vllm/models", "vllm-node-test/tiny-llama")
    for path in (base_dir, f"{base_dir}/revisions", model_dir):
        directory = host.file(path)
        assert directory.is_directory and directory.user == "vllm" and directory.mode == 0o750, path
    assert host.file(f"{base_dir}/revisions").listdir() == [model_dir.rsplit("/", 1)[1]]
    shard = host.file(f"{model_dir}/model-00001-of-00003.safetensors")
    assert shard.size == 524504 and shard.user == "vllm" and shard.mode == 0o640
    assert host.run(f"sudo -u vllm cat {model_dir}/config.json").rc == 0
    manifest = json.loads(host.file(f"{base_dir}/.vllm-node-download.json").content_string)
    assert manifest["requested_revision"] == "main" and len(manifest["commit"]) == 40
    assert {f["path"] for f in manifest["files"] if "sha256" in f} == {
        f"model-0000{n}-of-00003.safetensors" for n in (1, 2, 3)}, "the Hub's LFS sha256 of every shard is recorded"
    marker = json.loads(host.file(f"{model_dir}/.vllm-node-complete.json").content_string)
    assert marker["commit"] == manifest["commit"] and marker["verified"] is True and marker["files"] == 11
    on_disk = {k: v for k, v in sha256_of_files(host, model_dir).items() if k != ".vllm-node-complete.json"}
    assert marker["sha256"] == on_disk, "every file's sha256 as downloaded"
    canonical = json.dumps(marker["sha256"], sort_keys=True, separators=(",", ":"))
    assert marker["manifest_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    fp8 = revision_dir(host, "/srv/vllm/models", "vllm-node-test/tiny-deepseek-v3-fp8kv")
    fp8_marker = json.loads(host.file(f"{fp8}/.vllm-node-complete.json").content_string)
    assert fp8_marker["sha256"]["config.json"] == host.file(fp8 + "/config.json.orig").sha256sum, (
        "the manifest holds the original bytes, not model_config's patch")
    quant = json.loads(host.file(fp8 + "/hf_quant_config.json").content_string)
    assert "kv_cache_quant_algo" not in quant["quantization"]
    orig = json.loads(host.file(fp8 + "/hf_quant_config.json.orig").content_string)
    assert orig["quantization"]["kv_cache_quant_algo"] == "FP8"
    cfg = json.loads(host.file(fp8 + "/config.json").content_string)
    assert "kv_cache_scheme" not in cfg["quantization_config"]
    assert cfg["quantization_config"]["quant_method"] == "modelopt", "only the KV declaration is dropped"


def test_complete_model_rerun_fetches_nothing(host) -> None:
    hub(host, "reset")
    out = run_play("rerun_complete", base("/srv/vllm/models", "vllm-node-test/tiny-llama"))
    assert "changed=0" in out, out[-3000:]
    assert hub(host, "counters")["requests"] == 0, "a complete, recorded model must not touch the hub"
    hashing = re.search(r"TASK \[model_download : Hash the small files.*?(?=\nTASK \[)", out, flags=re.DOTALL)
    assert hashing and "skipping:" in hashing.group(0), "the hashing task did not run, skipped"
    assert not re.search(r"^(ok|changed):", hashing.group(0), flags=re.MULTILINE), (
        "a converged rerun must read the sha256 from its marker, not hash files")
    assert result(host)["manifest_sha256"] and len(result(host)["file_sha256"]) == 11


def test_metadata_step_first_then_shards_with_disk_refusal(host) -> None:
    """Metadata alone exposes config + total_size; a too-small filesystem refuses the shards before downloading."""
    root = "/srv/mp-small"
    host.run(f"mkdir -p {root} && (mountpoint -q {root} || mount -t tmpfs -o size=3m tmpfs {root}) && rm -rf {root}/*")
    assert host.mount_point(root).exists, "need a small tmpfs for the disk-space refusal"
    hub(host, "reset")
    repo = "vllm-node-test/tiny-deepseek-v3"
    run_play("metadata_only", base(root, repo, model_download_step="metadata", model_download_disk_margin_bytes=0))
    res = result(host)
    assert res["config"]["architectures"] == ["DeepseekV3ForCausalLM"]
    index = json.loads(host.file(f"{revision_dir(host, root, repo)}/model.safetensors.index.json").content_string)
    assert res["checkpoint_bytes"] == index["metadata"]["total_size"] > 0
    shards = [p for p in hub_counters(host, repo) if p.endswith(".safetensors")]
    assert shards == [], f"the metadata step fetched shards: {shards}"
    assert not host.file(f"{revision_dir(host, root, repo)}/model-00001-of-00003.safetensors").exists
    hub(host, "reset")
    out = run_play("disk_refusal", base(root, repo, model_download_disk_margin_bytes=1048576), expect_ok=False)
    assert "not enough disk space" in out and "missing" in out and "Nothing was downloaded" in out
    shards = [p for p in hub_counters(host, repo) if p.endswith(".safetensors")]
    assert shards == [], "refusal must come before any shard"
    host.run(f"umount {root}")


def test_interrupted_download_resumes_only_the_missing_shard(host) -> None:
    root, repo = "/srv/mp-resume", "vllm-node-test/tiny-deepseek-v3"
    host.run(f"rm -rf {root}")
    hub(host, "reset")
    big = "model-00001-of-00003.safetensors"
    hub(host, "drop", {"glob": f"{repo}/{big}", "after_bytes": 1_000_000, "times": 50})
    out = run_play("interrupted", base(root, repo), expect_ok=False)
    assert "hf download of" in out and "failed" in out and "run the play again to resume" in out.lower()
    first = hub_counters(host, repo)
    assert first[big]["drops"] >= 1
    assert not host.file(f"{revision_dir(host, root, repo)}/{big}").exists
    for other in ("model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"):
        assert host.file(f"{revision_dir(host, root, repo)}/{other}").exists, f"{other} should have survived"
    hub(host, "reset")
    run_play("resumed", base(root, repo))
    second = hub_counters(host, repo)
    refetched = {p: c["bytes"] for p, c in second.items() if c.get("bytes")}
    assert set(refetched) == {big}, f"only the interrupted shard may be fetched again, got {refetched}"
    assert refetched[big] == host.file(f"{revision_dir(host, root, repo)}/{big}").size == 2443848
    TIMINGS["resume_refetched_bytes"] = refetched[big]


def test_unreachable_hub_with_a_partial_directory_is_not_success(host) -> None:
    """Hub down with a partial directory: hf may exit 1, or 0 with "Returning existing local_dir"; both must fail."""
    root, repo = "/srv/mp-offline", "vllm-node-test/tiny-llama"
    host.run(f"rm -rf {root}")
    run_play("offline_metadata", base(root, repo, model_download_step="metadata"))
    assert host.run("systemctl stop hf-hub-fixture.service").rc == 0
    try:
        out = run_play("offline_shards", base(root, repo), expect_ok=False)
    finally:
        assert host.run("systemctl start hf-hub-fixture.service && sleep 2").rc == 0
    assert any(m in out for m in ("could not reach", "missing or with a wrong size", "failed (rc 1)")), out[-3000:]
    assert "Connection refused" in out
    assert not host.file(f"{revision_dir(host, root, repo)}/.vllm-node-complete.json").exists
    host.run(f"rm -rf {root}")


def test_corrupted_shard_is_detected_and_repaired_on_request(host) -> None:
    root, repo = "/srv/mp-corrupt", "vllm-node-test/tiny-llama"
    host.run(f"rm -rf {root}")
    hub(host, "drop", {"glob": f"{repo}/model-00003-of-00003.safetensors", "after_bytes": 1000, "times": 50})
    run_play("corrupt_setup", base(root, repo), expect_ok=False)
    hub(host, "reset")
    shard = f"{revision_dir(host, root, repo)}/model-00001-of-00003.safetensors"
    # Flip bytes in a finished shard without changing its size or mtime: invisible to `hf download`.
    flip = (
        f"python3 -c \"import os;p='{shard}';s=os.stat(p);f=open(p,'r+b');f.seek(4096);b=f.read(8);f.seek(4096);"
        f"f.write(bytes(x ^ 0xFF for x in b));f.close();os.utime(p,ns=(s.st_atime_ns,s.st_mtime_ns))\""
    )
    assert host.run(flip).rc == 0
    out = run_play("corrupt_detected", base(root, repo), expect_ok=False)
    assert "failed verification" in out and "model-00001-of-00003.safetensors" in out
    assert not host.file(f"{revision_dir(host, root, repo)}/.vllm-node-complete.json").exists
    hub(host, "reset")
    run_play("corrupt_repaired", base(root, repo, model_download_repair=True))
    assert hub_counters(host, repo)["model-00001-of-00003.safetensors"]["bytes"] == 524504
    marker = host.file(f"{revision_dir(host, root, repo)}/.vllm-node-complete.json").content_string
    assert json.loads(marker)["verified"] is True


def test_private_repo_with_token_leaves_no_trace(host) -> None:
    root, repo = "/srv/mp-private", "vllm-node-test/tiny-llama-private"
    host.run(f"rm -rf {root}")
    out = run_play("private_no_token", base(root, repo, model_download_token=""), expect_ok=False)
    assert "could not resolve" in out
    # The metadata step alone (site.yml runs it before the re-plan, which may refuse and end the play there).
    out = run_play("private_metadata", base(root, repo, model_download_token=TOKEN, model_download_step="metadata"))
    assert TOKEN not in out and not host.file("/var/lib/vllm-node/hf-home/token").exists, "token file left behind"
    host.run("rm -f /tmp/mp-ps.txt /tmp/mp-ps.stop")
    watcher = host.run(  # sample the process table (all arguments of every process) during the whole run
        "nohup sh -c 'while [ ! -e /tmp/mp-ps.stop ]; do ps -eww -o args >> /tmp/mp-ps.txt; sleep 0.1; done' "
        ">/dev/null 2>&1 &"
    )
    assert watcher.rc == 0
    try:
        out = run_play(
            "private_token", base(root, repo, model_download_token=TOKEN, model_download_progress_interval=1)
        )
    finally:
        host.run("touch /tmp/mp-ps.stop")
    assert TOKEN not in out, "the token leaked into the Ansible output"
    assert "--token" not in out
    ps_log = host.run("sleep 1; cat /tmp/mp-ps.txt").stdout
    assert "download vllm-node-test/tiny-llama-private" in ps_log, "the watcher never saw the hf process"
    assert TOKEN not in ps_log, "the token was visible in a process's arguments"
    host.run("rm -f /tmp/mp-ps.txt")
    # Every file on the node except the hub fixture's own token list (the fake Hub must know the token).
    leaked = host.run(
        "grep -rlI --exclude-dir=proc --exclude-dir=sys --exclude-dir=hf-hub-fixture --exclude-dir=hf-hub "
        f"--exclude-dir=wheels {TOKEN} / 2>/dev/null; grep -rl {TOKEN} /run/log /var/log 2>/dev/null; true"
    ).stdout.split()
    assert leaked == [], f"token found in files: {leaked}"
    assert host.file(f"{revision_dir(host, root, repo)}/model-00001-of-00003.safetensors").size == 524504


def test_patch_follows_the_plan_and_restores(host) -> None:
    fp8 = revision_dir(host, "/srv/vllm/models", "vllm-node-test/tiny-deepseek-v3-fp8kv")
    plan = {"attention": "mla", "checkpoint_kv_cache_dtype": "fp8_e4m3", "gpu": "rtx-pro-6000-blackwell"}
    common = {
        "mp_download": False, "mp_config": True, "model_config_dir": fp8, "model_config_compute_capability": "12.0",
    }
    out = run_play("config_033", {**common, "model_config_plan": {**plan, "vllm_version": "0.33.0",
                                                                    "checkpoint_kv_cache_dtype_supported": True}})
    assert result(host)["changes"] == [] and "no rule matched" in out
    quant = json.loads(host.file(fp8 + "/hf_quant_config.json").content_string)
    assert quant["quantization"]["kv_cache_quant_algo"] == "FP8", "0.33 supports FP8 MLA KV: originals back"
    assert host.file(fp8 + "/config.json").sha256sum == host.file(fp8 + "/config.json.orig").sha256sum
    plan_017 = {**plan, "vllm_version": "0.17.0", "checkpoint_kv_cache_dtype_supported": False}
    out = run_play("config_017", {**common, "model_config_plan": plan_017})
    res = result(host)
    assert sorted(c["path"] for c in res["changes"]) == [
        "quantization.kv_cache_quant_algo", "quantization_config.kv_cache_scheme",
    ]
    assert res["rules"] == ["sm120-mla-fp8-kv-before-0.18"] and "rule sm120-mla-fp8-kv-before-0.18" in out
    out = run_play("config_017_again", {**common, "model_config_plan": plan_017})
    assert "changed=0" in out, "patching twice must change nothing"
    run_play("config_restore", {**common, "model_config_plan": plan_017, "model_config_restore_originals": True})
    assert host.file(fp8 + "/hf_quant_config.json").sha256sum == host.file(fp8 + "/hf_quant_config.json.orig").sha256sum
    # A plain Llama: the rule does not match whatever the version.
    llama = revision_dir(host, "/srv/vllm/models", "vllm-node-test/tiny-llama")
    llama_plan = {"attention": "full", "checkpoint_kv_cache_dtype": None,
                  "vllm_version": "0.17.0", "checkpoint_kv_cache_dtype_supported": True}
    run_play("config_llama", {**common, "model_config_dir": llama, "model_config_plan": llama_plan})
    assert result(host)["changes"] == [] and not host.file(llama + "/config.json.orig").exists
    # Back to the converged state (0.17 patch) so that molecule's own state stays consistent.
    run_play("config_017_final", {**common, "model_config_plan": plan_017})


def test_progress_is_printed_for_a_long_download(host) -> None:
    root, repo = "/srv/mp-big", "vllm-node-test/big-zeros"
    host.run(f"rm -rf {root}")
    # Pace the 600 MiB shard to 24 MiB/s (~25 s): on a quiet machine the local hub otherwise delivers it
    # within one poll interval and only the final line would be seen.
    hub(host, "throttle", {"glob": "*big-zeros/*.safetensors", "bytes_per_second": 24 * 2**20})
    out = run_play("progress", base(root, repo, model_download_progress_interval=1, model_download_verify=True))
    hub(host, "reset")
    lines = [line for line in out.splitlines() if f"{repo}: " in line and "%" in line]
    assert len(lines) >= 2, "expected several progress lines:\n" + out[-4000:]
    assert "(100.0 %)" in lines[-1] or "(finished)" in out
    TIMINGS["progress_lines"] = len(lines)
    host.run(f"rm -rf {root}")


REV_REPO = "vllm-node-test/tiny-llama"
SHARDS = [f"model-0000{n}-of-00003.safetensors" for n in (1, 2, 3)]


def test_revision_b_after_a_downloads_only_the_changed_shard(host) -> None:
    """rev-b (shard 3 changed) after main: its own directory, shards 1-2 hard-linked from main's, only shard 3 and
    the small files fetched; main's directory stays as it was until the prune."""
    root = "/srv/mp-rev"
    host.run(f"rm -rf {root}")
    run_play("rev_a", base(root, REV_REPO))
    res_a = result(host)
    dir_a = res_a["dir"]
    assert dir_a == f"{root}/{REV_REPO}/revisions/{res_a['commit']}" == revision_dir(host, root, REV_REPO)
    before_a = sha256_of_files(host, dir_a)
    hub(host, "reset")
    start = time.monotonic()
    out = run_play("rev_b", base(root, REV_REPO, model_download_revision="rev-b"))
    TIMINGS["rev_b_seconds"] = round(time.monotonic() - start, 1)
    res_b = result(host)
    dir_b = res_b["dir"]
    assert res_b["commit"] != res_a["commit"] and dir_b == f"{root}/{REV_REPO}/revisions/{res_b['commit']}"
    sent = {path: c["bytes"] for path, c in hub_counters(host, REV_REPO).items() if c.get("bytes")}
    total = sum(f["size"] for f in res_b["files"])
    TIMINGS["rev_b_downloaded_bytes"], TIMINGS["rev_b_total_bytes"] = sum(sent.values()), total
    assert SHARDS[0] not in sent and SHARDS[1] not in sent, f"unchanged shards were downloaded: {sent}"
    assert sent[SHARDS[2]] == host.file(f"{dir_b}/{SHARDS[2]}").size
    flat = " ".join(out.split())  # Ansible wraps long messages
    linked = sum(f["size"] for f in res_b["files"] if f["path"] in SHARDS[:2])
    assert f"2 files ({linked / 1024:.2f} KiB) linked from verified revisions" in flat, out[-3000:]
    # shard 3 + README.md + .gitattributes (not metadata files): the disk check counts only what is really missing
    missing = sum(f["size"] for f in res_b["files"] if f["path"] in (SHARDS[2], "README.md", ".gitattributes"))
    assert f"3 of 11 files missing, {missing / 1024:.2f} KiB to download" in flat, out[-3000:]
    for shard in SHARDS[:2]:
        inodes = host.run(f"stat -c %i {dir_a}/{shard} {dir_b}/{shard}").stdout.split()
        assert len(set(inodes)) == 1, f"{shard} is not a hard link of revision A's file"
    after_b = sha256_of_files(host, dir_b)
    expected = res_b["file_sha256"]
    assert {k: v for k, v in after_b.items() if k != ".vllm-node-complete.json"} == expected
    hub_b = host.run(f"sha256sum /srv/hf-hub/{REV_REPO}@rev-b/{SHARDS[2]}").stdout.split()[0]
    assert expected[SHARDS[2]] == hub_b != res_a["file_sha256"][SHARDS[2]], "B's shard 3 is B's weights"
    assert res_b["manifest_sha256"] != res_a["manifest_sha256"]
    assert sha256_of_files(host, dir_a) == before_a, "revision A's directory is untouched"
    # Pruning keeps the serving revision only; the links keep B's files whole.
    run_play("rev_prune_keep2", {**base(root, REV_REPO, model_download_revision="rev-b"), "mp_download": True,
                                 "mp_prune": True, "model_download_keep_revisions": 2})
    assert result(host)["pruned"] == [] and host.file(dir_a).exists
    run_play("rev_prune", {**base(root, REV_REPO, model_download_revision="rev-b"), "mp_prune": True})
    assert result(host)["pruned"] == [res_a["commit"]]
    assert not host.file(dir_a).exists and host.file(dir_b).is_directory
    assert sha256_of_files(host, dir_b) == after_b, "B's linked shards survive the removal of A"
    assert host.run(f"stat -c %h {dir_b}/{SHARDS[0]}").stdout.strip() == "1"
    out = run_play("rev_prune_again", {**base(root, REV_REPO, model_download_revision="rev-b"), "mp_prune": True})
    assert "changed=0" in out and result(host)["pruned"] == []


def test_a_corrupted_revision_b_fails_and_leaves_a_whole(host) -> None:
    """B's changed shard arrives corrupted (hub's corrupt control): hf cache verify fails the role, so nothing the
    service reads changes (site.yml stops before vllm_service); A's directory is as it was; pruning after A is
    served again removes the unverified B."""
    root = "/srv/mp-rev-bad"
    host.run(f"rm -rf {root}")
    run_play("bad_b_a", base(root, REV_REPO))
    dir_a, commit_a = result(host)["dir"], result(host)["commit"]
    before_a = sha256_of_files(host, dir_a)
    marker_a = host.file(f"{dir_a}/.vllm-node-complete.json").content_string
    hub(host, "corrupt", {"glob": f"{REV_REPO}/{SHARDS[2]}", "times": 50})
    try:
        out = run_play("bad_b", base(root, REV_REPO, model_download_revision="rev-b"), expect_ok=False)
    finally:
        hub(host, "reset")
    assert "failed verification" in out and SHARDS[2] in out
    dir_b = revision_dir(host, root, REV_REPO)
    assert dir_b != dir_a and not host.file(f"{dir_b}/.vllm-node-complete.json").exists
    assert sha256_of_files(host, dir_a) == before_a, "revision A's files changed"
    assert host.file(f"{dir_a}/.vllm-node-complete.json").content_string == marker_a
    # A again (what still serves), then prune: the unverified B goes, A stays.
    run_play("bad_b_back_to_a", {**base(root, REV_REPO, model_download_revision=commit_a), "mp_prune": True})
    assert result(host)["dir"] == dir_a and result(host)["pruned"] == [dir_b.rsplit("/", 1)[1]]
    assert host.file(f"{root}/{REV_REPO}/revisions").listdir() == [commit_a]


def test_the_old_flat_layout_is_moved_into_its_revision(host) -> None:
    """Files directly in <root>/<org>/<name> (before revisions/) with an old marker (no sha256): moved once into
    revisions/<recorded commit>, verified again, nothing downloaded."""
    root = "/srv/mp-flat"
    host.run(f"rm -rf {root}")
    run_play("flat_setup", base(root, REV_REPO))
    model_dir, commit = result(host)["dir"], result(host)["commit"]
    base_dir = f"{root}/{REV_REPO}"
    strip = (f"python3 -c \"import json;p='{model_dir}/.vllm-node-complete.json';d=json.load(open(p));"
             f"[d.pop(k) for k in ('sha256', 'manifest_sha256')];json.dump(d, open(p, 'w'))\"")
    assert host.run(strip).rc == 0
    moved = host.run(f"cd {model_dir} && mv -t {base_dir} -- $(ls -A) && rmdir {model_dir} {base_dir}/revisions")
    assert moved.rc == 0, moved.stderr
    files = sha256_of_files(host, base_dir)
    hub(host, "reset")
    out = run_play("flat_migrated", base(root, REV_REPO))
    assert f"into {model_dir}" in " ".join(out.split()) and result(host)["dir"] == model_dir
    assert host.run(f"ls -A {base_dir}").stdout.split() == [".vllm-node-download.json", "revisions"]
    # the completion marker is rewritten by the new verification; the download record stays in the base directory
    kept_apart = {".vllm-node-complete.json", ".vllm-node-download.json"}
    moved_files = {k: v for k, v in sha256_of_files(host, model_dir).items() if k not in kept_apart}
    assert moved_files == {k: v for k, v in files.items() if k not in kept_apart}, "every file moved, unchanged"
    assert sum(c["bytes"] for c in hub_counters(host, REV_REPO).values()) == 0, "moving must not download"
    marker = json.loads(host.file(f"{model_dir}/.vllm-node-complete.json").content_string)
    assert marker["commit"] == commit and len(marker["sha256"]) == 11, "verified again, sha256 recorded"
    assert "changed=0" in run_play("flat_rerun", base(root, REV_REPO))
    host.run(f"rm -rf {root}")


def test_zz_report_timings() -> None:
    report = PROJECT / "artifacts" / "model_pipeline-timings.json"
    report.write_text(json.dumps(TIMINGS, indent=2) + "\n")
    print("model_pipeline timings (s):", json.dumps(TIMINGS))
    assert TIMINGS
