"""The decisions of model_download (module_utils/model_download/files.py): selection, sizes, the record and the
marker, links, pruning, the disk check and the messages."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf

A, B, C = "a" * 40, "b" * 40, "c" * 40
SHA1, SHA2, SHA3 = "1" * 64, "2" * 64, "3" * 64
LISTING = [
    {"type": "file", "path": "config.json", "size": 670},
    {"type": "file", "path": "model-00001-of-00002.safetensors", "size": 1000},
    {"type": "file", "path": "model-00002-of-00002.safetensors", "size": 500},
    {"type": "file", "path": "model.safetensors.index.json", "size": 1727},
    {"type": "directory", "path": "original"},
    {"type": "file", "path": "original/consolidated.pth", "size": 9999},
    {"type": "file", "path": "README.md", "size": 10},
]
REQ = {"repo": "org/m", "revision": "main", "refresh": False, "root": "/srv", "base_dir": "/srv/org/m",
       "keep_revisions": 1, "hf_cli": "/opt/hf", "endpoint": "http://hub", "hf_home": "/var/hf", "include": [],
       "exclude": [], "metadata_patterns": ["*.json"], "disk_margin_bytes": 100, "disk_margin_percent": 10.0,
       "progress_interval": 15, "timeout_seconds": 3600, "max_workers": 8, "verify": True, "reverify": False,
       "repair": False, "owner": "vllm", "group": "vllm", "ca_bundle": "", "environment": {}}


# ---- selection and sizes ---------------------------------------------------------------------------------------


def test_select_all_files_without_patterns_drops_folders() -> None:
    paths = [f["path"] for f in mdf.select_files(LISTING)]
    assert "original" not in paths and len(paths) == 6 and paths == sorted(paths)


def test_select_include_exclude_and_trailing_slash() -> None:
    got = mdf.select_files(LISTING, include=["*.json", "*.safetensors"], exclude=["model-00002-*"])
    assert [f["path"] for f in got] == ["config.json", "model-00001-of-00002.safetensors",
                                        "model.safetensors.index.json"]
    assert "original/consolidated.pth" not in [f["path"] for f in mdf.select_files(LISTING, exclude=["original/"])]


def test_select_keeps_the_lfs_sha256_of_both_listing_formats() -> None:
    listing = [
        {"path": "config.json", "size": 5, "blob_id": "x" * 40},
        {"path": "m1.safetensors", "size": 9, "lfs": {"size": 9, "sha256": SHA1.upper(), "pointer_size": 1}},
        {"type": "file", "path": "m2.safetensors", "size": 8, "lfs": {"oid": SHA2, "size": 8}},
        {"path": "m3.safetensors", "size": 7, "lfs": {"sha256": "not-a-sha"}},
    ]
    assert mdf.select_files(listing) == [
        {"path": "config.json", "size": 5}, {"path": "m1.safetensors", "size": 9, "sha256": SHA1},
        {"path": "m2.safetensors", "size": 8, "sha256": SHA2}, {"path": "m3.safetensors", "size": 7},
    ]


PATHS = st.from_regex(r"[a-z]{1,6}(/[a-z]{1,4})?\.(json|bin|py)", fullmatch=True)


@given(st.lists(st.fixed_dictionaries({"path": PATHS, "size": st.integers(0, 10**12)}), max_size=20),
       st.lists(st.sampled_from(["*.json", "*.bin", "a*", "x/"]), max_size=3))
def test_selection_is_sorted_and_a_subset_and_metadata_is_a_subset_of_it(listing, patterns) -> None:
    selected = mdf.select_files(listing, exclude=patterns)
    assert [f["path"] for f in selected] == sorted(f["path"] for f in selected)
    assert all(f in [{"path": x["path"], "size": x["size"]} for x in listing] for f in selected)
    meta = mdf.split_metadata(selected, ["*.json"])
    assert all(f["path"].endswith(".json") for f in meta) and all(f in selected for f in meta)


def test_metadata_split_keeps_small_files_only() -> None:
    meta = mdf.split_metadata(mdf.select_files(LISTING), ["*.json", "tokenizer*"])
    assert [f["path"] for f in meta] == ["config.json", "model.safetensors.index.json"]


def test_local_sizes_leave_out_hf_bookkeeping_and_count_kept_originals() -> None:
    local = mdf.local_sizes({".cache/huggingface/download/a.json.metadata": 90, ".cache/x.incomplete": 4,
                             "sub/.cache/kept.json": 1, "config.json": 600, "config.json.orig": 670, "other.orig": 5})
    assert local == {"sub/.cache/kept.json": 1, "config.json": 670, "config.json.orig": 670, "other.orig": 5}
    assert mdf.originals_to_restore([{"path": "config.json"}, {"path": "x.json"}], local) == ["config.json"]


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 100)),
       st.dictionaries(st.sampled_from(["a", "b", "c", "e"]), st.integers(0, 100)))
def test_missing_files_are_exactly_the_absent_or_wrong_sized(expected, local) -> None:
    files = [{"path": p, "size": s} for p, s in sorted(expected.items())]
    missing = mdf.missing_files(files, local)
    assert {f["path"] for f in missing} == {p for p, s in expected.items() if local.get(p) != s}
    assert mdf.total_size(missing) + mdf.total_size(f for f in files if f not in missing) == sum(expected.values())


@pytest.mark.parametrize(("rev", "expected"),
                         [(A, True), ("main", False), ("A" * 40, False), ("a" * 39, False), ("", False)])
def test_is_commit(rev: str, expected: bool) -> None:
    assert mdf.is_commit(rev) is expected


# ---- inputs, record, marker ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [{"repo": "nope"}, {"revision": ""}, {"base_dir": "rel"}, {"keep_revisions": 0},
                                 {"disk_margin_bytes": -1}, {"progress_interval": 0}, {"timeout_seconds": 0}])
def test_check_request_refuses_with_the_variables_to_set(bad) -> None:
    mdf.check_request(REQ)
    with pytest.raises(mdf.ModelDownloadError, match="model_download: bad input .* Set model_download_repo"):
        mdf.check_request({**REQ, **bad})


def test_record_is_reused_for_the_same_request_only() -> None:
    record = mdf.new_record(REQ, A, LISTING, "now")
    assert record["commit"] == A and len(record["files"]) == 6 and record["resolved_at"] == "now"
    assert mdf.record_reusable(record, REQ)
    assert not mdf.record_reusable(None, REQ)
    for change in ({"revision": "dev"}, {"endpoint": "http://other"}, {"include": ["*.json"]}, {"repo": "org/n"}):
        assert not mdf.record_reusable(record, {**REQ, **change}), change
    assert not mdf.record_reusable({**record, "files": []}, REQ)
    # refresh follows a branch again, except right after a metadata-only pass (the plan was made from its commit)
    assert not mdf.record_reusable(record, {**REQ, "refresh": True})
    assert mdf.record_reusable(record, {**REQ, "refresh": True}, handed_over=True)
    pinned = mdf.new_record({**REQ, "revision": A}, A, LISTING, "now")
    assert mdf.record_reusable(pinned, {**REQ, "revision": A, "refresh": True})


def test_marker_complete_needs_commit_count_sha256_verification_and_sizes() -> None:
    files = [{"path": "a.json", "size": 2}, {"path": "m.safetensors", "size": 9, "sha256": SHA1}]
    hashes = mdf.file_sha256(files, {"a.json": SHA2})
    marker = mdf.new_marker("org/m", A, files, True, hashes, "now")
    local = {"a.json": 2, "m.safetensors": 9}
    assert mdf.marker_complete(marker, A, files, local, verify=True)
    assert not mdf.marker_complete(marker, B, files, local, verify=True)
    assert not mdf.marker_complete(marker, A, files, {"a.json": 2}, verify=True)
    assert not mdf.marker_complete({**marker, "verified": False}, A, files, local, verify=True)
    assert mdf.marker_complete({**marker, "verified": False}, A, files, local, verify=False)
    old = {k: v for k, v in marker.items() if k not in ("sha256", "manifest_sha256")}
    assert not mdf.marker_complete(old, A, files, local, verify=True), "a marker before revisions/ is verified again"
    assert not mdf.marker_complete(None, A, files, local, verify=True)


def test_file_sha256_takes_lfs_oids_and_measured_hashes_and_refuses_neither() -> None:
    files = [{"path": "b.json", "size": 1}, {"path": "a.safetensors", "size": 2, "sha256": SHA1}]
    assert list(mdf.file_sha256(files, {"b.json": SHA2.upper()}).items()) == [("a.safetensors", SHA1),
                                                                              ("b.json", SHA2)]
    with pytest.raises(mdf.ModelDownloadError, match="no sha256 for b.json.*model_download_reverify=true"):
        mdf.file_sha256(files, {})


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.sampled_from([SHA1, SHA2, SHA3]), max_size=6))
def test_manifest_sha256_is_the_hash_of_canonical_json_whatever_the_order(hashes) -> None:
    canonical = json.dumps(hashes, sort_keys=True, separators=(",", ":"))
    assert mdf.manifest_sha256(hashes) == hashlib.sha256(canonical.encode()).hexdigest()
    assert mdf.manifest_sha256(dict(reversed(list(hashes.items())))) == mdf.manifest_sha256(hashes)


# ---- links, pruning, the old layout ----------------------------------------------------------------------------

FILES_B = [
    {"path": "config.json", "size": 5},
    {"path": "m1.safetensors", "size": 9, "sha256": SHA3},          # changed in B
    {"path": "m2.safetensors", "size": 8, "sha256": SHA2},          # unchanged
    {"path": "sub/renamed.safetensors", "size": 9, "sha256": SHA1},  # A's m1 under another name
]
REVISION_A = {"dir": f"/m/revisions/{A}", "sha256": {"config.json": "f" * 64, "m1.safetensors": SHA1,
                                                     "m2.safetensors": SHA2}}


def test_link_plan_links_only_lfs_files_with_a_verified_twin_the_same_path_first() -> None:
    assert mdf.link_plan(FILES_B, {}, [REVISION_A]) == [
        {"path": "m2.safetensors", "size": 8, "source": f"/m/revisions/{A}/m2.safetensors",
         "metadata": f"/m/revisions/{A}/.cache/huggingface/download/m2.safetensors.metadata"},
        {"path": "sub/renamed.safetensors", "size": 9, "source": f"/m/revisions/{A}/m1.safetensors",
         "metadata": f"/m/revisions/{A}/.cache/huggingface/download/m1.safetensors.metadata"},
    ]
    assert mdf.link_plan(FILES_B, {"m2.safetensors": 8, "sub/renamed.safetensors": 9}, [REVISION_A]) == []
    other = {"dir": f"/m/revisions/{C}", "sha256": {"aaa.safetensors": SHA2, "m2.safetensors": SHA2}}
    plan = mdf.link_plan(FILES_B, {"sub/renamed.safetensors": 9}, [other])
    assert [p["source"] for p in plan] == [f"/m/revisions/{C}/m2.safetensors"]


def test_verified_revisions_reads_only_complete_verified_markers_of_their_own_commit() -> None:
    good = json.dumps({"commit": A, "verified": True, "sha256": {"x": SHA1}})
    markers = {A: good, B: json.dumps({"commit": B, "verified": False, "sha256": {}}), C: "{not json",
               "d" * 40: json.dumps({"commit": A, "verified": True, "sha256": {}}),
               "e" * 40: json.dumps({"commit": "e" * 40, "verified": True})}
    assert mdf.verified_revisions(markers, "/m/revisions") == [{"dir": f"/m/revisions/{A}", "sha256": {"x": SHA1}}]


def test_prune_keeps_the_serving_revision_and_the_newest_completed_others() -> None:
    names = [A, B, C, "d" * 40, "not-a-commit"]
    completed = {A: 10.0, B: 30.0, C: 20.0}  # d has no marker: an interrupted download
    assert mdf.prune_plan(names, completed, A, 1) == [B, C, "d" * 40]
    assert mdf.prune_plan(names, completed, A, 2) == [C, "d" * 40]
    assert mdf.prune_plan(names, completed, A, 9) == ["d" * 40]


@pytest.mark.parametrize(("serving", "keep"), [(f"/m/revisions/{A}", 0), ("/m/revisions/main", 1),
                                               (f"/other/{A}", 1), ("", 1)])
def test_prune_refuses_bad_input_naming_the_fix(serving: str, keep: int) -> None:
    assert mdf.check_prune("/m/revisions", f"/m/revisions/{A}", 1, "org/m") == A
    with pytest.raises(mdf.ModelDownloadError, match="model_download \\(prune\\).*model_download_serving_dir"):
        mdf.check_prune("/m/revisions", serving, keep, "org/m")


@given(st.sets(st.sampled_from([A, B, C, "d" * 40, "e" * 40]), min_size=1),
       st.dictionaries(st.sampled_from([A, B, C, "d" * 40]), st.floats(0, 1e9)), st.integers(1, 6))
def test_prune_never_deletes_the_serving_one_and_keeps_at_most_keep(names, completed, keep) -> None:
    serving = sorted(names)[0]
    victims = mdf.prune_plan(names, completed, serving, keep)
    assert serving not in victims and set(victims) <= set(names)
    assert len(set(names) - set(victims)) <= keep


# ---- models no unit serves any more ------------------------------------------------------------------------------


def repo_doc(repo: str | None, revisions: list[str] | None = None, extra: tuple[str, ...] = (),
             other: tuple[str, ...] = ()) -> dict:
    """A model directory as node.scan_models lists it: the record, revisions/ (None: absent), other entries."""
    entries = ([mdf.RECORD_NAME] if repo else []) + (["revisions"] if revisions is not None else []) + list(extra)
    return {"record": repo, "entries": entries, "revisions": revisions, "revisions_other": list(other)}


LISTING_MODELS = {"root": "/m", "orgs": {
    "org": {"entries": ["served", "gone"], "repos": {"served": repo_doc("org/served", [A]),
                                                    "gone": repo_doc("org/gone", [A, B])}},
    "other": {"entries": ["gone2"], "repos": {"gone2": repo_doc("other/gone2", [C],
                                                                (".vllm-node-bundle-copied-" + C,))}},
    "hand": {"entries": ["made"], "repos": {"made": repo_doc(None, [A])}},          # no record: not the project's
    "lora": {"entries": ["org"], "repos": {"org": repo_doc(None)}},                # the adapters' root below it
    "misnamed": {"entries": ["x"], "repos": {"x": repo_doc("org/served", [A])}},    # a record of another repo
}}


def test_unserved_plan_deletes_the_recorded_models_no_unit_serves() -> None:
    plan = mdf.unserved_plan(LISTING_MODELS, ["org/served"], [f"/m/org/served/revisions/{A}", "/m/lora"])
    assert [item["repo"] for item in plan] == ["org/gone", "other/gone2"]
    gone, gone2 = plan
    assert gone["paths"] == [f"/m/org/gone/revisions/{A}", f"/m/org/gone/revisions/{B}",
                             f"/m/org/gone/{mdf.RECORD_NAME}"]
    assert gone["rmdirs"] == ["/m/org/gone/revisions", "/m/org/gone"] and gone["left"] == []
    # the only model of its org: the org directory goes too, once empty
    assert gone2["rmdirs"] == ["/m/other/gone2/revisions", "/m/other/gone2", "/m/other"]
    assert f"/m/other/gone2/.vllm-node-bundle-copied-{C}" in gone2["paths"]


def test_unserved_plan_keeps_what_the_project_did_not_write() -> None:
    listing = {"root": "/m", "orgs": {"org": {"entries": ["gone", "notes.txt"], "repos": {
        "gone": repo_doc("org/gone", [A, "scratch"], ("my-notes",), ("stray-file",))}}}}
    [item] = mdf.unserved_plan(listing, ["org/served"], [])
    assert item["paths"] == [f"/m/org/gone/revisions/{A}", f"/m/org/gone/{mdf.RECORD_NAME}"]
    assert item["left"] == ["/m/org/gone/revisions/scratch", "/m/org/gone/revisions/stray-file",
                            "/m/org/gone/my-notes"]
    assert item["rmdirs"] == []
    # revisions/ that is not a real directory (a link) is left with the directory holding it
    listing["orgs"]["org"]["repos"]["gone"] = {**repo_doc("org/gone", None), "entries": [mdf.RECORD_NAME, "revisions"]}
    [item] = mdf.unserved_plan(listing, ["org/served"], [])
    assert item["paths"] == [f"/m/org/gone/{mdf.RECORD_NAME}"] and item["left"] == ["/m/org/gone/revisions"]


def test_unserved_plan_spares_a_served_repo_in_any_case_and_any_served_directory() -> None:
    assert mdf.unserved_plan(LISTING_MODELS, ["ORG/Gone", "other/gone2", "org/served"], []) == []
    # the served directory inside a repo whose name is not served (another base_dir) protects it all the same
    plan = mdf.unserved_plan(LISTING_MODELS, ["x/y"], [f"/m/org/gone/revisions/{B}", "/m/other"])
    assert [item["repo"] for item in plan] == ["org/served"]
    assert "/m/org" not in plan[0]["rmdirs"]  # org/gone stays in it
    assert mdf.unserved_plan({"root": "/", "orgs": LISTING_MODELS["orgs"]}, ["x/y"], []) == []
    # another root (the models' root, seen from an adapters' root above it) is never deleted nor what holds it
    plan = mdf.unserved_plan(LISTING_MODELS, ["org/served"], [], ["/m/org/gone/sub", "/m/other"])
    assert [item["repo"] for item in plan] == ["other/gone2"] and plan[0]["rmdirs"][-1] == "/m/other/gone2"


NAMES = st.sampled_from(["a", "b", "Org", "lora", "x.y"])
# a directory's record: its own repo (the project's), another one, or none
RECORDS = st.sampled_from(["own", "own", "org/other", None])
REPO_DOCS = st.builds(
    repo_doc, RECORDS, st.one_of(st.none(), st.lists(st.sampled_from([A, B, "tmp"]), unique=True)),
    st.lists(st.sampled_from([".vllm-node-bundle-copied-x", "notes"]), unique=True).map(tuple),
    st.lists(st.sampled_from([C, "f"]), unique=True).map(tuple))


def listing_of(orgs: dict) -> dict:
    """A listing whose "own" records name their own directory's repo."""
    return {"root": "/m", "orgs": {org: {"entries": sorted(repos), "repos": {
        name: {**doc, "record": f"{org}/{name}" if doc["record"] == "own" else doc["record"]}
        for name, doc in repos.items()}} for org, repos in orgs.items()}}


