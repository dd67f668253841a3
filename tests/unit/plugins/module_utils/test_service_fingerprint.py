"""The service fingerprint: stable, order-independent, sensitive to every component, never holding a secret."""

from __future__ import annotations

import hashlib
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_node.vllm_node.plugins.filter.service_fingerprint import (
    FilterModule,
)
from ansible_collections.vllm_node.vllm_node.plugins.filter.service_fingerprint import (
    service_fingerprint as service_fingerprint_filter,
)
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.service_fingerprint import (
    FingerprintError,
    canonical_json,
    fingerprint_inputs,
    service_fingerprint,
)

SECRET = "sk-vllm-do-not-leak-0123456789abcdefghijklmnop"

COMPONENTS = {
    "service": "a" * 64,
    "venv": "/opt/vllm/venvs/0.32.0-cpu",
    "venv_lock_sha256": "b" * 64,
    "model_commit": "0123456789abcdef0123456789abcdef01234567",
    "model_manifest_sha256": "c" * 64,
    "model_config_files_sha256": {"config.json": "d" * 64, "hf_quant_config.json": ""},
    "unit_sha256": "e" * 64,
    "env_sha256": "f" * 64,
    "waiter_sha256": "1" * 64,
    "ca_bundle_sha256": "",
}


def test_the_same_inputs_give_the_same_fingerprint():
    first = service_fingerprint(COMPONENTS, {"api_key": SECRET})
    second = service_fingerprint(dict(COMPONENTS), {"api_key": SECRET})
    assert first == second
    assert len(first["fingerprint"]) == 64
    int(first["fingerprint"], 16)


def test_the_fingerprint_is_the_sha256_of_the_inputs_as_canonical_json():
    result = service_fingerprint(COMPONENTS)
    text = json.dumps(result["inputs"], sort_keys=True, separators=(",", ":"))
    assert result["fingerprint"] == hashlib.sha256(text.encode()).hexdigest()


def test_order_does_not_matter():
    reordered = dict(reversed(list(COMPONENTS.items())))
    reordered["model_config_files_sha256"] = dict(reversed(list(COMPONENTS["model_config_files_sha256"].items())))
    assert service_fingerprint(reordered)["fingerprint"] == service_fingerprint(COMPONENTS)["fingerprint"]
    assert list(service_fingerprint(reordered)["inputs"]) == sorted(COMPONENTS)


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_any_component_change_changes_it(name):
    changed = dict(COMPONENTS)
    value = COMPONENTS[name]
    changed[name] = dict(value, **{"config.json": "9" * 64}) if isinstance(value, dict) else value + "x"
    assert service_fingerprint(changed)["fingerprint"] != service_fingerprint(COMPONENTS)["fingerprint"]


def test_a_new_or_dropped_component_changes_it():
    base = service_fingerprint(COMPONENTS)["fingerprint"]
    assert service_fingerprint(dict(COMPONENTS, extra="x"))["fingerprint"] != base
    fewer = {k: v for k, v in COMPONENTS.items() if k != "ca_bundle_sha256"}
    assert service_fingerprint(fewer)["fingerprint"] != base


def test_a_secret_change_changes_it():
    one = service_fingerprint(COMPONENTS, {"api_key": SECRET})["fingerprint"]
    other = service_fingerprint(COMPONENTS, {"api_key": SECRET + "2"})["fingerprint"]
    assert one != other


def test_a_secret_value_never_appears_in_the_output():
    result = service_fingerprint(COMPONENTS, {"api_key": SECRET})
    assert result["inputs"]["api_key"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert SECRET not in canonical_json(result)
    assert SECRET not in repr(result)


def test_unknown_components_keep_the_previous_value():
    """A run where a publishing role did not run (null) keeps the recorded value: no restart for it."""
    recorded = service_fingerprint(COMPONENTS, {"api_key": SECRET})
    partial = dict(COMPONENTS, venv_lock_sha256=None, model_config_files_sha256=None)
    again = service_fingerprint(partial, {"api_key": None}, previous=recorded["inputs"])
    assert again == recorded
    # a known value still wins over the record
    moved = service_fingerprint(dict(partial, venv="/opt/vllm/venvs/0.31.0-cpu"), {"api_key": None},
                                previous=recorded["inputs"])
    assert moved["fingerprint"] != recorded["fingerprint"]
    assert moved["inputs"]["venv_lock_sha256"] == COMPONENTS["venv_lock_sha256"]


def test_unknown_component_without_a_record_is_null():
    assert fingerprint_inputs({"model_commit": None}) == {"model_commit": None}


def test_a_name_given_twice_is_refused():
    with pytest.raises(FingerprintError, match="api_key given both"):
        service_fingerprint({"api_key": "x"}, {"api_key": "y"})


def test_non_json_values_are_refused():
    with pytest.raises(FingerprintError, match="component 'venv' is not JSON data"):
        service_fingerprint({"venv": object()})


def test_non_dict_input_is_refused():
    with pytest.raises(FingerprintError, match="must be dicts"):
        service_fingerprint(["service"])  # type: ignore[arg-type]


def test_the_filter_wraps_errors_and_is_registered():
    assert FilterModule().filters()["service_fingerprint"] is service_fingerprint_filter
    assert service_fingerprint_filter(COMPONENTS) == service_fingerprint(COMPONENTS)
    with pytest.raises(AnsibleFilterError, match="must be dicts"):
        service_fingerprint_filter("nope")
