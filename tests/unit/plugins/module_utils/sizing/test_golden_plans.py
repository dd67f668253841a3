"""The sizing package reproduces, byte for byte, the plans and refusals of the single-file module it replaced
(tests/unit/data/sizing_plans_golden.json: every catalog model x 8 GPU setups x 16 knob sets, cpu, the story)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import sizing_golden
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import SizingError, memory_plan

GOLDEN = sizing_golden.load_golden()


@pytest.fixture(scope="module")
def produced() -> dict[str, str]:
    from sizing_groundtruth import load_releases

    return sizing_golden.run(memory_plan, SizingError, load_releases())


def test_the_grid_is_the_recorded_one(produced: dict[str, str]) -> None:
    assert sorted(produced) == sorted(GOLDEN)
    assert len(GOLDEN) > 1000
    refused = [k for k, v in GOLDEN.items() if json.loads(v).keys() == {"error"}]
    assert 100 < len(refused) < len(GOLDEN) - 500   # both outcomes are covered


@pytest.mark.parametrize("model", sorted({k.split("|")[0] for k in GOLDEN}))
def test_plans_are_byte_identical(produced: dict[str, str], model: str) -> None:
    cases = [k for k in GOLDEN if k.split("|")[0] == model]
    differ = [k for k in cases if produced[k] != GOLDEN[k]]
    assert not differ, f"{len(differ)} of {len(cases)} plans differ, first {differ[0]}:\n" \
        f"recorded: {GOLDEN[differ[0]][:400]}\nproduced: {produced[differ[0]][:400]}"


def test_story_is_in_the_grid() -> None:
    story: dict[str, Any] = json.loads(GOLDEN["story|0"])
    assert story["fits"] is False
    assert "bf16 KV needs 17.16 GiB per GPU for 262,144 tokens" in story["checks"][-1]["message"]
