"""Pure decisions of model_download (no I/O, no Ansible): what to fetch, what is complete, what to link or prune.

Every function takes and returns plain JSON-like data, so the same code runs on the controller (the action plugin)
and on the node (the module model_download_node), and is unit-tested without either.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# hf's per-file bookkeeping in a --local-dir: <dir>/.cache/huggingface/download/<path>.metadata
HF_METADATA_DIR = ".cache/huggingface/download"
RECORD_NAME = ".vllm-node-download.json"
MARKER_NAME = ".vllm-node-complete.json"
# What the model directory holds besides an old (pre-revisions/) layout: revisions/, the record, and the
# offline_bundle role's marker of a snapshot it copied (moving it would make that role copy again on every run).
LAYOUT_EXCLUDES = ("revisions", RECORD_NAME, ".vllm-node-bundle-copied-*")
# Output of `hf` that means "I could not reach the Hub and returned whatever was on disk" (exit code 0!).
OFFLINE_FALLBACK_MARKERS = ("Returning existing local_dir", "as remote repo cannot be accessed")
# The metadata documents the planner reads (from model_config's kept original when it patched one).
PLANNER_DOCS = ("config.json", "model.safetensors.index.json", "hf_quant_config.json")


class ModelDownloadError(ValueError):
    """A refusal whose text is the whole message: what, why and the fix."""


# ---- inputs ---------------------------------------------------------------------------------------------------


def check_request(req: Mapping[str, Any]) -> None:
    """Refuse bad inputs with one message naming every variable to set."""
    ok = (
        bool(REPO_RE.match(str(req.get("repo") or "")))
        and len(str(req.get("revision") or "")) > 0
        and str(req.get("base_dir") or "").startswith("/")
        and int(req.get("keep_revisions", 1)) >= 1
        and int(req.get("disk_margin_bytes", 0)) >= 0
        and float(req.get("disk_margin_percent", 0)) >= 0
        and int(req.get("progress_interval", 1)) >= 1
        and int(req.get("timeout_seconds", 1)) >= 1
    )
    if not ok:
        raise ModelDownloadError(
            f"model_download: bad input (repo '{req.get('repo')}', revision '{req.get('revision')}', dir "
            f"'{req.get('base_dir')}'). Set model_download_repo to an 'org/name' Hub id (or vllm_node_model to a "
            "catalog key with a repo), model_download_revision to a branch, tag or 40-hex commit, "
            "model_download_base_dir to an absolute path, model_download_keep_revisions to 1 or more, and "
            "non-negative margins / a positive progress interval and timeout."
        )


def is_commit(revision: str) -> bool:
    """True when the revision is a full 40-hex commit id (no resolution needed)."""
    return bool(COMMIT_RE.match(revision or ""))


# ---- the Hub's file list --------------------------------------------------------------------------------------


def _normalise_patterns(patterns: Iterable[str] | None) -> list[str]:
    """Apply the Hub client's convention: a pattern ending in '/' means 'everything below'."""
    return [p + "*" if p.endswith("/") else p for p in patterns or []]


