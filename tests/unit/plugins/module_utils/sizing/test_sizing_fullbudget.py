"""The plan's whole per-GPU budget (weights and available KV) against public full start-up logs (issue 26).

Table: `PYTHONPATH=collections:tests/unit .venv/bin/python tests/unit/sizing_fullbudget.py`.
"""

from __future__ import annotations

import pytest

import sizing_fullbudget as fb
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.budget import (
    activation_peak,
    mxfp4_padding_bytes,
    torch_total,
)
from sizing_groundtruth import load_releases

ROWS = fb.rows()
SCORE = fb.score(ROWS)
# What the set scores now (34 of 37, 92 %; 33 before the FlashInfer sampler counted through 0.11.0 and the dense MLP
# floor, 32 before the profile peak lost its flat 0.5 GiB floor, 22 of 27 before the A100 logs, the per-rank MXFP4
# padding, the FlashInfer sampler rule and the A100 40GB in the catalog): a later change may only do better. Every
# miss is listed in MISSES with its reason, and every one of them errs low (the safety test below). The three left
# have the same cause: no vLLM behaviour the plan lacks, but its three allowances (the 1 % weights margin, the
# sampler's 10 copies against ~9.6-9.7 logged, 0.25 GiB non-torch growth against 0.13-0.14) add up to 0.9-1.3 GiB
# on pools of 1.7-4.5 GiB, where 5 % is 0.09-0.22 GiB; without the margin they still miss and others go over.
FLOOR_WITHIN = 34
MISSES = {
    "llmd-h100-qwen3-32b-tp1:available_kv_gib": "4.45 GiB left of 71.26: the 1 % weights margin (0.61 GiB), the "
                                                "sampler's 10 copies against the 9.7 logged and the non-torch margin "
                                                "are 22 % of it (errs low)",
    "llmd-h100-gpt-oss-120b:available_kv_gib": "3.33 GiB left of 75.22 (the row adds up at utilization 0.95): the "
                                               "weights margin and the card's checkpoint size (+0.81 GiB), the "
                                               "sampler's 10 copies against 9.6 (+0.29) and the non-torch margin "
                                               "(+0.12) are 38 % of it (errs low)",
    "vllm-27508-gpt-oss-120b-h100:available_kv_gib": "a pip/conda install: Marlin's layout, as the log's own figures "
                                                     "say (75.22 - 1.71 - ~7.5 of sampler and non-torch = ~66.0 GiB "
                                                     "of weights, vllm#23278's Marlin load); the same three "
                                                     "allowances are 1.0 GiB of a 1.71 GiB pool (errs low)",
}


def test_every_log_cites_its_source_version_and_words() -> None:
    for log in fb.load_logs():
        assert log["source_url"].startswith("https://"), log["id"]
        assert log["vllm_version"] and log["quote"] and log["expect"], log["id"]
        assert set(log["expect"]) <= {"weights_gib", "available_kv_gib", "kv_tokens"}, log["id"]


def test_the_set_is_broad_and_has_blackwell() -> None:
    assert SCORE["logs"] >= 15 and SCORE["sources"] >= 8 and SCORE["figures"] >= 25
    gpus = {log.get("gpu") for log in fb.load_logs()}
    assert {"rtx-pro-6000-blackwell", "rtx-5090"} <= gpus and {"h100-80gb", "a100-80gb", "a100-40gb"} <= gpus


def test_safety_the_plan_never_finds_more_kv_than_vllm_had() -> None:
    """The story's failure mode: "fits" where vLLM fails at load. Never more than 2 % above vLLM's figure."""
    kv = [r for r in ROWS if r["quantity"] == "available_kv_gib"]
    over = [(r["log"], round(r["over"] * 100, 2)) for r in kv if r["over"] > fb.SAFETY_MARGIN]
    assert not over
    for row in kv:   # vLLM found no room: neither may the plan
        if row["logged"] <= 0:
            assert row["predicted"] <= 0, row["log"]


