"""The fingerprint of everything a running vLLM process depends on (pure, no Ansible import, no I/O).

The vllm_service role restarts the service when this changes: a venv switch, a new model revision, a patched
config, a new unit, environment, API key or CA bundle, each reaches the process with exactly one restart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


class FingerprintError(ValueError):
    """An input the fingerprint cannot take (the message says what to fix)."""


def sha256_text(text: str) -> str:
    """sha256 hex of a string (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: one text for one value, whatever the order it was built in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _plain(name: str, value: Any) -> Any:
    """A component value as JSON data (strings, numbers, booleans, lists, dicts); anything else is refused."""
    try:
        return json.loads(canonical_json(value))
    except (TypeError, ValueError):
        raise FingerprintError(f"service_fingerprint: component {name!r} is not JSON data "
                               f"({type(value).__name__}); pass a string, number, list or dict") from None


def fingerprint_inputs(components: Mapping[str, Any], secrets: Mapping[str, Any] | None = None,
                       previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The inputs the fingerprint is taken over, as recorded on the node.

    components: name -> value (a path, a hash, a dict of hashes...). None means "not known in this run" (the
      role that publishes it did not run, e.g. a --tags run): the value recorded last time is kept, so a partial
      run does not restart the service for what it did not look at.
    secrets: name -> secret value; only its sha256 hex is kept (a secret never reaches the record). None: as above.
    previous: the inputs of the last record (empty on a new node).
    """
    secrets = secrets or {}
    previous = previous or {}
    if not isinstance(components, Mapping) or not isinstance(secrets, Mapping) or not isinstance(previous, Mapping):
        raise FingerprintError("service_fingerprint: components, secrets and previous must be dicts "
                               "(name -> value)")
    both = sorted(set(components) & set(secrets))
    if both:
        raise FingerprintError(f"service_fingerprint: {', '.join(both)} given both as a component and as a secret; "
                               "pass each once")
    inputs: dict[str, Any] = {}
    for name, value in components.items():
        inputs[str(name)] = _plain(name, previous.get(name) if value is None else value)
    for name, value in secrets.items():
        if value is None:
            inputs[str(name)] = _plain(name, previous.get(name))
        else:
            inputs[str(name)] = sha256_text(str(value))
    return dict(sorted(inputs.items()))


def service_fingerprint(components: Mapping[str, Any], secrets: Mapping[str, Any] | None = None,
                        previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{"fingerprint": sha256 hex of the inputs as canonical JSON, "inputs": the inputs (fingerprint_inputs)}."""
    inputs = fingerprint_inputs(components, secrets, previous)
    return {"fingerprint": sha256_text(canonical_json(inputs)), "inputs": inputs}

