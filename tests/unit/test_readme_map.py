"""README.md is a map a newcomer can trust: short, every path and command in it real, no run diary.

The checks (each a small pure function, tested on bad input below as well as on the real files):
- README.md has at most 200 lines;
- every repository path it names in backticks, code blocks or links exists (placeholders such as `<role>` are
  checked up to the placeholder, globs must match, paths under what a run generates are left out);
- every `make <target>` it names is a target of the Makefile, every playbook it names exists;
- no dated run (a date, a numbered run, a commit id) in README.md, molecule/**/README.md or the Makefile: figures
  live in docs/measurements.md;
- the README's own `make plan` commands run as the Makefile's plan target runs them: the first fits (exit 0, the
  plan printed and written), the second is refused with the sentence the README quotes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from repo_root import ROOT as REPO

README = REPO / "README.md"
MAKEFILE = REPO / "Makefile"
MAX_LINES = 200
# Made by `make setup` or by a run, not in git: a path under one of these is not checked.
GENERATED = (".venv/", "artifacts/", ".cache/")
# A token without a slash is a path only with one of these suffixes (so `config.json`, a model's file, is not).
FILE_SUFFIXES = (".yml", ".yaml", ".md", ".py", ".sh", ".cfg", ".toml", ".txt", ".j2")
PATH_TOKEN = re.compile(r"[\w.<>*/-]+")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MAKE_CALL = re.compile(r"(?:^|[\s;&|(])make((?:\s+(?:-\S+|[A-Z_]+=\S*))*)\s+([a-z][a-z0-9_-]*)")
PLAYBOOK = re.compile(r"\bplaybooks/[\w./-]+\.ya?ml\b")
FQCN_PLAYBOOK = re.compile(r"\bvllm_node\.vllm_node\.(\w+)")
MAKE_RULE = re.compile(r"^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?!=)", re.M)
DIARY = {
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a numbered run": re.compile(r"\bruns? \d+(?:\s*(?:-|and|to)\s*\d+)?\b", re.I),
    "a commit id": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
}


def code_texts(markdown: str) -> list[str]:
    """The bodies of the fenced blocks, then the inline code spans of the text around them."""
    fences = FENCE.findall(markdown)
    prose = FENCE.sub("", markdown)
    return fences + CODE_SPAN.findall(prose)


def is_repo_path(token: str) -> bool:
    """Whether a token of code reads as a path inside the repository (not an option, URL, absolute path or name)."""
    if not token or token.startswith(("/", "-", "~")) or "=" in token or "://" in token:
        return False
    if not PATH_TOKEN.fullmatch(token) or not re.search(r"[A-Za-z]", token):
        return False
    return "/" in token or token.endswith(FILE_SUFFIXES)


def path_mentions(markdown: str) -> list[str]:
    """Every repository path the text names: tokens of its code, and its relative link targets."""
    found: list[str] = []
    for code in code_texts(markdown):
        for raw in code.split():
            token = raw.strip("'\",;:()[]")
            if is_repo_path(token):
                found.append(token)
    for target in LINK.findall(markdown):
        target = target.split("#", 1)[0]
        if target and "://" not in target and not target.startswith(("/", "mailto:")):
            found.append(target)
    return found


def missing_paths(markdown: str, root: Path) -> list[str]:
    """The paths named in the text that do not exist under root (placeholders checked up to the placeholder)."""
    missing = []
    for mention in path_mentions(markdown):
        path = mention
        if path.startswith(GENERATED) or path.rstrip("/") in {g.rstrip("/") for g in GENERATED}:
            continue
        if "<" in path:
            path = path[: path.index("<")]
            path = path[: path.rfind("/") + 1]
            if not path:
                continue
        if "*" in path:
            if not any(root.glob(path.rstrip("/"))):
                missing.append(mention)
        elif not (root / path).exists():
            missing.append(mention)
    return missing


def make_targets(makefile: str) -> set[str]:
    """The rule names of a Makefile (variable assignments with := are not rules)."""
    return {name for names in MAKE_RULE.findall(makefile) for name in names.split()}


def make_calls(markdown: str) -> list[str]:
    """The targets of every `make ...` in the text's code."""
    return [m.group(2) for code in code_texts(markdown) for m in MAKE_CALL.finditer(code)]