LISTINGS = st.dictionaries(NAMES, st.dictionaries(NAMES, REPO_DOCS, max_size=3), max_size=3).map(listing_of)


@given(LISTINGS, st.lists(st.builds(lambda o, n: f"{o}/{n}", NAMES, NAMES), max_size=4),
       st.lists(st.builds(lambda o, n, r: f"/m/{o}/{n}/revisions/{r}", NAMES, NAMES, st.sampled_from([A, B])),
                max_size=3))
def test_unserved_plan_never_touches_a_served_repo_or_directory_or_a_foreign_one(listing, served, dirs) -> None:
    plan = mdf.unserved_plan(listing, served, [*dirs, "/m/lora"], ["/m/a/b/x"])
    for item in plan:
        org, name = item["repo"].split("/")
        assert item["repo"].casefold() not in {s.casefold() for s in served}
        assert listing["orgs"][org]["repos"][name]["record"] == item["repo"], "only a directory the project recorded"
        for path in item["paths"] + item["rmdirs"]:
            assert path.startswith("/m/" + org + "/") or path == "/m/" + org
            for guarded in [*dirs, "/m/lora"]:
                assert not (path == guarded or guarded.startswith(path + "/") or path.startswith(guarded + "/"))
            assert not "/m/a/b/x".startswith(path + "/")
        for path in item["paths"]:
            rel = path[len(item["dir"]) + 1:]
            assert rel == mdf.RECORD_NAME or rel.startswith(".vllm-node-bundle-copied-") or (
                rel.startswith("revisions/") and mdf.is_commit(rel[len("revisions/"):]))


