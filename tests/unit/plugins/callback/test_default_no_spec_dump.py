"""The stdout callback drops the argument-spec dump of a refused role input, and nothing else."""

from __future__ import annotations

import importlib

callback = importlib.import_module("ansible_collections.vllm_node.vllm_node.plugins.callback.default_no_spec_dump")


def refused() -> dict:
    return {"failed": True, "msg": "Validation of arguments failed:\nvalue of x must be one of: a, b, got: c",
            "argument_errors": ["value of x must be one of: a, b, got: c"],
            "argument_spec_data": {"x": {"type": "str", "choices": ["a", "b"]}},
            "validate_args_context": {"role": "vllm_node"}, "changed": False}


def test_the_refused_input_keeps_its_errors_and_loses_the_dump() -> None:
    plugin = callback.CallbackModule()
    result = refused()
    plugin._clean_results(result, "ansible.builtin.validate_argument_spec")
    assert "argument_spec_data" not in result and "validate_args_context" not in result
    assert result["argument_errors"] == ["value of x must be one of: a, b, got: c"] and result["msg"]


def test_other_tasks_keep_every_key() -> None:
    plugin = callback.CallbackModule()
    result = refused()
    plugin._clean_results(result, "ansible.builtin.command")
    assert "argument_spec_data" in result and "validate_args_context" in result
