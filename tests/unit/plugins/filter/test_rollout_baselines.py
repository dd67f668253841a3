"""rollout_baselines: each restarting instance's benchmark record from the rollout's slurp loop; an instance without
one (no file, no figures) is left out, so the rollout can name it; a broken record is refused naming its file."""
from __future__ import annotations

import base64
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_node.vllm_node.plugins.filter.rollout_baselines import rollout_baselines

LEVELS = {"single": {"output_tps": 41.0}, "concurrent": {"output_tps": 96.5}}


def read(name: str, record: object) -> dict:
    """One slurp result that read the instance's record."""
    return {"item": name, "source": f"/var/lib/vllm-node/benchmark-last-{name}.json",
            "content": base64.b64encode(json.dumps(record).encode()).decode()}


def missing(name: str) -> dict:
    """One slurp result of a file that is not there (failed_when: false)."""
    return {"item": name, "failed": False, "msg": "file not found: /var/lib/vllm-node/benchmark-last-x.json"}


def test_each_instance_keeps_its_own_record() -> None:
    chat = {"time": "2026-12-06T20:00:00Z", "levels": LEVELS}
    mla = {"time": "2026-12-06T21:00:00Z", "levels": {"single": {"output_tps": 7.5}}}
    assert rollout_baselines([read("chat", chat), read("mla", mla)]) == {"chat": chat, "mla": mla}


def test_an_instance_without_a_record_or_figures_is_left_out() -> None:
    chat = {"time": "t", "levels": LEVELS}
    got = rollout_baselines([missing("mla"), read("chat", chat), read("empty", {"time": "t", "levels": {}})])
    assert got == {"chat": chat}
    assert rollout_baselines([]) == {}


@pytest.mark.parametrize("content", [base64.b64encode(b"{not json").decode(), "!!not base64!!",
                                     base64.b64encode(b"[1, 2]").decode()])
def test_a_broken_record_is_refused_naming_its_file(content: str) -> None:
    with pytest.raises(AnsibleFilterError, match="benchmark-last-chat.json"):
        rollout_baselines([{"item": "chat", "source": "/var/lib/vllm-node/benchmark-last-chat.json",
                            "content": content}])
