"""The plan's whole per-GPU budget against public full start-up logs (issue 26), shared by the tests and the printer.

Each log in tests/unit/data/vllm-full-budget-logs.yaml states what vLLM measured for one GPU, tensor parallel size,
--gpu-memory-utilization, model and vLLM version: the weights per GPU ("Model loading took X GiB") and the KV cache
memory left ("Available KV cache memory: Y GiB"). The plan predicts both before any download; this module scores
it. Run directly for the table (PYTHONPATH=collections:tests/unit):

    .venv/bin/python tests/unit/sizing_fullbudget.py
"""

from __future__ import annotations

import functools
from typing import Any

import yaml

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.inputs import PlanInputs
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.plan import size
from repo_root import UNIT_DATA
from sizing_groundtruth import ROOT, load_releases

GiB = 1 << 30
MiB = 1 << 20
DATA = UNIT_DATA / "vllm-full-budget-logs.yaml"
WEIGHTS_TOLERANCE = 0.03       # |predicted / logged - 1| for "Model loading took"
KV_TOLERANCE = 0.05            # the same for "Available KV cache memory"
SAFETY_MARGIN = 0.02           # the plan's available KV may exceed vLLM's by at most this fraction, on any log
REQUIRED_SHARE = 0.90          # of all figures within their tolerance


@functools.cache
def _document() -> dict[str, Any]:
    with open(DATA, encoding="utf-8") as handle:
        return dict(yaml.safe_load(handle))


@functools.cache
def _gpus() -> dict[str, Any]:
    with open(ROOT / "roles" / "vllm_node" / "vars" / "main" / "gpus.yml", encoding="utf-8") as handle:
        return dict(yaml.safe_load(handle)["vllm_node_catalog_gpus"])


def load_logs() -> list[dict[str, Any]]:
    """The logs, each with its config and checkpoint bytes resolved."""
    doc = _document()
    out = []
    for log in doc["logs"]:
        entry = dict(log)
        entry["config_json"] = doc["configs"][log["config"]]
        entry["checkpoint_bytes"] = doc["checkpoints"][log["checkpoint"]]["bytes"]
        out.append(entry)
    return out


def plan_kwargs(log: dict[str, Any], releases: dict[str, Any]) -> dict[str, Any]:
    """The plan's inputs for one log: what the source states, nothing tuned per log."""
    kwargs: dict[str, Any] = {
        "releases": releases, "checkpoint_bytes": log["checkpoint_bytes"], "gpu_count": log["tp"],
        "tensor_parallel_size": log["tp"], "gpu_memory_utilization": log["util"],
        "vllm_version": log["vllm_version"], "max_model_len": log.get("max_model_len", "auto")}
    if "gpu" in log:
        kwargs["gpu"] = _gpus()[log["gpu"]]
    else:   # a GPU outside the catalog: nvidia-smi's total, as the preflight would pass it
        kwargs["gpu_memory_bytes"] = int(log["gpu_memory_mib"]) * MiB
        kwargs["compute_capability"] = log["compute_capability"]
        kwargs["gpu_name"] = log["gpu_name"]
    kwargs.update(log.get("knobs") or {})
    return kwargs


def predict(log: dict[str, Any], releases: dict[str, Any] | None = None) -> tuple[float, float, int]:
    """(weights GiB per GPU, available KV GiB, KV bytes per token per GPU) the plan predicts; the KV may be < 0."""
    sized = size(PlanInputs.from_kwargs(log["config_json"], **plan_kwargs(log, releases or load_releases())))
    return sized.weights / GiB, sized.available / GiB, int(sized.layout.bytes_per_token)


def logged_kv_gib(expect: dict[str, Any], bytes_per_token: int) -> float | None:
    """The available KV the log states: in GiB, or a full-attention pool in tokens x bytes per token."""
    if "available_kv_gib" in expect:
        return float(expect["available_kv_gib"])
    if "kv_tokens" in expect:
        return int(expect["kv_tokens"]) * bytes_per_token / GiB
    return None


def rows(releases: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per logged figure: log, quantity, logged, predicted, error (fraction), within, over (safety)."""
    out = []
    for log in load_logs():
        weights, kv, per_token = predict(log, releases)
        expect = log["expect"]
        if "weights_gib" in expect:
            logged = float(expect["weights_gib"])
            error = weights / logged - 1
            out.append({"log": log["id"], "source": log["source_url"], "quantity": "weights_gib",
                        "logged": logged, "predicted": weights, "error": error,
                        "within": abs(error) <= WEIGHTS_TOLERANCE, "over": 0.0})
        logged_kv = logged_kv_gib(expect, per_token)
        if logged_kv is not None:
            logged = logged_kv
            if logged > 0:
                error = kv / logged - 1
                within = abs(error) <= KV_TOLERANCE
            else:   # vLLM found no room: the plan must not find any either
                error = kv - logged
                within = kv <= 0
            out.append({"log": log["id"], "source": log["source_url"], "quantity": "available_kv_gib",
                        "logged": logged, "predicted": kv, "error": error, "within": within,
                        "over": (kv - logged) / abs(logged) if logged else kv})
    return out


def score(table: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures within tolerance, their share, and the worst over-prediction of the available KV."""
    within = sum(1 for r in table if r["within"])
    kv = [r for r in table if r["quantity"] == "available_kv_gib"]
    worst = max(kv, key=lambda r: r["over"])
    return {"figures": len(table), "within": within, "share": within / len(table),
            "worst_over": worst["over"], "worst_over_log": worst["log"],
            "logs": len({r["log"] for r in table}), "sources": len({r["source"].split("/blob/")[0] for r in table})}


def main() -> None:
    table = rows()
    print(f"{'log':44} {'quantity':17} {'logged':>9} {'predicted':>10} {'error':>9}  within")
    for r in table:   # a logged KV <= 0 (vLLM found no room) is compared in GiB: the plan must find none either
        error = f"{r['error']:+.2f} GiB" if r["logged"] <= 0 else f"{r['error'] * 100:+.1f} %"
        print(f"{r['log']:44} {r['quantity']:17} {r['logged']:>9.2f} {r['predicted']:>10.2f} {error:>9}  "
              f"{'yes' if r['within'] else 'NO'}")
    s = score(table)
    print(f"\n{s['within']} of {s['figures']} figures within tolerance ({s['share'] * 100:.0f} %), {s['logs']} logs, "
          f"{s['sources']} sources; worst KV over-prediction {s['worst_over'] * 100:+.1f} % ({s['worst_over_log']})")


if __name__ == "__main__":
    main()
