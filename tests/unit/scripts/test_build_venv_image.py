"""scripts/build-venv-image.sh: the image's key follows the locks, the vllm_env role, the script, its playbook and the
base image; an image carrying the current key is left alone, any other starts a build container run as molecule runs the
nodes (systemd, the wheelhouse mounted, not privileged). Docker is replaced by a recorder, so nothing is built. Also:
the scenarios on the venv image are the ones `make molecule` builds it for, and the install's own scenarios are not
among them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from repo_root import ROOT

SCRIPT = ROOT / "scripts" / "build-venv-image.sh"
IMAGE = "local/debian-vllm-venvs:bookworm"
LABEL = "vllm-node.venv-image.key"


def fake_docker(tmp_path: Path) -> tuple[Path, Path]:
    """A `docker` that answers the base image's id ($FAKE_BASE_ID) and the venv image's label ($FAKE_LABEL), records
    every call in a log and fails any other command; return it and the log."""
    log = tmp_path / "docker-calls.log"
    fake = tmp_path / "docker"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in
  "image inspect -f {{{{.Id}}}} "*) echo "$FAKE_BASE_ID" ;;
  *"{LABEL}"*) [ -n "$FAKE_LABEL" ] && echo "$FAKE_LABEL" || exit 1 ;;
  *) exit 1 ;;
esac
""")
    fake.chmod(0o755)
    return fake, log


def run(root: Path, tmp_path: Path, *args: str, base_id: str = "sha256:base", label: str = ""
        ) -> tuple[subprocess.CompletedProcess, str]:
    """Run the script found under `root` with the fake docker; return the result and the recorded docker calls."""
    fake, log = fake_docker(tmp_path)
    log.unlink(missing_ok=True)
    (tmp_path / "wheelhouse").mkdir(exist_ok=True)
    env = {**os.environ, "DOCKER": str(fake), "FAKE_BASE_ID": base_id, "FAKE_LABEL": label,
           "WHEELHOUSE": str(tmp_path / "wheelhouse"), "VENV_IMAGE_LOCK": str(tmp_path / "build.lock")}
    result = subprocess.run(["bash", str(root / "scripts" / "build-venv-image.sh"), *args], capture_output=True,
                            text=True, timeout=60, env=env)
    return result, log.read_text() if log.exists() else ""


def key(root: Path, tmp_path: Path, base_id: str = "sha256:base") -> str:
    """The key the script computes for the tree under `root`."""
    result, _ = run(root, tmp_path, "--key", base_id=base_id)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"[0-9a-f]{64}\n", result.stdout), result.stdout
    return result.stdout.strip()


def copy_tree(tmp_path: Path) -> Path:
    """The script, its playbook and the vllm_env role copied to a tree of their own (to change a lock there)."""
    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    for name in ("build-venv-image.sh", "venv-image.yml"):
        shutil.copy(ROOT / "scripts" / name, root / "scripts" / name)
    shutil.copytree(ROOT / "roles" / "vllm_env", root / "roles" / "vllm_env")
    return root


def test_the_key_follows_the_locks_the_role_the_script_its_playbook_and_the_base_image(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    first = key(root, tmp_path)
    assert key(root, tmp_path) == first == key(ROOT, tmp_path)
    assert key(root, tmp_path, base_id="sha256:another-base") != first
    lock = root / "roles/vllm_env/files/requirements/vllm-0.31.0-cpu.txt"
    lock.write_text(lock.read_text() + "\n")
    after_lock = key(root, tmp_path)
    assert after_lock != first
    (root / "roles/vllm_env/tasks/build.yml").write_text((root / "roles/vllm_env/tasks/build.yml").read_text() + "\n")
    assert key(root, tmp_path) not in (first, after_lock)
    after_role = key(root, tmp_path)
    (root / "scripts/venv-image.yml").write_text((root / "scripts/venv-image.yml").read_text() + "\n")
    after_playbook = key(root, tmp_path)
    script = root / "scripts/build-venv-image.sh"
    script.write_text(script.read_text() + "\n")
    assert len({first, after_lock, after_role, after_playbook, key(root, tmp_path)}) == 5


def test_an_image_with_the_current_key_is_left_alone(tmp_path: Path) -> None:
    result, calls = run(ROOT, tmp_path, label=key(ROOT, tmp_path))
    assert result.returncode == 0, result.stderr
    assert "is up to date" in result.stdout
    assert not re.search(r"^(run|commit|rm|exec|stop)\b", calls, re.M), calls


def test_another_key_starts_a_build_container_as_molecule_runs_the_nodes(tmp_path: Path) -> None:
    result, calls = run(ROOT, tmp_path, label="an-older-key")
    # the fake docker refuses `run`: the script stops there, and nothing is committed
    assert result.returncode != 0
    assert "building " + IMAGE in result.stdout
    started = [line for line in calls.splitlines() if line.startswith("run ")]
    assert len(started) == 1, calls
    assert "local/debian-systemd:bookworm /lib/systemd/systemd" in started[0]
    assert f" -v {tmp_path.resolve()}/wheelhouse:/opt/wheelhouse:ro " in started[0]
    for part in ("--cap-add SYS_ADMIN", "--cgroupns host", "-v /sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs /run",
                 "--stop-signal SIGRTMIN+3"):
        assert part in started[0], part
    assert "--privileged" not in started[0]
    assert not re.search(r"^commit\b", calls, re.M)


def makefile_list(makefile: str, name: str) -> set[str]:
    """The words of the Makefile's `NAME ?= ...` line."""
    found = re.search(rf"^{name} \?= (.+)$", makefile, re.M)
    assert found, name
    return set(found.group(1).split())


def test_the_scenarios_on_the_venv_image_get_it_built_and_the_install_is_proven_elsewhere() -> None:
    makefile = (ROOT / "Makefile").read_text()
    listed = makefile_list(makefile, "VENV_IMAGE_SCENARIOS")
    wheelhouse = makefile_list(makefile, "WHEELHOUSE_SCENARIOS")
    on_image = {p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml") if IMAGE in p.read_text()}
    assert on_image == listed and on_image
    # they mount the wheelhouse: vllm_env_offline checks that it is there
    assert on_image <= wheelhouse
    # day2 installs from the wheelhouse and from PyPI, offline from the bundle: never from the venv image
    assert not on_image & {"day2", "offline"}
    assert re.search(r"^molecule: .*\\\n.*VENV_IMAGE_SCENARIOS.*venv-image", makefile, re.M)
    assert re.search(r"^TEST_FIRST := .*\\\n.*VENV_IMAGE_SCENARIOS.*venv-image", makefile, re.M)
