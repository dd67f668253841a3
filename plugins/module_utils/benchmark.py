"""The serving benchmark's figures and their verdict: pure functions of `vllm bench serve` results, a band and the
node's previous run.

`vllm bench serve --save-result` writes one JSON per run (keys `completed`, `failed`, `output_throughput`,
`median_tpot_ms`, `p50_ttft_ms`, `p99_itl_ms`, ...). `figures` keeps what the check reports; `compare` holds each
figure against the catalog band (roles/vllm_node/vars/main/benchmark_bands.yml) and against the previous run.
"""

from __future__ import annotations

from typing import Any

# Figure -> True when a higher value is better. A regression is a move in the worse direction.
HIGHER_IS_BETTER: dict[str, bool] = {
    "output_tps": True,
    "per_user_tps": True,
    "ttft_ms_p50": False,
    "ttft_ms_p99": False,
    "tpot_ms_p50": False,
    "tpot_ms_p99": False,
    "itl_ms_p50": False,
    "itl_ms_p99": False,
}
# Tails (p99) are held against the band only: over the check's few prompts a p99 is nearly the maximum, so it
# swings several-fold run to run on a host that does other work (TPOT p99 3.1 ms, then 14.7 ms, while p50 holds).
TAIL_FIGURES = frozenset(f for f in HIGHER_IS_BETTER if f.endswith("_p99"))
# The two load levels the check runs: one user alone, and the planned concurrency.
LEVELS = ("single", "planned")


def _number(result: dict[str, Any], key: str) -> float | None:
    """A finite number from the result, else None."""
    value = result.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # NaN != NaN
        return None
    return float(value)


def figures(result: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """What the check reports of one `vllm bench serve` result: counts, throughput, latency p50/p99.

    per_user_tps is 1000 / median TPOT (one user's decode speed); None when vLLM measured no TPOT.
    """
    if not isinstance(result, dict):
        raise ValueError(f"a vllm bench serve result must be a JSON object, got {type(result).__name__}")
    tpot = _number(result, "median_tpot_ms")
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "successful": int(result.get("completed") or 0),
        "failed": int(result.get("failed") or 0),
        "duration_s": _number(result, "duration"),
        "output_tps": _number(result, "output_throughput"),
        "per_user_tps": round(1000.0 / tpot, 2) if tpot else None,
    }
    for metric in ("ttft", "tpot", "itl"):
        for pct in ("p50", "p99"):
            out[f"{metric}_ms_{pct}"] = _number(result, f"{pct}_{metric}_ms")
    return out


def band_for(bands: dict[str, Any], model: str, gpu: str, vllm_version: str, gpu_count: int) -> dict[str, Any]:
    """The catalog band for model x GPU x vLLM version ({} when there is none, or it was measured on another count)."""
    entry = ((bands.get(model) or {}).get(gpu) or {}).get(str(vllm_version)) or {}
    if entry.get("gpu_count") not in (None, gpu_count):
        return {}
    return entry


def _worse(figure: str, measured: float, limit: float) -> bool:
    """True when `measured` is on the bad side of `limit` for this figure."""
    return measured < limit if HIGHER_IS_BETTER[figure] else measured > limit


def _edge(figure: str, band: dict[str, Any]) -> float | None:
    """The band's edge a regression crosses: its min for a rate, its max for a latency."""
    value = band.get("min" if HIGHER_IS_BETTER[figure] else "max")
    return None if value is None else float(value)


def _previous_limit(figure: str, previous: float, tolerance: float) -> float:
    """How far the figure may move from the previous run before it is a regression: a factor of 1 + tolerance
    either way (a rate may drop to previous / (1 + t), a latency grow to previous x (1 + t))."""
    return previous / (1 + tolerance) if HIGHER_IS_BETTER[figure] else previous * (1 + tolerance)