def test_every_available_kv_miss_errs_low() -> None:
    """Where the plan misses vLLM's available KV by more than the tolerance, it is below vLLM's figure, never above."""
    misses = [r for r in ROWS if r["quantity"] == "available_kv_gib" and not r["within"]]
    assert misses and all(r["predicted"] < r["logged"] for r in misses), [r["log"] for r in misses]


def test_the_flashinfer_sampler_counts_only_where_the_release_uses_it() -> None:
    """FlashInfer installed: vLLM 0.9.1-0.11.0 (on unless VLLM_USE_FLASHINFER_SAMPLER=0) and 0.24+ sample without
    sorting the vocab; 0.11.1-0.23 sort anyway (FlashInfer's sampler became opt-in in 0.11.1). Unknown (the default)
    charges the sort: less KV, never more."""
    releases = load_releases()
    log = next(entry for entry in fb.load_logs() if entry["id"] == "dennislee-a100-qwen2-7b-util050")
    assert log["knobs"]["flashinfer_sampler"] is True
    unknown = dict(log, knobs={k: v for k, v in log["knobs"].items() if k != "flashinfer_sampler"})
    versions = ("0.9.0", "0.10.1", "0.11.0", "0.11.1", "0.23.0", "0.24.0")
    kv = {(version, fi): fb.predict(dict(entry, vllm_version=version), releases)[1]
          for version in versions for fi, entry in ((True, log), (False, unknown))}
    sampler_gib = 256 * 152064 * 4 * 8 / fb.GiB   # 10 copies against 2
    for version in ("0.10.1", "0.11.0"):
        assert kv[version, True] - kv[version, False] == pytest.approx(sampler_gib, abs=0.01), version
    for version in ("0.9.0", "0.11.1", "0.23.0", "0.24.0"):
        assert kv[version, True] == pytest.approx(kv[version, False], abs=1e-9), version


def test_the_gpt_oss_120b_row_adds_up_at_its_utilization() -> None:
    """vLLM 0.11.0: available KV = torch total x utilization - weights - torch peak - non-torch (gpu_worker.py
    determine_available_memory). llm-d's gpt-oss-120b row (64.38, 7.38, 0.13, 3.33 GiB, SUCCESS) adds up at 0.95 of
    79.18 GiB; at the campaign's 0.9 it leaves no room, and vLLM would have refused to start."""
    log = next(entry for entry in fb.load_logs() if entry["id"] == "llmd-h100-gpt-oss-120b")
    used = 64.38 + 7.38 + 0.13 + log["expect"]["available_kv_gib"]
    assert log["util"] == 0.95 and used == pytest.approx(0.95 * 79.18, abs=0.01)
    assert 0.9 * 79.18 - (64.38 + 7.38 + 0.13) < 0


def test_a_wide_dense_mlp_sets_the_forward_peak() -> None:
    """LlamaMLP holds gate_up's [tokens, 2 x intermediate / TP] and SiluAndMul's [tokens, intermediate / TP] at once:
    for Mistral-Small-3.2-24B (intermediate 32,768 = 6.4 x hidden) at 8,192 tokens that is 1.5 GiB, above the
    hidden-state estimate (1.25), and with FlashInfer's sampler (2 copies, vLLM 0.11.0) the largest phase; a MoE model
    and a config without intermediate_size take no floor."""
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.budget import Batch, dense_mlp_bytes
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.model import model_shape

    releases = load_releases()
    docs = fb._document()["configs"]
    mistral = model_shape(docs["mistral-small-3.2-24b"])
    assert dense_mlp_bytes(mistral, 8192) == 8192 * 3 * 32768 * 2
    assert dense_mlp_bytes(mistral, 8192, 2) == 8192 * 3 * 16384 * 2
    peak, text = activation_peak(mistral, Batch(8192, 1024), releases, 1, "0.11.0", flashinfer=True)
    assert peak == int(1.5 * fb.GiB + 0.25 * fb.GiB) and text.count("dense MLP 1.50") == 1
    assert dense_mlp_bytes(model_shape(docs["gpt-oss-120b"]), 8192) == 0
    assert dense_mlp_bytes(model_shape(docs["llama-3.1-8b"]), 8192) == 0   # not stated in the config
    row = next(r for r in ROWS if r["log"] == "llmd-h100-mistral-small-3.2-24b" and r["quantity"] == "available_kv_gib")
    assert row["within"] and row["over"] <= fb.SAFETY_MARGIN
    without, _ = activation_peak(mistral, Batch(8192, 1024), releases, 1, "0.11.0", flashinfer=False)
    assert without > peak   # unknown FlashInfer: the sort's 10 copies (5 GiB) are charged


