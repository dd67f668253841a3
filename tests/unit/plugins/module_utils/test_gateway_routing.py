"""The gateway's pools (plugins/module_utils/gateway_routing.py): one `vllm` pool without models, one pool per model
name with them, each server checked once and tracked elsewhere; the models' map and /v1/models list; the error bodies
in vLLM's shape as HAProxy strings; what the role's check refuses."""
from __future__ import annotations

import json

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.filter.gateway import gateway_models_list
from ansible_collections.vllm_node.vllm_node.plugins.filter.gateway import gateway_routing as routing_filter
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gateway_routing as gr

FLEET = [{"name": "node1", "address": "10.0.0.1", "port": 8000, "agent_port": 8021},
         {"name": "old node", "address": "fd00::5", "port": 8000}]
MODELS = [{"name": "node1", "address": "10.0.0.1", "port": 8000, "agent_port": 8021,
           "models": ["llama", "llama-sql"]},
          {"name": "node2", "address": "10.0.0.2", "port": 8001, "models": ["org/qwen", "llama"]}]


def unquote(text: str) -> str:
    """What HAProxy makes of a double-quoted argument's inside (\\x -> x), log-format %% -> %."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out).replace("%%", "%")


def test_without_models_one_pool_of_every_server_as_before():
    routing = gr.routing(FLEET, 1024)
    assert routing["errors"] == [] and routing["models"] == [] and routing["map"] == ""
    assert [(p["name"], p["affinity"], p["model"]) for p in routing["pools"]] == [("vllm", "vllm_affinity", None)]
    assert routing["pools"][0]["servers"] == [
        {"name": "node1", "address": "10.0.0.1", "port": 8000, "agent_port": 8021, "track": None},
        {"name": "old_node", "address": "[fd00::5]", "port": 8000, "agent_port": None, "track": None}]


def test_one_pool_per_model_each_server_checked_in_its_first_and_tracked_in_the_others():
    routing = gr.routing(MODELS, 1024)
    assert routing["models"] == ["llama", "llama-sql", "org/qwen"]
    pools = {p["model"]: p for p in routing["pools"]}
    assert [p["name"] for p in routing["pools"]] == ["model_llama", "model_llama-sql", "model_org_qwen"]
    assert pools["llama"]["affinity"] == "model_llama_affinity"
    assert [(s["name"], s["track"]) for s in pools["llama"]["servers"]] == [
        ("node1", None), ("node2", "model_org_qwen/node2")]
    assert [(s["name"], s["track"]) for s in pools["llama-sql"]["servers"]] == [("node1", "model_llama/node1")]
    assert [(s["name"], s["track"]) for s in pools["org/qwen"]["servers"]] == [("node2", None)]
    assert pools["llama"]["servers"][0]["agent_port"] == 8021
    assert routing["map"] == "llama model_llama\nllama-sql model_llama-sql\norg/qwen model_org_qwen\n"


def test_pool_names_never_meet_after_the_replacement_or_an_affinity_twin():
    names = gr.pool_names(["a/b", "a_b", "x", "x_affinity", "a.b"])
    assert names == {"a/b": "model_a_b", "a_b": "model_a_b_2", "x": "model_x", "x_affinity": "model_x_affinity_2",
                     "a.b": "model_a.b"}
    every = list(names.values()) + [n + gr.AFFINITY_SUFFIX for n in names.values()]
    assert len(every) == len(set(every))


@pytest.mark.parametrize("backends,fragment", [
    ([MODELS[0], FLEET[1]], "either every gateway_backends entry lists its models or none does; old node"),
    ([{**MODELS[0], "models": []}], "node1: models must be a non-empty list"),
    ([{**MODELS[0], "models": "llama"}], "node1: models must be a non-empty list"),
    ([{**MODELS[0], "models": ["my model"]}], "without spaces or control characters"),
    ([{**MODELS[0], "models": ["#x"]}], "not starting with #"),
    ([{**MODELS[0], "models": ["", 3]}], "['', 3]"),
])
def test_models_the_check_refuses(backends, fragment):
    routing = gr.routing(backends, 1024)
    assert any(fragment in error for error in routing["errors"]), routing["errors"]
    assert routing["pools"] == [] and routing["models"] == []


def test_the_error_bodies_are_vllms_shape_once_haproxy_unquotes_them():
    routing = gr.routing([{**MODELS[0], "models": ['we"ird$HOME%s', "llama"]}], 2048)
    bad = json.loads(unquote(routing["bad_request"]))["error"]
    assert bad["type"] == "BadRequestError" and bad["code"] == 400 and bad["param"] == "model"
    assert 'we"ird$HOME%s, llama' in bad["message"]
    large = json.loads(unquote(routing["too_large"]))["error"]
    assert large["code"] == 413 and "2048 bytes" in large["message"]
    # the 404: vLLM 0.32's message with the request's model put in by HAProxy (a JSON-escaped string)
    not_found = routing["not_found"]
    assert not_found.count(gr.MODEL_PLACEHOLDER) == 1
    body = json.loads(unquote(not_found.replace(gr.MODEL_PLACEHOLDER, "gpt-4o")))
    assert body == {"error": {"message": 'The model `gpt-4o` does not exist. Valid aliases: we"ird$HOME%s, llama.',
                              "type": "NotFoundError", "param": "model", "code": 404}}
    assert "\\$HOME" in not_found and "%%s" in not_found, "no environment variable, no log-format tag"


def test_the_models_list_keeps_each_models_created_and_dates_a_new_one():
    first = json.loads(gr.models_list(["a", "b"], "", 100))
    assert first == {"object": "list", "data": [
        {"id": "a", "object": "model", "created": 100, "owned_by": "vllm"},
        {"id": "b", "object": "model", "created": 100, "owned_by": "vllm"}]}
    text = gr.models_list(["a", "b"], "", 100)
    assert gr.models_list(["a", "b"], text, 200) == text, "a re-run changes nothing"
    later = json.loads(gr.models_list(["b", "c"], text, 300))
    assert [(m["id"], m["created"]) for m in later["data"]] == [("b", 100), ("c", 300)]
    for previous in ("not json", "[]", '{"data": [{"id": "a"}]}'):
        assert json.loads(gr.models_list(["a"], previous, 7))["data"][0]["created"] == 7


def test_the_filters_wrap_the_functions():
    assert routing_filter(MODELS, "1024")["models"] == ["llama", "llama-sql", "org/qwen"]
    assert json.loads(gateway_models_list(["a"], None, "5"))["data"][0]["created"] == 5
    with pytest.raises(Exception, match="gateway_routing"):
        routing_filter(MODELS, "many")
