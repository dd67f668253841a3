"""Role README variable tables come from meta/argument_specs.yml and cannot drift from it.

(The specs' option names against defaults/main.yml: tests/unit/test_role_interfaces.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from repo_root import ROOT as REPO

SPECS = sorted(REPO.glob("roles/*/meta/argument_specs.yml"))
BEGIN, END = "<!-- BEGIN_ANSIBLE_DOCS -->", "<!-- END_ANSIBLE_DOCS -->"


def _options(spec_file: Path) -> dict[str, dict[str, Any]]:
    """Every entry point's options, keyed by entry point."""
    specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
    return {entry: spec.get("options") or {} for entry, spec in specs.items()}


def _defaults(spec_file: Path) -> dict[str, Any]:
    return yaml.safe_load((spec_file.parents[1] / "defaults" / "main.yml").read_text()) or {}


@pytest.mark.parametrize("spec_file", SPECS, ids=lambda p: p.parts[-3])
def test_a_spec_default_is_the_real_default(spec_file: Path) -> None:
    """The README shows the spec's `default`; where defaults/main.yml holds a plain value, it must be that value."""
    defaults = _defaults(spec_file)
    for entry, options in _options(spec_file).items():
        for name, option in options.items():
            real = defaults.get(name)
            if "default" in option and not (isinstance(real, str) and "{{" in real):
                assert option["default"] == real, f"{entry}/{name}: spec says {option['default']!r}, defaults {real!r}"


def _mini_repo(tmp_path: Path, role: str = "node_facts") -> Path:
    """The files role-docs.sh needs, with one real role."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "role-docs.sh", work / "scripts")
    for name in (".aar_doc.yml", "galaxy.yml"):
        shutil.copy(REPO / name, work)
    shutil.copytree(REPO / "roles" / role, work / "roles" / role)
    return work


def _role_docs(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # aar-doc comes from the same venv as this interpreter.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", str(work / "scripts" / "role-docs.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_hand_edited_table_fails_the_check_and_make_docs_restores_it(tmp_path: Path) -> None:
    work = _mini_repo(tmp_path)
    readme = work / "roles" / "node_facts" / "README.md"
    original = readme.read_text()
    assert BEGIN in original and END in original
    row = "| `node_facts_probe_timeout` | int | `30` |"
    assert row in original, "the generated row this test edits"
    readme.write_text(original.replace(row, row.replace("`30`", "`45`")))
    check = _role_docs(work, "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "roles/node_facts/README.md differs" in check.stderr and "run: make docs" in check.stderr
    assert "-| `node_facts_probe_timeout` | int | `45` |" in check.stderr, "the diff shows the edited row"
    fix = _role_docs(work)
    assert fix.returncode == 0, fix.stderr
    assert readme.read_text() == original
    assert _role_docs(work, "--check").returncode == 0


def test_a_spec_change_fails_the_check_until_regenerated(tmp_path: Path) -> None:
    work = _mini_repo(tmp_path)
    spec = work / "roles" / "node_facts" / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace("default: 30", "default: 31"))
    assert _role_docs(work, "--check").returncode == 1
    assert _role_docs(work).returncode == 0
    assert "| `node_facts_probe_timeout` | int | `31` |" in (spec.parents[1] / "README.md").read_text()


def test_a_role_with_specs_but_no_markers_is_refused_with_the_fix(tmp_path: Path) -> None:
    work = _mini_repo(tmp_path)
    readme = work / "roles" / "node_facts" / "README.md"
    readme.write_text("# node_facts\n\nNo table markers here.\n")
    result = _role_docs(work)
    assert result.returncode == 1
    assert BEGIN in result.stderr and END in result.stderr and "make docs" in result.stderr
    assert readme.read_text() == "# node_facts\n\nNo table markers here.\n", "nothing may be written"