def test_figures_within_tolerance_do_not_regress() -> None:
    within = SCORE["within"]
    misses = {f"{r['log']}:{r['quantity']}" for r in ROWS if not r["within"]}
    assert misses <= set(MISSES), f"new misses: {sorted(misses - set(MISSES))}"
    assert within >= FLOOR_WITHIN, f"{within} of {SCORE['figures']} within tolerance (was {FLOOR_WITHIN})"


@pytest.mark.parametrize("row", [r for r in ROWS if r["quantity"] == "weights_gib"],
                         ids=lambda r: r["log"])
def test_weights_within_three_percent(row: dict) -> None:
    assert row["within"], f"{row['log']}: {row['predicted']:.2f} GiB vs {row['logged']} ({row['error'] * 100:+.1f} %)"


def test_the_old_sampler_estimate_over_predicted_the_kv_cache() -> None:
    """With the sampler warm-up at 2 logits copies on vLLM 0.11 (the estimate before issue 26), Llama-3.1-8B on
    H100 gets more KV than vLLM had; with nvidia-smi's total instead of torch's it gets more still."""
    releases = load_releases()
    log = next(entry for entry in fb.load_logs() if entry["id"] == "llmd-h100-llama-3.1-8b")
    _, kv, _ = fb.predict(log, releases)
    _, kv_old, _ = fb.predict(log, dict(releases, sampler_logits_copies=[{"since": "0.0.0", "value": 2}]))
    assert kv <= 51.38 * (1 + fb.SAFETY_MARGIN) < kv_old
    smi = dict(fb.plan_kwargs(log, releases), gpu={k: v for k, v in fb._gpus()["h100-80gb"].items()
                                                   if k != "torch_memory_gib"})
    smi_releases = dict(releases, sizing_estimates=dict(releases["sizing_estimates"], torch_invisible_gib=0))
    smi["releases"] = smi_releases
    sized = fb.size(fb.PlanInputs.from_kwargs(log["config_json"], **smi))
    torch_gib = fb._gpus()["h100-80gb"]["torch_memory_gib"]
    assert sized.available / fb.GiB - kv == pytest.approx(0.9 * (81559 / 1024 - torch_gib), abs=0.01)


def test_torch_total_comes_from_the_catalog_or_errs_low() -> None:
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.inputs import PlanInputs, resolve_device

    releases = load_releases()
    gpu = fb._gpus()["rtx-pro-6000-blackwell"]
    inputs = PlanInputs.from_kwargs({}, releases=releases, gpu=gpu)
    total, text = torch_total(inputs, resolve_device(inputs))
    assert total == round(94.97 * fb.GiB) and "catalog" in text
    bare = PlanInputs.from_kwargs({}, releases=releases, gpu={"memory_mib": 97887})
    total, text = torch_total(bare, resolve_device(bare))
    assert total == 97887 * fb.MiB - fb.GiB and "assumed" in text   # more than any measured difference (0.71 GiB)


