#!/usr/bin/env python3
"""The vllm_env role's pinned requirements files ("locks"): compile them, summarise them into the catalog the
roles read, and check that every pin of a CUDA lock resolves on the package index for its node's Python and
platform, from the index's metadata only (PEP 691 JSON pages; no wheel is downloaded).

  python scripts/vllm_locks.py compile [--uv UV]   # make locks: one CUDA lock per Python the supported OSes carry
                                                   # (uv: the nodes' version, vllm_env_uv_version, in .cache/uv-tool)
  python scripts/vllm_locks.py catalog [--check]   # roles/vllm_node/vars/main/vllm_locks.yml from the locks
  python scripts/vllm_locks.py check [--refresh] [LOCK...]   # make unit runs it (make lock-check alone)

Index pages are cached in .cache/pypi-simple/ (a second run is offline); a cached page that does not know a pinned
version is fetched again, --refresh fetches every page. LOCK_CHECK_INDEX_URL points the check at a mirror.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
REQ_DIR = ROOT / "roles" / "vllm_env" / "files" / "requirements"
PLATFORMS_FILE = ROOT / "roles" / "vllm_node" / "vars" / "main" / "platforms.yml"
CATALOG_FILE = ROOT / "roles" / "vllm_node" / "vars" / "main" / "vllm_locks.yml"
CACHE_DIR = ROOT / ".cache" / "pypi-simple"
DEFAULT_INDEX = "https://pypi.org/simple"
# Compile options shared by every CUDA lock (the header uv writes records them with the Python).
COMPILE_PLATFORM = "x86_64-manylinux_2_28"
# Files uploaded after this are not considered: a lock compiled from scratch resolves against the index as it was
# then, the same answer every time (yanked files aside).
# Existing locks keep their pins anyway (uv prefers the versions already in the output file).
EXCLUDE_NEWER = "2026-12-01T00:00:00Z"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
LOCK_NAME = re.compile(r"^vllm-(?P<version>[^-]+)-(?P<variant>[a-z]+)(?:-py(?P<python>\d+\.\d+))?\.txt$")
# The distribution whose version is the lock's CUDA runtime (cu12-suffixed before CUDA 13).
# Pins the plan reads from the catalog (`pins`, only those a lock has): the weight loaders' packages (a loader whose
# package the lock lacks is refused) and the JIT compilers whose caches the compile-cache key covers
# (plugins/module_utils/sizing/warmstart.py).
PLANNED_PINS = ("fastsafetensors", "flashinfer-python", "instanttensor", "runai-model-streamer", "triton")
CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$")


@dataclass(frozen=True)
class Pin:
    """One `name==version` line of a lock with the sha256 hashes that follow it."""

    name: str
    version: str
    hashes: tuple[str, ...] = field(default=())


def parse_lock(text: str) -> dict[str, Pin]:
    """Map each pinned distribution (canonical name) to its pin. Raises ValueError for a hash before any pin."""
    pins: dict[str, Pin] = {}
    current: str | None = None
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins[current] = Pin(current, match.group(2))
        digests = HASH.findall(line)
        if digests:
            if current is None:
                raise ValueError(f"a --hash line before any pin: {line.strip()}")
            pin = pins[current]
            pins[current] = Pin(pin.name, pin.version, pin.hashes + tuple(digests))
    return pins


def lock_python(text: str) -> str:
    """The Python a lock was compiled for, from the `--python-version X.Y` uv records in its header ('' if none)."""
    match = re.search(r"--python-version[ =](\d+\.\d+)", text)
    return match.group(1) if match else ""


def lock_summary(name: str, text: str) -> dict[str, Any]:
    """What the roles need to know about one lock: its file, Python, size, torch and CUDA runtime (major)."""
    match = LOCK_NAME.match(name)
    if not match:
        raise ValueError(f"{name}: lock files are named vllm-<version>-<variant>[-py<X.Y>].txt")
    python = lock_python(text)
    if match.group("python") and match.group("python") != python:
        raise ValueError(f"{name} is named for Python {match.group('python')} but compiled for Python {python}")
    pins = parse_lock(text)
    runtime = next((pin.version for pin in pins.values() if CUDA_RUNTIME.match(pin.name)), None)
    return {
        "file": name,
        "python": python,
        "packages": len(pins),
        "torch": pins["torch"].version if "torch" in pins else None,
        "cuda_runtime": runtime,
        "cuda_major": int(runtime.split(".")[0]) if runtime else None,
        "pins": {name: pins[name].version for name in PLANNED_PINS if name in pins},
    }


def release_key(name: str) -> str:
    """'0.33.0-cuda' for vllm-0.33.0-cuda-py3.12.txt (and for vllm-0.33.0-cuda.txt)."""
    match = LOCK_NAME.match(name)
    if not match:
        raise ValueError(f"{name}: lock files are named vllm-<version>-<variant>[-py<X.Y>].txt")
    return f"{match.group('version')}-{match.group('variant')}"


def lock_files(req_dir: Path = REQ_DIR, variant: str | None = None) -> list[Path]:
    """The locks in the role's requirements directory, optionally of one variant, sorted by name."""
    return sorted(p for p in req_dir.glob("vllm-*.txt")
                  if LOCK_NAME.match(p.name) and (variant is None or LOCK_NAME.match(p.name)["variant"] == variant))


