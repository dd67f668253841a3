"""The sizing maths against real vLLM start-up reports (error table: `python tests/unit/sizing_groundtruth.py`)."""

from __future__ import annotations

import pytest

import sizing_groundtruth as gt
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.versions import rule

ROWS = gt.rows()
COMPARED = [r for r in ROWS if r["expected"] is not None]
EXCLUDED = {r["case"]: r["note"] for r in ROWS if r["source"] == "excluded"}


def test_every_case_has_a_rule():
    """A new report in the ground-truth file must be classified, not silently skipped."""
    assert not [r["case"] for r in ROWS if r["source"] == "-"]
    assert {c["id"] for c in gt.load_cases()} == set(gt.CASE_RULES)


def test_added_cases_cite_their_source_and_version():
    for case in gt.EXTRA_CASES:
        assert case["source_url"].startswith("https://") and case["vllm_version"], case["id"]


def test_enough_numbers_are_compared():
    assert len(COMPARED) >= 25
    assert len({r["case"] for r in COMPARED}) >= 13


@pytest.mark.parametrize("row", COMPARED, ids=[f"{r['case']}:{r['source']}:{r['quantity']}" for r in COMPARED])
def test_reproduces_within_one_percent(row):
    assert row["error"] <= gt.TOLERANCE, (
        f"{row['case']} {row['quantity']}: expected {row['expected']}, predicted {row['predicted']} "
        f"({row['error'] * 100:.2f} %)")


def test_excluded_cases_are_the_documented_ones():
    # Excluded entirely: DeepSeek-V4 (unmodelled). Partly excluded cases keep their 0.33 prediction rows and
    # carry their reason in CASE_RULES["why"].
    assert set(EXCLUDED) == {"vllm-44376-comment"}
    for case_id, rules in gt.CASE_RULES.items():
        if not rules["expect"] or rules.get("unmodelled"):
            assert rules.get("why"), f"{case_id} drops its expect numbers without saying why"


def test_unmodelled_deepseek_v4_is_refused_not_guessed():
    case = next(c for c in gt.load_cases() if c["id"] == "vllm-44376-comment")
    with pytest.raises(ValueError, match="compress_ratios"):
        gt.vm.kv_cache_bytes(case["config"], 30000, tensor_parallel_size=2, kv_cache_dtype="fp8")


def test_error_table_has_no_worse_row_than_half_a_percent():
    """Tighter than the contract: the worst row today is 0.40 % (vllm-28228 concurrency at ~0.11 rules)."""
    assert max(r["error"] for r in COMPARED) < 0.005


def test_a_pool_taken_from_logged_tokens_prints_those_tokens():
    """Cases without an available-KV line take the pool from the logged token count: it must print that count."""
    releases = gt.load_releases()
    for case in gt.load_cases():
        rules = gt.CASE_RULES[case["id"]]
        if not rules.get("available_from_tokens"):
            continue
        kwargs = dict(gt._kwargs(case, rules), releases=releases, vllm_version=rules["version"])
        pool = gt._pool_from_tokens(case, gt._kwargs(case, rules), releases, rules["version"])
        length = case["expect"]["max_model_len"]
        assert gt.vm.kv_cache_tokens(case["config"], pool, length, **kwargs) == case["expect"]["kv_tokens"]


def test_the_mtp_hybrid_case_needs_the_speculative_model():
    """Issue 15's 27B hybrid with MTP n=3: within 0.3 % with the drafter modelled, +11 % without it."""
    case = next(c for c in gt.load_cases() if c["id"] == "club3090-594-qwen36-27b-mtp")
    rules = gt.CASE_RULES[case["id"]]
    kwargs = dict(gt._kwargs(case, rules), releases=gt.load_releases(), vllm_version=rules["version"])
    available, length = int(case["expect"]["available_kv_gib"] * gt.GiB), case["expect"]["max_model_len"]
    logged = case["expect"]["kv_tokens"]
    with_mtp = gt.vm.kv_cache_tokens(case["config"], available, length, **kwargs)
    without = gt.vm.kv_cache_tokens(case["config"], available, length, **dict(kwargs, speculative_config=None))
    assert abs(with_mtp - logged) / logged < 0.005
    assert (without - logged) / logged > 0.10


# (source, vLLM version, logged tokens, printed concurrency, max_model_len): start-up lines without the available
# KV memory, which still pin the token formula: the per-group count is a multiple of the block size and does not
# follow the printed concurrency; the concurrency formula prints int(concurrency x length).
FORMULA_LOGS = [
    ("vllm#39734 gemma-4-31B-it", "0.19.1", 37392, 1.53, 262144),
    ("vllm#39866 gemma-4-26B-A4B fp8", "0.19.1", 78256, 2.15, 262144),
    ("vllm#40691 Qwen3.5-27B", "0.19.0", 290864, 33.04, 32768),
    ("club-3090#91 qwen3.6-27b mtp3", "0.20.1", 619479, 2.36, 262144),
    ("club-3090#594 qwen3.6-27b mtp3", "0.24.0", 300220, 1.15, 262144),
]


@pytest.mark.parametrize(("source", "version", "tokens", "concurrency", "length"), FORMULA_LOGS,
                         ids=[f[0] for f in FORMULA_LOGS])
def test_the_token_formula_rule_matches_what_each_version_logged(source, version, tokens, concurrency, length):
    formula = rule(gt.load_releases(), "kv_cache_tokens_formula", version)
    if formula == "concurrency":
        assert round(tokens / length, 2) == concurrency, source
    else:
        assert formula == "per_group_blocks"
        assert tokens % 16 == 0 and round(tokens / length, 2) != concurrency, source
