"""The gateway's pools (roles/gateway): one pool `vllm` for every server, or, when the gateway_backends entries list
the `models` each server serves, one pool per model name, a request routed by its JSON body's `model`.

A pool is a leastconn backend and its affinity twin (consistent hash). A server that serves several names is in each
of their pools; it is health-checked (and agent-checked) once, in the pool of its first name, and every other
appearance tracks that one, so a drain or a failed check moves it out of all its pools at once. Also the texts the
role renders for model routing: the map (model -> pool), vLLM's /v1/models list, and the OpenAI-shaped error bodies
as HAProxy strings.
"""

from __future__ import annotations

import json
import re
from typing import Any

SINGLE_POOL = "vllm"
AFFINITY_SUFFIX = "_affinity"
MODEL_POOL_PREFIX = "model_"
# What HAProxy takes in a proxy or server name; anything else becomes _.
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
# A model name is a key of HAProxy's map file: no whitespace or control character, no leading # (a comment there).
MODEL_NAME_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f]")
# The request's model in the 404's log-format string (JSON-escaped by HAProxy's json converter).
MODEL_PLACEHOLDER = "%[var(txn.model),json(utf8s)]"
OWNED_BY = "vllm"


def haproxy_name(text: Any) -> str:
    """A proxy or server name HAProxy takes: characters other than letters, digits, _ . - become _."""
    return NAME_UNSAFE.sub("_", str(text))


def server_address(address: Any) -> str:
    """The address as a server line writes it: an IPv6 address in brackets."""
    text = str(address)
    return f"[{text}]" if ":" in text else text


