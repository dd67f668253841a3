"""rollout_drained_baseline: the registered result of the pre-change benchmark (a drained node, before its change)
becomes the gate's baseline; a run that measured nothing now gives no figures and says why, so the rollout refuses
the node (rollout_require_baseline) instead of gating it against figures of another moment."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_node.vllm_node.plugins.filter.rollout_drained_baseline import rollout_drained_baseline

LEVELS = {"single": {"concurrency": 1, "ttft_ms_p50": 15.7, "output_tps": 96.5},
          "planned": {"concurrency": 4, "ttft_ms_p50": 243.0, "output_tps": 120.0}}
TIME = "2026-12-07T02:00:00+00:00"
RAN = {"changed": False, "levels": LEVELS, "previous": {"time": "2026-12-01T08:00:00+00:00"}, "wall_seconds": 12.5,
       "settings": {"num_prompts": 8}, "reused": "", "skipped_reason": ""}


def test_a_run_gives_its_figures_as_the_baseline_of_this_moment() -> None:
    record = rollout_drained_baseline(RAN, TIME)
    assert record == {"source": "drained", "time": TIME, "levels": LEVELS, "settings": {"num_prompts": 8},
                      "wall_seconds": 12.5, "failure": ""}
    assert "previous" not in record, "the kept record is not this baseline"


@pytest.mark.parametrize("result,why", [
    ({"failed": True, "msg": "vllm bench serve exited 1: boom "},
     "the benchmark failed: vllm bench serve exited 1: boom"),
    ({"skipped": True, "skip_reason": "Conditional result was False"}, "skipped (Conditional result was False)"),
    ({**RAN, "levels": {}, "skipped_reason": "check mode (the benchmark loads the server)"}, "did not run (check mode"),
    ({**RAN, "reused": "2026-12-01T08:00:00+00:00"}, "reused the figures of 2026-12-01T08:00:00+00:00"),
    ({**RAN, "levels": {}}, "measured no figures"),
])
def test_a_run_without_figures_of_this_moment_gives_none_and_says_why(result: dict, why: str) -> None:
    record = rollout_drained_baseline(result, TIME)
    assert record["levels"] == {} and record["settings"] == {}
    assert why in record["failure"], record["failure"]
    assert record["source"] == "drained" and record["time"] == TIME


def test_what_is_not_a_registered_result_is_refused_naming_the_filter() -> None:
    with pytest.raises(AnsibleFilterError, match="rollout_drained_baseline"):
        rollout_drained_baseline(["levels"], TIME)  # type: ignore[arg-type]
