"""Rule engine of the model_config role: which known incompatibilities apply, and the patched documents.

A rule (roles/model_config/vars/main.yml) is data:
  id: str, description: str,
  when: {<fact>: <expected>, ..., any: [{...}, ...]}   # all keys must hold; `any` needs one alternative
  remove: [{file: "config.json", path: ["quantization_config", "kv_cache_scheme"]}, ...]
Condition keys are fact names with an optional operator suffix:
  <fact>: value | [values]        equality / membership
  <fact>_regex: "re"              re.search on the string value
  <fact>_lt / <fact>_ge: "0.18.0"  version comparison (missing fact = not satisfied)
  <fact>_major_in: [12]           major number of a "12.0"-style capability
"""

from __future__ import annotations

import copy
import re
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.versions import version_tuple

_SUFFIXES = ("_regex", "_lt", "_ge", "_major_in")


def _holds(key: str, expected: Any, facts: dict[str, Any]) -> bool:
    """Evaluate one condition against the facts."""
    if key == "any":
        return any(conditions_hold(alt, facts) for alt in expected)
    for suffix in _SUFFIXES:
        if key.endswith(suffix):
            name = key[: -len(suffix)]
            value = facts.get(name)
            if value is None or value == "":
                return False
            if suffix == "_regex":
                return re.search(str(expected), str(value)) is not None
            if suffix == "_lt":
                return version_tuple(value) < version_tuple(expected)
            if suffix == "_ge":
                return version_tuple(value) >= version_tuple(expected)
            major = version_tuple(value)[:1]
            return bool(major) and major[0] in [int(e) for e in expected]
    value = facts.get(key)
    if isinstance(expected, list):
        return value in expected
    return value == expected


def conditions_hold(conditions: dict[str, Any], facts: dict[str, Any]) -> bool:
    """True when every condition of the dict holds."""
    return all(_holds(key, expected, facts) for key, expected in (conditions or {}).items())


def matching_rules(rules: list[dict[str, Any]], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The rules whose `when` holds for these facts, in table order."""
    return [rule for rule in rules or [] if conditions_hold(rule.get("when", {}), facts)]


def patch_document(doc: dict[str, Any], filename: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply the removals of the rules that target `filename`.

    Returns {"content": patched copy, "changes": [{rule, file, path, old}]}; the input is not modified.
    A removal whose path is absent changes nothing and is not reported.
    """
    patched = copy.deepcopy(doc)
    changes: list[dict[str, Any]] = []
    for rule in rules or []:
        for removal in rule.get("remove", []):
            if removal.get("file") != filename:
                continue
            path = list(removal["path"])
            parent: Any = patched
            for part in path[:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else None
            if isinstance(parent, dict) and path[-1] in parent:
                old = parent.pop(path[-1])
                changes.append({"rule": rule["id"], "file": filename, "path": ".".join(path), "old": old})
    return {"content": patched, "changes": changes}


def file_sources(names: list[str], stats: dict[str, dict[str, Any]], state: dict[str, Any]) -> list[dict[str, Any]]:
    """Where each config's original lives.

    stats maps "<name>" and "<name>.orig" to stat results (exists, checksum); state is the role's record
    ({"files": {name: {"patched_sha1": ...}}}). The .orig is the original while the file is either identical to it
    or the patch we recorded; otherwise the file was replaced (e.g. a new download) and the .orig is stale.
    """
    out: list[dict[str, Any]] = []
    for name in names:
        cur = stats.get(name, {}) or {}
        orig = stats.get(name + ".orig", {}) or {}
        if not cur.get("exists") and not orig.get("exists"):
            continue
        recorded = ((state or {}).get("files", {}).get(name) or {}).get("patched_sha1")
        use_orig = bool(orig.get("exists")) and (
            not cur.get("exists") or cur.get("checksum") in (orig.get("checksum"), recorded)
        )
        out.append(
            {
                "name": name,
                "exists": bool(cur.get("exists")),
                "sha1": cur.get("checksum", ""),
                "orig_exists": bool(orig.get("exists")),
                "orig_sha1": orig.get("checksum", ""),
                "source": name + ".orig" if use_orig else name,
                "stale_orig": bool(orig.get("exists")) and not use_orig,
            }
        )
    return out


def patch_all(originals: dict[str, dict[str, Any]], rules: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """patch_document for every {filename: document}."""
    return {name: patch_document(doc, name, rules) for name, doc in originals.items()}


def state_record(written: list[dict[str, Any]], patches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The record of the patched files from the copy results (those that carry a checksum)."""
    files: dict[str, Any] = {}
    for res in written or []:
        if "checksum" not in res or res.get("skipped"):
            continue
        name = res["item"]["name"]
        rules = sorted({c["rule"] for c in patches[name]["changes"]})
        files[name] = {"patched_sha1": res["checksum"], "rules": rules}
    return {"files": files}


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        """The filters the model_config role calls (documented in plugins/filter/<name>.yml); patch_document and
        version_tuple are this module's helpers, not filters."""
        return {
            "model_config_matching_rules": matching_rules,
            "model_config_file_sources": file_sources,
            "model_config_patch_all": patch_all,
            "model_config_state_record": state_record,
        }
