"""Ansible filters over plugins/module_utils/node_manifest.py: the node manifest from the roles' facts, the fields a
run failed to publish, and the field-by-field comparison of two manifests. Documented per filter in
plugins/filter/<name>.yml (ansible-doc -t filter vllm_node.vllm_node.<name>).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import node_manifest
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input


def _mapping_or_none(value: Any) -> dict[str, Any] | None:
    """A previous manifest as a dict, from a dict or its JSON text; anything else (none yet, a file that is not a
    JSON object) is no previous manifest."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, dict) else None


@reports_bad_input
def node_manifest_build(facts: Any, secrets: Any = (), previous: Any = None, now: str = "") -> dict[str, Any]:
    """The roles' facts -> the node manifest (host section apart, secrets replaced, manifest_sha256)."""
    return node_manifest.build(facts, list(secrets or []), _mapping_or_none(previous), str(now or ""))


@reports_bad_input
def node_manifest_newly_missing(manifest: Any, previous: Any = None) -> list[str]:
    """Fields the previous manifest knew that this one does not (the run did not publish them)."""
    return node_manifest.newly_missing(manifest, _mapping_or_none(previous))


@reports_bad_input
def node_manifest_compare(a: Any, b: Any, ignore: Any = ()) -> list[str]:
    """Two manifests -> their differences outside the host section, one line per field."""
    return node_manifest.compare(a, b, list(ignore or []))


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        """The filters of this file."""
        return {
            "node_manifest_build": node_manifest_build,
            "node_manifest_newly_missing": node_manifest_newly_missing,
            "node_manifest_compare": node_manifest_compare,
        }
