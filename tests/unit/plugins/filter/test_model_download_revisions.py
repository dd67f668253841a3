"""The revision helpers of the model_download filters: LFS sha256 kept, link plan, per-file sha256, prune plan."""
from __future__ import annotations

import base64
import hashlib
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_node.vllm_node.plugins.filter import model_download as md

A = "a" * 40
B = "b" * 40
C = "c" * 40
SHA1 = "1" * 64
SHA2 = "2" * 64
SHA3 = "3" * 64


def test_select_keeps_the_lfs_sha256_of_both_listing_formats() -> None:
    listing = [
        {"path": "config.json", "size": 5, "blob_id": "x" * 40},
        {"path": "m1.safetensors", "size": 9, "lfs": {"size": 9, "sha256": SHA1.upper(), "pointer_size": 1}},
        {"type": "file", "path": "m2.safetensors", "size": 8, "lfs": {"oid": SHA2, "size": 8}},
        {"path": "m3.safetensors", "size": 7, "lfs": {"sha256": "not-a-sha"}},
    ]
    assert md.select_files(listing) == [
        {"path": "config.json", "size": 5},
        {"path": "m1.safetensors", "size": 9, "sha256": SHA1},
        {"path": "m2.safetensors", "size": 8, "sha256": SHA2},
        {"path": "m3.safetensors", "size": 7},
    ]


FILES_B = [
    {"path": "config.json", "size": 5},
    {"path": "m1.safetensors", "size": 9, "sha256": SHA3},          # changed in B
    {"path": "m2.safetensors", "size": 8, "sha256": SHA2},          # unchanged
    {"path": "sub/renamed.safetensors", "size": 9, "sha256": SHA1},  # A's m1 under another name
]
REVISION_A = {"dir": f"/m/revisions/{A}", "sha256": {"config.json": "f" * 64, "m1.safetensors": SHA1,
                                                     "m2.safetensors": SHA2}}


def test_link_plan_links_only_lfs_files_with_a_verified_twin() -> None:
    plan = md.link_plan(FILES_B, {}, [REVISION_A])
    assert plan == [
        {"path": "m2.safetensors", "size": 8, "source": f"/m/revisions/{A}/m2.safetensors",
         "metadata": f"/m/revisions/{A}/.cache/huggingface/download/m2.safetensors.metadata"},
        {"path": "sub/renamed.safetensors", "size": 9, "source": f"/m/revisions/{A}/m1.safetensors",
         "metadata": f"/m/revisions/{A}/.cache/huggingface/download/m1.safetensors.metadata"},
    ]


def test_link_plan_skips_present_files_and_prefers_the_same_path() -> None:
    assert md.link_plan(FILES_B, {"m2.safetensors": 8, "sub/renamed.safetensors": 9}, [REVISION_A]) == []
    other = {"dir": f"/m/revisions/{C}", "sha256": {"aaa.safetensors": SHA2, "m2.safetensors": SHA2}}
    plan = md.link_plan(FILES_B, {"sub/renamed.safetensors": 9}, [other])
    assert [p["source"] for p in plan] == [f"/m/revisions/{C}/m2.safetensors"]
    assert md.link_plan(FILES_B, {}, []) == []
    assert md.link_plan(FILES_B, {"m2.safetensors": 3}, [REVISION_A])[0]["path"] == "m2.safetensors", "wrong size"


def test_file_sha256_takes_lfs_oids_and_measured_hashes() -> None:
    got = md.file_sha256(FILES_B, {"config.json": "E" * 64, "m1.safetensors": "0" * 64})
    assert got == {"config.json": "e" * 64, "m1.safetensors": SHA3, "m2.safetensors": SHA2,
                   "sub/renamed.safetensors": SHA1}, "the Hub's LFS oid wins for LFS files"
    assert list(got) == sorted(got)
    with pytest.raises(AnsibleFilterError, match="no sha256 for config.json"):
        md.file_sha256(FILES_B, {})


def test_manifest_sha256_is_the_hash_of_canonical_json() -> None:
    manifest = {"b.json": SHA2, "a.json": SHA1}
    canonical = '{"a.json":"' + SHA1 + '","b.json":"' + SHA2 + '"}'
    assert md.manifest_sha256(manifest) == hashlib.sha256(canonical.encode()).hexdigest()
    assert json.dumps(manifest, sort_keys=True, separators=(",", ":")) == canonical
    assert md.manifest_sha256({"a.json": SHA1}) != md.manifest_sha256(manifest)


def dirs(*names: str) -> list[dict[str, str]]:
    return [{"path": f"/m/revisions/{n}"} for n in names]


def markers(**mtimes: float) -> list[dict[str, object]]:
    return [{"path": f"/m/revisions/{n}/.vllm-node-complete.json", "mtime": t} for n, t in mtimes.items()]


def test_prune_keeps_the_serving_revision_and_the_newest_others() -> None:
    found = dirs(A, B, C, "not-a-commit")
    done = markers(**{A: 100.0, B: 300.0, C: 200.0})
    assert md.prune_plan(found, done, B, 1) == [A, C]
    assert md.prune_plan(found, done, A, 2) == [C], "keep 2 = the serving one + the newest other (B)"
    assert md.prune_plan(found, done, A, 5) == []
    unfinished = markers(**{A: 100.0})
    assert md.prune_plan(found, unfinished, A, 3) == [B, C], "a revision without a marker is never kept"
    assert md.prune_plan(dirs(A), markers(**{A: 1.0}), A, 1) == []


@pytest.mark.parametrize(("serving", "keep", "message"), [
    (A, 0, "keep must be an integer >= 1"), (A, True, "keep must be"), ("main", 1, "not a 40-hex commit"),
    ("", 1, "not a 40-hex commit"),
])
def test_prune_refuses_bad_input(serving: str, keep: int, message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        md.prune_plan(dirs(A, B), [], serving, keep)


def slurped(path: str, doc: object) -> dict[str, str]:
    return {"item": path, "content": base64.b64encode(json.dumps(doc).encode()).decode()}


def test_verified_revisions_reads_only_complete_verified_markers() -> None:
    good = {"commit": A, "verified": True, "sha256": {"m.safetensors": SHA1}}
    results = [
        slurped(f"/m/revisions/{A}/.vllm-node-complete.json", good),
        slurped(f"/m/revisions/{B}/.vllm-node-complete.json", dict(good, commit=B, verified=False)),
        slurped(f"/m/revisions/{C}/.vllm-node-complete.json", {"commit": C, "verified": True}),  # old marker
        slurped(f"/m/revisions/{B}/.vllm-node-complete.json", good),  # names another commit than its directory
        {"item": f"/m/revisions/{C}/.vllm-node-complete.json", "content": "bm90IGpzb24="},
    ]
    assert md.verified_revisions(results) == [{"dir": f"/m/revisions/{A}", "sha256": {"m.safetensors": SHA1}}]


def test_metadata_sources_read_the_kept_original_and_skip_absent_files():
    local = {"config.json": 10, "config.json.orig": 12, "hf_quant_config.json": 3}
    sources = md.metadata_sources(["config.json", "hf_quant_config.json", "model.safetensors.index.json"], local,
                                  "/srv/m/revisions/abc")
    assert sources == {"config.json": "/srv/m/revisions/abc/config.json.orig",
                       "hf_quant_config.json": "/srv/m/revisions/abc/hf_quant_config.json"}
