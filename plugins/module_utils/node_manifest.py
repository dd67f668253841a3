"""The node manifest: what a vLLM node is, assembled from the facts the roles publish, and compared field by field.

Pure functions, no Ansible import: the filters in plugins/filter/node_manifest.py call them, and so does the
command line (`scripts/compare-manifests.sh A B`, which runs this file's main()).

Layout of a manifest (every key sorted when written):
- `host`: what differs between two nodes built from the same inventory (names, machine-id, kernel, addresses,
  `generated_at`); left out of `manifest_sha256` and of comparisons;
- `os`, `driver`, `vllm`, `model`, `config`, `service`, `plan`: what the inventory and the roles made of the node;
- `instances` (only on a node serving several models): each instance's name, unit, port, model, repo, commit, GPUs;
- `missing`: the dotted names of the fields whose fact was not published (their value is null, never guessed);
- `manifest_sha256`: sha256 of the canonical JSON of everything but `host` and itself.
Secret values never appear: the secrets passed in are replaced wherever they occur, and a string under a
secret-looking name (HF_TOKEN, VLLM_API_KEY, password, ...) is replaced unless it is a hash or a path.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

SCHEMA = "vllm-node/manifest/1"
SECTIONS = ("os", "driver", "vllm", "model", "config", "service", "plan")
REDACTED = "<redacted>"
# Names whose string value is a secret: HF_TOKEN, VLLM_API_KEY, api-key, password, ... (not "tokens", "max_tokens").
_SECRET_NAME = re.compile(r"(^|_)(token|secret|password|passwd|api_?key|credentials?)($|_)", re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the form every hash of this project is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_json(value: Any) -> str:
    """sha256 hex of the canonical JSON of a value."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def _known(value: Any) -> bool:
    """A published fact: not null, not an empty string (what `| default('')` leaves when a role did not run)."""
    return value is not None and value != ""


