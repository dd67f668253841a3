"""module_utils/lora_sync against a stand-in of vLLM's runtime LoRA API (harness.backends.FakeVllm): missing
adapters are loaded, removed ones unloaded, a moved one reloaded; a second run and check mode send no POST; vLLM's
refusals come back with the adapter named; the diff from any served set to any wanted set lands on the wanted set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import lora_sync as ls
from harness.backends import FakeVllm

KEY = "sync-test-key"


@pytest.fixture
def vllm() -> Iterator[FakeVllm]:
    server = FakeVllm(api_key=KEY, adapters={"old": "/a/old/1", "kept": "/a/kept/1", "moved": "/a/moved/1"}).start()
    yield server
    server.stop()


WANTED = [{"name": "kept", "path": "/a/kept/1"}, {"name": "moved", "path": "/a/moved/2"},
          {"name": "new", "path": "/a/new/1"}]


def test_sync_loads_the_missing_unloads_the_removed_and_reloads_the_moved(vllm: FakeVllm) -> None:
    result = ls.sync(ls.http_request(vllm.url, KEY), WANTED)
    assert result["changed"] is True
    assert result["unloaded"] == ["moved", "old"] and result["loaded"] == ["moved", "new"]
    assert vllm.adapters == {"kept": "/a/kept/1", "moved": "/a/moved/2", "new": "/a/new/1"}
    assert vllm.posts() == [("/v1/unload_lora_adapter", {"lora_name": "moved"}),
                            ("/v1/unload_lora_adapter", {"lora_name": "old"}),
                            ("/v1/load_lora_adapter", {"lora_name": "moved", "lora_path": "/a/moved/2"}),
                            ("/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/a/new/1"})]
    assert "old /a/old/1\n" in result["diff"]["before"] and "new /a/new/1\n" in result["diff"]["after"]
    # the second run: nothing to do, nothing sent but the read
    vllm.calls.clear()
    again = ls.sync(ls.http_request(vllm.url, KEY), WANTED)
    assert again["changed"] is False and again["loaded"] == again["unloaded"] == []
    assert [(m, p) for m, p, _ in vllm.calls] == [("GET", "/v1/models")]


def test_check_mode_reports_the_change_and_sends_nothing(vllm: FakeVllm) -> None:
    before = dict(vllm.adapters)
    result = ls.sync(ls.http_request(vllm.url, KEY), WANTED, check_mode=True)
    assert result["changed"] is True and result["loaded"] == ["moved", "new"]
    assert result["adapters"] == ["kept", "moved", "new"]
    assert vllm.adapters == before and vllm.posts() == []


def test_an_empty_list_unloads_every_adapter_and_leaves_the_base(vllm: FakeVllm) -> None:
    result = ls.sync(ls.http_request(vllm.url, KEY), [])
    assert result["unloaded"] == ["kept", "moved", "old"] and vllm.adapters == {}
    assert result["diff"]["after"] == ""


def test_a_refused_load_names_the_adapter_and_vllms_reason(vllm: FakeVllm) -> None:
    vllm.refuse["new"] = (400, "Loading lora new failed: No adapter found for /a/new/1")
    with pytest.raises(ls.SyncError, match=r"vLLM refused to load adapter new from /a/new/1 \(400\): Loading lora "
                                           r"new failed: No adapter found"):
        ls.sync(ls.http_request(vllm.url, KEY), WANTED)


def test_a_wrong_key_and_no_server_are_one_message_each(vllm: FakeVllm) -> None:
    with pytest.raises(ls.SyncError, match="GET /v1/models answered 401"):
        ls.sync(ls.http_request(vllm.url, "wrong"), WANTED)
    vllm.stop()
    with pytest.raises(ls.SyncError, match=f"cannot reach vLLM at {vllm.url}"):
        ls.sync(ls.http_request(vllm.url, KEY, timeout=5), WANTED)


def test_a_name_twice_or_without_a_path_is_refused_before_any_request() -> None:
    def no_request(method: str, path: str, body: object) -> tuple[int, str]:
        raise AssertionError("no request expected")
    with pytest.raises(ls.SyncError, match="adapter a is listed twice"):
        ls.sync(no_request, [{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}])
    with pytest.raises(ls.SyncError, match="needs a name and a path"):
        ls.sync(no_request, [{"name": "a"}])


def test_the_base_is_not_an_adapter() -> None:
    models = {"data": [{"id": "base", "root": "/m", "parent": None}, {"id": "a", "root": "/a", "parent": "base"}]}
    assert ls.served_adapters(models) == {"a": "/a"}
    with pytest.raises(ls.SyncError, match="did not answer a model list"):
        ls.served_adapters({"detail": "Not Found"})


adapter_sets = st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["/p/1", "/p/2"]), max_size=6)


@given(adapter_sets, adapter_sets)
def test_the_plan_lands_any_served_set_on_the_wanted_set(served: dict[str, str], wanted: dict[str, str]) -> None:
    plan = ls.plan_sync(served, wanted)
    after = {k: v for k, v in served.items() if k not in plan.unload}
    assert not set(dict(plan.load)) & set(after), "a load never meets a name still loaded (vLLM answers 400)"
    after.update(plan.load)
    assert after == wanted
    assert plan.changed is (served != wanted)
