"""The venvs of the node that lived through the day-2 sequence (runs after test_day2.py and the manifest
comparison), then the vllm_env role alone on it: its rollback switch and its refusal of an unknown version.

These were the vllm_env scenario's checks on a node of its own (create, converge, idempotence, side_effect);
`make test` runs them here instead, on a node that already holds two real versions and a broken build, which saves
that scenario's ~20 min in the CI budget. `make molecule MOLECULE_SCENARIOS=vllm_env` still runs it (it alone also
covers the role's check mode on a fresh node and a same-version rebuild side by side).
State here (test_day2.py): current -> 0.31.0-cpu (step 07 switched back to it), previous -> 0.32.0-cpu, broken-cpu
built but refused at the smoke import (step 03).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from test_day2 import ARTIFACTS, NODE, PROJECT, converge

from harness import playbook
from harness.venv import assert_build_record, assert_root_owned_and_read_only, assert_service_account, run_ok

testinfra_hosts = [f"ansible://{NODE}"]

ROOT = "/opt/vllm"
SERVED, PREVIOUS = "0.31.0", "0.32.0"
ACTIVE = f"{ROOT}/venvs/{SERVED}-cpu"
LOCK = PROJECT / f"roles/vllm_env/files/requirements/vllm-{SERVED}-cpu.txt"
INSTALL_TASK = "vllm_env : Install the pinned requirements with hashes (uv pip sync)"
ROLE_DEFAULTS = yaml.safe_load((PROJECT / "roles/vllm_env/defaults/main.yml").read_text())


def pinned(name: str) -> str:
    """The version the served lock pins for a package."""
    return re.search(rf"^{re.escape(name)}==(\S+)", LOCK.read_text(), re.M).group(1)


def role_alone(step: str, **on_top: Any) -> tuple[int, str]:
    """vllm_env_role.yml with the sequence's final extra vars and `on_top`; (rc, output)."""
    final = json.loads((ARTIFACTS / "final-extra-vars.json").read_text())
    rc, output, _ = converge(step, dict(final, **on_top), path="molecule/day2/vllm_env_role.yml")
    return rc, output


def links(host) -> tuple[str, str]:
    return host.file(f"{ROOT}/current").linked_to, host.file(f"{ROOT}/previous").linked_to


# ---- the state the sequence left --------------------------------------------------------------------------------


def test_service_account(host):
    assert_service_account(host)


def test_links_after_the_switch_back(host):
    assert links(host) == (ACTIVE, f"{ROOT}/venvs/{PREVIOUS}-cpu")
    assert not host.file(f"{ROOT}/current.new").exists, "no leftover of the atomic switch"


def test_venvs_are_root_owned_and_read_only_for_the_service(host):
    assert_root_owned_and_read_only(host, ROOT, ACTIVE)


def test_build_record_matches_the_repo_requirements(host):
    assert_build_record(host, ACTIVE, LOCK, SERVED)


def test_vllm_imports_as_the_service_user_and_its_console_script_runs(host):
    imported = "import vllm; print(vllm.__version__)"
    out = run_ok(host, f"cd / && runuser -u vllm -- {ROOT}/current/bin/python -c '{imported}'")
    assert out.splitlines()[-1] == SERVED
    out = run_ok(host, f"cd / && VLLM_TARGET_DEVICE=cpu {ROOT}/current/bin/vllm --version")
    assert out.splitlines()[-1].startswith(SERVED)


def test_dist_info_alias_reports_the_cpu_build(host):
    out = run_ok(host, f"{ROOT}/current/bin/python -c 'import importlib.metadata as m; print(m.version(\"vllm\"))'")
    assert out == f"{SERVED}+cpu"


def test_hf_cli_is_the_pinned_one(host):
    assert f"version: {pinned('huggingface-hub')}" in run_ok(host, f"{ROOT}/current/bin/hf version")


def test_quirk_packages_absent_and_torch_is_the_cpu_wheel(host):
    quirks = "('torchvision', 'torchaudio', 'torchcodec', 'triton')"
    code = f"import importlib.util as u, torch; print([n for n in {quirks} if u.find_spec(n)], torch.__version__)"
    assert run_ok(host, f"{ROOT}/current/bin/python -c \"{code}\"") == f"[] {pinned('torch')}"


def test_bytecode_compiled(host):
    assert host.file(f"{ACTIVE}/lib/python3.11/site-packages/vllm/__pycache__").is_directory


def test_uv_pinned_in_the_tools_venv(host):
    assert run_ok(host, f"{ROOT}/tools/bin/uv --version").startswith(f"uv {ROLE_DEFAULTS['vllm_env_uv_version']}")


def test_extra_ca_certificates_installed(host):
    # the demo inventory trusts this machine's extra CAs on the node (demo_trust_controller_cas)
    for name in sorted(p.stem for p in Path("/usr/local/share/ca-certificates").glob("*.crt")):
        assert host.file(f"/usr/local/share/ca-certificates/vllm-node-{name}.crt").exists, name


def test_broken_build_is_not_marked_finished(host):
    assert host.file(f"{ROOT}/venvs/broken-cpu").is_directory
    assert not host.file(f"{ROOT}/venvs/broken-cpu/vllm-node-build.json").exists


# ---- the role alone: rollback and refusal (they change the links; nothing runs after this file) -----------------


def test_rollback_switches_to_previous_without_installing_then_has_nothing_left(host):
    built = host.file(f"{ROOT}/venvs/{PREVIOUS}-cpu/vllm-node-build.json").mtime
    rc, out = role_alone("09-vllm-env-rollback", vllm_env_rollback=True)
    assert rc == 0, out[-3000:]
    assert links(host) == (f"{ROOT}/venvs/{PREVIOUS}-cpu",) * 2
    assert host.file(f"{ROOT}/venvs/{PREVIOUS}-cpu/vllm-node-build.json").mtime == built, "rebuilt, not switched"
    install = playbook.statuses(out, INSTALL_TASK)
    assert install in ([], ["skipping"]), "the rollback installed"
    rc, out = role_alone("10-vllm-env-rollback-again", vllm_env_rollback=True)
    assert rc == 0, out[-3000:]
    assert playbook.recap(out, NODE)["changed"] == 0, "a second rollback has nothing left to switch"
    assert links(host) == (f"{ROOT}/venvs/{PREVIOUS}-cpu",) * 2


def test_a_version_without_a_lock_is_refused_before_any_venv(host):
    rc, out = role_alone("11-vllm-env-unknown-version", vllm_node_vllm_version="9.9.9")
    assert rc != 0
    assert "No pinned requirements file" in out and f"vllm-{SERVED}-cpu.txt" in out, out[-3000:]
    assert not host.file(f"{ROOT}/venvs/9.9.9-cpu").exists
