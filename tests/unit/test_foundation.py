"""Checks of the foundation's own promises: set-up refuses clearly, CI runs the README's test command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from repo_root import ROOT as REPO


def _fake_python(bindir: Path, name: str, version: str) -> None:
    """Write an executable that behaves like an old CPython for the version probe."""
    major, minor = (int(p) for p in version.split(".")[:2])
    script = bindir / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-c" ]; then exit $([ {minor} -ge 12 ] && [ {major} -ge 3 ] && echo 0 || echo 1); fi\n'
        f'echo "Python {version}"\n'
    )
    script.chmod(0o755)


def test_setup_refuses_without_python_312_and_says_what_to_install(tmp_path: Path) -> None:
    """With only Python 3.11 available, set-up stops with a message naming what to install."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup-controller.sh", work / "scripts")
    shutil.copy(REPO / "requirements.txt", work)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_python(bindir, "python3", "3.11.7")
    for tool in ("bash", "sha256sum", "cut", "cat", "ls", "sort", "dirname", "rm"):
        found = shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    env = {"PATH": str(bindir), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "no-pyenv")}
    result = subprocess.run(
        ["bash", str(work / "scripts" / "setup-controller.sh")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no Python >= 3.12 found" in result.stderr
    assert "apt-get install -y python3 python3-venv" in result.stderr
    assert not (work / ".venv").exists(), "nothing may be created when set-up refuses"


def test_setup_updates_an_existing_venv_in_place_when_requirements_change(tmp_path: Path) -> None:
    """A changed requirements.txt is installed into the existing venv: `make` puts .venv/bin first on PATH, and
    recreating the venv once took the venv's own python as the base and deleted it (and everyone's tools with it)."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup-controller.sh", work / "scripts")
    (work / "requirements.txt").write_text("pinned==1.0\n")
    venv_bin = work / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (work / ".venv" / ".requirements.sha256").write_text("an older requirements.txt\n")
    log = tmp_path / "python.log"
    python = venv_bin / "python"
    python.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exit 0\necho "$*" >> {log}\n')
    python.chmod(0o755)
    (venv_bin / "python3.13").symlink_to(python)
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(work / "scripts" / "setup-controller.sh")],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert log.read_text() == "-m pip install --quiet --disable-pip-version-check -r requirements.txt\n"
    assert python.exists(), "the venv must not be deleted"
    want = subprocess.run(["sha256sum", str(work / "requirements.txt")], capture_output=True, text=True, check=True)
    assert (work / ".venv" / ".requirements.sha256").read_text().split()[0] == want.stdout.split()[0]


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run must call the very command the README tells people to run for the tests."""
    readme = (REPO / "README.md").read_text()
    match = re.search(r"^\s*(make test)\s*$", readme, re.MULTILINE)
    assert match, "README must show `make test` as the test command"
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.MULTILINE)
    assert "ensure-docker.sh" in ci


def test_make_test_covers_every_molecule_scenario_on_disk() -> None:
    """A scenario added under molecule/ but left out of `make test` would silently never run in CI: `make test` runs
    every scenario on disk but those MOLECULE_NOT_IN_TEST names (each with its reason in the Makefile), and names
    none that is not there; every scenario a lane names is one `make test` runs."""
    makefile = (REPO / "Makefile").read_text()
    listed = re.search(r"^MOLECULE_SCENARIOS \?= (.+)$", makefile, re.MULTILINE)
    lanes = re.search(r"^MOLECULE_LANES \?= (.+)$", makefile, re.MULTILINE)
    left_out = re.search(r"^MOLECULE_NOT_IN_TEST := (.*)$", makefile, re.MULTILINE)
    assert listed and lanes and left_out
    on_disk = {p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml")}
    assert on_disk, "no molecule scenarios found"
    run, out = set(listed.group(1).split()), set(left_out.group(1).split())
    assert not run & out and run | out == on_disk, (run, out, on_disk)
    for name in out:   # each scenario left out says why, in the comment right above
        assert re.search(rf"^# .*\b{name}: ", makefile, re.MULTILINE), f"no reason in the Makefile for {name}"
    assert set(lanes.group(1).replace(";", " ").split()) <= run, lanes.group(1)


SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))


