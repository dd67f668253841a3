"""The LoRA adapters a running vLLM serves, brought to the wanted set over its runtime API (issue 30).

vLLM (with VLLM_ALLOW_RUNTIME_LORA_UPDATING) lists the adapters it serves in GET /v1/models (an entry with a
`parent`: the base's name; `root`: the adapter's directory), loads one with POST /v1/load_lora_adapter
{lora_name, lora_path} and unloads one with POST /v1/unload_lora_adapter {lora_name}. The sync unloads what is
served and not wanted, loads what is wanted and not served, and reloads an adapter whose directory changed (a new
pinned revision): no restart, nothing else touched, nothing done when the two sets agree.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# method, path, JSON body or None -> (HTTP status, body text)
Request = Callable[[str, str, "dict[str, Any] | None"], "tuple[int, str]"]
LOAD, UNLOAD, MODELS = "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/models"


class SyncError(RuntimeError):
    """vLLM could not be read or refused a load or unload (the message names the adapter and vLLM's reason)."""


@dataclass(frozen=True)
class SyncPlan:
    """What to do: unload these names, then load these (name, path) pairs."""

    unload: tuple[str, ...]
    load: tuple[tuple[str, str], ...]

    @property
    def changed(self) -> bool:
        """Whether anything is to be done."""
        return bool(self.unload or self.load)


def wanted_adapters(adapters: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """name -> path of the adapters to serve; a name twice or an entry without name or path is refused."""
    wanted: dict[str, str] = {}
    for adapter in adapters:
        name, path = str(adapter.get("name") or ""), str(adapter.get("path") or "")
        if not name or not path:
            raise SyncError(f"every adapter needs a name and a path; got {dict(adapter)!r}")
        if name in wanted:
            raise SyncError(f"adapter {name} is listed twice: give each adapter a name of its own")
        wanted[name] = path
    return wanted


def served_adapters(models: Any) -> dict[str, str]:
    """name -> directory of the adapters in a /v1/models answer (the entries with a parent; the base has none)."""
    data = models.get("data") if isinstance(models, Mapping) else None
    if not isinstance(data, list):
        raise SyncError(f"{MODELS} did not answer a model list: {str(models)[:200]}")
    return {str(m["id"]): str(m.get("root") or "") for m in data if isinstance(m, Mapping) and m.get("parent")}


def plan_sync(served: Mapping[str, str], wanted: Mapping[str, str]) -> SyncPlan:
    """Unload the served adapters that are not wanted or whose directory changed; load the missing and changed."""
    moved = {name for name in set(served) & set(wanted) if served[name] != wanted[name]}
    unload = tuple(sorted((set(served) - set(wanted)) | moved))
    load = tuple((name, wanted[name]) for name in sorted((set(wanted) - set(served)) | moved))
    return SyncPlan(unload, load)


def _reason(text: str) -> str:
    """vLLM's error message out of its answer (JSON {"error": {"message"}} or {"message"}, else the text)."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        if body.get("message"):
            return str(body["message"])
    return text.strip()[:500]


def read_served(request: Request) -> dict[str, str]:
    """The adapters vLLM serves now."""
    status, text = request("GET", MODELS, None)
    if status != 200:
        raise SyncError(f"GET {MODELS} answered {status}: {_reason(text)}")
    try:
        return served_adapters(json.loads(text))
    except ValueError as exc:
        raise SyncError(f"GET {MODELS} did not answer JSON: {text[:200]}") from exc


def apply(plan: SyncPlan, request: Request) -> None:
    """Unload, then load, stopping at the first refusal (SyncError with vLLM's reason)."""
    for name in plan.unload:
        status, text = request("POST", UNLOAD, {"lora_name": name})
        if status != 200:
            raise SyncError(f"vLLM refused to unload adapter {name} ({status}): {_reason(text)}")
    for name, path in plan.load:
        status, text = request("POST", LOAD, {"lora_name": name, "lora_path": path})
        if status != 200:
            raise SyncError(f"vLLM refused to load adapter {name} from {path} ({status}): {_reason(text)}. Check "
                            "that the directory holds the adapter's files, readable by the service user, and that "
                            "the plan accepted it (vllm_node_lora_adapters)")


def _listing(adapters: Mapping[str, str]) -> str:
    return "".join(f"{name} {path}\n" for name, path in sorted(adapters.items()))


def sync(request: Request, adapters: Sequence[Mapping[str, Any]], check_mode: bool = False) -> dict[str, Any]:
    """Bring vLLM's served adapters to `adapters` ([{name, path}]); in check mode only say what would change.
    Returns changed, loaded, unloaded, adapters (the names served afterwards; in check mode, once it would have
    run) and a diff of "name path" lines."""
    wanted = wanted_adapters(adapters)
    served = read_served(request)
    plan = plan_sync(served, wanted)
    if plan.changed and not check_mode:
        apply(plan, request)
        after = read_served(request)
        if after != wanted:
            raise SyncError(f"after the sync vLLM serves {sorted(after)} where {sorted(wanted)} were asked for")
    return {"changed": plan.changed, "unloaded": list(plan.unload), "loaded": [name for name, _ in plan.load],
            "adapters": sorted(wanted),
            "diff": {"before": _listing(served), "after": _listing(wanted)}}


def http_request(base_url: str, api_key: str = "", timeout: float = 120.0) -> Request:
    """A Request to vLLM at base_url (loopback: no proxy) with its API key as a bearer token."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def request(method: str, path: str, body: dict[str, Any] | None) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        data = json.dumps(body).encode() if body is not None else None
        call = urllib.request.Request(base_url.rstrip("/") + path, data=data, headers=headers, method=method)
        try:
            with opener.open(call, timeout=timeout) as response:
                return int(response.status), response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError) as exc:
            raise SyncError(f"cannot reach vLLM at {base_url}: {getattr(exc, 'reason', exc)}") from exc

    return request
