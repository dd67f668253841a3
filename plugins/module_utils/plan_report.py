"""The plan as a picture: the data of the per-GPU memory chart and the static HTML page that draws it.

Pure functions of the plan (the preflight role's vllm_node_plan, as written to artifacts/plan-<host>.json) and,
when one exists, the inference check's report (what vLLM itself logged at start-up); and the check's own page (the
serving benchmark's latency percentiles). The pages are rendered from Jinja2 templates with the charting library
inlined, so they work offline.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
from markupsafe import Markup

GIB = 1024 ** 3

# The planned stack, bottom to top: what vLLM's budget (gpu-memory-utilization x GPU memory) holds first, then the
# part of the KV cache the request needs beyond that budget (non-zero only when the plan does not fit), then what
# stays outside the budget. Key, legend label, the plan's per_gpu field (None: computed).
PLANNED_SEGMENTS: tuple[tuple[str, str, str | None], ...] = (
    ("weights", "Weights", "weights_bytes"),
    ("activation_peak", "Activation peak", "activation_peak_bytes"),
    ("cudagraph", "CUDA graphs", "cudagraph_bytes"),
    ("kv_cache", "KV cache", "kv_cache_bytes"),
    ("kv_over_budget", "KV cache needed beyond the budget", None),
    ("non_torch", "CUDA context + NCCL", "non_torch_bytes"),
    ("headroom", "Headroom", "headroom_bytes"),
)
# What the inference check read from vLLM's start-up log, per rank: key, legend label, the report's startup list.
REPORTED_SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("weights", "Weights (vLLM reported)", "model_loading_bytes"),
    ("kv_cache", "KV cache (vLLM reported)", "available_kv_cache_bytes"),
)


def _bytes(value: Any, where: str) -> int:
    """A byte count from the plan, or ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{where} must be a byte count (a number >= 0), got {value!r}: pass the plan JSON "
                         "the preflight role wrote (vllm_node_plan)")
    return int(value)


def kv_over_budget_bytes(plan: dict[str, Any]) -> int:
    """Bytes of KV cache the requested context needs beyond what the budget leaves for it (0 when it fits)."""
    kv = plan.get("kv") or {}
    needed = _bytes(kv.get("needed_bytes", 0), "kv.needed_bytes")
    available = _bytes(kv.get("available_bytes", 0), "kv.available_bytes")
    return max(0, needed - available) if not plan.get("fits", True) else 0


def _reported(check: dict[str, Any] | None, gpus: int) -> dict[str, list[int | None]]:
    """Per-rank figures vLLM logged (check report's startup lists), None where a rank logged nothing."""
    startup = (check or {}).get("startup") or {}
    out: dict[str, list[int | None]] = {}
    for key, _label, field in REPORTED_SEGMENTS:
        values = startup.get(field) or []
        if not isinstance(values, list):
            raise ValueError(f"check report startup.{field} must be a list of byte counts, got {values!r}")
        out[key] = [_bytes(values[i], f"startup.{field}[{i}]") if i < len(values) else None for i in range(gpus)]
    return out


def memory_chart(plan: dict[str, Any], check: dict[str, Any] | None = None) -> dict[str, Any]:
    """The per-GPU stacked memory chart's data, in bytes: one planned stack per GPU, plus vLLM's reported figures.

    The plan's figures are per GPU (the most loaded rank), so each of the plan's gpu_count GPUs gets the same
    planned stack; the reported stack is per rank as vLLM logged it (absent without a check report).
    Raises ValueError when the plan lacks the fields the preflight role writes.
    """
    if not isinstance(plan, dict) or not isinstance(plan.get("per_gpu"), dict):
        raise ValueError("plan must be the plan JSON the preflight role wrote (a dict with per_gpu and kv), got "
                         f"{type(plan).__name__}")
    per_gpu = plan["per_gpu"]
    gpus = plan.get("gpu_count")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"plan gpu_count must be an integer >= 1, got {gpus!r}")
    planned: dict[str, int] = {}
    for key, _label, field in PLANNED_SEGMENTS:
        planned[key] = (kv_over_budget_bytes(plan) if field is None
                        else _bytes(per_gpu.get(field, 0), f"per_gpu.{field}"))
    reported = _reported(check, gpus) if check else {}
    return {
        "gpus": [f"GPU {i}" for i in range(gpus)],
        "fits": bool(plan.get("fits")),
        "budget_bytes": _bytes(per_gpu.get("requested_bytes", 0), "per_gpu.requested_bytes"),
        "total_bytes": _bytes(per_gpu.get("total_bytes", 0), "per_gpu.total_bytes"),
        "kv_needed_bytes": _bytes((plan.get("kv") or {}).get("needed_bytes", 0), "kv.needed_bytes"),
        "planned": [{"key": key, "label": label, "bytes": [planned[key]] * gpus}
                    for key, label, _field in PLANNED_SEGMENTS],
        "reported": [{"key": key, "label": label, "bytes": reported[key]}
                     for key, label, _field in REPORTED_SEGMENTS if any(v is not None for v in reported.get(key, []))],
    }


