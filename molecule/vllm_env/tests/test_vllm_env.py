"""State of a node after the vllm_env scenario (converge, idempotence, side_effect)."""
import json
import re
from pathlib import Path

from harness.venv import assert_build_record, assert_root_owned_and_read_only, assert_service_account, run_ok

ROOT = "/opt/vllm"
ACTIVE = f"{ROOT}/venvs/0.32.0-cpu"
REPO = Path(__file__).resolve().parents[3]
LOCK = REPO / "roles/vllm_env/files/requirements/vllm-0.32.0-cpu.txt"


def test_service_account(host):
    assert_service_account(host)


def test_links_point_at_the_rolled_back_venv(host):
    current = host.file(f"{ROOT}/current")
    assert current.is_symlink
    assert current.linked_to == ACTIVE
    assert host.file(f"{ROOT}/previous").linked_to == ACTIVE
    assert not host.file(f"{ROOT}/current.new").exists, "no leftover of the atomic switch"


def test_venvs_are_root_owned_and_read_only_for_the_service(host):
    assert_root_owned_and_read_only(host, ROOT, ACTIVE)


def test_build_record_matches_the_repo_requirements(host):
    assert_build_record(host, ACTIVE, LOCK, "0.32.0")


def test_vllm_imports_as_the_service_user(host):
    out = run_ok(
        host, f"cd / && runuser -u vllm -- {ROOT}/current/bin/python -c 'import vllm; print(vllm.__version__)'"
    )
    assert out.splitlines()[-1] == "0.32.0"


def test_vllm_console_script_runs(host):
    out = run_ok(host, f"cd / && VLLM_TARGET_DEVICE=cpu {ROOT}/current/bin/vllm --version")
    assert out.splitlines()[-1].startswith("0.32.0")


def test_vllm_serve_help(host):
    out = run_ok(host, f"cd / && VLLM_TARGET_DEVICE=cpu {ROOT}/current/bin/vllm serve --help")
    assert "usage: vllm serve" in out


def test_dist_info_alias_reports_cpu_build(host):
    out = run_ok(host, f"{ROOT}/current/bin/python -c 'import importlib.metadata as m; print(m.version(\"vllm\"))'")
    assert out == "0.32.0+cpu"


def test_hf_cli_present(host):
    pinned = re.search(r"^huggingface-hub==(\S+)", LOCK.read_text(), re.M).group(1)
    out = run_ok(host, f"{ROOT}/current/bin/hf version")
    assert f"version: {pinned}" in out


def test_quirk_packages_absent(host):
    code = (
        "import importlib.util as u; "
        "print([n for n in ('torchvision','torchaudio','torchcodec','triton') if u.find_spec(n)])"
    )
    assert run_ok(host, f"{ROOT}/current/bin/python -c \"{code}\"") == "[]"


def test_torch_is_the_cpu_wheel(host):
    assert run_ok(host, f"{ROOT}/current/bin/python -c 'import torch; print(torch.__version__)'") == "2.13.0+cpu"


def test_bytecode_compiled(host):
    assert host.file(f"{ACTIVE}/lib/python3.11/site-packages/vllm/__pycache__").is_directory


def test_uv_pinned_in_tools_venv(host):
    assert run_ok(host, f"{ROOT}/tools/bin/uv --version").startswith("uv 0.13.8")


def test_extra_ca_certificates_installed(host):
    host_cas = sorted(p.stem for p in Path("/usr/local/share/ca-certificates").glob("*.crt"))
    for name in host_cas:
        assert host.file(f"/usr/local/share/ca-certificates/vllm-node-{name}.crt").exists


def test_broken_build_not_finished(host):
    assert host.file(f"{ROOT}/venvs/broken-cpu").is_directory
    assert not host.file(f"{ROOT}/venvs/broken-cpu/vllm-node-build.json").exists


def test_published_facts(host):
    facts = json.loads(host.file("/var/tmp/vllm_env-facts.json").content_string)
    assert facts["vllm_env_python"] == f"{ROOT}/current/bin/python"
    assert facts["vllm_env_bin_dir"] == f"{ROOT}/current/bin"
    assert facts["vllm_env_active_version"] == "0.32.0"
    assert facts["vllm_env_active_variant"] == "cpu"