def select_files(
    listing: Iterable[Mapping[str, Any]], include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """Keep the files of a `hf models ls -R --format json` listing matching include and not exclude.

    Same semantics as huggingface_hub's allow/ignore patterns: fnmatch on the repo path, an empty include list
    selects everything. Folders are dropped. Returns [{path, size}] sorted by path, plus `sha256` for the files in
    LFS (lfs.sha256, or lfs.oid in the Hub API's tree format): what `hf cache verify` checks and what tells an
    unchanged shard of another revision.
    """
    allow, ignore = _normalise_patterns(include), _normalise_patterns(exclude)
    selected: list[dict[str, Any]] = []
    for item in listing:
        path = item.get("path")
        if not path or item.get("type", "file") != "file" or "size" not in item:
            continue
        if allow and not any(fnmatch.fnmatch(path, p) for p in allow):
            continue
        if any(fnmatch.fnmatch(path, p) for p in ignore):
            continue
        entry: dict[str, Any] = {"path": path, "size": int(item["size"])}
        lfs = item.get("lfs") or {}
        sha256 = str(lfs.get("sha256") or lfs.get("oid") or "").lower()
        if SHA256_RE.match(sha256):
            entry["sha256"] = sha256
        selected.append(entry)
    return sorted(selected, key=lambda f: f["path"])


def split_metadata(files: Iterable[Mapping[str, Any]], metadata_patterns: Iterable[str]) -> list[dict[str, Any]]:
    """The files whose path matches one of the metadata patterns (the small files)."""
    patterns = _normalise_patterns(metadata_patterns)
    return [dict(f) for f in files if any(fnmatch.fnmatch(f["path"], p) for p in patterns)]


def local_sizes(found: Mapping[str, int]) -> dict[str, int]:
    """{relative path: size} of a revision directory without hf's .cache; a <file>.orig stands for its file.

    model_config keeps the pristine file as <file>.orig beside its patched copy: the original is what the Hub
    served, so its size stands for the file (a patched config is not a missing or broken download).
    """
    sizes = {p: s for p, s in found.items() if p != ".cache" and not p.startswith(".cache/")}
    for path in [p for p in sizes if p.endswith(".orig")]:
        if path[: -len(".orig")] in sizes:
            sizes[path[: -len(".orig")]] = sizes[path]
    return sizes


def missing_files(expected: Iterable[Mapping[str, Any]], local: Mapping[str, int]) -> list[dict[str, Any]]:
    """Expected files that are absent locally or whose size differs from the Hub's."""
    return [dict(f) for f in expected if local.get(f["path"]) != f["size"]]


def total_size(files: Iterable[Mapping[str, Any]]) -> int:
    """Sum of the 'size' fields."""
    return sum(int(f["size"]) for f in files)


def originals_to_restore(files: Iterable[Mapping[str, Any]], local: Mapping[str, int]) -> list[str]:
    """Files of the revision that model_config patched (a <file>.orig is beside them): put back before hf compares."""
    return sorted(f["path"] for f in files if f"{f['path']}.orig" in local)


# ---- the record (<base>/.vllm-node-download.json) and the completion marker --------------------------------------


def record_reusable(record: Mapping[str, Any] | None, req: Mapping[str, Any], handed_over: bool = False) -> bool:
    """Whether the recorded commit and file list answer this request without asking the Hub.

    A branch or tag with refresh is resolved again, except right after a metadata-only pass of the same request
    (handed_over): the plan was made from that pass's commit, which must not move in between.
    """
    if not record:
        return False
    same = (
        record.get("repo") == req["repo"]
        and record.get("requested_revision") == req["revision"]
        and record.get("endpoint") == req["endpoint"]
        and list(record.get("include") or []) == list(req["include"])
        and list(record.get("exclude") or []) == list(req["exclude"])
        and len(record.get("files") or []) > 0
    )
    refresh = bool(req["refresh"]) and not is_commit(req["revision"]) and not handed_over
    return same and not refresh


def new_record(req: Mapping[str, Any], commit: str, listing: Iterable[Mapping[str, Any]], now: str) -> dict[str, Any]:
    """The record of a resolved request: the commit and its selected files."""
    return {
        "repo": req["repo"], "requested_revision": req["revision"], "commit": commit, "endpoint": req["endpoint"],
        "include": list(req["include"]), "exclude": list(req["exclude"]), "resolved_at": now,
        "files": select_files(listing, req["include"], req["exclude"]),
    }


def marker_complete(
    marker: Mapping[str, Any] | None, commit: str, files: list[dict[str, Any]], local: Mapping[str, int], verify: bool
) -> bool:
    """The revision is complete: its marker names the commit, every file's sha256 (written once verified, when
    verify is on) and the file count, and every file is there with the Hub's size. A marker without the per-file
    sha256 (written before revisions/) is not complete: that revision is verified once more."""
    if not marker:
        return False
    return (
        marker.get("commit") == commit
        and marker.get("files") == len(files)
        and (marker.get("verified") is True or not verify)
        and sorted(marker.get("sha256") or {}) == sorted(f["path"] for f in files)
        and not missing_files(files, local)
    )


def file_sha256(files: Iterable[Mapping[str, Any]], hashed: Mapping[str, str] | None = None) -> dict[str, str]:
    """{path: sha256} of every file of a revision: the Hub's LFS sha256 where there is one, else the hash measured
    on the node (hashed: {path: hex}, the original bytes). Refuses a file with neither."""
    hashed = hashed or {}
    out: dict[str, str] = {}
    for entry in files:
        digest = str(entry.get("sha256") or hashed.get(entry["path"]) or "").lower()
        if not SHA256_RE.match(digest):
            raise ModelDownloadError(
                f"model_download: no sha256 for {entry['path']} (neither the Hub's LFS oid nor a hash measured on "
                "the node); run the role again with model_download_reverify=true"
            )
        out[entry["path"]] = digest
    return dict(sorted(out.items()))


def manifest_sha256(hashes: Mapping[str, str]) -> str:
    """sha256 hex of a {path: sha256} manifest as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(dict(hashes), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def new_marker(
    repo: str, commit: str, files: list[dict[str, Any]], verified: bool, hashes: Mapping[str, str], now: str
) -> dict[str, Any]:
    """The completion marker of a revision: what it holds and every file's sha256 as downloaded."""
    return {"repo": repo, "commit": commit, "files": len(files), "bytes": total_size(files), "verified": verified,
            "completed_at": now, "sha256": dict(hashes), "manifest_sha256": manifest_sha256(hashes)}


# ---- linking from other revisions, pruning, the old layout -----------------------------------------------------


def verified_revisions(markers: Mapping[str, str], revisions_dir: str) -> list[dict[str, Any]]:
    """[{dir, sha256}] of the revisions whose completion marker says verified and lists every file's sha256.

    markers: {commit directory name: marker text}. A marker that does not parse, is not verified, has no sha256
    manifest or does not name its own directory's commit is left out (its files are downloaded, not linked).
    """
    out: list[dict[str, Any]] = []
    for name, text in sorted(markers.items()):
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if (isinstance(doc, dict) and doc.get("verified") is True and isinstance(doc.get("sha256"), dict)
                and doc.get("commit") == name):
            out.append({"dir": posixpath.join(revisions_dir, name), "sha256": doc["sha256"]})
    return out


def link_plan(
    files: Iterable[Mapping[str, Any]], local: Mapping[str, int], revisions: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The files of a new revision that can be hard-linked from a verified revision instead of downloaded.

    A file qualifies when it carries the Hub's sha256 (LFS files), is absent or of the wrong size locally, and a
    verified revision holds a file with that sha256 (the same path first). Small files without an LFS sha256 are
    downloaded: they cost nothing and model_config may have replaced them. Returns [{path, size, source,
    metadata}] sorted by path, metadata being hf's bookkeeping of the source (copied beside the link).
    """
    by_sha: dict[str, list[tuple[str, str]]] = {}
    for revision in revisions:
        root, hashes = str(revision.get("dir") or ""), revision.get("sha256") or {}
        if not root or not isinstance(hashes, Mapping):
            continue
        for path, digest in sorted(hashes.items()):
            by_sha.setdefault(str(digest).lower(), []).append((root, path))
    plan: list[dict[str, Any]] = []
    for entry in files:
        digest = entry.get("sha256")
        if not digest or local.get(entry["path"]) == entry["size"] or digest not in by_sha:
            continue
        candidates = by_sha[digest]
        root, path = next((c for c in candidates if c[1] == entry["path"]), candidates[0])
        plan.append({"path": entry["path"], "size": entry["size"], "source": posixpath.join(root, path),
                     "metadata": posixpath.join(root, HF_METADATA_DIR, path + ".metadata")})
    return sorted(plan, key=lambda item: item["path"])


def check_prune(revisions_dir: str, serving_dir: str, keep: int, repo: str) -> str:
    """The serving commit, or a refusal naming what to set."""
    serving = posixpath.basename(serving_dir or "")
    if (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1
            or posixpath.dirname(serving_dir or "") != revisions_dir or not is_commit(serving)):
        raise ModelDownloadError(
            f"model_download (prune): keep {keep} revisions of {repo}, serving '{serving_dir}'. Set "
            "model_download_keep_revisions to 1 or more, and run the role first (it publishes model_download_dir) "
            f"or set model_download_serving_dir to {revisions_dir}/<commit>."
        )
    return serving


def prune_plan(directories: Iterable[str], completed: Mapping[str, float], serving: str, keep: int) -> list[str]:
    """Revision directories to delete: all but the serving one and the keep-1 most recently completed others.

    directories: the names in <base>/revisions (only 40-hex names count: what the role creates); completed:
    {name: mtime of its completion marker} (a directory without one is an unfinished or failed download and is
    always deleted).
    """
    commits = sorted(c for c in set(directories) - {serving} if is_commit(c))
    finished = sorted((c for c in commits if c in completed), key=lambda c: (-completed[c], c))
    kept = set(finished[: keep - 1])
    return [c for c in commits if c not in kept]


# ---- models no unit serves any more (tasks_from: unserved) ------------------------------------------------------

# What model_download (and offline_bundle, writing the same record) puts in a model directory besides revisions/:
# the record, its temporary file while it is written, the bundle's copy markers.
OWN_ENTRIES = (RECORD_NAME, RECORD_NAME + ".vllm-node-tmp.*", ".vllm-node-bundle-copied-*")


def _within(path: str, top: str) -> bool:
    """path is top or below it (both normalised, absolute)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def _overlaps(path: str, others: Iterable[str]) -> bool:
    """path is, contains or lies inside one of others."""
    return any(_within(path, o) or _within(o, path) for o in others)


def _own(name: str) -> bool:
    """An entry of a model directory that model_download or offline_bundle writes (OWN_ENTRIES)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in OWN_ENTRIES)


def unserved_repo(repo_id: str, repo: Mapping[str, Any], base: str) -> dict[str, Any]:
    """What to delete of one model directory the project created: its 40-hex revision directories and its own files
    (OWN_ENTRIES), then revisions/ and the directory itself when nothing else is left in them. `left`: the entries
    found there that the project did not write (kept, named in the report).

    repo: {"entries": [names in the directory], "revisions": [real directories in revisions/], or None when
    revisions is absent or not a real directory, "revisions_other": [the other names in revisions/]}.
    """
    entries = sorted(str(e) for e in repo.get("entries") or [])
    listed = repo.get("revisions")
    revisions = sorted({str(r) for r in listed or []} | {str(r) for r in repo.get("revisions_other") or []})
    commits = sorted(str(r) for r in listed or [] if is_commit(str(r)))
    paths = [posixpath.join(base, "revisions", c) for c in commits]
    paths += [posixpath.join(base, e) for e in entries if _own(e)]
    left = [posixpath.join(base, "revisions", r) for r in revisions if r not in commits]
    left += [posixpath.join(base, e) for e in entries
             if not _own(e) and not (e == "revisions" and listed is not None)]
    rmdirs = []
    if "revisions" in entries and listed is not None and len(commits) == len(revisions):
        rmdirs.append(posixpath.join(base, "revisions"))
    if not left:
        rmdirs.append(base)
    return {"repo": repo_id, "dir": base, "paths": paths, "rmdirs": rmdirs, "left": left}


def unserved_plan(listing: Mapping[str, Any], served_repos: Iterable[str], served_dirs: Iterable[str],
                  roots: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The downloaded models no unit serves any more, and what to delete of each.

    listing: {"root": <models root>, "orgs": {org: {"entries": [names in <root>/<org>], "repos": {name: {"record":
    the repo its .vllm-node-download.json names or None, "entries": [...], "revisions": [...] (unserved_repo)}}}}}
    (real directories only, no symbolic links). A directory is the project's when its record names its own repo
    (<org>/<name>). It is deleted only when no served repo has that name (compared case-insensitively, as the Hub
    does), no served directory is, contains or lies inside it, and it is not nor contains one of the other roots
    (the models' root above the adapters'). Returns [{repo, dir, paths (to delete: trees and files), rmdirs (emptied
    directories to remove, innermost first; an org directory left empty last), left (foreign entries kept)}],
    sorted by repo.
    """
    root = posixpath.normpath(str(listing.get("root") or ""))
    served = {str(r).casefold() for r in served_repos}
    guarded = [posixpath.normpath(str(d)) for d in served_dirs if str(d or "").startswith("/")]
    others = [posixpath.normpath(str(d)) for d in roots if str(d or "").startswith("/")]
    if not root.startswith("/") or root == "/":
        return []
    plan: list[dict[str, Any]] = []
    for org, org_doc in sorted((listing.get("orgs") or {}).items()):
        org_dir = posixpath.join(root, org)
        removed = []
        for name, repo in sorted((org_doc.get("repos") or {}).items()):
            repo_id, base = f"{org}/{name}", posixpath.join(org_dir, name)
            if (not REPO_RE.match(repo_id) or repo.get("record") != repo_id or repo_id.casefold() in served
                    or _overlaps(base, guarded) or any(_within(o, base) for o in others)):
                continue
            plan.append(unserved_repo(repo_id, repo, base))
            if base in plan[-1]["rmdirs"]:
                removed.append(name)
        if (removed and sorted(removed) == sorted(org_doc.get("entries") or []) and not _overlaps(org_dir, guarded)
                and not any(_within(o, org_dir) for o in others)):
            plan[-1]["rmdirs"].append(org_dir)
    return plan


def freed_bytes(inodes: Iterable[tuple[int, int, int, int]]) -> int:
    """Bytes a deletion frees: inodes [(device, inode, size, link count)], one entry per name deleted. A file
    hard-linked from a directory that stays (another revision, another model) frees nothing."""
    seen: dict[tuple[int, int], list[int]] = {}
    for dev, ino, size, nlink in inodes:
        seen.setdefault((dev, ino), [size, nlink, 0])[2] += 1
    return sum(size for size, nlink, names in seen.values() if names >= nlink)


def layout_commit(entries: Iterable[str], flat_marker: str | None, record: Mapping[str, Any] | None) -> str:
    """The commit of files found directly in the model directory (the layout before revisions/): the one their
    completion marker names (the files really are that commit), else the one of the record; '' if neither."""
    if MARKER_NAME in entries and flat_marker:
        try:
            return str((json.loads(flat_marker) or {}).get("commit") or "")
        except (ValueError, AttributeError):
            return ""
    return str((record or {}).get("commit") or "")


def layout_excluded(name: str) -> bool:
    """Whether an entry of the model directory belongs to the current layout (not moved)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in LAYOUT_EXCLUDES)


# ---- hf ---------------------------------------------------------------------------------------------------------


def hf_env(req: Mapping[str, Any], token_file: str) -> dict[str, str]:
    """The environment of every hf process. The token is read from token_file (HF_TOKEN_PATH): never --token (the
    process table), never an environment value (Ansible puts those on a command line)."""
    env = {"HF_ENDPOINT": str(req["endpoint"]), "HF_HOME": str(req["hf_home"]), "HF_TOKEN_PATH": token_file,
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "HF_HUB_ETAG_TIMEOUT": "30", "HF_HUB_DOWNLOAD_TIMEOUT": "60", "NO_COLOR": "1"}
    if req.get("ca_bundle"):
        env["SSL_CERT_FILE"] = str(req["ca_bundle"])
    env.update({str(k): str(v) for k, v in (req.get("environment") or {}).items()})
    return env


def download_argv(req: Mapping[str, Any], commit: str, directory: str, paths: Iterable[str] = ()) -> list[str]:
    """`hf download` of the given paths (the metadata files), or of the whole selection with --include/--exclude."""
    argv = ["download", str(req["repo"]), *paths, "--revision", commit, "--local-dir", directory,
            "--max-workers", str(req["max_workers"])]
    if not paths:
        argv += [f"--include={p}" for p in req["include"]] + [f"--exclude={p}" for p in req["exclude"]]
    return argv


def verify_argv(req: Mapping[str, Any], commit: str, directory: str) -> list[str]:
    """`hf cache verify` of a revision directory; every file must be there unless patterns select a part."""
    argv = ["cache", "verify", str(req["repo"]), "--revision", commit, "--local-dir", directory]
    return argv + (["--fail-on-missing-files"] if not req["include"] and not req["exclude"] else [])


def offline_fallback(stdout: str, stderr: str) -> bool:
    """hf fell back to the local directory because the Hub could not be reached (it then exits 0)."""
    return any(m in (stdout or "") + (stderr or "") for m in OFFLINE_FALLBACK_MARKERS)


def verify_mismatches(text: str) -> list[str]:
    """Paths named as checksum mismatches in `hf cache verify` output ('  - PATH: expected ...')."""
    return re.findall(r"^\s*- (.+?): expected \S+", text or "", flags=re.MULTILINE)


def key_lines(stderr: str) -> str:
    """hf's lines that say what went wrong (the last six distinct ones)."""
    pattern = re.compile(r"(?i)errno|error:|refused|not found|unauthorized|forbidden|timed out|consistency")
    lines: list[str] = []
    for line in (stderr or "").splitlines():
        if pattern.search(line) and line not in lines:
            lines.append(line)
    return " | ".join(lines[-6:])


# ---- the disk check and the messages ------------------------------------------------------------------------------


def disk_margin(missing_bytes: int, margin_bytes: int, margin_percent: float) -> int:
    """Free space required besides the missing bytes: the larger of the two margins."""
    return max(int(margin_bytes), math.ceil(missing_bytes * float(margin_percent) / 100))


def check_disk(free: int, missing_bytes: int, req: Mapping[str, Any], directory: str, checkpoint: int) -> str:
    """The line saying what fits, or a refusal with the numbers and what to change."""
    margin = disk_margin(missing_bytes, req["disk_margin_bytes"], req["disk_margin_percent"])
    need = missing_bytes + margin
    if free < need:
        raise ModelDownloadError(
            f"model_download: not enough disk space in {directory} for {req['repo']}: free {free} bytes "
            f"({human(free)}), needed {need} bytes = {missing_bytes} missing ({human(missing_bytes)}) + margin "
            f"{margin} ({human(margin)}); index total_size {checkpoint}. Free {human(need - free)} more, or move "
            "vllm_node_model_root / model_download_root to a larger filesystem (or lower "
            "model_download_disk_margin_bytes). Nothing was downloaded."
        )
    return f"model_download: {human(free)} free, {human(missing_bytes)} to download + {human(margin)} margin"


def download_failure(repo: str, commit: str, res: Mapping[str, Any], timeout: int) -> str:
    """Why a background `hf download` failed, with hf's key lines and how to resume."""
    rc = res.get("rc")
    timed_out = f": timed out after {timeout} s" if rc is None else ""
    tail = (res.get("stderr") or res.get("msg") or "")[-1200:]
    return (
        f"model_download: hf download of {repo}@{commit} failed (rc {rc if rc is not None else 'none'}{timed_out}): "
        f"{key_lines(res.get('stderr') or '')} (end of hf's output: {tail}) Finished files are kept: run the play "
        "again to resume (only the missing files are fetched)."
    )


def human(num: float) -> str:
    """Binary-prefixed size (GiB, MiB...)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        # judged on the printed value: 1048571 B is 1023.996 KiB, which prints as 1024.00 KiB, i.e. 1.00 MiB
        text = f"{num:.0f}" if unit == "B" else f"{num:.2f}"
        if abs(float(text)) < 1024 or unit == "TiB":
            return f"{text} {unit}"
        num /= 1024.0
    return f"{num:.2f} TiB"  # pragma: no cover - the loop returns at TiB


def progress_line(done: int, total: int, elapsed: float) -> str:
    """One progress line: bytes, percent, rate and ETA (total may be 0)."""
    # The directory probe also counts hf's own small bookkeeping files: never report more than the total.
    done = max(0, min(done, total)) if total > 0 else done
    pct = 100.0 if total <= 0 else 100.0 * done / total
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 and total > done else 0.0
    return f"{human(done)} / {human(total)} ({pct:.1f} %), {human(rate)}/s, elapsed {int(elapsed)} s, ETA {int(eta)} s"


# ---- the planner's inputs -----------------------------------------------------------------------------------------


def planner_inputs(
    config: Mapping[str, Any] | None,
    index: Mapping[str, Any] | None = None,
    quant: Mapping[str, Any] | None = None,
    files: Iterable[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The sizing plan's inputs from a model's config.json, index, hf_quant_config.json and file list.

    One rule for the checkpoint size: the index's metadata.total_size when it is positive, else the sum of the
    *.safetensors sizes in files ([{path, size}]: the Hub listing or a local directory listing), else 0 (the
    planner then falls back to the catalog's checkpoint_bytes).
    Returns {config, quant_config, checkpoint_bytes, checkpoint_bytes_source: index | shards | none}.
    """
    for name, doc in zip(PLANNER_DOCS, (config, index, quant), strict=True):
        if doc is not None and not isinstance(doc, Mapping):
            raise ModelDownloadError(
                f"model_download_planner_inputs: {name} must hold a JSON object, got {type(doc).__name__}; "
                "point at the model's own file (re-download it if it is damaged)"
            )
    metadata = (index or {}).get("metadata") or {}
    total = metadata.get("total_size") if isinstance(metadata, Mapping) else None
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise ModelDownloadError(
            f"model_download_planner_inputs: model.safetensors.index.json metadata.total_size must be a non-negative "
            f"integer, got {total!r}; fix or remove the index (the size then comes from the shards)"
        )
    shard_bytes = total_size(f for f in files or [] if str(f.get("path", "")).endswith(".safetensors"))
    if total:
        checkpoint, source = total, "index"
    elif shard_bytes > 0:
        checkpoint, source = shard_bytes, "shards"
    else:
        checkpoint, source = 0, "none"
    return {"config": dict(config or {}), "quant_config": dict(quant or {}), "checkpoint_bytes": checkpoint,
            "checkpoint_bytes_source": source}


def shard_bytes(files: Iterable[Mapping[str, Any]]) -> int:
    """Sum of the *.safetensors sizes of a file list."""
    return total_size(f for f in files if str(f["path"]).endswith(".safetensors"))