def load_platforms(path: Path = PLATFORMS_FILE) -> dict[str, dict[str, str]]:
    """vllm_node_platforms: OS key (Ubuntu-24) -> {name, python, glibc}."""
    return yaml.safe_load(path.read_text())["vllm_node_platforms"]


# ---------------------------------------------------------------------------------------------------- index pages

Fetch = Callable[[str], dict[str, Any]]


def fetch_page(name: str, index_url: str = DEFAULT_INDEX, timeout: float = 60, attempts: int = 3) -> dict[str, Any]:
    """A project's PEP 691 JSON page from the index, reduced to what the check reads (file names, sha256, Python).
    A project the index does not have (404) is a page without files; a network error is retried, then raised."""
    request = urllib.request.Request(f"{index_url.rstrip('/')}/{canonicalize_name(name)}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (https index URL)
                page = json.load(response)
            break
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return {"name": canonicalize_name(name), "files": []}
            if attempt == attempts:
                raise
        except (urllib.error.URLError, TimeoutError):
            if attempt == attempts:
                raise
        time.sleep(2 * attempt)
    return {"name": canonicalize_name(name),
            "files": [{"filename": f["filename"], "sha256": f.get("hashes", {}).get("sha256", ""),
                       "requires_python": f.get("requires-python") or "", "yanked": bool(f.get("yanked"))}
                      for f in page.get("files", [])]}


def file_version(filename: str) -> Version | None:
    """The version of a wheel or sdist file name; None for anything else (eggs, exe installers)."""
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def files_of_version(page: dict[str, Any], version: str) -> list[dict[str, Any]]:
    """The files of a page whose version equals `version` (PEP 440 equality: 1.0 == 1.0.0)."""
    wanted = Version(version)
    # Parsing every file name of a large project is slow: look at the names that spell the version first, and at
    # all of them only when none does.
    spelled = [f for f in page["files"] if version in f["filename"] or str(wanted) in f["filename"]]
    mine = [f for f in spelled if file_version(f["filename"]) == wanted]
    return mine or [f for f in page["files"] if f not in spelled and file_version(f["filename"]) == wanted]


class CachedIndex:
    """Index pages cached as JSON files: fetched when missing, on refresh, or when a page lacks a pin's version."""

    def __init__(self, cache_dir: Path = CACHE_DIR, fetch: Fetch | None = None, refresh: bool = False) -> None:
        self.cache_dir = cache_dir
        self.fetch = fetch or fetch_page
        self.refresh = refresh
        self.fetched = 0

    def page(self, name: str, version: str) -> dict[str, Any]:
        """The page of `name`, fresh enough to know `version` if the index does."""
        path = self.cache_dir / f"{canonicalize_name(name)}.json"
        if not self.refresh and path.is_file():
            page = json.loads(path.read_text())
            if files_of_version(page, version):
                return page
        page = self.fetch(name)
        self.fetched += 1
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(page, separators=(",", ":")))
        tmp.replace(path)
        return page


# ------------------------------------------------------------------------------------------------ the resolution