def test_freed_bytes_counts_a_file_only_when_every_name_of_it_goes() -> None:
    # inode 1: both links deleted; inode 2: one of two links deleted (the other stays); inode 3: a plain file
    assert mdf.freed_bytes([(1, 1, 100, 2), (1, 1, 100, 2), (1, 2, 50, 2), (1, 3, 7, 1), (2, 1, 5, 1)]) == 112
    assert mdf.freed_bytes([]) == 0


def test_layout_commit_prefers_the_marker_of_the_files_themselves() -> None:
    marker = json.dumps({"commit": A})
    assert mdf.layout_commit([mdf.MARKER_NAME, "x"], marker, {"commit": B}) == A
    assert mdf.layout_commit(["x"], None, {"commit": B}) == B
    assert mdf.layout_commit([mdf.MARKER_NAME], "{broken", {"commit": B}) == ""
    assert mdf.layout_commit(["x"], None, None) == ""
    assert [n for n in ("revisions", mdf.RECORD_NAME, ".vllm-node-bundle-copied-" + A, "config.json")
            if not mdf.layout_excluded(n)] == ["config.json"]


# ---- hf, the disk check, the messages ---------------------------------------------------------------------------


def test_hf_env_reads_the_token_from_a_file_and_takes_the_extra_environment_last() -> None:
    env = mdf.hf_env({**REQ, "ca_bundle": "/etc/ca.crt", "environment": {"HF_HUB_OFFLINE": 1, "NO_COLOR": "0"}},
                     "/var/hf/token")
    assert env["HF_TOKEN_PATH"] == "/var/hf/token" and env["HF_ENDPOINT"] == "http://hub"
    assert env["SSL_CERT_FILE"] == "/etc/ca.crt" and env["HF_HUB_OFFLINE"] == "1" and env["NO_COLOR"] == "0"
    assert "SSL_CERT_FILE" not in mdf.hf_env(REQ, "/t") and not any("hf_" in v for v in env.values())


