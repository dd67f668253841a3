"""`make gpu-probe` against the simulated GPU node: a local/debian-systemd:bookworm container with no network, the
simulated tools of tests/fixtures/gpu_node installed (nvidia-smi answering -q -x with a healthy RTX PRO 6000) and
nothing else of the project's but the checkout and the wheels the probe carries (together at most 60 MiB). The probe
must pass in under 8 minutes, say it is simulated, and leave the measured fields null with the reason."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".cache" / "gpu-probe" / "wheels"
IMAGE = "local/debian-systemd:bookworm"
CARRIED_MAX = 60 * 2**20
INSIDE = """set -e
mkdir -p /src && tar -xf /carried.tar -C /src && cd /src
install -m 0755 tests/fixtures/gpu_node/nvidia-smi /usr/bin/nvidia-smi
install -m 0755 tests/fixtures/gpu_node/lspci /usr/local/bin/lspci
cp tests/fixtures/gpu_health/rtx-pro-6000-healthy.xml /etc/
python3 -c "import json; d = json.load(open('tests/fixtures/gpu_node/gpus.json'))
d['smi_xml'] = 'rtx-pro-6000-healthy.xml'
json.dump(d, open('/etc/vllm-node-fake-gpus.json', 'w'))"
bash scripts/gpu-probe.sh /out   # what make gpu-probe runs (the image has no make)
"""


def carried() -> bytes:
    """The checkout (tracked and new files, as git lists them; links as links: collections/ is the link stub that
    makes the checkout the collection) and the probe's wheels, as one tar."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    names = [n for n in listed if n and ((ROOT / n).is_file() or (ROOT / n).is_symlink())]
    names += [str(p.relative_to(ROOT)) for p in sorted(WHEELS.glob("*.whl"))]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in names:
            tar.add(ROOT / name, arcname=name)
    return buffer.getvalue()


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs docker and the local base image")
def test_the_probe_passes_on_the_simulated_node_and_says_so(tmp_path: Path) -> None:
    if not list(WHEELS.glob("pip-*.whl")):
        subprocess.run(["bash", str(ROOT / "scripts/gpu-probe.sh"), "wheels"], check=True, timeout=600)
    payload = carried()
    assert len(payload) <= CARRIED_MAX, f"the probe carries {len(payload) / 2**20:.1f} MiB"
    (tmp_path / "carried.tar").write_bytes(payload)
    (tmp_path / "inside.sh").write_text(INSIDE)
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    name = f"gpu-probe-test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        ["docker", "run", "--rm", "--name", name, "--network", "none",
         "-v", f"{tmp_path / 'carried.tar'}:/carried.tar:ro", "-v", f"{tmp_path / 'inside.sh'}:/inside.sh:ro",
         "-v", f"{out}:/out", IMAGE, "bash", "/inside.sh"],
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((out / "gpu-probe-report.json").read_text())
    assert report["simulated"] is True and "stand-in" in report["simulated_reason"]
    assert report["duration_s"] < 480
    assert report["gpu"] == {"count": 8, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                             "pci_device_id": "10de:2bb5", "memory_total_mib": 97887, "detected_by": "nvidia-smi",
                             "catalog_key": "rtx-pro-6000-blackwell"}
    assert report["health"]["verdict"] == "PASS"
    assert report["plan"]["fits"] is True and report["plan"]["per_gpu"]["total_bytes"] == 97887 * 2**20
    assert report["plan"]["cuda_context_bytes"] == int(0.75 * 2**30)
    measured = report["measured"]
    assert all(measured[field] is None for field in ("torch_total_bytes", "cuda_context_bytes", "non_torch_bytes"))
    assert measured["reason"].startswith("simulated: ")
    assert all(line["measured_bytes"] is None for line in report["compare"].values())
    assert (out / "raw" / "nvidia-smi-q-x.xml").read_text().startswith("<?xml")
    assert report["host"]["python"].startswith("3.11") and report["host"]["ansible_core"].startswith("2.19.")
