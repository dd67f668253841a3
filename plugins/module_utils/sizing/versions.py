"""vLLM versions and the release rules (vllm_node_vllm_releases) looked up by version.

The releases data (roles/vllm_node/vars/main/vllm_releases.yml) is the single source of every
version-dependent rule and planning estimate: this module has no built-in copy, and a missing rule is a
SizingError naming it.
"""

from __future__ import annotations

from typing import Any

from packaging.version import InvalidVersion, Version

from .errors import SizingError

Releases = dict[str, Any]
# The release a plan is for when the caller names none: the vllm_node role's default vllm_node_vllm_version
# (roles/vllm_node/defaults/main.yml; tests/unit/plugins/module_utils/sizing/test_node_plan.py keeps them equal).
DEFAULT_VERSION = "0.33.0"
_SOURCE = "roles/vllm_node/vars/main/vllm_releases.yml (vllm_node_vllm_releases)"


def version_tuple(version: Any) -> tuple[int, ...]:
    """'0.33.0' / '0.15.2rc1.dev93+g11' -> (0, 33, 0): the PEP 440 release part, padded to three numbers.

    Pre-releases compare as their release: a 0.18.0rc1 build already carries the 0.18 behaviour.
    """
    try:
        release = Version(str(version)).release
    except InvalidVersion as exc:
        raise SizingError(f"vllm_version {version!r} is not a version like '0.33.0'") from exc
    return (release + (0, 0, 0))[:3]


def releases_data(releases: Any) -> Releases:
    """The releases mapping; the whole vars file ({vllm_node_vllm_releases: ...}) is accepted too."""
    if not isinstance(releases, dict) or not releases:
        raise SizingError(f"releases is required: pass releases=vllm_node_vllm_releases (from {_SOURCE})")
    inner = releases.get("vllm_node_vllm_releases")
    return inner if isinstance(inner, dict) else releases


def section(releases: Releases, *path: str) -> Any:
    """A nested table of the releases data, e.g. section(rel, 'attention_backends', 'cpu')."""
    node: Any = releases
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            raise SizingError(f"the releases data has no {'.'.join(path)}; add it to {_SOURCE}")
        node = node[key]
    return node


def rule(releases: Releases, name: str, version: str) -> Any:
    """Value of a version-dependent rule: the entry with the highest `since` <= version."""
    entries = section(releases, name)
    if not isinstance(entries, list):
        return entries
    wanted = version_tuple(version)
    best: tuple[int, ...] | None = None
    chosen: Any = None
    for entry in entries:
        since = version_tuple(entry.get("since", "0.0.0"))
        if since <= wanted and (best is None or since >= best):
            best, chosen = since, entry.get("value")
    if best is None:
        raise SizingError(f"the releases rule {name} has no entry for vLLM {version}; add one to {_SOURCE}")
    return chosen


def estimate(releases: Releases, name: str) -> float:
    """A planning estimate constant (sizing_estimates.<name>)."""
    return float(section(releases, "sizing_estimates", name))