def supported_tags(python: str, glibc: str, arch: str = "x86_64") -> frozenset[Tag]:
    """Wheel tags a CPython `python` (3.12) on a glibc `glibc` (2.39) Linux `arch` installs, as pip and uv rank them:
    manylinux_2_Y for every Y up to the node's glibc (and the legacy manylinux1/2010/2014 aliases), abi3 wheels of
    older CPythons, pure-Python wheels."""
    major, minor = (int(part) for part in python.split("."))
    glibc_major, glibc_minor = (int(part) for part in glibc.split("."))
    platforms = [f"manylinux_{glibc_major}_{m}_{arch}" for m in range(glibc_minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    platforms += [f"{alias}_{arch}" for m, alias in legacy.items() if glibc_major == 2 and m <= glibc_minor]
    interpreter = f"cp{major}{minor}"
    tags = set(cpython_tags((major, minor), abis=[interpreter, "abi3", "none"], platforms=platforms))
    tags |= set(compatible_tags((major, minor), interpreter, platforms))
    return frozenset(tags)


def check_pin(pin: Pin, page: dict[str, Any], python: str, tags: frozenset[Tag]) -> str | None:
    """Why `pin` cannot be installed with --require-hashes on that Python and platform, or None when it can: the
    index must list a wheel of the pinned version whose tags and Requires-Python fit and whose sha256 is one of the
    lock's hashes."""
    mine = files_of_version(page, pin.version)
    if not mine:
        return "the index has no file of this version"
    fitting = [f for f in mine
               if f["filename"].endswith(".whl") and set(parse_wheel_filename(f["filename"])[3]) & tags
               and (not f["requires_python"] or SpecifierSet(f["requires_python"]).contains(python))]
    if not fitting:
        # python-abi-platform of each wheel (the file name's last three fields), "sdist" for a source archive
        kinds = sorted({"-".join(f["filename"].removesuffix(".whl").split("-")[-3:])
                        if f["filename"].endswith(".whl") else "sdist" for f in mine})
        return f"no wheel for this Python and platform (the index has: {', '.join(kinds)})"
    if not set(pin.hashes) & {f["sha256"] for f in fitting}:
        return (f"none of the lock's {len(pin.hashes)} hashes matches a fitting wheel "
                f"({', '.join(f['filename'] for f in fitting[:3])})")
    return None


def check_lock(text: str, label: str, targets: Iterable[tuple[str, str]], index: CachedIndex,
               workers: int = 8) -> tuple[list[str], int]:
    """Every pin of one lock against the index, for each (os_name, glibc) the lock serves. Returns the problems
    (each naming the lock, the package, its version, the Python and the OS) and the number of pins checked."""
    python = lock_python(text)
    if not python:
        return [f"{label}: no --python-version in the header: recompile it with `make locks`"], 0
    pins = sorted(parse_lock(text).values(), key=lambda p: p.name)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pages = dict(zip([p.name for p in pins], pool.map(lambda p: index.page(p.name, p.version), pins),
                         strict=True))
    problems = []
    for os_name, glibc in targets:
        tags = supported_tags(python, glibc)
        for pin in pins:
            reason = check_pin(pin, pages[pin.name], python, tags)
            if reason:
                problems.append(f"{label}: {pin.name}=={pin.version} for Python {python} on {os_name} "
                                f"(x86_64, glibc {glibc}): {reason}")
    return problems, len(pins)


def lock_targets(python: str, platforms: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    """(OS name, glibc) of every supported OS whose Python is `python`."""
    return [(p["name"], p["glibc"]) for p in platforms.values() if p["python"] == python]


# ------------------------------------------------------------------------------------------ catalog and compile

def requires_python(distribution: str, version: str, index: CachedIndex) -> str:
    """The Requires-Python of a release's wheels on the index ('' when it declares none)."""
    page = index.page(distribution, version)
    values = {f["requires_python"] for f in files_of_version(page, version) if f["filename"].endswith(".whl")}
    return sorted(values)[0] if values else ""


def build_catalog(req_dir: Path, index: CachedIndex) -> dict[str, Any]:
    """vllm_node_vllm_locks: release key -> {distribution, requires_python, pythons: {X.Y: summary}}."""
    catalog: dict[str, Any] = {}
    for lock in lock_files(req_dir):
        summary = lock_summary(lock.name, lock.read_text())
        key = release_key(lock.name)
        version, variant = key.rsplit("-", 1)
        distribution = "vllm" if variant == "cuda" else f"vllm-{variant}"
        entry = catalog.setdefault(key, {"distribution": distribution,
                                         "requires_python": requires_python(distribution, version, index),
                                         "pythons": {}})
        entry["pythons"][summary.pop("python")] = summary
    return catalog


def render_catalog(catalog: dict[str, Any]) -> str:
    """The catalog as the vars file the vllm_node role loads (stable order, so a rebuild diffs cleanly)."""
    body = yaml.safe_dump({"vllm_node_vllm_locks": catalog}, sort_keys=True, default_flow_style=None, width=160)
    return ("---\n# GENERATED by `make locks` (scripts/vllm_locks.py catalog) from roles/vllm_env/files/requirements/: "
            "do not edit.\n# Per vLLM release and build: the Pythons it has a lock for (the node's Python picks one), "
            "each lock's size, torch\n# and CUDA runtime (its major decides the oldest driver branch, "
            "vllm_node_driver_cuda), the pins the plan reads\n# (weight loaders, JIT compilers) and the release's "
            "Requires-Python.\n" + body)


def compile_locks(uv: str, req_dir: Path, platforms: dict[str, dict[str, str]], index: CachedIndex) -> list[str]:
    """One lock per CUDA release (.in) and Python the supported OSes carry, where the release supports that Python.
    A new lock is seeded with the release's existing lock, so every Python pins the same versions where it can.
    Returns notes on the Pythons left out."""
    notes = []
    pythons = sorted({p["python"] for p in platforms.values()}, key=Version)
    for source in sorted(req_dir.glob("vllm-*-cuda.in")):
        version = source.name.removeprefix("vllm-").removesuffix("-cuda.in")
        supported = SpecifierSet(requires_python("vllm", version, index))
        existing = lock_files(req_dir, "cuda")
        seed = next((p for p in existing if release_key(p.name) == f"{version}-cuda"), None)
        for python in pythons:
            if not supported.contains(python):
                users = ", ".join(p["name"] for p in platforms.values() if p["python"] == python)
                notes.append(f"vLLM {version}: no lock for Python {python} ({users}): "
                             f"vLLM {version} requires Python {supported}")
                continue
            out = req_dir / f"vllm-{version}-cuda-py{python}.txt"
            if not out.exists() and seed is not None:
                out.write_text(seed.read_text())
            subprocess.run([uv, "pip", "compile", "--quiet", "--generate-hashes", "--python-version", python,
                            "--python-platform", COMPILE_PLATFORM, "--exclude-newer", EXCLUDE_NEWER,
                            source.name, "-o", out.name], cwd=req_dir, check=True)
            seed = seed or out
    return notes


def ensure_uv(tool_dir: Path = ROOT / ".cache" / "uv-tool") -> str:
    """uv of the version the nodes run (vllm_env_uv_version), installed with pip into its own venv once."""
    defaults = yaml.safe_load((ROOT / "roles" / "vllm_env" / "defaults" / "main.yml").read_text())
    version = str(defaults["vllm_env_uv_version"])
    uv = tool_dir / "bin" / "uv"
    if uv.exists():
        current = subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=False).stdout
        if current.split()[1:2] == [version]:
            return str(uv)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(tool_dir)], check=True)
    subprocess.run([str(tool_dir / "bin" / "pip"), "install", "--quiet", f"uv=={version}"], check=True)
    return str(uv)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    comp = sub.add_parser("compile", help="compile the CUDA locks (needs uv and the index), then the catalog")
    comp.add_argument("--uv", default="", help="uv to run (default: vllm_env_uv_version in .cache/uv-tool)")
    cat = sub.add_parser("catalog", help="write the catalog of the locks")
    cat.add_argument("--check", action="store_true", help="fail when the committed catalog differs")
    chk = sub.add_parser("check", help="check every pin of the CUDA locks against the index")
    chk.add_argument("--refresh", action="store_true", help="fetch every index page again")
    chk.add_argument("locks", nargs="*", type=Path)
    args = parser.parse_args(argv)

    index_url = os.environ.get("LOCK_CHECK_INDEX_URL", DEFAULT_INDEX)
    index = CachedIndex(fetch=lambda name: fetch_page(name, index_url), refresh=getattr(args, "refresh", False))
    platforms = load_platforms()
    if args.command == "compile":
        for note in compile_locks(args.uv or ensure_uv(), REQ_DIR, platforms, index):
            print(f"vllm_locks: {note}")
    if args.command in ("compile", "catalog"):
        text = render_catalog(build_catalog(REQ_DIR, index))
        if getattr(args, "check", False):
            if CATALOG_FILE.read_text() != text:
                print(f"vllm_locks: {CATALOG_FILE.relative_to(ROOT)} is not what the locks say: run `make locks`",
                      file=sys.stderr)
                return 1
            return 0
        CATALOG_FILE.write_text(text)
        print(f"vllm_locks: wrote {CATALOG_FILE.relative_to(ROOT)}")
        return 0

    started = time.monotonic()
    locks = args.locks or lock_files(REQ_DIR, "cuda")
    problems: list[str] = []
    pins = 0
    try:
        for lock in locks:
            text = lock.read_text()
            targets = lock_targets(lock_python(text), platforms)
            if not targets:
                problems.append(f"{lock.name}: Python {lock_python(text)} is the Python of no supported OS "
                                f"({PLATFORMS_FILE.relative_to(ROOT)})")
                continue
            found, count = check_lock(text, lock.name, targets, index)
            problems += found
            pins += count
    except (urllib.error.URLError, TimeoutError) as err:
        print(f"vllm_locks: the index {index_url} did not answer ({err}); the cache {CACHE_DIR} lacks pages",
              file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"vllm_locks: {pins} pins of {len(locks)} CUDA locks checked against {index_url} "
          f"({index.fetched} pages fetched) in {time.monotonic() - started:.1f} s: "
          f"{'FAILED, ' + str(len(problems)) + ' problems' if problems else 'every pin resolves'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