def config_diff(name: str, original: str | None, patched: str | None) -> list[str] | None:
    """Unified diff (lines) of a config's kept original against the file vLLM reads.

    Both sides are compared as canonical, indented JSON when they parse, so the diff shows what a rule changed and
    not how the file was formatted; text that is not JSON is compared as it is. None when a side was not read.
    """
    if original is None or patched is None:
        return None

    def lines(text: str) -> list[str]:
        try:
            return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False).splitlines()
        except ValueError:
            return text.splitlines()

    return list(difflib.unified_diff(lines(original), lines(patched), f"{name}.orig", name, lineterm=""))


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """A copy of `value` without secret values.

    Every occurrence of a secret (in keys and strings) becomes "<redacted>"; so does a string under a
    secret-looking key (HF_TOKEN, VLLM_API_KEY, ...) unless it is a sha256 hex or an absolute path.
    """
    values = sorted({str(s) for s in secrets if s is not None and str(s) != ""}, key=len, reverse=True)

    def scrub(text: str) -> str:
        for secret in values:
            text = text.replace(secret, REDACTED)
        return text

    def walk(item: Any, key: str = "") -> Any:
        if isinstance(item, Mapping):
            return {scrub(str(k)): walk(v, str(k)) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [walk(v, key) for v in item]
        if isinstance(item, str):
            if _SECRET_NAME.search(key.replace("-", "_")) and not (_SHA256.match(item) or item.startswith("/")):
                return REDACTED if item else item
            return scrub(item)
        return item

    return walk(value)


def _field(section: dict[str, Any], missing: list[str], path: str, value: Any) -> None:
    """Set section[last part of path] = value, or null and record `path` in `missing` when it is not known."""
    section[path.rsplit(".", 1)[-1]] = value if _known(value) else None
    if not _known(value):
        missing.append(path)


def lora_adapters(downloaded: Any) -> list[dict[str, Any]]:
    """The LoRA adapters served over the model, by name: repository, revision, base, directory, every file's sha256
    and the hash over them (model_download's lora files; [] when none are served, which is not a gap)."""
    if not isinstance(downloaded, list):
        return []
    keys = ("name", "repository", "revision", "base", "dir", "files", "files_sha256")
    return sorted(({key: adapter.get(key) for key in keys} for adapter in downloaded if isinstance(adapter, Mapping)),
                  key=lambda adapter: str(adapter["name"]))


INSTANCE_KEYS = ("name", "unit", "port", "model", "repo", "commit", "gpus", "served_model_name")


def instances(served: Any) -> list[dict[str, Any]]:
    """The instances a node serves (vllm_node_instances), by name: unit, port, model (catalog key), repo, commit,
    GPUs (CUDA_VISIBLE_DEVICES, "" on the cpu device) and served name; [] on a single-model node, not a gap."""
    if not isinstance(served, list):
        return []
    return sorted(({key: item.get(key) for key in INSTANCE_KEYS} for item in served if isinstance(item, Mapping)),
                  key=lambda item: str(item["name"]))


def build(facts: Mapping[str, Any], secrets: Iterable[str] = (), previous: Mapping[str, Any] | None = None,
          now: str = "") -> dict[str, Any]:
    """The manifest of a node from the facts the roles published (node_manifest_facts in the role).

    `facts` keys (null or "" = not published): host {inventory_hostname, hostname, machine_id, kernel_release,
    kernel_version, addresses, gpu_health (the preflight's GPU health brief)}, os {distribution, version, codename,
    family, major_version, architecture},
    device, driver_version, driver_flavour, cuda_home, vllm_version, vllm_variant, venv, lock_sha256, model_repo,
    model_revision, model_commit, model_dir, model_file_sha256 (dict), model_manifest_sha256, lora_adapters (list,
    model.adapters when not empty), config_rules_applied,
    config_changes, config_files_sha256, config_texts (file name -> text, the kept originals as "<file>.orig"),
    service_name, fingerprint,
    fingerprint_inputs, unit_sha256, env_sha256, plan, instances (list: the instances served, `instances` when not
    empty; model and service then describe the last one served).
    `previous` is the manifest the node holds: when its content hash equals the new one, its `generated_at` is kept
    (the file is then byte-for-byte the same and a rerun changes nothing); otherwise `now` is used.
    """
    if not isinstance(facts, Mapping):
        raise TypeError(f"node_manifest: the facts must be a dict, got {type(facts).__name__}")
    missing: list[str] = []

    os_facts = facts.get("os") or {}
    os_section: dict[str, Any] = {}
    for name in ("distribution", "version", "codename", "family", "major_version", "architecture"):
        _field(os_section, missing, f"os.{name}", os_facts.get(name))

    device = facts.get("device")
    driver: dict[str, Any] = {}
    _field(driver, missing, "driver.device", device)
    if device == "cpu":
        # no NVIDIA driver is installed for the cpu device: null here is the truth, not a gap
        driver.update(required=False, version=None, flavour=None, cuda_home=None)
    else:
        driver["required"] = True
        _field(driver, missing, "driver.version", facts.get("driver_version"))
        _field(driver, missing, "driver.flavour", facts.get("driver_flavour"))
        driver["cuda_home"] = facts.get("cuda_home") or None  # empty = no toolkit installed, a valid choice

    vllm: dict[str, Any] = {}
    for name, key in (("version", "vllm_version"), ("variant", "vllm_variant"), ("venv", "venv"),
                      ("lock_sha256", "lock_sha256")):
        _field(vllm, missing, f"vllm.{name}", facts.get(key))

    model: dict[str, Any] = {}
    for name in ("repo", "revision", "commit", "dir"):
        _field(model, missing, f"model.{name}", facts.get(f"model_{name}"))
    files = facts.get("model_file_sha256")
    _field(model, missing, "model.files", dict(sorted(files.items())) if isinstance(files, Mapping) and files else None)
    _field(model, missing, "model.files_sha256", facts.get("model_manifest_sha256"))
    adapters = lora_adapters(facts.get("lora_adapters"))
    if adapters:
        model["adapters"] = adapters

    config: dict[str, Any] = {}
    _field(config, missing, "config.rules_applied", facts.get("config_rules_applied"))
    changes = facts.get("config_changes")
    _field(config, missing, "config.changes", changes)
    _field(config, missing, "config.files_sha256", facts.get("config_files_sha256") or None)
    texts = facts.get("config_texts") or {}
    diffs: dict[str, Any] = {}
    for name in sorted({str(c.get("file")) for c in changes or [] if isinstance(c, Mapping) and c.get("file")}):
        diffs[name] = config_diff(name, texts.get(f"{name}.orig"), texts.get(name))
        if diffs[name] is None:
            missing.append(f"config.diffs.{name}")
    config["diffs"] = diffs

    service: dict[str, Any] = {}
    for name, key in (("name", "service_name"), ("fingerprint", "fingerprint"),
                      ("fingerprint_inputs", "fingerprint_inputs"), ("unit_sha256", "unit_sha256"),
                      ("env_sha256", "env_sha256")):
        _field(service, missing, f"service.{name}", facts.get(key) or None)

    plan = facts.get("plan") or None
    plan_section: dict[str, Any] = {}
    _field(plan_section, missing, "plan.content", plan)
    plan_section["sha256"] = sha256_json(plan) if plan else None

    content: dict[str, Any] = {"schema": SCHEMA, "os": os_section, "driver": driver, "vllm": vllm, "model": model,
                               "config": config, "service": service, "plan": plan_section,
                               "missing": sorted(missing)}
    served = instances(facts.get("instances"))
    if served:
        content["instances"] = served
    secret_list = list(secrets or [])
    content = redact(content, secret_list)
    content["manifest_sha256"] = content_sha256(content)

    host_facts = facts.get("host") or {}
    host = {name: host_facts.get(name) if _known(host_facts.get(name)) else None
            for name in ("inventory_hostname", "hostname", "machine_id", "kernel_release", "kernel_version")}
    host["addresses"] = sorted(str(a) for a in host_facts.get("addresses") or [])
    # this node's GPUs' health (the preflight's gpu_health brief): per host, outside the hash and the comparisons
    host["gpu_health"] = host_facts.get("gpu_health") if isinstance(host_facts.get("gpu_health"), Mapping) else None
    previous_host = (previous or {}).get("host") or {}
    same = isinstance(previous, Mapping) and previous.get("manifest_sha256") == content["manifest_sha256"]
    host["generated_at"] = previous_host.get("generated_at") if same and previous_host.get("generated_at") else now
    content["host"] = redact(host, secret_list)
    return dict(sorted(content.items()))


def content_sha256(manifest: Mapping[str, Any]) -> str:
    """sha256 of a manifest without its host section and its own hash."""
    return sha256_json({k: v for k, v in manifest.items() if k not in ("host", "manifest_sha256")})


def render(manifest: Mapping[str, Any]) -> str:
    """The file's text: indented JSON, sorted keys, one trailing newline."""
    return json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def newly_missing(manifest: Mapping[str, Any], previous: Mapping[str, Any] | None) -> list[str]:
    """Fields the node's manifest knows but this run did not publish (a run with --tags, a role skipped).

    Overwriting would lose what the node is; the role keeps the file instead and says which facts were missing.
    """
    if not isinstance(previous, Mapping) or not isinstance(previous.get("missing"), list):
        return []
    return sorted(set(manifest.get("missing") or []) - set(previous["missing"]))


def _path(parent: str, key: Any) -> str:
    """Dotted path; keys that are not identifiers (file names) in brackets: model.files["config.json"]."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    text = str(key)
    part = f".{text}" if _IDENTIFIER.match(text) else f"[{json.dumps(text)}]"
    return (parent + part) if parent else part.lstrip(".")


def _flatten(value: Any, parent: str, out: dict[str, Any]) -> None:
    """Leaves of a JSON value by path; an empty dict or list is a leaf of its own."""
    if isinstance(value, Mapping) and value:
        for key in value:
            _flatten(value[key], _path(parent, key), out)
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            _flatten(item, _path(parent, index), out)
    else:
        out[parent] = value


def compare(a: Mapping[str, Any], b: Mapping[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """Field-by-field differences of two manifests outside `host` (and the hash, which follows the content).

    One line per differing leaf: `path: A=<json> B=<json>`, `path: only in A (<json>)`; fields whose path starts
    with one of `ignore` are left out. A manifest whose manifest_sha256 does not match its content is reported too.
    Empty list = the two nodes are the same.
    """
    for label, manifest in (("A", a), ("B", b)):
        if not isinstance(manifest, Mapping):
            raise TypeError(f"compare: manifest {label} must be a JSON object, got {type(manifest).__name__}")
    prefixes = [str(p) for p in ignore]
    leaves: list[dict[str, Any]] = []
    for manifest in (a, b):
        flat: dict[str, Any] = {}
        _flatten({k: v for k, v in manifest.items() if k not in ("host", "manifest_sha256")}, "", flat)
        leaves.append(flat)
    lines: list[str] = []
    for path in sorted(set(leaves[0]) | set(leaves[1])):
        if any(path == p or path.startswith((p + ".", p + "[")) for p in prefixes):
            continue
        if path not in leaves[1]:
            lines.append(f"{path}: only in A ({canonical_json(leaves[0][path])})")
        elif path not in leaves[0]:
            lines.append(f"{path}: only in B ({canonical_json(leaves[1][path])})")
        elif leaves[0][path] != leaves[1][path]:
            lines.append(f"{path}: A={canonical_json(leaves[0][path])} B={canonical_json(leaves[1][path])}")
    for label, manifest in (("A", a), ("B", b)):
        if "manifest_sha256" in manifest and manifest["manifest_sha256"] != content_sha256(manifest):
            lines.append(f"manifest_sha256 of {label} does not match its content (edited by hand?)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """compare A B [--ignore PATH ...]: print the differences; 0 = same node, 1 = different, 2 = unreadable."""
    parser = argparse.ArgumentParser(
        prog="compare-manifests",
        description="Compare two node manifests (JSON) field by field, outside the host section.")
    parser.add_argument("a", help="first manifest.json (e.g. artifacts/<host>/manifest.json)")
    parser.add_argument("b", help="second manifest.json")
    parser.add_argument("--ignore", action="append", default=[], metavar="PATH",
                        help='leave out a field and everything under it, e.g. service.env_sha256 or '
                             'model.files (repeatable)')
    args = parser.parse_args(argv)
    manifests = []
    for path in (args.a, args.b):
        try:
            with open(path, encoding="utf-8") as handle:
                manifests.append(json.load(handle))
        except (OSError, ValueError) as err:
            print(f"compare-manifests: cannot read {path}: {err}", file=sys.stderr)
            return 2
    try:
        lines = compare(manifests[0], manifests[1], args.ignore)
    except TypeError as err:
        print(f"compare-manifests: {err}", file=sys.stderr)
        return 2
    if not lines:
        print(f"same node: {args.a} and {args.b} agree outside host "
              f"(manifest_sha256 {manifests[0].get('manifest_sha256')})")
        return 0
    print(f"{len(lines)} difference(s) between A={args.a} and B={args.b}:")
    for line in lines:
        print(f"  {line}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
