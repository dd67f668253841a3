"""The vllm_env role's pinned requirements files are complete, hashed locks that match the role's data:
every pin has a sha256, each file records the Python it was compiled for, the default vLLM version
(roles/vllm_node/defaults) has a file, and the cpu variant's unusable distributions (vars/main.yml) are not in
its file. The cpu locks (0.31.0 and 0.32.0, for the day-2 upgrade and rollback) are compiled alike, pin the same
torch, and their versions are in the release rules' known versions. The CUDA locks of a release (one per Python,
vllm-<version>-cuda-py<X.Y>.txt) are compiled from one .in by one command."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from repo_root import ROOT

ROLE = ROOT / "roles" / "vllm_env"
REQ_DIR = ROLE / "files" / "requirements"
LOCKS = sorted(REQ_DIR.glob("vllm-*.txt"))
CPU_LOCKS = sorted(REQ_DIR.glob("vllm-*-cpu.txt"))
CUDA_LOCKS = sorted(REQ_DIR.glob("vllm-*-cuda-py*.txt"))
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
# vllm-<version>-<variant>[-py<X.Y>].txt
NAME = re.compile(r"vllm-(?P<version>[^-]+)-(?P<variant>[a-z]+)(?:-py(?P<python>\d+\.\d+))?\.txt")


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """Map each pinned distribution (normalised name) to its version and sha256 hashes."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            current = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            pins[current] = (match.group(2), [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            assert current is not None, f"hash before any pin: {line}"
            pins[current][1].append(digest)
    return pins


def variants() -> dict:
    return yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__vllm_env_variants"]


def test_there_are_locks():
    assert {p.name for p in LOCKS} >= {"vllm-0.33.0-cuda-py3.11.txt", "vllm-0.33.0-cuda-py3.12.txt",
                                       "vllm-0.33.0-cuda-py3.13.txt", "vllm-0.32.0-cpu.txt", "vllm-0.31.0-cpu.txt"}


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_pin_is_hashed(lock: Path):
    pins = parse_lock(lock.read_text())
    assert len(pins) > 50
    unhashed = [name for name, (_, hashes) in pins.items() if not hashes]
    assert unhashed == []
    # Anything that is not a pin, a hash, a comment or a continuation would be an unpinned requirement.
    stray = [line for line in lock.read_text().splitlines()
             if line.strip() and not PIN.match(line) and not line.lstrip().startswith(("--hash", "#"))]
    assert stray == []


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_lock_matches_its_name_and_input(lock: Path):
    version, variant, python = NAME.fullmatch(lock.name).group("version", "variant", "python")
    dist = variants()[variant]["distribution"]
    assert parse_lock(lock.read_text())[dist][0] == version
    assert (REQ_DIR / f"vllm-{version}-{variant}.in").is_file(), "the .in the lock was compiled from is kept beside it"
    header = re.search(r"--python-version (\d+\.\d+)", lock.read_text())
    assert header, "the role reads the target Python from here"
    assert python in (None, header.group(1)), "a -py<X.Y> lock is compiled for that Python"
    assert lock.name in lock.read_text().splitlines()[1], "the header records the command that wrote it"


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_variant_uninstall_list_is_not_in_the_lock(lock: Path):
    variant = NAME.fullmatch(lock.name).group("variant")
    pins = parse_lock(lock.read_text())
    assert [name for name in variants()[variant]["uninstall"] if name in pins] == []


@pytest.mark.parametrize("lock", CPU_LOCKS, ids=lambda p: p.name)
def test_cpu_lock_takes_torch_from_the_wheelhouse(lock: Path):
    version, hashes = parse_lock(lock.read_text())["torch"]
    assert version == "2.13.0+cpu"
    wheels = list(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))
    if not wheels:
        pytest.skip("no /opt/wheels torch wheel on this machine")
    import hashlib
    assert hashlib.sha256(wheels[0].read_bytes()).hexdigest() in hashes


def test_locks_ship_the_hf_cli():
    for lock in LOCKS:
        assert "huggingface-hub" in parse_lock(lock.read_text()), lock.name


def test_node_default_has_a_lock():
    knobs = yaml.safe_load((ROOT / "roles" / "vllm_node" / "defaults" / "main.yml").read_text())
    name = f"vllm-{knobs['vllm_node_vllm_version']}-{knobs['vllm_node_vllm_variant']}"
    assert list(REQ_DIR.glob(f"{name}-py*.txt")) or (REQ_DIR / f"{name}.txt").is_file()


def test_cpu_locks_are_compiled_alike_with_one_torch():
    """Both versions build from one wheelhouse only if they share torch (not on PyPI) and the compile options."""
    def command(lock: Path) -> str:
        version = re.fullmatch(r"vllm-(.+)-cpu\.txt", lock.name).group(1)
        return lock.read_text().splitlines()[1].replace(version, "VERSION")

    assert len(CPU_LOCKS) >= 2
    assert len({command(lock) for lock in CPU_LOCKS}) == 1, [command(lock) for lock in CPU_LOCKS]
    assert len({str(parse_lock(lock.read_text())["torch"]) for lock in CPU_LOCKS}) == 1


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_lock_version_is_known_to_the_release_rules(lock: Path):
    version = NAME.fullmatch(lock.name).group("version")
    releases = yaml.safe_load((ROOT / "roles" / "vllm_node" / "vars" / "main" / "vllm_releases.yml").read_text())
    assert version in releases["vllm_node_vllm_releases"]["known_versions"]


def test_cuda_locks_of_a_release_are_compiled_alike():
    """One .in, one uv command per release; only the Python (and the output name) differ (make locks)."""
    def command(lock: Path) -> str:
        python = NAME.fullmatch(lock.name).group("python")
        return lock.read_text().splitlines()[1].replace(python, "X.Y")

    assert len(CUDA_LOCKS) >= 3
    by_release: dict[str, set[str]] = {}
    for lock in CUDA_LOCKS:
        by_release.setdefault(NAME.fullmatch(lock.name).group("version"), set()).add(command(lock))
    assert all(len(commands) == 1 for commands in by_release.values()), by_release
    assert not list(REQ_DIR.glob("vllm-*-cuda.txt")), "CUDA locks are per Python: vllm-<version>-cuda-py<X.Y>.txt"
