"""Tests of the simulated GPU tools (tests/fixtures/gpu_node): they must parse like the real ones."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPU_NODE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_node"
FIELDS = "index,name,memory.total,memory.used,memory.free,compute_cap,pci.bus_id,driver_version,uuid"


def run(tool: str, *args: str, data: str | Path = "gpus.json") -> subprocess.CompletedProcess[str]:
    """Run a stand-in with the given data file (a name next to the tools, or a path)."""
    path = data if isinstance(data, Path) else GPU_NODE / data
    env = dict(os.environ, VLLM_NODE_FAKE_GPUS=str(path))
    return subprocess.run([sys.executable, str(GPU_NODE / tool), *args], env=env,
                          capture_output=True, text=True, check=False)


def test_query_csv_with_header_parses() -> None:
    out = run("nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv")
    assert out.returncode == 0, out.stdout
    rows = list(csv.reader(io.StringIO(out.stdout), skipinitialspace=True))
    assert rows[0] == ["index", "name", "memory.total [MiB]", "memory.used [MiB]", "memory.free [MiB]",
                       "compute_cap", "pci.bus_id", "driver_version", "uuid"]
    assert len(rows) == 9
    assert rows[1][:3] == ["0", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "97887 MiB"]
    assert rows[1][5:8] == ["12.0", "00000000:01:00.0", "580.95.05"]
    assert rows[8][6] == "00000000:08:00.0"
    assert len({row[8] for row in rows[1:]}) == 8, "UUIDs must be unique"


def test_query_noheader_nounits() -> None:
    out = run("nvidia-smi", "--query-gpu=index,memory.total,memory.free", "--format=csv,noheader,nounits")
    lines = out.stdout.splitlines()
    assert lines == [f"{i}, 97887, 97887" for i in range(8)]


def test_query_space_separated_arguments_and_id_selection() -> None:
    out = run("nvidia-smi", "--query-gpu", "index,pci.device_id", "--format", "csv,noheader", "-i", "2,5")
    assert out.stdout.splitlines() == ["2, 0x2BB510DE", "5, 0x2BB510DE"]


def test_unknown_field_is_rejected_like_the_real_tool() -> None:
    out = run("nvidia-smi", "--query-gpu=index,gpu_bogus", "--format=csv")
    assert out.returncode == 2
    assert out.stdout.startswith('Field "gpu_bogus" is not a valid field to query.')


def test_query_without_format_and_bad_option_fail() -> None:
    assert run("nvidia-smi", "--query-gpu=index").returncode == 2
    assert run("nvidia-smi", "--frobnicate").returncode == 2
    assert run("nvidia-smi", "--query-gpu=index", "--format=json").returncode == 2


def test_list_version_and_table() -> None:
    listing = run("nvidia-smi", "-L").stdout.splitlines()
    assert len(listing) == 8
    assert listing[0].startswith("GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-")
    version = run("nvidia-smi", "--version").stdout
    assert "DRIVER version      : 580.95.05" in version and "CUDA Version        : 13.0" in version
    table = run("nvidia-smi").stdout.splitlines()
    assert "Driver Version: 580.95.05" in table[2] and "CUDA Version: 13.0" in table[2]
    assert sum("97887MiB" in line for line in table) == 8
    assert len({len(line) for line in table[1:]}) == 1, "the table's lines must all be the same width"


@pytest.mark.parametrize("data", ["gpus-proprietary.json", "gpus-no-driver.json", "gpus-none.json"])
def test_driver_down_variants(data: str) -> None:
    out = run("nvidia-smi", "--query-gpu=index", "--format=csv", data=data)
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout


def test_missing_data_file_means_no_driver(tmp_path: Path) -> None:
    assert run("nvidia-smi", "-L", data=tmp_path / "absent.json").returncode == 9
    assert run("lspci", "-nn", data=tmp_path / "absent.json").stdout == ""


def test_no_devices(tmp_path: Path) -> None:
    data = json.loads((GPU_NODE / "gpus.json").read_text()) | {"gpus": []}
    (tmp_path / "d.json").write_text(json.dumps(data))
    out = run("nvidia-smi", "-L", data=tmp_path / "d.json")
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")


def test_lspci_nn_lists_gpus_among_other_devices() -> None:
    lines = run("lspci", "-nn").stdout.splitlines()
    gpus = [line for line in lines if "[10de:2bb5]" in line]
    assert len(gpus) == 8 and len(lines) > 8
    assert gpus[0] == ("01:00.0 3D controller [0302]: NVIDIA Corporation GB202GL "
                       "[RTX PRO 6000 Blackwell Server Edition] [10de:2bb5] (rev a1)")
    assert any("[0300]" in line and "[1a03:2000]" in line for line in lines), "the BMC VGA must be there"


def test_lspci_vendor_filter_and_machine_format() -> None:
    assert len(run("lspci", "-d", "10de:").stdout.splitlines()) == 8
    assert run("lspci", "-d", "8086:").stdout.count("\n") == 2
    assert len(run("lspci", "-d", "::0302").stdout.splitlines()) == 8
    machine = run("lspci", "-mm", "-nn", "-d", "10de:").stdout.splitlines()
    assert machine[0] == ('01:00.0 "3D controller [0302]" "NVIDIA Corporation [10de]" '
                          '"GB202GL [RTX PRO 6000 Blackwell Server Edition] [2bb5]" -ra1 '
                          '"NVIDIA Corporation [10de]" "Device [204e]"')
    assert run("lspci", "-D", "-n", "-s", "03:00").stdout == "0000:03:00.0 0302: 10de:2bb5 (rev a1)\n"


def test_lspci_and_nvidia_smi_agree_on_bus_ids() -> None:
    smi = run("nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader").stdout.split()
    pci = [line.split()[0] for line in run("lspci", "-D", "-d", "10de:").stdout.splitlines()]
    assert [b[4:].lower() for b in smi] == pci


def test_bad_lspci_option() -> None:
    assert run("lspci", "-x").returncode == 2