def test_hf_argv_of_the_metadata_files_the_shards_and_the_verification() -> None:
    assert mdf.download_argv(REQ, A, "/d", ["config.json"]) == [
        "download", "org/m", "config.json", "--revision", A, "--local-dir", "/d", "--max-workers", "8"]
    patterned = {**REQ, "include": ["*.json"], "exclude": ["original/*"]}
    assert mdf.download_argv(patterned, A, "/d")[-2:] == ["--include=*.json", "--exclude=original/*"]
    assert mdf.verify_argv(REQ, A, "/d")[-1] == "--fail-on-missing-files"
    assert "--fail-on-missing-files" not in mdf.verify_argv(patterned, A, "/d")


def test_offline_fallback_and_verify_mismatches_read_hfs_output() -> None:
    assert mdf.offline_fallback("", "Returning existing local_dir `/d` as remote repo cannot be accessed")
    assert not mdf.offline_fallback("/d\n", "Fetching 3 files")
    text = ("[FAIL] Checksum verification failed for the following file(s):\n"
            "  - model-00002-of-00003.safetensors: expected abc (sha256), got def\n"
            "  - sub dir/x.json: expected 123 (git-sha1), got 456\n")
    assert mdf.verify_mismatches(text) == ["model-00002-of-00003.safetensors", "sub dir/x.json"]
    assert mdf.verify_mismatches("Verified 12 file(s). All checksums match.") == []