def unknown_make_targets(markdown: str, targets: Iterable[str]) -> list[str]:
    known = set(targets)
    return [target for target in make_calls(markdown) if target not in known]


def missing_playbooks(markdown: str, root: Path) -> list[str]:
    """Playbooks named by path, or by FQCN on an ansible-playbook line, that do not exist."""
    named = PLAYBOOK.findall(markdown)
    for line in markdown.splitlines():
        if "ansible-playbook" in line:
            named += [f"playbooks/{name}.yml" for name in FQCN_PLAYBOOK.findall(line)]
    return [path for path in named if not (root / path).is_file()]


def diary_lines(text: str) -> list[str]:
    """Lines that read as a run diary: a date, a numbered run, a commit id."""
    return [f"{number}: {what}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1)
            for what, pattern in DIARY.items() if pattern.search(line)]


def plan_commands(markdown: str) -> list[tuple[str, str]]:
    """Each fenced `make plan ...` block and the prose that follows it (up to the next fence or heading)."""
    found = []
    for match in FENCE.finditer(markdown):
        if match.group(1).lstrip().startswith("make plan"):
            after = re.split(r"^```|^#", markdown[match.end():], maxsplit=1, flags=re.M)[0]
            found.append((match.group(1).strip(), after))
    return found


def plan_recipe(makefile: str, block: str, plan_file: Path) -> str:
    """The shell line make would run for the README's `make plan VAR=...` block (the plan written to plan_file)."""
    words = shlex.split(block)
    assert words[:2] == ["make", "plan"], block
    variables = dict(word.split("=", 1) for word in words[2:])
    lines = makefile.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"plan\s*:(?!=)", line))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line[1:])
    body = "\n".join(recipe)
    for name, value in variables.items():
        body = body.replace(f"$({name})", value)
    assert "$(" not in body, f"the plan target uses a make variable this test does not set: {body}"
    return f"{body} -e vllm_node_plan_file={shlex.quote(str(plan_file))}"


def over_length(text: str, limit: int = MAX_LINES) -> int | None:
    """The text's line count when it is over the limit, else None."""
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    return lines if lines > limit else None


def squeeze(text: str) -> str:
    return " ".join(text.split())


# --- the real files ---------------------------------------------------------------------------------------------

def test_the_readme_is_short() -> None:
    lines = over_length(README.read_text())
    assert lines is None, f"README.md has {lines} lines (at most {MAX_LINES}): move detail to a role README"


def test_every_path_the_readme_names_exists() -> None:
    assert path_mentions(README.read_text()), "no path found: the extraction is broken"
    assert missing_paths(README.read_text(), REPO) == []


def test_every_make_target_and_playbook_the_readme_names_exists() -> None:
    text = README.read_text()
    assert {"setup", "demo", "plan", "test"} <= set(make_calls(text))
    assert unknown_make_targets(text, make_targets(MAKEFILE.read_text())) == []
    assert missing_playbooks(text, REPO) == []