def merge_config(base: dict, over: dict) -> dict:
    """`over` merged into `base` as molecule merges a scenario into its base config: mappings key by key, any other
    value (a list too) replaced."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = (merge_config(base[key], value) if isinstance(base.get(key), dict) and isinstance(value, dict)
                       else value)
    return merged


def scenario_config(scenario: str) -> dict:
    """molecule/<scenario>/molecule.yml over the shared .config/molecule/config.yml, parsed and merged."""
    base = yaml.safe_load((REPO / ".config" / "molecule" / "config.yml").read_text())
    return merge_config(base, yaml.safe_load((REPO / "molecule" / scenario / "molecule.yml").read_text()))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verifier_options_are_strings_or_flags(scenario: str) -> None:
    """molecule hands the testinfra verifier's options to shlex as they are: an int (``durations: 20``) passes its
    schema and then crashes the verify stage with a TypeError, so every value is a string or a boolean flag."""
    config = scenario_config(scenario)
    options = (config.get("verifier") or {}).get("options") or {}
    wrong = {key: value for key, value in options.items() if not isinstance(value, (str, bool))}
    assert not wrong, f"molecule/{scenario}/molecule.yml verifier options that are not strings: {wrong}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenarios_pipeline_their_modules(scenario: str) -> None:
    """molecule writes its own ansible.cfg, so the project's ``pipelining = true`` does not reach converge and
    idempotence. Without it every module on the docker connection costs five ``docker exec`` (mkdir, copy, chmod,
    run, rm) instead of one: measured 29 s against 11 s for 30 ``stat`` tasks, three times the controller CPU."""
    config = scenario_config(scenario)
    env = (config.get("provisioner") or {}).get("env") or {}
    assert str(env.get("ANSIBLE_PIPELINING", "")).lower() == "true", (
        f"molecule/{scenario}/molecule.yml: set provisioner.env.ANSIBLE_PIPELINING: \"true\"")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenarios_destroy_with_the_shared_retrying_playbook(scenario: str) -> None:
    """molecule-plugins' destroy neither retries a failed forced removal nor prints Docker's error; one such failure
    under load failed a CI run whose tests had all passed. Every scenario uses molecule/shared/destroy.yml."""
    config = scenario_config(scenario)
    playbooks = (config.get("provisioner") or {}).get("playbooks") or {}
    assert playbooks.get("destroy") == "../shared/destroy.yml", f"molecule/{scenario}/molecule.yml"
    assert (REPO / "molecule" / scenario / playbooks["destroy"]).resolve().is_file()


@pytest.mark.parametrize("script", sorted((REPO / "scripts").glob("*.sh")) + [REPO / ".ci" / "run"])
def test_shell_scripts_parse(script: Path) -> None:
    """Every shell script at least parses (bash -n) and is executable."""
    assert os.access(script, os.X_OK), f"{script} is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)


def _stand_in(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _ensure_docker(tmp_path: Path, dockerd_body: str, wait_seconds: int) -> subprocess.CompletedProcess:
    """Run scripts/ensure-docker.sh with stand-in docker tools; dockerd lives only in an sbin folder off PATH.

    The stand-in client answers `docker info` once the stand-in engine has written its ready marker, the way
    the real client answers once dockerd listens. apt-get must not run: every tool is present.
    """
    bindir, sbindir = tmp_path / "bin", tmp_path / "sbin"
    bindir.mkdir()
    sbindir.mkdir()
    ready = tmp_path / "engine-ready"
    _stand_in(bindir / "docker", f'[ "$1" = info ] && [ -e {ready} ]\n')
    _stand_in(bindir / "debootstrap", "exit 0\n")
    _stand_in(bindir / "gpg", "exit 0\n")
    _stand_in(bindir / "apt-get", 'echo "apt-get ran: $*" >&2; exit 1\n')
    _stand_in(sbindir / "dockerd", dockerd_body.replace("READY", str(ready)))
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "ENSURE_DOCKER_CLIENT": str(bindir / "docker"),
        "ENSURE_DOCKER_SBIN_DIRS": str(sbindir),
        "ENSURE_DOCKER_WAIT_SECONDS": str(wait_seconds),
        "ENSURE_DOCKER_LOG": str(tmp_path / "dockerd.log"),
    }
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "ensure-docker.sh")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="ensure-docker only starts an engine as root")


@needs_root
def test_ensure_docker_starts_a_dockerd_that_is_not_on_path(tmp_path: Path) -> None:
    """Debian's docker.io installs dockerd in /usr/sbin; the script must find and start it there.

    CI once failed on this.
    """
    result = _ensure_docker(tmp_path, "touch READY\n", wait_seconds=10)
    assert result.returncode == 0, result.stderr
    assert "starting dockerd" in result.stdout
    assert "apt-get ran" not in result.stderr


@needs_root
def test_ensure_docker_reports_the_log_when_dockerd_dies(tmp_path: Path) -> None:
    """An engine that exits at once fails the script without sitting out the wait, with its own last words shown."""
    started = time.monotonic()
    dies = 'echo "failed to start daemon: stand-in storage error"; exit 1\n'
    result = _ensure_docker(tmp_path, dies, wait_seconds=30)
    assert time.monotonic() - started < 15
    assert result.returncode == 1
    assert "dockerd exited before it answered" in result.stderr
    assert "stand-in storage error" in result.stderr


def test_the_collection_stub_stays_links_to_the_checkout() -> None:
    """collections/ must point back at the repository: molecule's prerun would replace the links with an installed
    (stale) copy, which is why every scenario turns it off."""
    stub = REPO / "collections" / "ansible_collections" / "vllm_node" / "vllm_node"
    entries = sorted(stub.iterdir())
    assert entries and all(p.is_symlink() for p in entries), [p.name for p in entries if not p.is_symlink()]
    assert {p.name for p in entries} >= {"galaxy.yml", "plugins", "roles", "playbooks", "meta"}
    with_prerun = [scenario for scenario in SCENARIOS if scenario_config(scenario).get("prerun") is not False]
    assert with_prerun == []
