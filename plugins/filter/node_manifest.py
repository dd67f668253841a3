"""Ansible filters over plugins/module_utils/node_manifest.py: the node manifest from the roles' facts, the fields a
run failed to publish, and the field-by-field comparison of two manifests. Documented per filter in
plugins/filter/<name>.yml (ansible-doc -t filter vllm_node.vllm_node.<name>).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import node_manifest

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain Python use (tests) without Ansible installed
    AnsibleFilterError = ValueError


def _filter(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a wrong input's TypeError/ValueError into AnsibleFilterError, naming the filter."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, TypeError, KeyError) as err:
            raise AnsibleFilterError(f"{func.__name__}: {err}") from err
    return wrapper


def _mapping_or_none(value: Any) -> dict[str, Any] | None:
    """A previous manifest as a dict, from a dict or its JSON text; anything else (none yet, a file that is not a
    JSON object) is no previous manifest."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, dict) else None


@_filter
def node_manifest_build(facts: Any, secrets: Any = (), previous: Any = None, now: str = "") -> dict[str, Any]:
    """The roles' facts -> the node manifest (host section apart, secrets replaced, manifest_sha256)."""
    return node_manifest.build(facts, list(secrets or []), _mapping_or_none(previous), str(now or ""))


@_filter
def node_manifest_newly_missing(manifest: Any, previous: Any = None) -> list[str]:
    """Fields the previous manifest knew that this one does not (the run did not publish them)."""
    return node_manifest.newly_missing(manifest, _mapping_or_none(previous))


@_filter
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