def compare(measured: dict[str, dict[str, Any]], band: dict[str, Any], previous: dict[str, dict[str, Any]] | None,
            tolerance: float, band_name: str = "") -> dict[str, Any]:
    """Each figure of each level against the band and the previous run; the verdict with the numbers.

    measured / previous: {level: figures(...)}; band: {level: {concurrency?, figure: {min, max}}, previous_tolerance?}
    (a level's band with another concurrency than measured is not applied).
    A figure fails when it is worse than the band's edge (min of a rate, max of a latency) or worse than the
    previous run by more than a factor 1 + tolerance (the band's previous_tolerance wins over `tolerance`).
    Failed requests always fail. Returns {rows, failures, passed, band, tolerance}.
    """
    if tolerance < 0:
        raise ValueError(f"the tolerance against the previous run must be >= 0, got {tolerance}")
    tol = float(band.get("previous_tolerance", tolerance))
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for level in LEVELS:
        figs = measured.get(level)
        if not figs:
            continue
        where = f"c={figs.get('concurrency')}"
        if figs.get("failed"):
            failures.append(f"{where}: {figs['failed']} of {figs['failed'] + figs.get('successful', 0)} "
                            "benchmark requests failed")
        before = (previous or {}).get(level) or {}
        if before.get("concurrency") not in (None, figs.get("concurrency")):
            before = {}  # measured at another concurrency: not comparable
        level_band = band.get(level) or {}
        # A band measured at another concurrency says nothing about this level.
        if level_band.get("concurrency") not in (None, figs.get("concurrency")):
            level_band = {}
        for figure in HIGHER_IS_BETTER:
            value = figs.get(figure)
            limits = level_band.get(figure) or {}
            edge = _edge(figure, limits)
            prev = before.get(figure)
            row = {"level": level, "concurrency": figs.get("concurrency"), "figure": figure, "measured": value,
                   "band": limits or None, "previous": prev, "verdict": "ok"}
            if value is None:
                row["verdict"] = "not measured"
            else:
                reasons = []
                if edge is not None and _worse(figure, value, edge):
                    reasons.append(f"expected {'>=' if HIGHER_IS_BETTER[figure] else '<='} {edge:g} "
                                   f"(band {_fmt(limits.get('min'), '-')}..{_fmt(limits.get('max'), '-')}"
                                   f"{' of ' + band_name if band_name else ''})")
                if (figure not in TAIL_FIGURES and isinstance(prev, (int, float))
                        and _worse(figure, value, _previous_limit(figure, prev, tol))):
                    reasons.append(f"previous run {prev:g} (tolerance {tol * 100:g} %)")
                if reasons:
                    row["verdict"] = "regression"
                    failures.append(f"{where} {figure}: measured {value:g}, " + "; ".join(reasons)
                                    + (f", previous {prev:g}" if isinstance(prev, (int, float))
                                       and not any(r.startswith("previous") for r in reasons) else ""))
                elif edge is None and not limits:
                    row["verdict"] = "no band"
            rows.append(row)
    return {"rows": rows, "failures": failures, "passed": not failures, "band": band_name or None,
            "tolerance": tol, "summary": summary(measured, band_name, not failures)}


def _fmt(value: Any, unknown: str = "?") -> str:
    """A figure for a sentence (`unknown` when there is none)."""
    return unknown if value is None else f"{value:g}"


def summary(measured: dict[str, dict[str, Any]], band_name: str, passed: bool) -> str:
    """One line: per level the output and per-user tok/s and TTFT p99, then the band and the verdict."""
    parts = [f"c={figs.get('concurrency')}: {_fmt(figs.get('output_tps'))} tok/s out, "
             f"{_fmt(figs.get('per_user_tps'))} tok/s per user, TTFT p99 {_fmt(figs.get('ttft_ms_p99'))} ms, "
             f"{figs.get('failed', 0)} failed"
             for level in LEVELS if (figs := measured.get(level))]
    return (f"benchmark {'; '.join(parts)}; band: {band_name or 'none in the catalog'}; "
            + ("within the band and the previous run" if passed else "REGRESSION"))