def test_disk_check_says_what_fits_and_refuses_with_the_numbers() -> None:
    assert mdf.disk_margin(10_000, 100, 10) == 1000 and mdf.disk_margin(10, 100, 10) == 100
    assert mdf.check_disk(20_000, 10_000, REQ, "/d", 5) == (
        "model_download: 19.53 KiB free, 9.77 KiB to download + 1000 B margin")
    with pytest.raises(mdf.ModelDownloadError) as err:
        mdf.check_disk(10_500, 10_000, REQ, "/d", 5)
    assert str(err.value).startswith("model_download: not enough disk space in /d for org/m: free 10500 bytes")
    assert "needed 11000 bytes = 10000 missing" in str(err.value) and "Free 500 B more" in str(err.value)
    assert str(err.value).endswith("Nothing was downloaded.")


def test_download_failure_names_hfs_key_lines_and_how_to_resume() -> None:
    stderr = "Fetching 3 files\nurllib3 error: Connection refused\nurllib3 error: Connection refused\nbye\n"
    text = mdf.download_failure("org/m", A, {"rc": 1, "stderr": stderr}, 60)
    assert f"hf download of org/m@{A} failed (rc 1): urllib3 error: Connection refused (end of" in text
    assert text.endswith("run the play again to resume (only the missing files are fetched).")
    assert "(rc none: timed out after 60 s)" in mdf.download_failure("org/m", A, {"rc": None, "msg": "x"}, 60)


