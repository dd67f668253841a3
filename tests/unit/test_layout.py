"""tests/unit is laid out like the source tree (tests/unit/README.md): a test module sits in the folder that mirrors
what it tests, only the checks of the repository as a whole sit at the top level (REPOSITORY_WIDE), every mirrored
folder has its source folder, and no module computes a path from its own location (repo_root.ROOT does)."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from repo_root import ROOT

UNIT = ROOT / "tests" / "unit"
# The top-level folders of tests/unit and the source folder each mirrors (below them, the same relative path).
MIRRORS = {"plugins": "plugins", "roles": "roles", "scripts": "scripts", "fixtures": "tests/fixtures",
           "harness": "tests/harness"}
# Top-level folders that mirror nothing and hold no test module: recorded inputs.
DATA_FOLDERS = {"data"}
# The test modules that check the repository as a whole (every role, every plugin, the README, the foundation),
# the only ones at the top level.
REPOSITORY_WIDE = {"test_foundation.py", "test_jinja_backslashes.py", "test_layout.py", "test_plugin_docs.py",
                   "test_readme_map.py", "test_role_docs.py", "test_role_interfaces.py"}
# The one module allowed to compute a path from its own location.
ROOT_MODULE = "repo_root.py"


def is_test_module(path: Path) -> bool:
    """What pytest collects by default (python_files: test_*.py, *_test.py)."""
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def reads_own_file(source: str) -> bool:
    """Whether the code (not its strings or comments) reads its own `__file__` (`module.__file__` is another's)."""
    previous = ""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.string == "__file__" and previous != ".":
            return True
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = token.string
    return False


def skipped(relative: Path) -> bool:
    """Caches and hidden folders (__pycache__, .hypothesis, ...) are nobody's layout."""
    return any(part == "__pycache__" or part.startswith(".") for part in relative.parts)


def folder_problems(unit: Path, root: Path) -> list[str]:
    """Each folder under `unit` that mirrors no existing source folder, named with where it should point."""
    problems = []
    for folder in sorted(path for path in unit.rglob("*") if path.is_dir()):
        relative = folder.relative_to(unit)
        top = relative.parts[0]
        if skipped(relative) or top in DATA_FOLDERS:
            continue
        if top not in MIRRORS:
            problems.append(f"tests/unit/{relative.as_posix()}/ mirrors no source folder "
                            f"(top-level folders: {', '.join(sorted(MIRRORS))}, or {', '.join(sorted(DATA_FOLDERS))})")
            continue
        source = Path(MIRRORS[top], *relative.parts[1:])
        if not (root / source).is_dir():
            problems.append(f"tests/unit/{relative.as_posix()}/ has no source counterpart: {source.as_posix()}/ "
                            "does not exist")
    return problems


def module_problems(unit: Path, repository_wide: set[str]) -> list[str]:
    """Test modules at the top level that are not repository-wide, test modules in data folders, and modules other
    than repo_root.py that compute a path from their own location."""
    problems = []
    for path in sorted(unit.rglob("*.py")):
        relative = path.relative_to(unit)
        if skipped(relative):
            continue
        if is_test_module(path) and len(relative.parts) == 1 and path.name not in repository_wide:
            problems.append(f"tests/unit/{path.name} is flat: move it to the folder that mirrors what it tests, or "
                            "add it to REPOSITORY_WIDE if it checks the repository as a whole")
        if is_test_module(path) and relative.parts[0] in DATA_FOLDERS:
            problems.append(f"tests/unit/{relative.as_posix()}: a data folder holds no test module")
        if path.name != ROOT_MODULE and reads_own_file(path.read_text(encoding="utf-8")):
            problems.append(f"tests/unit/{relative.as_posix()} computes a path from __file__: use "
                            "`from repo_root import ROOT`")
    return problems


def layout_problems(unit: Path, root: Path, repository_wide: set[str] = REPOSITORY_WIDE) -> list[str]:
    """Everything in `unit` (a tests/unit tree) that breaks the layout rule, against the source tree at `root`."""
    return folder_problems(unit, root) + module_problems(unit, repository_wide)


def test_the_unit_tests_are_laid_out_like_the_source_tree() -> None:
    assert layout_problems(UNIT, ROOT) == []


def test_the_repository_wide_list_names_existing_top_level_modules() -> None:
    assert sorted(name for name in REPOSITORY_WIDE if not (UNIT / name).is_file()) == []


def test_the_mirrored_roots_exist() -> None:
    assert sorted(source for source in MIRRORS.values() if not (ROOT / source).is_dir()) == []


def test_repo_root_is_the_checkout() -> None:
    assert (ROOT / "galaxy.yml").is_file() and (ROOT / "tests" / "unit" / ROOT_MODULE).is_file()


def write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_mirrored_layout_passes(tmp_path: Path) -> None:
    root, unit = tmp_path, tmp_path / "tests" / "unit"
    for source in ("plugins/filter", "roles/gateway/templates", "scripts", "tests/fixtures/gpu_node"):
        (root / source).mkdir(parents=True)
    for module in ("plugins/filter/test_x.py", "roles/gateway/templates/test_y.py", "scripts/test_z.py",
                   "fixtures/gpu_node/test_w.py", "plugins/filter/x_test.py"):
        write(unit / module, 'import os\n\nMODULE = os.__file__  # __file__ of another module\nDOC = "__file__"\n')
    write(unit / "test_everything.py")
    write(unit / "helper.py")
    write(unit / "data" / "recorded" / "page.json")
    write(unit / "plugins" / "__pycache__" / "test_x.cpython-313.pyc")
    assert layout_problems(unit, root, {"test_everything.py"}) == []


def test_a_flat_module_a_folder_without_source_and_a_computed_root_are_named(tmp_path: Path) -> None:
    root, unit = tmp_path, tmp_path / "tests" / "unit"
    (root / "plugins" / "filter").mkdir(parents=True)
    write(unit / "test_gateway.py")                                   # flat, not repository-wide
    write(unit / "plugins" / "filtr" / "test_a.py")                   # a typo: no plugins/filtr
    write(unit / "roles" / "gone" / "test_b.py")                      # a role that was removed
    write(unit / "misc" / "test_c.py")                                # a top folder that mirrors nothing
    write(unit / "data" / "test_d.py")                                # a test among the data
    write(unit / "plugins" / "filter" / "test_e.py", "ROOT = Path(__file__).resolve().parents[3]\n")
    problems = layout_problems(unit, root, {"test_everything.py"})
    assert problems == [
        "tests/unit/misc/ mirrors no source folder (top-level folders: fixtures, harness, plugins, roles, scripts, "
        "or data)",
        "tests/unit/plugins/filtr/ has no source counterpart: plugins/filtr/ does not exist",
        "tests/unit/roles/ has no source counterpart: roles/ does not exist",
        "tests/unit/roles/gone/ has no source counterpart: roles/gone/ does not exist",
        "tests/unit/data/test_d.py: a data folder holds no test module",
        "tests/unit/plugins/filter/test_e.py computes a path from __file__: use `from repo_root import ROOT`",
        "tests/unit/test_gateway.py is flat: move it to the folder that mirrors what it tests, or add it to "
        "REPOSITORY_WIDE if it checks the repository as a whole",
    ]