def test_the_profile_phases_peak_one_at_a_time() -> None:
    """Encoder, forward and sampler run in turn and free their activations: the peak is the largest, not the sum."""
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.budget import Batch
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.model import model_shape

    releases = load_releases()
    config = fb._document()["configs"]["llama-3.1-8b"]
    shape = model_shape(config)
    small, _ = activation_peak(shape, Batch(8192, 1), releases, 1, "0.11.0")
    large, text = activation_peak(shape, Batch(8192, 1024), releases, 1, "0.11.0")
    sampler = 1024 * 128256 * 4 * 10
    assert large - small == pytest.approx(sampler - 8192 * 4096 * 2 * 16, abs=1 << 20)
    assert "sampler warm-up of 1,024 requests (the largest phase" in text
    two_ranks, text2 = activation_peak(shape, Batch(8192, 1024), releases, 2, "0.11.0")
    assert two_ranks - large == round(0.42 * fb.GiB) and "TP 2 communication buffers" in text2
    eight_ranks, _ = activation_peak(shape, Batch(8192, 1024), releases, 8, "0.11.0")
    assert eight_ranks - large == pytest.approx(7 * 0.42 * fb.GiB, abs=8)   # per peer: the steeper extrapolation


def test_the_profile_peak_has_no_flat_floor() -> None:
    """vLLM's non-KV memory is the weights + the torch peak *allocated* + the non-torch growth (memory_profiling reads
    allocated_bytes.all.peak): no allocator slack. The peak is the largest phase + non-torch growth + comm, nothing
    else; with a 0.5 GiB floor Qwen2-7B at utilization 0.25 on A100 (5.01 GiB logged) missed low by 11 %."""
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.budget import Batch
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.model import model_shape

    releases = load_releases()
    shape = model_shape(fb._document()["configs"]["qwen2-7b"])
    peak, _ = activation_peak(shape, Batch(2048, 256), releases, 1, "0.10.1", flashinfer=True)
    sampler = 256 * 152064 * 4 * 2
    forward = 2048 * 3584 * 2 * 16
    assert sampler > forward
    assert peak == int(sampler + 0.25 * fb.GiB)
    row = next(r for r in ROWS if r["log"] == "dennislee-a100-qwen2-7b-util025" and r["quantity"] == "available_kv_gib")
    assert row["within"] and row["predicted"] < row["logged"]


def test_mxfp4_on_hopper_is_marlin_unless_triton_kernels_is_known() -> None:
    """vLLM picks the Triton MXFP4 backend on Hopper only where triton_kernels is installed, else Marlin (hidden and
    the rank's intermediate padded). Unknown charges Marlin: vllm#27508 (a pip/conda install) had 1.71 GiB left; with
    Triton's lighter weights the plan would find more than vLLM had."""
    from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.model import model_shape

    releases = load_releases()
    config = fb._document()["configs"]["gpt-oss-120b"]
    shape = model_shape(config)
    marlin = mxfp4_padding_bytes(config, shape, "9.0", releases, "0.11.0", 1)
    triton = mxfp4_padding_bytes(config, shape, "9.0", releases, "0.11.0", 1, triton_kernels=True)
    per_expert = 36 * 128 * 3 * 4.25 / 8
    assert marlin == int(per_expert * (3072 * 2944 - 2880 * 2880))
    assert triton == int(per_expert * (3072 * 2880 - 2880 * 2880))
    assert mxfp4_padding_bytes(config, shape, "8.0", releases, "0.11.0", 1, triton_kernels=True) == marlin
    log = next(entry for entry in fb.load_logs() if entry["id"] == "vllm-27508-gpt-oss-120b-h100")
    assert "mxfp4_triton_kernels" not in (log.get("knobs") or {})
    _, kv, _ = fb.predict(log)
    _, kv_triton, _ = fb.predict(dict(log, knobs=dict(log["knobs"], mxfp4_triton_kernels=True)))
    assert kv < 1.71 < 1.71 * (1 + fb.SAFETY_MARGIN) < kv_triton
