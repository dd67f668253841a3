"""What Prometheus needs per vLLM instance of a node that serves several models (vllm_node_instances, issue 27): the
scrape target of each instance (its own port on the node's scrape address), the labels it carries (instance_name,
model) and the alert thresholds its own plan gives (the waiting-queue threshold from its kv.max_concurrency).

Read by the observability role (filter observability_instances) from the split's plan document (the plan with an
`instances` list, plugins/module_utils/sizing/instances.py): each instance's `plan` is a single-model plan with its
service block (`service.port`); an instance without a plan (refused) serves nothing and gets no target. A plan
without instances (one model per node) gives [] and the role keeps its single target and single thresholds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

# vllm_node_instances' names (sizing/instances.py): safe as a PromQL label value and a file_sd label.
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


def scrape_host(target: str) -> str:
    """The host part of a host:port scrape target, an IPv6 host in brackets ([::1] from `[::1]:8000` or `::1:8000`).

    Raises ValueError for a target without a numeric port."""
    host, sep, port = str(target or "").strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"the vLLM scrape target must be host:port, got {target!r}")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        host = f"[{host}]"
    return host


def waiting_threshold(max_concurrency: Any, override: Any = None) -> int:
    """Waiting requests above which a growing queue alerts: the override when set, else the plan's concurrency at
    full context rounded up (at least 1; 1 when the plan has none)."""
    if override is not None:
        value = int(override)
        if value < 0:
            raise ValueError(f"observability_alert_waiting_requests must be >= 0, got {override!r}")
        return value
    concurrency = float(max_concurrency) if max_concurrency is not None else 1.0
    return max(math.ceil(concurrency), 1)


def _port(name: str, plan: Mapping[str, Any]) -> int:
    """An instance's service port from its plan; ValueError naming the instance when it has none."""
    service = plan.get("service")
    port = service.get("port") if isinstance(service, Mapping) else None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"instance {name!r}: its plan has no service.port in 1..65535 (got {port!r}); "
                         "plan it again with site.yml or plan.yml")
    return port


def instance(entry: Mapping[str, Any], host: str, override: Any = None) -> dict[str, Any] | None:
    """One instance's monitoring record, or None when it has no plan (refused: nothing serves it).

    {name, model (its served_model_name: vLLM's model_name label), target (host:port), waiting (threshold),
    max_concurrency, kv_tokens (None when the plan has none)}."""
    name = str(entry.get("name") or "")
    if not _NAME_RE.match(name):
        raise ValueError(f"an instance's name must be lower-case letters, digits, - and _, got {entry.get('name')!r}")
    plan = entry.get("plan")
    if not isinstance(plan, Mapping):
        return None
    kv_block = plan.get("kv")
    kv: Mapping[str, Any] = kv_block if isinstance(kv_block, Mapping) else {}
    model = str(plan.get("served_model_name") or entry.get("served_model_name") or entry.get("model") or name)
    return {"name": name, "model": model, "target": f"{host}:{_port(name, plan)}",
            "waiting": waiting_threshold(kv.get("max_concurrency"), override),
            "max_concurrency": kv.get("max_concurrency"), "kv_tokens": kv.get("tokens")}


def instances(plan: Mapping[str, Any] | None, vllm_target: str, override: Any = None) -> list[dict[str, Any]]:
    """Every planned instance's record (instance()), in the plan's order; [] for a single-model plan.

    vllm_target is the node's single-model scrape target (observability_vllm_target): its host is where each instance
    is scraped, on the instance's own port. Raises ValueError for two instances on one port or with one name."""
    entries = (plan or {}).get("instances") or []
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise ValueError(f"the plan's instances must be a list of mappings, got {entries!r}")
    if not entries:
        return []
    host = scrape_host(vllm_target)
    records = [r for r in (instance(e, host, override) for e in entries) if r is not None]
    for key in ("name", "target"):
        values = [r[key] for r in records]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"two instances share the {key} {', '.join(twice)}: each needs its own")
    return records