@pytest.mark.parametrize("path", [README, MAKEFILE, *sorted(REPO.glob("molecule/**/README.md"))],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_dated_run_outside_the_measurements(path: Path) -> None:
    assert diary_lines(path.read_text()) == [], f"{path.name}: figures and status go to docs/measurements.md"


def test_the_readme_plan_commands_run(tmp_path: Path) -> None:
    """The README's sizing commands, run as `make plan` runs them (without its setup step): the first fits and
    prints its plan, the second is refused with the sentence the README quotes."""
    commands = plan_commands(README.read_text())
    assert len(commands) == 2, "the README shows one fitting and one refused `make plan` block"
    makefile = MAKEFILE.read_text()
    venv_bin = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{venv_bin}:{os.environ.get('PATH', '')}", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               PY_COLORS="0", ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    runs = []
    for index, (block, _) in enumerate(commands):
        plan_file = tmp_path / f"plan-{index}.json"
        recipe = plan_recipe(makefile, block, plan_file)
        process = subprocess.Popen(["bash", "-eu", "-o", "pipefail", "-c", recipe], cwd=REPO, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        runs.append((process, plan_file))
    outputs = [(process.communicate(timeout=120)[0], process.returncode, plan_file) for process, plan_file in runs]

    output, rc, plan_file = outputs[0]
    assert rc == 0, output[-3000:]
    plan = json.loads(plan_file.read_text())
    assert plan["fits"] is True
    assert all(str(arg) in output for arg in plan["vllm_args"]), "the plan's vLLM arguments are not printed"

    output, rc, plan_file = outputs[1]
    assert rc != 0, output[-3000:]
    assert json.loads(plan_file.read_text())["fits"] is False
    quoted = re.search(r'"([^"]+)"', commands[1][1])
    assert quoted, "the README quotes the refusal after the refused command"
    assert squeeze(quoted.group(1)) in squeeze(output), output[-3000:]


# --- the checkers on bad input ------------------------------------------------------------------------------------

def test_a_broken_path_in_a_copy_of_the_readme_is_found() -> None:
    text = README.read_text()
    assert "`docs/measurements.md`" in text
    broken = text.replace("`docs/measurements.md`", "`docs/measurement.md`", 1)
    assert missing_paths(broken, REPO) == ["docs/measurement.md"]


def test_missing_paths_on_a_small_input(tmp_path: Path) -> None:
    (tmp_path / "roles" / "a").mkdir(parents=True)
    (tmp_path / "roles" / "a" / "README.md").write_text("")
    text = ("See `roles/a/README.md`, `roles/<role>/README.md`, `roles/*/README.md` and `roles/b/tasks/main.yml`;\n"
            "```\nansible-playbook -i inventories/<yours> nothere.yml -e x=y/z\n```\n"
            "[docs](docs/x.md#top), [web](https://example.org/a), `artifacts/plan.json`, `/etc/x.yml`, `config.json`,"
            " `roles/*/meta/x.yml`.")
    assert missing_paths(text, tmp_path) == ["inventories/<yours>", "nothere.yml", "roles/b/tasks/main.yml",
                                             "roles/*/meta/x.yml", "docs/x.md"]


def test_make_targets_and_playbooks_on_a_small_input(tmp_path: Path) -> None:
    makefile = "VAR := 1\nexport PATH := x\n.PHONY: a b\na: b\n\techo\nb c:\n\techo\n"
    assert make_targets(makefile) == {".PHONY", "a", "b", "c"}
    text = "Run `make a`, `make -j4 VAR=2 c` and\n```\nmake setup && make nope ARGS='x'\n```\nto make things."
    assert unknown_make_targets(text, make_targets(makefile)) == ["setup", "nope"]
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "site.yml").write_text("")
    text = "`playbooks/site.yml`, `playbooks/gone.yml`\n```\nansible-playbook vllm_node.vllm_node.verify\n```\n"
    assert missing_playbooks(text, tmp_path) == ["playbooks/gone.yml", "playbooks/verify.yml"]


def test_diary_lines_on_a_small_input() -> None:
    diary = ("Measured 2026-12-01 on the 2-core machine: 52.4 s.\nRun 5 rolled the canary back.\n"
             "runs 5-7 passed\nthe cold run of c0cae5e took 1964 s\n")
    assert [line.split(":")[0] for line in diary_lines(diary)] == ["1", "2", "3", "4"]
    assert diary_lines("Each run's output is kept; the second run changes nothing; step 03; sha256 of 0000000.") == []


def test_over_length_on_a_small_input() -> None:
    assert over_length("x\n" * MAX_LINES) is None
    assert over_length("x\n" * (MAX_LINES + 1)) == MAX_LINES + 1
    assert over_length("x\n" * MAX_LINES + "no newline at the end") == MAX_LINES + 1
    assert over_length(README.read_text() + "x\n" * MAX_LINES) is not None


def test_plan_recipe_follows_the_makefile(tmp_path: Path) -> None:
    makefile = "plan: setup\n\tansible-playbook playbooks/plan.yml $(ARGS)\n\nother:\n\ttrue\n"
    line = plan_recipe(makefile, "make plan ARGS='-e a=1 -e b=2'", tmp_path / "p.json")
    assert line == f"ansible-playbook playbooks/plan.yml -e a=1 -e b=2 -e vllm_node_plan_file={tmp_path / 'p.json'}"
    # A newline inside ARGS reaches the shell as a second command, as it does under make: that block would fail.
    assert "\n" in plan_recipe(makefile, "make plan ARGS='-e a=1\n  -e b=2'", tmp_path / "p.json")
