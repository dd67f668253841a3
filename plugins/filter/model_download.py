"""Pure helpers for the model_download role: file selection, size bookkeeping and the planner's inputs.

Kept free of Ansible state so they can be unit-tested (tests/unit/plugins/filter/test_model_pipeline_filters.py).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import posixpath
import re
from typing import Any, Iterable, Mapping

from ansible.errors import AnsibleFilterError

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# hf's per-file bookkeeping in a --local-dir: <dir>/.cache/huggingface/download/<path>.metadata
HF_METADATA_DIR = ".cache/huggingface/download"


def _normalise_patterns(patterns: Iterable[str] | None) -> list[str]:
    """Apply the Hub client's convention: a pattern ending in '/' means 'everything below'."""
    out: list[str] = []
    for pattern in patterns or []:
        out.append(pattern + "*" if pattern.endswith("/") else pattern)
    return out


def select_files(
    listing: list[dict[str, Any]],
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Keep the files of a `hf models ls -R --format json` listing matching include and not exclude.

    Same semantics as huggingface_hub's allow/ignore patterns: fnmatch on the repo path, an empty
    include list selects everything. Folders are dropped. Returns [{path, size}] sorted by path, plus `sha256` for the
    files stored in LFS (the listing's lfs.sha256, or lfs.oid in the Hub API's own tree format): the sha256 of the
    content, which `hf cache verify` checks and which tells an unchanged shard of another revision.
    """
    allow = _normalise_patterns(include)
    ignore = _normalise_patterns(exclude)
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
        if _SHA256_RE.match(sha256):
            entry["sha256"] = sha256
        selected.append(entry)
    return sorted(selected, key=lambda f: f["path"])


def split_metadata(files: list[dict[str, Any]], metadata_patterns: Iterable[str]) -> list[dict[str, Any]]:
    """Return the files whose path matches one of the metadata patterns (the small files)."""
    patterns = _normalise_patterns(metadata_patterns)
    return [f for f in files if any(fnmatch.fnmatch(f["path"], p) for p in patterns)]


def local_sizes(found: list[dict[str, Any]], root: str) -> dict[str, int]:
    """Index the regular files listed by `ansible.builtin.find` (recurse, hidden) under root as {relative path: size}.

    hf's own bookkeeping below <root>/.cache is left out: it is not part of the model.
    """
    base = posixpath.normpath(root)
    sizes: dict[str, int] = {}
    for entry in found or []:
        path, size = entry.get("path"), entry.get("size")
        if not path or not isinstance(size, int):
            continue
        rel = posixpath.relpath(posixpath.normpath(path), base)
        if rel == ".." or rel.startswith("../"):
            raise AnsibleFilterError(
                f"model_download_local_sizes: {path} is not below {root}; list the files of the model directory itself"
            )
        if rel == ".cache" or rel.startswith(".cache/"):
            continue
        sizes[rel] = size
    # model_config keeps the pristine file as <file>.orig beside its patched copy: the original is what the Hub
    # served, so its size stands for the file (a patched config is not a missing or broken download).
    for path in [p for p in sizes if p.endswith(".orig")]:
        if path[: -len(".orig")] in sizes:
            sizes[path[: -len(".orig")]] = sizes[path]
    return sizes


def missing_files(expected: list[dict[str, Any]], local: dict[str, int]) -> list[dict[str, Any]]:
    """Expected files that are absent locally or whose size differs from the Hub's."""
    return [f for f in expected if local.get(f["path"]) != f["size"]]


def total_size(files: list[dict[str, Any]]) -> int:
    """Sum of the 'size' fields."""
    return sum(int(f["size"]) for f in files)


def is_commit(revision: str) -> bool:
    """True when the revision is a full 40-hex commit id (no resolution needed)."""
    return bool(_COMMIT_RE.match(revision or ""))


def verify_mismatches(text: str) -> list[str]:
    """Paths named as checksum mismatches in `hf cache verify` output ('  - PATH: expected ...')."""
    return re.findall(r"^\s*- (.+?): expected \S+", text or "", flags=re.MULTILINE)


def progress_line(done: int, total: int, elapsed: float) -> str:
    """One progress line: bytes, percent, rate and ETA (total may be 0)."""
    # The directory probe also counts hf's own small bookkeeping files: never report more than the total.
    done = max(0, min(done, total)) if total > 0 else done
    pct = 100.0 if total <= 0 else 100.0 * done / total
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 and total > done else 0.0
    return (
        f"{_human(done)} / {_human(total)} ({pct:.1f} %), {_human(rate)}/s, "
        f"elapsed {int(elapsed)} s, ETA {int(eta)} s"
    )


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
    for name, doc in (("config.json", config), ("model.safetensors.index.json", index), ("hf_quant_config.json", quant)):
        if doc is not None and not isinstance(doc, Mapping):
            raise AnsibleFilterError(
                f"model_download_planner_inputs: {name} must hold a JSON object, got {type(doc).__name__}; "
                "point at the model's own file (re-download it if it is damaged)"
            )
    metadata = (index or {}).get("metadata") or {}
    total = metadata.get("total_size") if isinstance(metadata, Mapping) else None
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise AnsibleFilterError(
            f"model_download_planner_inputs: model.safetensors.index.json metadata.total_size must be a non-negative "
            f"integer, got {total!r}; fix or remove the index (the size then comes from the shards)"
        )
    shards = [f for f in files or [] if str(f.get("path", "")).endswith(".safetensors")]
    shard_bytes = total_size(shards)
    if total:
        checkpoint, source = total, "index"
    elif shard_bytes > 0:
        checkpoint, source = shard_bytes, "shards"
    else:
        checkpoint, source = 0, "none"
    return {
        "config": dict(config or {}),
        "quant_config": dict(quant or {}),
        "checkpoint_bytes": checkpoint,
        "checkpoint_bytes_source": source,
    }


def link_plan(
    files: list[dict[str, Any]],
    local: Mapping[str, int],
    revisions: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The files of a new revision that can be hard-linked from a verified revision instead of downloaded.

    files: the new revision's [{path, size, sha256?}]; local: {path: size} already in its directory;
    revisions: [{dir, sha256: {path: hex}}] of the other revisions whose download was verified (their completion
    markers). A file qualifies when it carries the Hub's sha256 (LFS files), is absent or of the wrong size locally,
    and a verified revision holds a file with that sha256 (the same path first). Small files without an LFS sha256
    are downloaded: they cost nothing and model_config may have replaced them.
    Returns [{path, size, source, metadata}] sorted by path: source = the file to link, metadata = hf's bookkeeping
    of that file in its revision (copied beside the link, so hf only compares the ETag instead of hashing it).
    """
    by_sha: dict[str, list[tuple[str, str]]] = {}
    for revision in revisions:
        root = str(revision.get("dir") or "")
        hashes = revision.get("sha256") or {}
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


def verified_revisions(markers: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{dir, sha256}] of the revisions whose completion marker says verified and lists every file's sha256.

    markers: the results of `ansible.builtin.slurp` looped over <base>/revisions/*/.vllm-node-complete.json
    ({item: path, content: base64}). A marker that does not parse, is not verified, has no sha256 manifest or does not
    name its own directory's commit is left out (its files are downloaded, not linked).
    """
    out: list[dict[str, Any]] = []
    for result in markers:
        path = str(result.get("item") or "")
        try:
            doc = json.loads(base64.b64decode(str(result.get("content") or "")))
        except (ValueError, TypeError):
            continue
        directory = posixpath.dirname(path)
        if (not isinstance(doc, dict) or doc.get("verified") is not True or not isinstance(doc.get("sha256"), dict)
                or doc.get("commit") != posixpath.basename(directory)):
            continue
        out.append({"dir": directory, "sha256": doc["sha256"]})
    return out


def file_sha256(files: list[dict[str, Any]], hashed: Mapping[str, str] | None = None) -> dict[str, str]:
    """{path: sha256} of every file of a revision: the Hub's LFS sha256 where there is one, else the hash measured
    on the node (hashed: {path: hex}, the original bytes). Refuses a file with neither."""
    hashed = hashed or {}
    out: dict[str, str] = {}
    for entry in files:
        digest = str(entry.get("sha256") or hashed.get(entry["path"]) or "").lower()
        if not _SHA256_RE.match(digest):
            raise AnsibleFilterError(
                f"model_download_file_sha256: no sha256 for {entry['path']} (neither the Hub's LFS oid nor a hash "
                "measured on the node); run the role again with model_download_reverify=true"
            )
        out[entry["path"]] = digest
    return dict(sorted(out.items()))


def manifest_sha256(hashes: Mapping[str, str]) -> str:
    """sha256 hex of a {path: sha256} manifest as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(dict(hashes), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def prune_plan(
    found: Iterable[Mapping[str, Any]],
    markers: Iterable[Mapping[str, Any]],
    serving: str,
    keep: int,
) -> list[str]:
    """Revision directories to delete: all but the serving one and the keep-1 most recently completed others.

    found: `ansible.builtin.find` entries of the directories in <base>/revisions (only 40-hex names count: what the
    role creates); markers: find entries of their completion markers (their mtime orders them; a directory without
    one is an unfinished or failed download and is always deleted); serving: the commit the service reads.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise AnsibleFilterError(
            f"model_download_prune_plan: keep must be an integer >= 1 (the serving revision), got {keep!r}; "
            "set model_download_keep_revisions to 1 or more"
        )
    if not is_commit(serving):
        raise AnsibleFilterError(
            f"model_download_prune_plan: the serving revision {serving!r} is not a 40-hex commit; run the role first "
            "(it publishes model_download_dir) or set model_download_serving_dir to revisions/<commit>"
        )
    completed = {posixpath.basename(posixpath.dirname(str(m["path"]))): float(m.get("mtime", 0)) for m in markers}
    commits = sorted({posixpath.basename(str(d["path"])) for d in found} - {serving})
    commits = [c for c in commits if is_commit(c)]
    finished = sorted((c for c in commits if c in completed), key=lambda c: (-completed[c], c))
    kept = set(finished[: keep - 1])
    return [c for c in commits if c not in kept]


def _human(num: float) -> str:
    """Binary-prefixed size (GiB, MiB...)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.2f} {unit}"
        num /= 1024.0
    return f"{num:.2f} TiB"


def metadata_sources(names: list[str], local: dict[str, Any], directory: str) -> dict[str, str]:
    """Name -> path to read for each metadata file present in `local` (relative path -> size).

    A file model_config patched is read from its kept original (<name>.orig): the planner needs the checkpoint's
    own config, not the patch.
    """
    return {
        name: f"{directory}/{name}.orig" if f"{name}.orig" in local else f"{directory}/{name}"
        for name in names
        if name in local
    }


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "model_download_select": select_files,
            "model_download_metadata": split_metadata,
            "model_download_local_sizes": local_sizes,
            "model_download_missing": missing_files,
            "model_download_total": total_size,
            "model_download_is_commit": is_commit,
            "model_download_verify_mismatches": verify_mismatches,
            "model_download_progress": progress_line,
            "model_download_human": _human,
            "model_download_planner_inputs": planner_inputs,
            "model_download_link_plan": link_plan,
            "model_download_verified_revisions": verified_revisions,
            "model_download_file_sha256": file_sha256,
            "model_download_manifest_sha256": manifest_sha256,
            "model_download_prune_plan": prune_plan,
            "model_download_metadata_sources": metadata_sources,
        }