def test_progress_line_reports_bytes_percent_and_eta() -> None:
    line = mdf.progress_line(512 * 1024**2, 1024**3, 10.0)
    assert "512.00 MiB / 1.00 GiB (50.0 %)" in line and "51.20 MiB/s" in line and "ETA 10 s" in line
    assert "(100.0 %)" in mdf.progress_line(5, 0, 0)
    assert "(100.0 %)" in mdf.progress_line(2000, 1000, 1.0), "never more than the total"


@example(1048571)   # 1023.996 KiB: printed 1024.00 KiB before the unit was chosen on the printed value
@given(st.integers(0, 2**50))
def test_human_is_a_binary_prefix_below_1024(num) -> None:
    value, unit = mdf.human(num).split(" ")
    assert unit in ("B", "KiB", "MiB", "GiB", "TiB") and (float(value) < 1024 or unit == "TiB")


def test_planner_inputs_and_shard_bytes() -> None:
    files = [{"path": "a.safetensors", "size": 10}, {"path": "b.safetensors", "size": 5}, {"path": "c.json", "size": 1}]
    assert mdf.shard_bytes(files) == 15
    assert mdf.planner_inputs({}, {"metadata": {"total_size": 12}}, None, files)["checkpoint_bytes_source"] == "index"
    assert mdf.planner_inputs({}, None, None, files)["checkpoint_bytes"] == 15
    with pytest.raises(mdf.ModelDownloadError, match="config.json must hold a JSON object"):
        mdf.planner_inputs([1], None, None, [])  # type: ignore[arg-type]