def instances_chart(plan: dict[str, Any]) -> dict[str, Any]:
    """The per-GPU chart of a split (vllm_node_instances): on every GPU of the node, what each instance on it takes
    (its budget's segments and its CUDA context + NCCL; the memory torch never sees counted with the first instance
    only), one instance above the other, then what stays free of the GPU (its total less the plan's used_bytes). An
    instance the plan refused draws nothing. The same shape as memory_chart, each segment naming its instance."""
    gpus = plan.get("gpu_count")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1 or not isinstance(plan.get("instances"), list):
        raise ValueError("plan must be a split's plan JSON (gpu_count and instances), got "
                         f"{sorted(plan) if isinstance(plan, dict) else type(plan).__name__}")
    unseen = _bytes(plan.get("unseen_bytes", 0), "unseen_bytes")
    planned, budget, seen_before = [], [0] * gpus, [False] * gpus
    for row in plan["instances"]:
        single = row.get("plan")
        if not single:
            continue
        chart = memory_chart(dict(single, fits=True))
        on = [i for i in row.get("gpus") or [] if 0 <= i < gpus]
        for i in on:
            budget[i] += chart["budget_bytes"]
        for segment in chart["planned"]:
            if segment["key"] in ("headroom", "kv_over_budget"):
                continue
            value = segment["bytes"][0]
            values = [(value - unseen if segment["key"] == "non_torch" and seen_before[i] else value) if i in on else 0
                      for i in range(gpus)]
            planned.append({"key": segment["key"], "label": f"{row['name']}: {segment['label']}",
                            "instance": row["name"], "bytes": values})
        for i in on:
            seen_before[i] = True
    rows = {int(g["index"]): g for g in plan.get("gpus") or []}
    total = max((_bytes(g.get("total_bytes", 0), "gpus[].total_bytes") for g in rows.values()), default=0)
    free = [max(0, total - _bytes(rows[i]["used_bytes"], "gpus[].used_bytes")) if i in rows else total
            for i in range(gpus)]
    planned.append({"key": "headroom", "label": "Free (outside every instance)", "instance": "", "bytes": free})
    return {"gpus": [f"GPU {i}" for i in range(gpus)], "fits": bool(plan.get("fits")), "budget_bytes": max(budget),
            "total_bytes": total, "kv_needed_bytes": 0, "planned": planned, "reported": []}


def script_json(value: Any) -> str:
    """JSON safe to embed in an HTML <script> element: '<', '>' and '&' escaped, so no string closes the element."""
    text = json.dumps(value, sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _render(template: str, chart_js: str, managed: str, **context: Any) -> str:
    """`template` (Jinja2 text) rendered with `context`, the charting library inlined and the managed line."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    # A library file never contains "</script" in code; escaping it keeps a string in it from closing the tag.
    return env.from_string(template).render(
        chart_js=Markup(chart_js.replace("</script", "<\\/script")), managed=managed, gib=GIB, **context)


def plan_report_html(plan: dict[str, Any], template: str, chart_js: str, check: dict[str, Any] | None = None,
                     managed: str = "") -> str:
    """The static HTML report: `template` (Jinja2 text) rendered with the plan, the chart data and the library.

    The page embeds the plan JSON itself (element #plan-json), the chart's data (#chart-data), the check report's
    summary when given, and `chart_js` inline, so it needs no network.
    """
    summary = {key: check.get(key) for key in ("host", "time", "url", "plan")} if check else None
    chart = instances_chart(plan) if "instances" in plan else memory_chart(plan, check)
    return _render(
        template, chart_js, managed,
        plan=plan,
        chart=chart,
        check=summary,
        plan_json=Markup(script_json(plan)),
        chart_json=Markup(script_json(chart)),
        check_json=Markup(script_json(summary)),
    )


# The benchmark's latency figures drawn on the check's page: key in the report's benchmark levels, label.
LATENCY_FIGURES: tuple[tuple[str, str], ...] = (
    ("ttft_ms_p50", "TTFT p50"), ("ttft_ms_p99", "TTFT p99"),
    ("tpot_ms_p50", "TPOT p50"), ("tpot_ms_p99", "TPOT p99"),
    ("itl_ms_p50", "ITL p50"), ("itl_ms_p99", "ITL p99"),
)


def latency_chart(check: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's latency percentiles per level (ms, None where not measured), from the check report.

    Raises ValueError when the report has no benchmark levels (the benchmark was off or skipped).
    """
    levels = ((check or {}).get("benchmark") or {}).get("levels") or {}
    if not isinstance(levels, dict) or not levels:
        raise ValueError("the check report has no benchmark levels (benchmark.levels): run the inference check "
                         "with inference_check_benchmark true, not in check mode")
    out = []
    for level, figs in levels.items():
        values = []
        for key, _label in LATENCY_FIGURES:
            value = figs.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"benchmark.levels.{level}.{key} must be a number of ms, got {value!r}")
            values.append(value)
        out.append({"level": level, "concurrency": figs.get("concurrency"), "ms": values})
    return {"figures": [{"key": key, "label": label} for key, label in LATENCY_FIGURES], "levels": out}


def check_report_html(check: dict[str, Any], template: str, chart_js: str, managed: str = "") -> str:
    """The inference check's static HTML report: the benchmark's latency percentiles as a chart, with the report
    JSON embedded (#check-json) and the chart's data (#chart-data); same rendering as the plan's page."""
    chart = latency_chart(check)
    return _render(
        template, chart_js, managed,
        check=check,
        chart=chart,
        check_json=Markup(script_json(check)),
        chart_json=Markup(script_json(chart)),
    )