def backend_errors(backends: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the `models` of gateway_backends entries ([] when nothing): every entry has a non-empty
    list of model names or none has; a name is a non-empty string without whitespace or control characters that
    does not start with #."""
    with_models = [b for b in backends if "models" in b]
    if not with_models:
        return []
    errors = []
    if len(with_models) != len(backends):
        without = ", ".join(str(b.get("name")) for b in backends if "models" not in b)
        errors.append(f"either every gateway_backends entry lists its models or none does; {without} "
                      "list(s) none")
    for backend in with_models:
        models = backend["models"]
        if not isinstance(models, list) or not models:
            errors.append(f"{backend.get('name')}: models must be a non-empty list of model names, got {models!r}")
            continue
        bad = [m for m in models if not isinstance(m, str) or not m or MODEL_NAME_UNSAFE.search(m)
               or m.startswith("#")]
        if bad:
            errors.append(f"{backend.get('name')}: model names must be non-empty strings without spaces or control "
                          f"characters, not starting with #: {bad!r}")
    return errors


def served_models(backends: list[dict[str, Any]]) -> list[str]:
    """Every model name of the backends, in order of first appearance, each once."""
    names: list[str] = []
    for backend in backends:
        names.extend(m for m in backend.get("models") or [] if m not in names)
    return names


def pool_names(models: list[str]) -> dict[str, str]:
    """Model -> its pool's name: model_<name made safe for HAProxy>, with _2, _3 ... where two names would meet
    (after the replacement, or a pool meeting another's affinity twin)."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    for model in models:
        base = MODEL_POOL_PREFIX + haproxy_name(model)
        name, n = base, 1
        while name in taken or name + AFFINITY_SUFFIX in taken:
            n += 1
            name = f"{base}_{n}"
        taken.update({name, name + AFFINITY_SUFFIX})
        out[model] = name
    return out


def server_entry(backend: dict[str, Any], track: str | None) -> dict[str, Any]:
    """One server line's parts: name, address, port, agent_port, and the pool/server it tracks (None: checked)."""
    return {"name": haproxy_name(backend["name"]), "address": server_address(backend["address"]),
            "port": backend["port"], "agent_port": backend.get("agent_port") or None, "track": track}


def build_pools(backends: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pools, each {name, affinity, model (None for the single pool), servers}: one pool `vllm` of every
    server when no backend lists models, else one per model name in order of first appearance."""
    models = served_models(backends)
    if not models:
        return [{"name": SINGLE_POOL, "affinity": SINGLE_POOL + AFFINITY_SUFFIX, "model": None,
                 "servers": [server_entry(b, None) for b in backends]}]
    names = pool_names(models)
    home = {haproxy_name(b["name"]): names[b["models"][0]] for b in backends}
    pools = []
    for model in models:
        servers = []
        for backend in backends:
            if model in backend["models"]:
                server = haproxy_name(backend["name"])
                servers.append(server_entry(backend, None if home[server] == names[model]
                                            else f"{home[server]}/{server}"))
        pools.append({"name": names[model], "affinity": names[model] + AFFINITY_SUFFIX, "model": model,
                      "servers": servers})
    return pools


def models_map(pools: list[dict[str, Any]]) -> str:
    """HAProxy's map file: one `model pool` line per model ("" for the single pool)."""
    return "".join(f"{p['model']} {p['name']}\n" for p in pools if p["model"] is not None)


def haproxy_string(text: str, log_format: bool = False) -> str:
    """`text` for the inside of a double-quoted HAProxy argument: \\ " and $ (an environment variable there)
    escaped, and % doubled in a log-format string."""
    if log_format:
        text = text.replace("%", "%%")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")


def error_body(message: str, kind: str, code: int, param: str | None = None) -> str:
    """vLLM's ErrorResponse as its server writes it: {"error": {message, type, param, code}}, compact."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}},
                      separators=(",", ":"))


def not_found_log_format(models: list[str]) -> str:
    """The 404 for a model not served, as a log-format string for inside double quotes: vLLM 0.32's own message
    (serve/engine/serving.py) with the request's model and the names served here."""
    marker = "\x01"
    body = error_body(f"The model `{marker}` does not exist. Valid aliases: {', '.join(models)}.",
                      "NotFoundError", 404, "model")
    before, after = body.split(json.dumps(marker)[1:-1], 1)
    return haproxy_string(before, log_format=True) + MODEL_PLACEHOLDER + haproxy_string(after, log_format=True)


def routing(backends: list[dict[str, Any]], max_body_bytes: int) -> dict[str, Any]:
    """Everything the gateway's configuration needs about its pools: pools, models (names served, [] for the
    single pool), map (the map file's text), and the model routing's error bodies as HAProxy strings
    (bad_request, too_large, not_found: a log-format string), and errors: what is wrong with the backends'
    `models` (backend_errors; then nothing else is computed: no pools, no models)."""
    errors = backend_errors(backends)
    pools = [] if errors else build_pools(backends)
    models = [p["model"] for p in pools if p["model"] is not None]
    return {
        "errors": errors,
        "pools": pools,
        "models": models,
        "map": models_map(pools),
        "bad_request": haproxy_string(error_body(
            "This gateway serves several models and routes a request by the `model` of its JSON body: send a JSON "
            f"body with a string `model`, one of: {', '.join(models)}.", "BadRequestError", 400, "model")),
        "too_large": haproxy_string(error_body(
            f"The request body is larger than this gateway's limit of {int(max_body_bytes)} bytes.",
            "Request Entity Too Large", 413)),
        "not_found": not_found_log_format(models),
    }


def models_list(models: list[str], previous: str, now: int) -> str:
    """vLLM's /v1/models answer for `models` ({"object": "list", "data": [{id, object, created, owned_by}]}), as
    the gateway returns it from a file. A model already in the `previous` file keeps its `created`, a new one gets
    `now` (epoch seconds), so the file changes only when the models do; an unreadable previous file counts as none."""
    try:
        old = {card["id"]: int(card["created"]) for card in json.loads(previous or "{}").get("data", [])}
    except (ValueError, TypeError, KeyError, AttributeError):
        old = {}
    data = [{"id": m, "object": "model", "created": old.get(m, int(now)), "owned_by": OWNED_BY} for m in models]
    return json.dumps({"object": "list", "data": data}, separators=(",", ":")) + "\n"
